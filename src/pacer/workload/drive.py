"""The one driver that feeds an in-process `Engine` from request specs and yields each
finished request's record: `pacer sim`, `pacer bench --engine inprocess`, `pacer sim
validate` and `pacer tune` all run it, on the wall clock or a virtual one.

Arrival rule (the HTTP client's and vLLM `bench serve`'s): a request arrives when its client
hands it over -- at its timestamp in an open loop; when a client slot frees under a
concurrency cap or in a closed loop (the later of the two). The engine sees it at the next
step boundary; the time until then counts as queue wait, as on a server. Between steps the
driver waits on the engine's clock (`Clock.wait_until`: the wall clock sleeps, the virtual
clock jumps), so the same loop serves both worlds.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from pacer.request import SamplingParams
from pacer.workload.report import STATUS_ERROR, STATUS_OK, STATUS_REJECTED, RequestRecord

if TYPE_CHECKING:
    from pacer.engine import Engine, RequestOutput

__all__ = ["DriveSpec", "Handoff", "ARRIVAL_NOTE", "ClientSlots", "drive", "record_from_output"]

ARRIVAL_NOTE = ("arrival = when the client hands a request over (its timestamp; under a concurrency cap or in "
                "a closed loop, when a slot frees); the engine sees it at the next step boundary and the time "
                "until then is queue wait, as on a server")


class DriveSpec(Protocol):
    """What the driver needs of a request; `pacer.workload.generator.RequestSpec` is one."""

    @property
    def request_id(self) -> str: ...
    @property
    def request_class(self) -> str: ...
    @property
    def prompt_token_ids(self) -> Sequence[int]: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def arrival_time(self) -> float | None: ...   # seconds from the start; None: closed loop
    @property
    def priority(self) -> int: ...
    @property
    def tenant(self) -> str: ...
    @property
    def session(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Handoff:
    """What the driver hands the engine for one spec: its prompt's token ids, its sampling params
    and its segment spans (start, length) for segment reuse."""

    prompt_token_ids: Sequence[int]
    params: SamplingParams
    segments: Sequence[tuple[int, int]] = ()


S = TypeVar("S", bound=DriveSpec)
Prepare = Callable[[S], Handoff]


class ClientSlots:
    """Client slots: at most `limit` requests in flight (None: no cap); each slot remembers when
    it freed, and the earliest-freed is taken first (a heap: several engines on their own clocks
    free slots out of time order)."""

    def __init__(self, limit: int | None, t0: float) -> None:
        self.free_at: list[float] = [t0] * limit if limit is not None else []
        self.unlimited = limit is None
        self.t0 = t0

    def next_free(self) -> float | None:
        """When a slot is free next (None: every slot is in flight)."""
        if self.unlimited:
            return self.t0
        return self.free_at[0] if self.free_at else None

    def take(self) -> None:
        if not self.unlimited:
            heapq.heappop(self.free_at)

    def release(self, t: float) -> None:
        if not self.unlimited:
            heapq.heappush(self.free_at, t)


def _ordered(specs: Iterable[S], closed_loop: bool) -> Iterator[S]:
    """A finite open-loop trace in arrival order (stable); anything else as given."""
    if closed_loop or not isinstance(specs, Sequence):
        return iter(specs)
    return iter(sorted(specs, key=lambda s: s.arrival_time or 0.0))


def drive(engine: Engine, specs: Iterable[S], prepare: Prepare[S], *, concurrency: int | None = None,
          closed_loop: bool = False, duration: float | None = None, t0: float | None = None
          ) -> Iterator[RequestRecord]:
    """Feed `engine` from `specs` (open loop at their timestamps, or a closed loop: each spec
    sent when a slot frees) until they run out or `duration` seconds have passed, and yield
    each request's record when it finishes (or is refused). `prepare(spec)` gives its `Handoff`
    (prompt token ids, sampling params, segments), called at hand-off, in hand-off order. Records'
    times are from `t0` (default: the engine clock when the driver starts)."""
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if closed_loop and concurrency is None:
        raise ValueError("a closed loop needs a concurrency")
    clock = engine.clock
    t0 = clock.now() if t0 is None else t0
    slots = ClientSlots(concurrency, t0)
    it = _ordered(specs, closed_loop)
    pending = next(it, None)
    in_flight: dict[str, S] = {}
    stalled = 0

    def handoff(spec: S) -> float | None:
        free = slots.next_free()
        if free is None:
            return None
        ts = 0.0 if closed_loop or spec.arrival_time is None else spec.arrival_time
        return max(t0 + ts, free)

    while True:
        now = clock.now()
        if duration is not None and now - t0 > duration:
            pending = None
        while pending is not None and (h := handoff(pending)) is not None and h <= now:
            refused = _submit(engine, pending, prepare, h, t0, in_flight)
            if refused is not None:
                yield refused
            else:
                slots.take()
            pending = next(it, None)
        if engine.has_unfinished_requests():
            steps_before = engine.num_steps
            for out in engine.step():
                spec = in_flight.pop(out.request_id, None) if out.finished else None
                if spec is not None:
                    slots.release(clock.now())
                    yield record_from_output(out, spec, t0)
            stalled = 0 if engine.num_steps > steps_before else stalled + 1
            if stalled <= 3:
                continue
            stalled = 0   # several steps ran nothing: only an arrival can change that
        elif pending is None:
            return
        h = handoff(pending) if pending is not None else None
        if h is None:
            raise RuntimeError(f"driver stalled at t={now - t0:.3f}s with {len(in_flight)} requests in flight")
        clock.wait_until(h)


def _submit(engine: Engine, spec: S, prepare: Prepare[S], arrival: float, t0: float,
            in_flight: dict[str, S]) -> RequestRecord | None:
    """Add one request with its hand-off time as arrival; a refused one becomes an error record."""
    handoff = prepare(spec)
    ids = handoff.prompt_token_ids
    try:
        rid = engine.add_request(ids, handoff.params, priority=spec.priority, tenant=spec.tenant,
                                 arrival_time=arrival, request_class=spec.request_class,
                                 segments=handoff.segments or None)
    except (ValueError, TypeError) as e:
        return RequestRecord(spec.request_id, spec.request_class, arrival - t0, status=STATUS_ERROR,
                             error=str(e), finish_time=arrival - t0, prompt_tokens=len(ids))
    in_flight[rid] = spec
    return None


def record_from_output(out: RequestOutput, spec: DriveSpec, t0: float) -> RequestRecord:
    """A finished request's record (times from `t0`); aborted and failed ones are errors, and
    those shed as hopeless (`shed_hopeless`) are refusals, as a server's 429."""
    status = STATUS_ERROR if out.finish_reason in ("abort", "error") else STATUS_OK
    if out.metrics.shed:
        status = STATUS_REJECTED
    rec = RequestRecord.from_metrics(out.metrics, request_id=spec.request_id, request_class=spec.request_class,
                                     t0=t0, status=status, tenant=spec.tenant, priority=spec.priority,
                                     session=spec.session)
    rec.cached_tokens = max(rec.cached_tokens, int(out.num_cached_tokens or 0))
    return rec
