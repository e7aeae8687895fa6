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
    PYTHONPATH=src python benchmarks/slo_sim_compare.py --num-prompts 16 --rates 3.0 --seeds 1-40 --quiet --step-noise 0.14

`--step-noise` scatters the simulated steps as a shared machine does (pacer.sim.noise): without
it no step runs over its prediction, so no chat misses its ITL and no admission check errs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from pacer.cli.main import main as pacer
from pacer.perf.profiles import calibration_path
from slo_overload import _slo_flags, checks


def run(policy: str, rate: float, seed: int, n: int, out: Path, noise: float = 0.0) -> dict[str, Any]:
    """The simulated run's summary (per class and `overall`, as `pacer bench` writes it); `noise`:
    the steps' coefficient of variation (`pacer sim --step-noise`)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        pacer(["sim", "--hardware", "cpu-local", "--workload", "mixed", "--request-rate", str(rate),
               "--num-prompts", str(n), "--seed", str(seed), "--scheduling-policy", policy, "--out", str(out),
               "--step-noise", str(noise), *_slo_flags()])
    summary: dict[str, Any] = json.loads(out.read_text())["summary"]
    return summary


def line(s: dict[str, Any]) -> str:
    o, chat = s["overall"], s.get("chat") or {}
    return (f"tok/s {o['output_tok_s']:6.1f} goodput {o['goodput_req_s']:.3f} att {o['slo_attainment']:.2f} "
            f"429 {o['num_rejected']} chat ttft p50 {chat.get('ttft_p50') or 0:6.2f}s "
            f"itl p99 chat {(chat.get('itl_p99') or 0) * 1e3:6.0f}ms all {(o.get('itl_p99') or 0) * 1e3:6.0f}ms")


def verdicts(runs: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """Issue 25's verdicts past saturation (`slo_overload.checks`, the real benchmark's own),
    counted over the seeds: (policy, fcfs) summaries per seed."""
    met = [checks(f, p, None) for p, f in runs]

    def count(key: str) -> int:
        return sum(1 for m in met if key in m and m[key][1])

    pooled = sum(1 for p, f in runs if (p["overall"].get("itl_p99") or 0) < (f["overall"].get("itl_p99") or 0))
    att = [(p["overall"]["slo_attainment"], f["overall"]["slo_attainment"]) for p, f in runs]
    ratios = sorted(p["overall"]["output_tok_s"] / f["overall"]["output_tok_s"] for p, f in runs)
    return (f"throughput median {ratios[len(ratios) // 2]:.3f}x, least {ratios[0]:.3f}x; mean attainment {sum(a for a, _ in att) / len(runs):.2f} (fcfs {sum(b for _, b in att) / len(runs):.2f}); "
            f"of {len(runs)} seeds: throughput >= 0.95x {count('tput')}, goodput >= fcfs's {count('good')}, "
            f"chat ttft p50 within 10% {count('chat')}, chat itl p99 better {count('itl')} (all classes' {pooled})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--rates", default="0.6,1.2,2.0")
    p.add_argument("--seeds", default="1,2,3", help="a list (1,2,3) or a range (1-12)")
    p.add_argument("--policies", default="fcfs,slo", help="fcfs first: the others are judged against it")
    p.add_argument("--quiet", action="store_true", help="only the verdict lines")
    p.add_argument("--step-noise", type=float, default=0.0, metavar="CV",
                   help="`pacer sim --step-noise`: each step's time scattered around the model (0: exact)")
    args = p.parse_args()
    logging.disable(logging.WARNING)   # the regime log lines
    fit = calibration_path()
    a, b, c = os.getloadavg()
    print(f"# slo_sim_compare: cpu-local profile {fit if fit.is_file() else 'shipped with pacer'}, "
          f"step noise cv {args.step_noise:g}, load {a:.1f}/{b:.1f}/{c:.1f}", flush=True)
    policies = args.policies.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for rate in (float(x) for x in args.rates.split(",")):
            per_policy: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {p: [] for p in policies}
            for seed in _seeds(args.seeds):
                base = None
                for policy in policies:
                    m = run(policy, rate, seed, args.num_prompts, Path(tmp) / "run.json", args.step_noise)
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
