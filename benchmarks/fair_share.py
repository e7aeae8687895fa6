"""Evidence for fair share between tenants (issue 29): fcfs, lpm, fair and lpm with a deficit
bound side by side, simulated (H200 x llama-3.1-8b) and on the real engine (default model, CPU).

- **two tenants, 10x load (light under its share)**: the light tenant's TTFT p50 under each
  policy against running alone (target under fair: <= 1.5x).
- **two tenants, 10x load, both backlogged (a burst)**: service split while both are
  backlogged (until the first tenant's last request finishes): target within 10% of 50/50,
  Jain >= 0.95 under fair.
- **prefix-heavy, three tenants**: cache hit rate and throughput of lpm+bound against lpm's
  (target >= 90%), Jain over the backlog; plain fair beside it (the locality it loses).
- **weighted 2:1**: equal offered load, weights 2:1: the split (target within 10% of 2:1).
- **real engine**: the burst case with a handful of requests; the policies' order by Jain
  beside the simulator's on the same trace.

    PYTHONPATH=src .venv/bin/python benchmarks/fair_share.py [--parts sim,real] [--num-threads 1]

Numbers depend on the machine and its load (printed beside them); nothing here asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pacer.config import EngineConfig  # noqa: E402
from pacer.perf.profiles import get_hardware, get_model  # noqa: E402
from pacer.sim.simulator import build_sim_engine, simulate  # noqa: E402
from pacer.workload.arrivals import make_arrivals  # noqa: E402
from pacer.workload.fairness import service_jain, tenant_rows  # noqa: E402
from pacer.workload.generator import generate_requests
from pacer.workload.report import RequestRecord  # noqa: E402
from pacer.workload.spec import BUILTIN_WORKLOADS, LengthDist, Workload  # noqa: E402
from pacer.workload.spec import ClassSpec as Cls  # noqa: E402

SIM_SEQS = 16      # seats of the simulated engine: a small batch keeps the backlog in the queue
BOUND = 20_000.0   # cost units a tenant may run ahead under lpm+bound (about 15 requests' prompts)
PREFIX_DOCS, PREFIX_BLOCKS, PREFIX_BURST, PREFIX_BOUND = 16, 2000, 120, 4000.0   # the prefix-heavy case


def loadavg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def cpu_flags() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "?"
    return ",".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f" {f}" in flags) or "none"


def sim_run(policy: str, specs: list[Any], bound: float = BOUND, **engine: Any) -> tuple[list[RequestRecord], float]:
    kwargs: dict[str, Any] = {"scheduling_policy": "lpm" if policy == "lpm+bound" else policy,
                              "max_num_seqs": SIM_SEQS, **engine}
    if policy == "lpm+bound":
        kwargs["fair_deficit_bound"] = bound
    eng, ex, clock = build_sim_engine(EngineConfig.from_kwargs(**kwargs), get_hardware("h200-sxm"),
                                      get_model("llama-3.1-8b"), keep_records=False)
    res = simulate(eng, ex, clock, specs)
    return res.records, res.sim_duration_s


def backlog_end(records: list[RequestRecord]) -> float:
    """When the first tenant's last request finished: the end of the window all are backlogged."""
    last: dict[str, float] = {}
    for r in records:
        last[r.tenant] = max(last.get(r.tenant, 0.0), r.finish_time or 0.0)
    return min(last.values())


def split_line(policy: str, records: list[RequestRecord], weights: dict[str, float] | None = None) -> str:
    rows = tenant_rows(records, until=backlog_end(records))
    shares = " ".join(f"{r.tenant}={r.share:.1%}" for r in rows)
    return f"{policy:10s} service over the backlog {shares}  Jain {service_jain(rows, weights):.3f}"


def hit_rate(records: list[RequestRecord]) -> float:
    return sum(r.cached_tokens for r in records) / max(1, sum(r.prompt_tokens for r in records))


def burst(wl: Workload, n: int, seed: int) -> list[Any]:
    return generate_requests(wl, make_arrivals(10_000.0, 1.0, None), seed=seed, num_requests=n)


