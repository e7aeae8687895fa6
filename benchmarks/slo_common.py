"""Helpers of benchmarks/slo_scheduling.py: simulated runs, the capacity search, the tables."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from pacer.config import EngineConfig
from pacer.config.slo import parse_slo
from pacer.perf.profiles import get_hardware, get_model
from pacer.sim.simulator import build_sim_engine, simulate
from pacer.workload.arrivals import make_arrivals
from pacer.workload.generator import generate_requests
from pacer.workload.report import OVERALL, Report, build_report
from pacer.workload.spec import Workload

POLICIES = ("fcfs", "priority", "sjf", "lpm", "slo")
_CACHE: dict[tuple[Any, ...], Report] = {}


def loadavg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def sim_report(*, policy: str, rate: float, hardware: str, model: str, workload: Workload, slo: list[str],
               num_requests: int, seed: int, max_model_len: int | None = None, cost_model: Any = None,
               **engine: Any) -> Report:
    """One simulated run of the seeded trace at `rate` under `policy` (memoised); `cost_model`
    replaces the hardware profile's (e.g. the real engine's corrected predictor)."""
    key = (policy, round(rate, 6), hardware, model, workload.name, tuple(slo), num_requests, seed, max_model_len,
           id(cost_model), tuple(sorted(engine.items())))
    if key in _CACHE:
        return _CACHE[key]
    hw, mp = get_hardware(hardware), get_model(model)
    kwargs: dict[str, Any] = {"scheduling_policy": policy, "slo": tuple(slo), **engine}
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    eng, ex, clock = build_sim_engine(EngineConfig.from_kwargs(**kwargs), hw, mp, keep_records=False,
                                      cost_model=cost_model)
    specs = generate_requests(workload, make_arrivals(rate, 1.0, None), seed=seed, num_requests=num_requests,
                              max_model_len=eng.max_model_len)
    result = simulate(eng, ex, clock, specs)
    report = build_report(result.records, slo=parse_slo(slo))
    _CACHE[key] = report
    return report


def sim_specs_report(*, policy: str, specs: list[Any], hardware: str, model: str, slo: list[str],
                     cost_model: Any = None, **engine: Any) -> Report:
    """The simulator's report for exactly these request specs (the real run's trace)."""
    kwargs: dict[str, Any] = {"scheduling_policy": policy, "slo": tuple(slo), **engine}
    eng, ex, clock = build_sim_engine(EngineConfig.from_kwargs(**kwargs), get_hardware(hardware), get_model(model),
                                      keep_records=False, cost_model=cost_model)
    return build_report(simulate(eng, ex, clock, specs).records, slo=parse_slo(slo))


def attainment(report: Report) -> float:
    return float(report.summary[OVERALL]["slo_attainment"] or 0.0)


def capacity_search(run: Callable[[float], Report], lo: float, target: float = 0.9, iters: int = 7) -> float:
    """Highest rate with attainment >= target: grow x2 from `lo` until it fails, then bisect."""
    if attainment(run(lo)) < target:
        while lo > 1e-3 and attainment(run(lo)) < target:
            lo /= 2
        return lo
    hi = lo * 2
    while attainment(run(hi)) >= target:
        lo, hi = hi, hi * 2
    for _ in range(iters):
        mid = (lo + hi) / 2
        if attainment(run(mid)) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def attainment_row(name: str, s: Mapping[str, Any]) -> str:
    att = s.get("slo_attainment")
    return (f"{name:16s} {('-' if att is None else f'{att * 100:5.1f}%'):>7s} {s['goodput_req_s']:7.2f} "
            f"{_ms(s['ttft_p50']):>8s} {_ms(s['ttft_p99']):>8s} {_ms(s['itl_p99']):>8s} "
            f"{int(s.get('num_deprioritized', 0) or 0):5d} {int(s['num_rejected']):5d} {int(s['num_requests']):5d}")


def class_table(reports: Mapping[str, Report]) -> str:
    lines = [f"{'policy/class':16s} {'attain':>7s} {'goodput':>7s} {'ttft50ms':>8s} {'ttft99ms':>8s} "
             f"{'itl99ms':>8s} {'depri':>5s} {'shed':>5s} {'n':>5s}"]
    for policy, rep in reports.items():
        for cls in [*rep.classes, OVERALL]:
            lines.append(attainment_row(f"{policy}/{cls}", rep.summary[cls]))
    return "\n".join(lines)
