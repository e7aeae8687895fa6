"""The simulator: arrivals on a virtual clock, the real Engine with a SimExecutor.

Requests are fed by the one driver (`pacer.workload.drive`) that `pacer bench --engine
inprocess` also runs: a request arrives when its client hands it over, the engine sees it at
the next step boundary, and when the engine is idle the virtual clock jumps to the next
arrival. Scheduling, KV bookkeeping, preemption and stop rules are the real `Engine`,
`Scheduler` and `KVCacheManager`: there is no simulator copy of them. Deterministic:
arrivals are ordered by (time, index), and nothing reads the wall clock except the speed
report. What the reports say of the engine comes from its `StepStats` and `snapshot()`.
"""

from __future__ import annotations

import functools
import gc
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pacer.clock import VirtualClock
from pacer.config import EngineConfig
from pacer.engine import Engine, StepStats
from pacer.perf.cost_model import CostModel, StepCost, make_cost_model
from pacer.perf.profiles import HardwareProfile, ModelProfile, kv_capacity_blocks, weight_dtype_for
from pacer.perf.step_model import SchedulerCostModel
from pacer.request import SamplingParams, StructuredOutputsParams
from pacer.sched.reasoning import ThinkTags
from pacer.sim.executor import SimExecutor
from pacer.sim.noise import StepNoise
from pacer.sim.structured import DEFAULT_STRUCTURED_COST, SimStructured, StructuredCost
from pacer.sim.trace_requests import request_spans
from pacer.workload.drive import DriveSpec, Handoff, drive
from pacer.workload.report import RequestRecord

__all__ = ["SimRequest", "TraceRequest", "SimResult", "build_sim_engine", "simulate", "resolve_dtype",
           "write_chrome_trace", "utilisation_summary"]

TraceRequest = DriveSpec   # what the simulator needs of a request; `pacer.workload.generator.RequestSpec` is one


@dataclass(frozen=True, slots=True)
class SimRequest:
    """A minimal TraceRequest: when it arrives, its prompt, and how many tokens it generates."""

    request_id: str
    arrival_time: float | None
    prompt_token_ids: Sequence[int]
    output_tokens: int
    request_class: str = "default"
    priority: int = 0
    tenant: str = "default"
    session: str | None = None
    structured_outputs: StructuredOutputsParams | None = None   # priced by pacer.sim.structured
    thinking_token_budget: int | None = None   # the scheduler predicts its length from it, as served
    segments: tuple[tuple[int, int], ...] = ()   # prompt spans whose KV may be reused (segment reuse)


@dataclass(slots=True)
class SimResult:
    records: list[RequestRecord]     # pacer bench's per-request records, times from the run's start
    sim_duration_s: float            # virtual seconds from the first arrival to the last finish
    wall_s: float
    num_steps: int
    busy_s: float                    # virtual seconds the device spent in steps
    num_preemptions: int
    num_kv_blocks: int
    cost_model: str
    executor: SimExecutor
    steps: list[StepStats] = field(default_factory=list)   # the engine's own, one per step (keep_records)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.sim_duration_s / self.wall_s if self.wall_s > 0 else float("inf")

    def stats(self) -> dict[str, Any]:
        return {"sim_duration_s": self.sim_duration_s, "wall_s": self.wall_s, "num_steps": self.num_steps,
                "busy_s": self.busy_s, "num_preemptions": self.num_preemptions, "kv_blocks": self.num_kv_blocks,
                "cost_model": self.cost_model}


def resolve_dtype(dtype: str, hw: HardwareProfile) -> str:
    return hw.default_dtype if dtype == "auto" else dtype


def build_sim_engine(config: EngineConfig, hw: HardwareProfile, model: ModelProfile, *, tp: int = 1,
                     gpu_memory_utilization: float = 0.9, cost_model: CostModel | None = None,
                     keep_records: bool = True, structured_cost: StructuredCost = DEFAULT_STRUCTURED_COST,
                     step_noise: StepNoise | None = None) -> tuple[Engine, SimExecutor, VirtualClock]:
    """The real Engine on a VirtualClock with a SimExecutor; KV sized as the real engine would.
    Structured outputs are priced by `structured_cost` (pacer.sim.structured). With `step_noise`
    the steps scatter around the model (pacer.sim.noise) and the scheduler's predictor refits
    from the simulated steps online, as the real engine's does from its measured ones."""
    dtype = resolve_dtype(config.model.dtype, hw)
    cache = config.cache
    kv_dtype = cache.kv_cache_dtype
    if hw.is_cpu or cache.num_kv_blocks is not None or cache.kv_cache_memory is not None:
        num_blocks = cache.resolve_num_blocks(model.kv_bytes_per_token(dtype, tp, kv_dtype))
    else:
        num_blocks = kv_capacity_blocks(hw, model, dtype, tp, cache.block_size, gpu_memory_utilization, kv_dtype)
    clock = VirtualClock()
    weight_dtype = weight_dtype_for(config.model.quantization)
    cm = cost_model or make_cost_model(hw, model, dtype, tp, cache.block_size, kv_dtype, weight_dtype)
    spec = config.scheduler.speculative()
    executor = SimExecutor(cm, clock, keep_records=keep_records,
                           kv_block_bytes=model.kv_bytes_per_token(dtype, tp, kv_dtype) * cache.block_size,
                           acceptance_rate=None if spec is None else spec.acceptance_rate, seed=config.model.seed,
                           structured_cost=structured_cost, step_noise=step_noise)
    refit = step_noise is not None and step_noise.cv > 0
    engine = Engine(config, executor, tokenizer=None, num_kv_blocks=num_blocks,
                    model_max_len=model.max_model_len, eos_token_ids=(), clock=clock,
                    vocab_size=model.vocab_size, cost_model=SchedulerCostModel(cm, refit=refit),
                    refit_cost_model=refit)
    engine.install_structured_outputs(SimStructured(clock, structured_cost, executor))
    engine.finished_outputs_only = True   # its drivers read finished outputs only (records)
    # no tokenizer: think tags past the vocabulary, which no simulated token is, so a request's
    # thinking_token_budget is accepted and shapes the scheduler's predictions as when served;
    # only budgeted requests think (a grammar without a budget starts at once, as before)
    engine.install_think_tags(ThinkTags((model.vocab_size,), (model.vocab_size + 1,)), gate_grammars=False)
    return engine, executor, clock