def part_sim(args: argparse.Namespace) -> None:
    policies = ("fcfs", "lpm", "fair", "lpm+bound")
    print(f"== simulated h200-sxm x llama-3.1-8b  (load {loadavg()}, cpu {cpu_flags()})")
    two = BUILTIN_WORKLOADS["two-tenants"]
    specs = generate_requests(two, make_arrivals(args.rate, 1.0, None), seed=args.seed, num_requests=args.n)
    alone = [s for s in specs if s.tenant == "light"]
    light_alone = tenant_rows(sim_run("fcfs", alone)[0])[0].ttft_p50 or 0.0
    print(f"-- two tenants, heavy 10x light, {args.rate:.0f} req/s offered, {len(specs)} requests; "
          f"light alone TTFT p50 {light_alone * 1000:.0f} ms")
    for p in policies:
        recs, dur = sim_run(p, specs)
        light = next(r for r in tenant_rows(recs) if r.tenant == "light")
        print(f"{p:10s} light TTFT p50 {(light.ttft_p50 or 0) * 1000:8.0f} ms = "
              f"{(light.ttft_p50 or 0) / max(light_alone, 1e-9):6.2f}x alone (target under fair <= 1.5x); "
              f"p99 {(light.ttft_p99 or 0) * 1000:.0f} ms")
    specs = burst(two, args.n, args.seed)
    print(f"-- two tenants, heavy 10x light, all {len(specs)} requests at once (both backlogged):")
    order_sim = {}
    for p in policies:
        recs, _ = sim_run(p, specs)
        order_sim[p] = service_jain(tenant_rows(recs, until=backlog_end(recs)))
        print(split_line(p, recs) + ("  (target 50/50 within 10%, Jain >= 0.95)" if p == "fair" else ""))
    prefix_heavy(args)
    weighted = Workload("weighted", tuple(Cls(t, LengthDist(512, 0.5), LengthDist(64, 0.5), tenant=t)
                                          for t in ("gold", "free")))
    specs = burst(weighted, args.n, args.seed)
    w = {"gold": 2.0, "free": 1.0}
    recs, _ = sim_run("fair", specs, fair_tenant_weights=w)
    rows = {r.tenant: r for r in tenant_rows(recs, until=backlog_end(recs))}
    print(f"-- weighted gold:free = 2:1, equal offered load, burst of {len(specs)}: fair splits "
          f"{rows['gold'].share:.1%}/{rows['free'].share:.1%} = {rows['gold'].service / rows['free'].service:.2f}:1 "
          f"(target 2:1 within 10%)")
    args.order_sim = order_sim


def doc_tenants(docs: int) -> Workload:
    """A heavy tenant (10x) whose prompts extend one of `docs` long shared documents, and two light
    tenants with unshared prompts: KV holds only some documents, so the order of service decides
    how many prompts find theirs cached."""
    heavy = tuple(Cls(f"heavy-doc{i}", LengthDist(128, 0.5), LengthDist(32, 0.5), weight=10.0 / docs,
                      shared_prefix_len=2048, tenant="heavy") for i in range(docs))
    return Workload("doc-tenants", heavy + tuple(Cls(t, LengthDist(512, 0.5), LengthDist(32, 0.5), tenant=t)
                                                 for t in ("light-a", "light-b")))


# (label, policy, bound, engine kwargs): lpm+bound with and without queue-aware eviction (a
# waiting request's prefix look-up counts as a use, so LRU keeps what the queue will read)
PREFIX_RUNS: tuple[tuple[str, str, float, dict[str, Any]], ...] = (
    ("lpm", "lpm", PREFIX_BOUND, {}),
    ("lpm+bound", "lpm+bound", PREFIX_BOUND, {}),
    ("lpm+bound/lru", "lpm+bound", PREFIX_BOUND, {"queue_aware_eviction": False}),
    (f"lpm+bound{PREFIX_BOUND * 4:.0f}", "lpm+bound", PREFIX_BOUND * 4, {}),
    ("fair", "fair", PREFIX_BOUND, {}),
    ("fcfs", "fcfs", PREFIX_BOUND, {}),
)


