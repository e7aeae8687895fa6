"""Drives a stream of `RequestSpec`s against a backend and collects `RequestRecord`s.

Two drivers with the same contract (specs in, records and the run's start time out):
`run_http` (asyncio; open loop sends each request at its arrival time as its own task,
closed loop keeps `concurrency` workers busy) and `run_inprocess` (the one in-process driver,
`pacer.workload.drive`, on an `Engine`; timestamps are the engine's own, so there is no network
or client noise). Both stamp an arrival when the client hands the request over. Neither
knows about reports.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from pacer.request import SamplingParams
from pacer.workload.budget import BudgetTally
from pacer.workload.drive import Handoff, drive
from pacer.workload.report import RequestRecord
from pacer.workload.spec import RequestSpec

if TYPE_CHECKING:
    from pacer.engine import Engine, StepStats

__all__ = ["Sender", "run_http", "run_inprocess", "InprocessStats"]

OnDone = Callable[[RequestRecord], None]


class Sender(Protocol):
    async def send(self, spec: RequestSpec, t0: float) -> RequestRecord: ...


async def run_http(specs: Iterable[RequestSpec], sender: Sender, *, concurrency: int | None = None,
                   closed_loop: bool = False, duration: float | None = None,
                   on_done: OnDone | None = None) -> tuple[list[RequestRecord], float]:
    """Open loop: each spec is sent at `t0 + arrival_time` (at most `concurrency` in flight, if
    set). Closed loop: `concurrency` workers send back to back until the specs run out or
    `duration` has passed. Returns records in send order and `t0` (perf_counter seconds)."""
    t0 = time.perf_counter()
    it = iter(specs)
    if closed_loop:
        if concurrency is None:
            raise ValueError("closed loop needs a concurrency")
        return await _closed_loop(it, sender, t0, concurrency, duration, on_done), t0
    sem = asyncio.Semaphore(concurrency) if concurrency else None

    async def one(spec: RequestSpec) -> RequestRecord:
        if sem is None:
            rec = await sender.send(spec, t0)
        else:
            async with sem:
                rec = await sender.send(spec, t0)
        if on_done is not None:
            on_done(rec)
        return rec

    tasks: list[asyncio.Task[RequestRecord]] = []
    for spec in it:
        delay = t0 + (spec.arrival_time or 0.0) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(spec)))
    return list(await asyncio.gather(*tasks)), t0


async def _closed_loop(it: Iterator[RequestSpec], sender: Sender, t0: float, concurrency: int,
                       duration: float | None, on_done: OnDone | None) -> list[RequestRecord]:
    records: list[tuple[int, RequestRecord]] = []
    order = itertools.count()

    async def worker() -> None:
        while duration is None or time.perf_counter() - t0 < duration:
            spec = next(it, None)   # asyncio is single-threaded: no lock needed around next()
            if spec is None:
                return
            n = next(order)
            rec = await sender.send(spec, t0)
            records.append((n, rec))
            if on_done is not None:
                on_done(rec)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [rec for _, rec in sorted(records, key=lambda x: x[0])]


class InprocessStats:
    """Per-step totals of an in-process run (fed by the engine's stats listener)."""

    def __init__(self) -> None:
        self.num_steps = 0
        self.busy_s = 0.0
        self.num_prefill_tokens = 0
        self.num_decode_tokens = 0
        self.sum_batch_size = 0
        self.num_preempted = 0
        self.max_kv_usage = 0.0
        self.spec: dict[str, Any] = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                                     "accepted_per_pos": [], "num_rejections": 0}
        self.budget = BudgetTally()

    def add(self, stats: StepStats) -> None:
        self.budget.add(stats)
        self.num_steps += 1
        self.busy_s += stats.total_s
        self.num_prefill_tokens += stats.num_prefill_tokens
        self.num_decode_tokens += stats.num_decode_tokens
        self.sum_batch_size += stats.batch_size
        self.num_preempted += stats.num_preempted
        self.max_kv_usage = max(self.max_kv_usage, stats.kv_usage)
        if stats.num_drafts:
            from pacer.sched.spec import SpecStats

            self.spec = SpecStats.sum(self.spec, stats).as_dict()

    def spec_decode(self) -> dict[str, Any] | None:
        """Speculative decoding over the run (acceptance rate, mean accepted length); None: no drafts."""
        return self.spec if self.spec["num_drafts"] else None

    def as_dict(self) -> dict[str, Any]:
        n = max(1, self.num_steps)
        return {"num_steps": self.num_steps, "busy_s": self.busy_s, "mean_step_s": self.busy_s / n,
                "mean_batch_size": self.sum_batch_size / n, "prefill_tokens": self.num_prefill_tokens,
                "decode_tokens": self.num_decode_tokens, "preempted": self.num_preempted,
                "max_kv_usage": self.max_kv_usage, "budget": self.budget.as_dict()}


def run_inprocess(specs: Iterable[RequestSpec], engine: Engine, *, endpoint: str = "completions",
                  temperature: float = 0.0, concurrency: int | None = None, closed_loop: bool = False,
                  duration: float | None = None, on_done: OnDone | None = None,
                  ) -> tuple[list[RequestRecord], float, InprocessStats]:
    """Run specs on `engine` in this thread through the one driver (`pacer.workload.drive`):
    records in hand-off order, the run's start on the engine clock, and per-step totals."""
    stats = InprocessStats()
    engine.stats_listeners.append(stats.add)
    t0 = engine.clock.now()
    order: list[str] = []
    records: dict[str, RequestRecord] = {}

    def prepare(spec: RequestSpec) -> Handoff:
        order.append(spec.request_id)
        params = SamplingParams(max_tokens=spec.output_tokens, temperature=temperature, ignore_eos=spec.ignore_eos)
        if endpoint != "chat" or engine.tokenizer is None:
            return Handoff(list(spec.prompt_token_ids), params, spec.segments)
        messages = [m.as_dict() for m in spec.messages]
        if not spec.segments:
            return Handoff(engine.tokenizer.apply_chat_template(messages), params)
        ids, spans = engine.tokenizer.chat_segments(messages, ("tool",))   # as a server marks them
        return Handoff(ids, params, tuple(spans))

    try:
        for rec in drive(engine, specs, prepare, concurrency=concurrency, closed_loop=closed_loop,
                         duration=duration, t0=t0):
            records[rec.request_id] = rec
            if on_done is not None:
                on_done(rec)
    finally:
        engine.stats_listeners.remove(stats.add)
    return [records[rid] for rid in order if rid in records], t0, stats
