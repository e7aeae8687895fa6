"""fcfs and slo on the simulator, the real benchmark's traces (benchmarks/slo_overload.py), side by side.

`pacer sim --hardware cpu-local` (this machine's saved `pacer sim calibrate` fit, or pacer's
shipped one) on the seeded `mixed` workload with the issue's targets, per rate, seed and policy:
output tok/s, goodput, attainment, refusals, chat TTFT p50 and ITL p99 (chat's and every class's),
then per rate each policy's verdicts against fcfs counted over the seeds (issue 25's: throughput
>= 0.95x, goodput, chat TTFT p50 within 10%, chat ITL p99 better; all classes' ITL p99 beside it).
Cheap (seconds), so a policy change can be judged on many traces before the real run; it prints
the profile it used.

    PYTHONPATH=src python benchmarks/slo_sim_compare.py --num-prompts 48 --rates 0.6,1.2,2.0
    PYTHONPATH=src python benchmarks/slo_sim_compare.py --num-prompts 16 --rates 3.0 --seeds 1-12 --quiet
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from pacer.cli.main import main as pacer
from pacer.perf.profiles import calibration_path
from slo_overload import _slo_flags


def run(policy: str, rate: float, seed: int, n: int, out: Path) -> dict[str, float]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        pacer(["sim", "--hardware", "cpu-local", "--workload", "mixed", "--request-rate", str(rate),
               "--num-prompts", str(n), "--seed", str(seed), "--scheduling-policy", policy, "--out", str(out),
               *_slo_flags()])
    s = json.loads(out.read_text())["summary"]
    o, chat = s["overall"], s.get("chat") or {}
    return {"tok_s": o["output_tok_s"], "goodput": o["goodput_req_s"], "att": o["slo_attainment"],
            "rejected": o["num_rejected"], "chat_ttft_p50": chat.get("ttft_p50") or 0.0,
            "itl_p99": o.get("itl_p99") or 0.0, "chat_itl_p99": chat.get("itl_p99") or 0.0}


def line(m: dict[str, float]) -> str:
    return (f"tok/s {m['tok_s']:6.1f} goodput {m['goodput']:.3f} att {m['att']:.2f} "
            f"429 {m['rejected']} chat ttft p50 {m['chat_ttft_p50']:6.2f}s itl p99 chat {m['chat_itl_p99'] * 1e3:6.0f}ms "
            f"all {m['itl_p99'] * 1e3:6.0f}ms")


def verdicts(runs: list[tuple[dict[str, float], dict[str, float]]]) -> str:
    """Issue 25's verdicts past saturation, counted over the seeds: (policy, fcfs) per seed."""
    def count(ok: Callable[[dict[str, float], dict[str, float]], bool]) -> int:
        return sum(1 for p, f in runs if ok(p, f))
    return (f"mean attainment {sum(p['att'] for p, _ in runs) / len(runs):.2f} (fcfs "
            f"{sum(f['att'] for _, f in runs) / len(runs):.2f}); of {len(runs)} seeds: throughput >= 0.95x "
            f"{count(lambda p, f: p['tok_s'] >= 0.95 * f['tok_s'])}, goodput >= fcfs's "
            f"{count(lambda p, f: p['goodput'] >= f['goodput'])}, chat ttft p50 within 10% "
            f"{count(lambda p, f: p['chat_ttft_p50'] <= 1.1 * f['chat_ttft_p50'])}, chat itl p99 better "
            f"{count(lambda p, f: p['chat_itl_p99'] < f['chat_itl_p99'])} (all classes' "
            f"{count(lambda p, f: p['itl_p99'] < f['itl_p99'])})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--rates", default="0.6,1.2,2.0")
    p.add_argument("--seeds", default="1,2,3", help="a list (1,2,3) or a range (1-12)")
    p.add_argument("--policies", default="fcfs,slo", help="fcfs first: the others are judged against it")
    p.add_argument("--quiet", action="store_true", help="only the verdict lines")
    args = p.parse_args()
    logging.disable(logging.WARNING)   # the regime log lines
    fit = calibration_path()
    a, b, c = os.getloadavg()
    print(f"# slo_sim_compare: cpu-local profile {fit if fit.is_file() else 'shipped with pacer'}, "
          f"load {a:.1f}/{b:.1f}/{c:.1f}", flush=True)
    policies = args.policies.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for rate in (float(x) for x in args.rates.split(",")):
            per_policy: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {p: [] for p in policies}
            for seed in _seeds(args.seeds):
                base = None
                for policy in policies:
                    m = run(policy, rate, seed, args.num_prompts, Path(tmp) / "run.json")
                    base = m if policy == "fcfs" else base
                    if base is not None and policy != "fcfs":
                        per_policy[policy].append((m, base))
                    if not args.quiet:
                        print(f"rate {rate} seed {seed} {policy:5s} {line(m)}", flush=True)
            for policy, runs in per_policy.items():
                if runs:
                    print(f"rate {rate} {policy} vs fcfs: {verdicts(runs)}", flush=True)


def _seeds(spec: str) -> list[int]:
    """'1,2,3' or '1-12'."""
    if "-" in spec:
        lo, hi = spec.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in spec.split(",")]


if __name__ == "__main__":
    main()
