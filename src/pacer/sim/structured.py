"""Structured outputs in the simulator: grammar compiles and token masks on the virtual clock.

`SimStructured` implements the structured-outputs protocol (`pacer.sched.structured.StructuredOutputs`,
as `pacer.structured.runtime.StructuredRuntime` does) without llguidance, so a simulated request
with `structured_outputs` goes through the real Engine and Scheduler exactly as a served one:
it waits in the scheduler's queue as WAITING_FOR_GRAMMAR (no seat, no KV, skipped by every
policy) for as long as its compile would take, then runs with its rows constrained.

- Compile: `StructuredCost.compile_s` per cold grammar, on `num_workers` workers (a compile
  queues behind busy ones). A grammar with the same content (`StructuredOutputsParams.cache_key()`,
  the real cache's key) already compiled is free; one still compiling is joined; the cache
  keeps `cache_size` grammars, least recently used out (as `StructuredOutputManager`).
- Masks (priced by `SimExecutor`): the masks of a step's constrained sampling rows are
  computed while the forward runs, so the step takes max(forward, rows x mask_row_s) plus
  rows x apply_row_s; a step without constrained rows costs what it always did.

Tokens are not checked against grammars (the simulator samples no real tokens): output
lengths come from `max_tokens`, as for every simulated request. When the engine has nothing
to run but compiles, its clock jumps to the first compile's end (the real engine sleeps on
an event until then).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pacer.clock import VirtualClock
from pacer.request import FinishReason, StructuredOutputsParams
from pacer.sched.structured import CompileOutcome

__all__ = ["StructuredCost", "SimStructured", "SimMasks", "DEFAULT_STRUCTURED_COST"]


@dataclass(frozen=True, slots=True)
class StructuredCost:
    """What structured outputs cost. Defaults measured on the 2-core development machine with
    the real llguidance matcher, SmolLM2's 49k vocabulary and the bounded JSON schemas of
    benchmarks/structured_outputs.py: a cold compile through the worker process 1.3-2.6 ms
    (that benchmark's "compile: cold schema"); llguidance filling one row's bitmask 5-30 us
    (more on a lexer state's first visit; pacer.structured.masks, 16 rows a step); the
    in-place apply from the bits (the C++ kernel) ~11 us a row of mostly forbidden words,
    ~18 us of mixed ones, with torch at 1 thread."""

    compile_s: float = 2e-3      # one cold grammar compile (worker round trip)
    mask_row_s: float = 2e-5     # mask thread time per constrained row per step (the bitmask fill)
    apply_row_s: float = 1.2e-5  # applying one row's mask to its logits, after the forward
    num_workers: int = 2         # compiles in parallel (--structured-outputs-workers)
    cache_size: int = 256        # grammars kept (StructuredOutputManager's default)

    def __post_init__(self) -> None:
        for name in ("compile_s", "mask_row_s", "apply_row_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"StructuredCost.{name} must be >= 0 seconds, got {getattr(self, name)!r}")
        if self.num_workers < 1 or self.cache_size < 1:
            raise ValueError("StructuredCost.num_workers and cache_size must be >= 1")

    def mask_extra(self, rows: int, step_s: float) -> tuple[float, float]:
        """(mask wait beyond the step's own time, apply time) of a step with `rows` constrained rows."""
        if rows <= 0:
            return 0.0, 0.0
        return max(0.0, rows * self.mask_row_s - step_s), rows * self.apply_row_s


DEFAULT_STRUCTURED_COST = StructuredCost()


class SimMasks:
    """A simulated step's token masks: which rows are constrained (no logits to mask)."""

    def __init__(self, request_ids: Sequence[str]) -> None:
        self.rows: Mapping[str, int] = {rid: i for i, rid in enumerate(request_ids)}

    def apply(self, logits: Any, request_ids: Sequence[str]) -> Any:
        return logits


@dataclass(frozen=True, slots=True)
class _Compile:
    key: str
    ready_at: float   # virtual time the grammar is ready


class _Waits:
    """Request id -> its compile (the real runtime's GrammarWaits, on virtual time)."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self._pending: dict[str, _Compile] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, request_id: str, compile_: _Compile) -> None:
        self._pending[request_id] = compile_

    def discard(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    def take_done(self) -> list[str]:
        """Ids of the requests whose compile has ended by now, in arrival order."""
        now = self.clock.now()
        done = [rid for rid, c in self._pending.items() if c.ready_at <= now]
        for rid in done:
            del self._pending[rid]
        return done

    def next_ready(self) -> float | None:
        return min((c.ready_at for c in self._pending.values()), default=None)


class SimStructured:
    """The structured-outputs runtime on a VirtualClock (install with
    `Engine.install_structured_outputs`; `build_sim_engine` does)."""

    def __init__(self, clock: VirtualClock, cost: StructuredCost = DEFAULT_STRUCTURED_COST,
                 executor: Any = None) -> None:
        self.clock = clock
        self.cost = cost
        self.executor = executor   # a SimExecutor: its mask counters join stats()
        self._waits = _Waits(clock)
        self._cache: OrderedDict[str, float] = OrderedDict()   # key -> when its compile ends
        self._workers = [0.0] * cost.num_workers               # heap: when each worker is free
        self._bound: set[str] = set()
        self.counts = {"compilations": 0, "cache_hits": 0, "compile_seconds": 0.0}

    def request(self, params: StructuredOutputsParams, tenant: str = "default") -> _Compile:
        key = params.cache_key()
        now = self.clock.now()
        ready = self._cache.get(key)
        if ready is not None:
            self._cache.move_to_end(key)
            self.counts["cache_hits"] += 1
            return _Compile(key, ready)
        start = max(now, heapq.heappop(self._workers))
        ready = start + self.cost.compile_s
        heapq.heappush(self._workers, ready)
        self.counts["compilations"] += 1
        self.counts["compile_seconds"] += self.cost.compile_s
        self._cache[key] = ready
        while len(self._cache) > self.cost.cache_size:
            self._cache.popitem(last=False)
        return _Compile(key, ready)

    def add_pending(self, request_id: str, compile: _Compile) -> None:
        self._waits.add(request_id, compile)

    def has_pending(self) -> bool:
        return len(self._waits) > 0

    def take_compiled(self) -> list[CompileOutcome]:
        """The compiles ended by now (a modelled compile never fails); their requests are bound."""
        done = self._waits.take_done()
        self._bound.update(done)
        return [CompileOutcome(rid) for rid in done]

    def masks(self, sampling_ids: Iterable[str]) -> SimMasks | None:
        if not self._bound:
            return None
        rows = [rid for rid in sampling_ids if rid in self._bound]
        return SimMasks(rows) if rows else None

    def advance(self, request_id: str, token_ids: Sequence[int]) -> FinishReason | None:
        return None   # no real tokens: lengths come from max_tokens

    def release(self, request_id: str) -> None:
        self._bound.discard(request_id)
        self._waits.discard(request_id)

    def wait(self, timeout: float) -> None:
        """Idle but for compiles: jump to the first one's end."""
        t = self._waits.next_ready()
        if t is not None:
            self.clock.wait_until(t)

    def wake(self) -> None:
        """An arrival or abort (the real engine's idle wait ends); nothing sleeps here."""

    def stats(self) -> dict[str, float]:
        ex = self.executor
        masks = {} if ex is None else {"mask_rows": ex.mask_rows, "mask_compute_seconds": ex.mask_compute_s,
                                       "mask_wait_seconds": ex.mask_wait_s}
        return {**self.counts, "timeouts": 0, "errors": 0, **masks}

    def close(self) -> None:
        self._bound.clear()
