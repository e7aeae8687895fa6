"""fcfs and slo on the simulator, the real benchmark's traces (benchmarks/slo_overload.py), side by side.

`pacer sim --hardware cpu-local` (this machine's saved `pacer sim calibrate` fit, or pacer's
shipped one) on the seeded `mixed` workload with the issue's targets, per rate, seed and policy:
output tok/s, goodput, attainment, refusals, chat TTFT p50 and ITL p99. Cheap (seconds), so a
policy change can be judged on many traces before the real run; it prints the profile it used.

    PYTHONPATH=src python benchmarks/slo_sim_compare.py --num-prompts 48 --rates 0.6,1.2,2.0
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

from pacer.cli.main import main as pacer
from pacer.perf.profiles import calibration_path
from slo_overload import _slo_flags


def run(policy: str, rate: float, seed: int, n: int, out: Path) -> str:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        pacer(["sim", "--hardware", "cpu-local", "--workload", "mixed", "--request-rate", str(rate),
               "--num-prompts", str(n), "--seed", str(seed), "--scheduling-policy", policy, "--out", str(out),
               *_slo_flags()])
    s = json.loads(out.read_text())["summary"]
    o, chat = s["overall"], s.get("chat") or {}
    return (f"tok/s {o['output_tok_s']:6.1f} goodput {o['goodput_req_s']:.3f} att {o['slo_attainment']:.2f} "
            f"429 {o['num_rejected']} chat ttft p50 {chat.get('ttft_p50') or 0:6.2f}s "
            f"itl p99 {(o.get('itl_p99') or 0) * 1e3:6.0f}ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--rates", default="0.6,1.2,2.0")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--policies", default="fcfs,slo")
    args = p.parse_args()
    logging.disable(logging.WARNING)   # the regime log lines
    fit = calibration_path()
    a, b, c = os.getloadavg()
    print(f"# slo_sim_compare: cpu-local profile {fit if fit.is_file() else 'shipped with pacer'}, "
          f"load {a:.1f}/{b:.1f}/{c:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for rate in (float(x) for x in args.rates.split(",")):
            for seed in (int(x) for x in args.seeds.split(",")):
                for policy in args.policies.split(","):
                    line = run(policy, rate, seed, args.num_prompts, Path(tmp) / "run.json")
                    print(f"rate {rate} seed {seed} {policy:5s} {line}", flush=True)


if __name__ == "__main__":
    main()