def simulate(engine: Engine, executor: SimExecutor, clock: VirtualClock, requests: Sequence[TraceRequest],
             concurrency: int | None = None) -> SimResult:
    """Run the trace to completion and return one record per request, in trace order.

    Open loop: each request arrives at its `arrival_time`; `concurrency` caps requests in
    flight (a request is handed over when a slot frees, and that is its arrival, as a client
    measures it). Requests with `arrival_time` None (closed loop) are all ready at the start.
    """
    if concurrency is None and any(r.arrival_time is None for r in requests):
        raise ValueError("requests without an arrival_time (closed loop) need a concurrency")
    steps: list[StepStats] = []
    if executor.keep_records:
        engine.stats_listeners.append(steps.append)
    t0 = clock.now()
    wall0 = time.perf_counter()
    # no cycle collection while it runs: a run leaves no cyclic garbage (reference counting frees
    # everything it drops; tests/sim/test_sim_no_cycles.py holds it), and the collections found
    # nothing while traversing every live request's token lists and the radix tree (~5-10% of a
    # run even with the young generation's threshold raised to 50,000)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        done = {rec.request_id: rec for rec in drive(engine, requests, _prepare, concurrency=concurrency, t0=t0)}
    finally:
        if was_enabled:
            gc.enable()
        if executor.keep_records:
            engine.stats_listeners.remove(steps.append)
    wall = time.perf_counter() - wall0
    snap = engine.snapshot()
    return SimResult(records=[done[r.request_id] for r in requests if r.request_id in done],
                     sim_duration_s=clock.now() - t0, wall_s=wall, num_steps=executor.num_steps,
                     busy_s=executor.busy_s, num_preemptions=snap.num_preemptions, num_kv_blocks=snap.num_blocks,
                     cost_model=executor.cost_model.name, executor=executor, steps=steps, extra={"t0": t0})


def _prepare(r: TraceRequest) -> Handoff:
    """Outputs are forced to the trace's lengths (a simulator samples no real tokens); a
    request's `structured_outputs`, when it has one, is kept (its compile and masks are priced), and
    so is its `thinking_token_budget` (the scheduler's predicted length) and its `segments` (segment
    reuse: the copies are priced, the recomputed tokens are prefill)."""
    structured = getattr(r, "structured_outputs", None)
    budget = getattr(r, "thinking_token_budget", None)
    segments = getattr(r, "segments", ())
    if structured is None:   # the params are frozen: requests of one length share them, checked once
        return Handoff(r.prompt_token_ids, _plain_params(r.output_tokens, budget), segments)
    return Handoff(r.prompt_token_ids, SamplingParams(max_tokens=r.output_tokens, ignore_eos=True, temperature=0.0,
                                                      structured_outputs=structured, thinking_token_budget=budget),
                   segments)


@functools.lru_cache(maxsize=4096)
def _plain_params(max_tokens: int, thinking_token_budget: int | None) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                          thinking_token_budget=thinking_token_budget)


def utilisation_summary(steps: Sequence[StepStats], costs: Mapping[int, StepCost]) -> list[str]:
    """Time-weighted compute and bandwidth utilisation by step kind (what GPU counters blur)."""
    pairs = [(s, costs[s.step_id]) for s in steps if s.step_id in costs]
    total = sum(c.time_s for _, c in pairs)
    if total <= 0:
        return []
    lines = []
    for kind in ("prefill", "decode", "mixed"):
        cs = [c for s, c in pairs if s.kind == kind]
        t = sum(c.time_s for c in cs)
        if not cs or t <= 0:
            continue
        cu = sum(c.compute_util * c.time_s for c in cs) / t
        bu = sum(c.bandwidth_util * c.time_s for c in cs) / t
        lines.append(f"{kind:8s} steps: {len(cs):7d}, {t / total * 100:5.1f}% of device time, "
                     f"est. compute {cu * 100:5.1f}% / bandwidth {bu * 100:5.1f}% of peak "
                     f"({'compute' if cu >= bu else 'memory'}-bound)")
    return lines


def write_chrome_trace(result: SimResult, path: str | Path) -> None:
    """One complete event per simulated step (chrome://tracing, Perfetto), with its token budget
    and why; then each request's wait for its first token (`request_spans`)."""
    events = []
    costs = result.executor.costs
    for s in result.steps:
        c = costs.get(s.step_id)
        if c is None:
            continue
        events.append({
            "name": s.kind,
            "ph": "X", "pid": 0, "tid": 0, "ts": (s.time - s.forward_s) * 1e6, "dur": c.time_s * 1e6,
            "args": {"step": s.step_id, "batch": s.batch_size, "prefill_tokens": s.num_prefill_tokens,
                     "decode_tokens": s.num_decode_tokens, "preempted": s.num_preempted,
                     "token_budget": s.token_budget, "budget_reason": s.budget_reason,
                     "compute_util": round(c.compute_util, 4), "bandwidth_util": round(c.bandwidth_util, 4),
                     "bound": c.bound},
        })
    events += request_spans(result.records, float(result.extra.get("t0", 0.0)))
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
