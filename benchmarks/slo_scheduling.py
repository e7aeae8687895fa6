"""Evidence for SLO-aware scheduling: fcfs, priority, sjf, lpm and slo side by side on one seeded trace.

Three parts (all by default; pick with --parts sim,real,long):

- **sim**: the simulator (the real Engine and Scheduler on a VirtualClock, SimExecutor) on
  H200 x llama-3.1-8b with the mixed workload; each class carries only its own targets
  (chat ttft 300 ms + itl 50 ms, rag ttft 2 s, agent ttft 500 ms, batch e2e 60 s). For every
  policy: capacity, the highest Poisson rate at which >= 90% of requests meet every target
  of their class (bisection), then per class attainment, goodput, TTFT p50/p99 and ITL p99
  of every policy at fcfs's capacity. Target: slo capacity >= 1.5x fcfs's.
- **real**: the in-process engine with the default model on this CPU. Targets scaled by one
  rule, measured unloaded first: TTFT = 3x the unloaded TTFT of the class's median prompt,
  ITL = 2x the unloaded decode step at batch 8, batch e2e = 3x its unloaded e2e. Rates from
  the simulator's capacity on `cpu-local` for these targets, simulated with the real engine's
  own predictor (the shipped fit times the start-up calibration's and the unloaded runs'
  corrections: `CorrectedCostModel`); fcfs and slo interleaved per repeat on the same trace;
  the simulator's attainment for the same trace beside the measured one. Targets: slo goodput >= 1.3x fcfs's where fcfs meets 70-80%, and simulated
  attainment within 10 points of measured.
- **long**: the "one long prompt slows every chat" case on the real engine: chats decoding
  while long prompts arrive; short chats' ITL p99 under slo vs fcfs, and throughput.

    PYTHONPATH=src .venv/bin/python benchmarks/slo_scheduling.py [--parts sim] [--sim-requests 600]
        [--real-requests 60] [--repeats 2] [--num-threads 1]

The sim part takes ~3-6 minutes on two cores (five capacity searches of ~12 runs). A reduced
real-engine check: `--parts real,long --real-requests 16 --repeats 1 --rate-factors 1.0
--long-chats 4 --long-prompts 2` (~10 minutes); the full size (the defaults) ~25-40 minutes
on a quiet 2-core machine.

Numbers depend on the machine and its load (printed beside them); nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pacer.workload.spec import BUILTIN_WORKLOADS  # noqa: E402
from slo_common import (  # noqa: E402
    POLICIES,
    attainment_row,
    capacity_search,
    class_table,
    loadavg,
    sim_report,
)

SIM_SLO = ["chat:ttft=300ms,itl=50ms", "rag:ttft=2s", "agent:ttft=500ms", "batch:e2e=60s"]


def part_sim(args: argparse.Namespace) -> None:
    print(f"== simulated h200-sxm x llama-3.1-8b, mixed workload, {args.sim_requests} requests per rate, "
          f"seed {args.seed}; targets {' '.join(SIM_SLO)}  (load {loadavg()})")
    wl = BUILTIN_WORKLOADS["mixed"]
    sim = {"hardware": "h200-sxm", "model": "llama-3.1-8b", "workload": wl, "slo": SIM_SLO,
           "num_requests": args.sim_requests, "seed": args.seed}
    caps: dict[str, float] = {}
    for policy in args.policies:
        caps[policy] = capacity_search(lambda rate, p=policy: sim_report(policy=p, rate=rate, **sim),
                                       lo=args.sim_lo, target=0.9)
        print(f"capacity {policy:8s}: {caps[policy]:6.2f} req/s (>= 90% of requests meet every target of their class)")
    if "fcfs" in caps and "slo" in caps:
        print(f"slo capacity / fcfs capacity = {caps['slo'] / caps['fcfs']:.2f}x (target >= 1.5x)")
    rate = caps.get("fcfs", args.sim_lo)
    print(f"-- every policy at fcfs's capacity, {rate:.2f} req/s:")
    reports = {p: sim_report(policy=p, rate=rate, **sim) for p in args.policies}
    print(class_table(reports))
    if "slo" in caps:
        rate = caps["slo"]
        print(f"-- every policy at slo's capacity, {rate:.2f} req/s:")
        print(class_table({p: sim_report(policy=p, rate=rate, **sim) for p in args.policies}))


def part_real(args: argparse.Namespace) -> list[str]:
    from slo_real import calibrate_targets, real_reports, sim_for

    targets, wl = calibrate_targets(args)
    print(f"-- real engine, targets by the rule (TTFT 3x unloaded median prompt, ITL 2x unloaded batch-8 "
          f"step, batch e2e 3x unloaded): {' '.join(targets)}  (load {loadavg()})")
    sim = {"hardware": "cpu-local", "model": "smollm2-135m", "workload": wl, "slo": targets,
           "num_requests": args.real_requests, "seed": args.seed, "max_model_len": args.max_model_len,
           "cost_model": getattr(args, "sim_cost_model", None)}
    sim_cap = capacity_search(lambda r: sim_report(policy="fcfs", rate=r, **sim), lo=0.25, target=0.75, iters=5)
    rates = [round(sim_cap * f, 3) for f in args.rate_factors]
    print(f"simulated fcfs rate for 75% attainment on cpu-local: {sim_cap:.3f} req/s -> real rates {rates}")
    for rate in rates:
        measured = real_reports(args, targets, rate, wl)
        specs = measured.pop("specs")
        for policy in ("fcfs", "slo"):
            predicted = sim_for(args, specs, policy, targets).summary["overall"]["slo_attainment"]  # type: ignore[arg-type]
            runs = measured[policy]
            att = [r.summary["overall"]["slo_attainment"] for r in runs]
            good = [r.summary["overall"]["goodput_req_s"] for r in runs]
            print(f"rate {rate:.3f} {policy:5s}: attainment {fmt_list(att, 100, '%')}, goodput "
                  f"{fmt_list(good, 1, ' req/s')}, simulated attainment {predicted * 100:.0f}%  "
                  f"({args.real_requests} requests x {len(runs)} repeats; load {loadavg()})")
        f_good = statistics.mean(r.summary["overall"]["goodput_req_s"] for r in measured["fcfs"])
        s_good = statistics.mean(r.summary["overall"]["goodput_req_s"] for r in measured["slo"])
        print(f"rate {rate:.3f}: slo goodput / fcfs goodput = {s_good / max(f_good, 1e-9):.2f}x (mean of repeats)")
        print(class_table({p: measured[p][0] for p in ("fcfs", "slo")}))
    return targets


def part_long(args: argparse.Namespace, targets: list[str] | None) -> None:
    from slo_real import calibrate_targets, long_prompt_case

    long_prompt_case(args, targets or calibrate_targets(args)[0])


def fmt_list(values: list[Any], scale: float, unit: str) -> str:
    return "/".join(f"{(v or 0) * scale:.2f}" if scale == 1 else f"{(v or 0) * scale:.0f}" for v in values) + unit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="sim,real,long", help="comma list of sim, real, long")
    p.add_argument("--policies", default=",".join(POLICIES), help="sim: policies to compare")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sim-requests", type=int, default=600, help="sim: requests per simulated rate")
    p.add_argument("--sim-lo", type=float, default=2.0, help="sim: a rate every policy sustains")
    p.add_argument("--real-requests", type=int, default=60, help="real: requests per run")
    p.add_argument("--repeats", type=int, default=2, help="real: runs of each policy per rate (interleaved)")
    p.add_argument("--rate-factors", default="1.0,1.3", help="real: rates as multiples of the simulated "
                                                             "fcfs 75%%-attainment rate")
    p.add_argument("--num-threads", type=int, default=1, help="real: torch threads (the calibration's)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--long-chats", type=int, default=8, help="long: concurrent short chats")
    p.add_argument("--long-prompts", type=int, default=3, help="long: long prompts arriving among them")
    args = p.parse_args(argv)
    args.policies = [x for x in args.policies.split(",") if x]
    args.rate_factors = [float(x) for x in args.rate_factors.split(",") if x]
    print(f"pacer slo_scheduling benchmark; cpus {os.cpu_count()}, load average {loadavg()}")
    parts = {x.strip() for x in args.parts.split(",")}
    if "sim" in parts:
        part_sim(args)
    targets = part_real(args) if "real" in parts else None
    if "long" in parts:
        part_long(args, targets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["main", "attainment_row"]
