"""A source as a trace, and the one place `pacer diagnose --what-if` and `pacer tune` run a trace
through the simulator or the real engine (so a change of driver is one edit here).

Lengths come from the source; arrivals from its timestamps, or, where it has none, Poisson at
a rate matching its count over its span (the source's e2e sum when it has no times at all).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pacer.diagnose.records import Source
from pacer.workload.report import OVERALL, RequestRecord, SloSet, build_report
from pacer.workload.spec import RequestSpec

__all__ = ["Replay", "specs_from_source", "SimTarget", "run_real", "run_server", "fmt_ms"]


def specs_from_source(source: Source, *, tokenizer: Any = None, seed: int = 0,
                      max_model_len: int | None = None) -> tuple[list[RequestSpec], str]:
    """(specs, how arrivals were made) for replaying the source."""
    from pacer.workload.trace import specs_from_trace

    recs = source.records
    if source.has_times:
        times = [r.arrival or 0.0 for r in recs]
        how = "at the source's timestamps"
    else:
        span = sum(r.e2e for r in recs)
        rate = len(recs) / span if span > 0 else 1.0
        rng = random.Random(f"{seed}:replay")
        t, times = 0.0, []
        for _ in recs:
            times.append(t)
            t += rng.expovariate(rate)
        how = f"Poisson at {rate:.3g} req/s (the source has no timestamps: its count over its summed e2e)"
    rows: list[Mapping[str, Any]] = []
    for r, ts in zip(recs, times):
        prompt = r.prompt_tokens
        if max_model_len is not None:
            prompt = min(prompt, max_model_len - r.output_tokens - 1)
        rows.append({"timestamp": ts, "prompt_tokens": max(1, prompt), "output_tokens": max(1, r.output_tokens),
                     "class": r.request_class})
    return specs_from_trace(rows, tokenizer=tokenizer, seed=seed, source=source.name), how


@dataclass(slots=True)
class Replay:
    """One replayed configuration: its records and the report's overall summary."""

    label: str
    records: list[RequestRecord]
    summary: dict[str, Any]
    num_kv_blocks: int = 0
    block_size: int = 16

    @property
    def attainment(self) -> float:
        return float(self.summary.get("slo_attainment") or 0.0)


class SimTarget:
    """Runs traces on simulated hardware with the real scheduler (`pacer.sim`)."""

    def __init__(self, hardware: str = "cpu-local", model: str | None = None, tp: int = 1,
                 gpu_memory_utilization: float = 0.9) -> None:
        from pacer.perf.profiles import get_hardware, get_model

        self.hw, self.model = get_hardware(hardware), get_model(model)
        self.tp, self.gpu_memory_utilization = tp, gpu_memory_utilization
        self.cost_model: Any = None   # None: the hardware's calibration; set by a refit on measured steps

    def kv_tokens(self, kwargs: dict[str, Any]) -> int:
        engine, _, _ = self._build(kwargs)
        return engine.snapshot().num_blocks * engine.config.cache.block_size

    def _build(self, kwargs: dict[str, Any]) -> Any:
        from pacer.config import EngineConfig
        from pacer.sim.simulator import build_sim_engine

        cfg = EngineConfig.from_kwargs(**kwargs)
        return build_sim_engine(cfg, self.hw, self.model, tp=self.tp, cost_model=self.cost_model,
                                gpu_memory_utilization=self.gpu_memory_utilization, keep_records=False)

    def max_model_len(self, kwargs: dict[str, Any]) -> int:
        engine, _, _ = self._build(kwargs)
        return int(engine.max_model_len)

    def run(self, label: str, kwargs: dict[str, Any], specs: Sequence[RequestSpec], slo: SloSet | None = None,
            replicas: int = 1) -> Replay:
        """Simulate `specs` (with `replicas`, replica 0 of a round-robin split: every k-th request)."""
        from pacer.sim.simulator import simulate

        if replicas > 1:
            specs = list(specs)[::replicas]
        engine, executor, clock = self._build(kwargs)
        result = simulate(engine, executor, clock, specs)
        summary = build_report(result.records, slo=slo).summary[OVERALL]
        return Replay(label, result.records, dict(summary), engine.snapshot().num_blocks, engine.config.cache.block_size)


def run_real(label: str, engine: Any, specs: Sequence[RequestSpec], slo: SloSet | None = None,
             recorder: Any = None) -> Replay:
    """Run `specs` on a real in-process engine (open loop at their arrival times); `recorder`
    (a `pacer.sim.validate.StepRecorder`) listens to every step when given."""
    from pacer.workload.runner import run_inprocess

    if recorder is not None:
        engine.schedule_listeners.append(recorder.on_schedule)
        engine.stats_listeners.append(recorder.on_stats)
    try:
        records, _, _ = run_inprocess(specs, engine)
    finally:
        if recorder is not None:
            engine.schedule_listeners.remove(recorder.on_schedule)
            engine.stats_listeners.remove(recorder.on_stats)
    summary = build_report(records, slo=slo).summary[OVERALL]
    return Replay(label, records, dict(summary), engine.snapshot().num_blocks, engine.config.cache.block_size)


def fmt_ms(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v * 1000:.0f} ms"


def run_server(label: str, base_url: str, specs: Sequence[RequestSpec], slo: SloSet | None = None,
               model: str | None = None) -> Replay:
    """Run `specs` against an OpenAI-compatible server (as `pacer bench --base-url` does)."""
    import asyncio

    from pacer.workload.client import OpenAIClient
    from pacer.workload.runner import run_http

    async def go() -> list[RequestRecord]:
        async with OpenAIClient(base_url, model=model) as client:
            await client.resolve_model()
            records, _ = await run_http(specs, client)
            return records

    records = asyncio.run(go())
    return Replay(label, records, dict(build_report(records, slo=slo).summary[OVERALL]))
