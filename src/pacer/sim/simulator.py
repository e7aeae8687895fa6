"""Simulator event loop: arrivals on a virtual clock, the real Engine with a SimExecutor.

The loop is the same one a serving front end runs: before every engine step, the requests
whose arrival time has passed are added (stamped with their own arrival time, so a request
that arrived in the middle of a step waits for the next one, as it would on real hardware);
when the engine is idle the clock jumps to the next arrival. Scheduling, KV bookkeeping,
preemption and stop rules are the real `Engine`, `Scheduler` and `KVCacheManager`: there is
no simulator copy of them. Deterministic: arrivals are ordered by (time, index), and nothing
reads the wall clock except the speed report.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pacer.bench.report import STATUS_OK, STATUS_REJECTED, RequestRecord
from pacer.clock import VirtualClock
from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.executor.sim_executor import SimExecutor, SimStepRecord
from pacer.request import SamplingParams
from pacer.sim.cost_model import CostModel, make_cost_model
from pacer.sim.profiles import HardwareProfile, ModelProfile, kv_capacity_blocks
from pacer.sim.step_model import SchedulerCostModel

__all__ = ["SimRequest", "TraceRequest", "SimResult", "build_sim_engine", "simulate", "resolve_dtype",
           "write_chrome_trace", "utilisation_summary"]


class TraceRequest(Protocol):
    """What the simulator needs of a request; `pacer.bench.workloads.RequestSpec` is one."""

    @property
    def request_id(self) -> str: ...
    @property
    def request_class(self) -> str: ...
    @property
    def prompt_token_ids(self) -> Sequence[int]: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def arrival_time(self) -> float | None: ...   # None: closed loop (sent when a slot frees)
    @property
    def priority(self) -> int: ...
    @property
    def tenant(self) -> str: ...


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
                     keep_records: bool = True) -> tuple[Engine, SimExecutor, VirtualClock]:
    """The real Engine on a VirtualClock with a SimExecutor; KV sized as the real engine would."""
    dtype = resolve_dtype(config.model.dtype, hw)
    cache = config.cache
    kv_dtype = cache.kv_cache_dtype
    if hw.is_cpu or cache.num_kv_blocks is not None or cache.kv_cache_memory is not None:
        num_blocks = cache.resolve_num_blocks(model.kv_bytes_per_token(dtype, tp, kv_dtype))
    else:
        num_blocks = kv_capacity_blocks(hw, model, dtype, tp, cache.block_size, gpu_memory_utilization, kv_dtype)
    clock = VirtualClock()
    cm = cost_model or make_cost_model(hw, model, dtype, tp, cache.block_size, kv_dtype)
    spec = config.scheduler.speculative()
    executor = SimExecutor(cm, clock, keep_records=keep_records,
                           kv_block_bytes=model.kv_bytes_per_token(dtype, tp, kv_dtype) * cache.block_size,
                           acceptance_rate=None if spec is None else spec.acceptance_rate, seed=config.model.seed)
    engine = Engine(config, executor, tokenizer=None, num_kv_blocks=num_blocks,
                    model_max_len=model.max_model_len, eos_token_ids=(), clock=clock,
                    vocab_size=model.vocab_size, cost_model=SchedulerCostModel(cm, refit=False),
                    refit_cost_model=False)
    return engine, executor, clock


def simulate(engine: Engine, executor: SimExecutor, clock: VirtualClock, requests: Sequence[TraceRequest],
             concurrency: int | None = None) -> SimResult:
    """Run the trace to completion and return one record per request, in trace order.

    Open loop: each request arrives at its `arrival_time`. `concurrency` caps requests in
    flight (a request is sent when a slot frees, and its arrival is the send time, as a client
    measures it); requests with `arrival_time` None (closed loop) are all ready at the start.
    """
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if concurrency is None and any(r.arrival_time is None for r in requests):
        raise ValueError("requests without an arrival_time (closed loop) need a concurrency")
    t0 = clock.now()
    ready = [t0 + (r.arrival_time or 0.0) for r in requests]
    pending: deque[int] = deque(sorted(range(len(requests)), key=lambda i: (ready[i], i)))
    backlog: deque[int] = deque()         # arrived, waiting for a concurrency slot
    index_of: dict[str, int] = {}
    records: list[RequestRecord | None] = [None] * len(requests)
    limit = concurrency or len(requests) or 1
    in_flight = 0
    idle_steps = 0
    wall0 = time.perf_counter()
    while pending or backlog or in_flight:
        now = clock.now()
        while pending and ready[pending[0]] <= now:
            backlog.append(pending.popleft())
        while backlog and in_flight < limit:
            i = backlog.popleft()
            index_of[_add(engine, requests[i], i, ready[i] if concurrency is None else now)] = i
            in_flight += 1
        if not in_flight:
            clock.set(ready[pending[0]])
            continue
        t_before = clock.now()
        for out in engine.step():
            if out.finished:
                i = index_of.pop(out.request_id)
                r = requests[i]
                records[i] = RequestRecord.from_metrics(
                    out.metrics, request_id=r.request_id, request_class=r.request_class, t0=t0,
                    tenant=r.tenant, priority=r.priority,
                    status=STATUS_REJECTED if out.metrics.shed else STATUS_OK)
                in_flight -= 1
        if clock.now() > t_before:
            idle_steps = 0
            continue
        idle_steps += 1            # nothing ran: only possible while requests are being admitted
        if idle_steps > 3:
            if not pending:
                raise RuntimeError(f"simulation stalled at t={clock.now():.3f}s with {in_flight} in flight")
            clock.set(max(clock.now(), ready[pending[0]]))
    wall = time.perf_counter() - wall0
    done = [r for r in records if r is not None]
    return SimResult(records=done, sim_duration_s=clock.now() - t0, wall_s=wall,
                     num_steps=executor.num_steps, busy_s=executor.busy_s,
                     num_preemptions=engine.scheduler.num_preemptions, num_kv_blocks=engine.kv.num_blocks,
                     cost_model=executor.cost_model.name, executor=executor)


def _add(engine: Engine, r: TraceRequest, index: int, arrival: float) -> str:
    params = SamplingParams(max_tokens=r.output_tokens, ignore_eos=True, temperature=0.0)
    return engine.add_request(r.prompt_token_ids, params, request_id=f"sim-{index}", priority=r.priority,
                              tenant=r.tenant, arrival_time=arrival, request_class=r.request_class)


def _kind(r: SimStepRecord) -> str:
    if r.num_prefill_tokens and r.num_decode_tokens:
        return "mixed"
    return "prefill" if r.num_prefill_tokens else "decode"


def utilisation_summary(records: Sequence[SimStepRecord]) -> list[str]:
    """Time-weighted compute and bandwidth utilisation by step kind (what GPU counters blur)."""
    total = sum(r.cost.time_s for r in records)
    if total <= 0:
        return []
    lines = []
    for kind in ("prefill", "decode", "mixed"):
        rs = [r for r in records if _kind(r) == kind]
        t = sum(r.cost.time_s for r in rs)
        if not rs or t <= 0:
            continue
        cu = sum(r.cost.compute_util * r.cost.time_s for r in rs) / t
        bu = sum(r.cost.bandwidth_util * r.cost.time_s for r in rs) / t
        lines.append(f"{kind:8s} steps: {len(rs):7d}, {t / total * 100:5.1f}% of device time, "
                     f"est. compute {cu * 100:5.1f}% / bandwidth {bu * 100:5.1f}% of peak "
                     f"({'compute' if cu >= bu else 'memory'}-bound)")
    return lines


def write_chrome_trace(result: SimResult, path: str | Path) -> None:
    """One complete event per simulated step (chrome://tracing, Perfetto)."""
    events = []
    for r in result.executor.records:
        c = r.cost
        events.append({
            "name": _kind(r),
            "ph": "X", "pid": 0, "tid": 0, "ts": r.start_s * 1e6, "dur": c.time_s * 1e6,
            "args": {"step": r.step_id, "batch": r.batch_size, "prefill_tokens": r.num_prefill_tokens,
                     "decode_tokens": r.num_decode_tokens, "preempted": r.num_preempted,
                    "token_budget": r.token_budget, "budget_reason": r.budget_reason,
                     "compute_util": round(c.compute_util, 4), "bandwidth_util": round(c.bandwidth_util, 4),
                     "bound": c.bound},
        })
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