def prefix_heavy(args: argparse.Namespace) -> None:
    """lpm, lpm+bound, fair and fcfs over bursts that fit lpm's queue limit, several seeds."""
    wl = doc_tenants(PREFIX_DOCS)
    print(f"-- prefix-heavy: heavy tenant (10x, {PREFIX_DOCS} shared 2048-token documents) + 2 light, bursts of "
          f"{PREFIX_BURST} requests, KV {PREFIX_BLOCKS} blocks, seeds 0..{args.prefix_seeds - 1}, bound "
          f"{PREFIX_BOUND:.0f}; means over seeds (hit rate and output tok/s also as a share of lpm's):")
    sums: dict[str, list[float]] = {}
    for seed in range(args.prefix_seeds):
        specs = burst(wl, PREFIX_BURST, seed)
        for p, policy, bound, extra in PREFIX_RUNS:
            recs, dur = sim_run(policy, specs, num_kv_blocks=PREFIX_BLOCKS, bound=bound, **extra)
            heavy = [r for r in recs if r.tenant == "heavy"]
            row = [hit_rate(recs), hit_rate(heavy), sum(r.output_tokens for r in recs) / dur,
                   service_jain(tenant_rows(recs, until=backlog_end(recs)))]
            acc = sums.setdefault(p, [0.0] * 4)
            for k, v in enumerate(row):
                acc[k] += v / args.prefix_seeds
    base = sums["lpm"]
    for p, (hr, hh, tput, jain) in sums.items():
        print(f"{p:14s} hit rate {hr:6.1%} ({hr / base[0]:.0%} of lpm)  heavy's own {hh:6.1%} ({hh / base[1]:.0%})  "
              f"output {tput:6.0f} tok/s ({tput / base[2]:.0%} of lpm)  Jain over the backlog {jain:.3f}")


def part_real(args: argparse.Namespace) -> None:
    import torch

    from pacer.workload.runner import run_inprocess

    torch.set_num_threads(args.num_threads)
    two = BUILTIN_WORKLOADS["two-tenants"]
    small = Workload("two-small", tuple(dataclasses.replace(c, prompt_len=LengthDist(96, 0.3),
                                                             output_len=LengthDist(8)) for c in two.classes))
    specs = burst(small, args.real_n, args.seed)
    print(f"== real engine, default model, {args.num_threads} torch thread(s), burst of {len(specs)} requests, "
          f"heavy 10x light  (load {loadavg()}, cpu {cpu_flags()})")
    from pacer.llm import LLM

    real: dict[str, float] = {}
    for p in ("fcfs", "lpm", "fair"):
        llm = LLM(scheduling_policy=p, max_num_seqs=4, max_num_batched_tokens=256)
        t = time.perf_counter()
        recs, _, _ = run_inprocess(specs, llm.engine)
        llm.close()
        rows = tenant_rows(recs, until=backlog_end(recs))
        real[p] = service_jain(rows)
        print(split_line(p, recs) + f"  ({time.perf_counter() - t:.0f} s)")
    sim: dict[str, float] = {}
    for p in ("fcfs", "lpm", "fair"):
        recs, _ = sim_run(p, specs, max_num_seqs=4, max_num_batched_tokens=256)
        sim[p] = service_jain(tenant_rows(recs, until=backlog_end(recs)))
    order = lambda d: " > ".join(sorted(d, key=lambda k: -d[k]))  # noqa: E731
    print(f"policies by Jain, real:      {order(real)}  ({', '.join(f'{k} {v:.3f}' for k, v in real.items())})")
    print(f"policies by Jain, simulated: {order(sim)}  ({', '.join(f'{k} {v:.3f}' for k, v in sim.items())})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="sim,real", help="sim, real (comma-separated).")
    ap.add_argument("--n", type=int, default=1100, help="Requests per simulated run.")
    ap.add_argument("--rate", type=float, default=80.0, help="Offered req/s of the two-tenant TTFT case.")
    ap.add_argument("--prefix-seeds", type=int, default=5, help="Bursts (seeds) of the prefix-heavy case.")
    ap.add_argument("--real-n", type=int, default=22, help="Requests of the real-engine run.")
    ap.add_argument("--num-threads", type=int, default=1, help="torch threads of the real engine.")
    ap.add_argument("--seed", type=int, default=0, help="Trace seed.")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if "sim" in parts:
        part_sim(args)
    if "real" in parts:
        part_real(args)


if __name__ == "__main__":
    main()
