"""Scheduling policies: the hooks a policy owns, and the static ones. Pure Python.

A policy decides everything that differs between policies; the scheduler (pacer.sched.scheduler)
calls its hooks and never names one. The hooks, with the no-op defaults of `Policy` (fcfs):

- **ordering**: `key` orders the waiting queue and the running requests within a step
  (smaller first), `victim_key` picks whom to preempt (the largest first), `outranks` says
  whether a waiting request may preempt a running one, `head_index` which waiting request is
  served first, `refresh` re-keys once per step, and `serves_before` whether a newcomer takes
  the step's prefill share ahead of a running partial prefill;
- **shedding**: `shed` names the waiting requests to refuse before they cost anything;
- **step limits**: `step_limit` may cap the rest of a step once its decodes are in.

`fcfs`, `priority` and `sjf` are static keys; `lpm` (longest prefix match first, SGLang's
policy) re-keys the queue every step from the prefix cache; `slo` (earliest due first, with its
ITL step budget and hopeless shedding) lives in `pacer.sched.slo_policy`. Each policy builds
itself from a `PolicyContext` (`from_context`); `pacer.sched.policy_factory.make_policy` is the
one factory that picks the class by name.

Aging (`WaitingQueue(max_queue_delay=...)`): a request that has waited longer than
`max_queue_delay` seconds is served in arrival order ahead of every request that has not,
whatever the policy, so no policy starves a request.

A request may wait while not ready to run (`WaitingQueue.add(req, ready=False)`: its
grammar is compiling). It keeps its place in the order, but the head is chosen among the
ready ones only, so it never blocks the requests behind it; `mark_ready` ends that state.
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter

from pacer.config.fair import FairSettings
from pacer.config.slo import SloSet
from pacer.request import Request, RequestStatus
from pacer.sched.fair_share import ServiceLedger
from pacer.sched.reasoning import predicted_output_tokens
from pacer.sched.step_cost import StepCostModel
from pacer.sched.step_plan import StepLimit, StepPlan

__all__ = ["Key", "Policy", "PolicyContext", "PrioritySchedulingPolicy", "SjfPolicy", "LpmPolicy", "WaitingQueue",
           "DEFAULT_MAX_QUEUE_DELAY_S", "LPM_MAX_QUEUE", "ARRIVAL_KEY", "RunningOrder"]

Key = tuple[float, ...]
ARRIVAL_KEY: Callable[[Request], Key] = attrgetter("metrics.arrival_time", "arrival_seq")   # Policy.key's tuple
DEFAULT_MAX_QUEUE_DELAY_S = 30.0   # aging bound of sjf, lpm and slo when none is given
LPM_MAX_QUEUE = 128                # longer queues fall back to fcfs order (as SGLang does)


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What the scheduler gives a policy to build itself from; each takes what it needs."""

    max_num_batched_tokens: int                                     # the step's token budget
    prefill_chunk: int                                              # the longest prefill chunk a step takes
    cached_prefix_tokens: Callable[[Request], int] | None = None    # the KV manager's look-up, no refs taken
    cost_model: StepCostModel | None = None                         # predicted step times (slo)
    slo_set: SloSet | None = None                                   # the configured classes' targets (slo)
    shed_hopeless: bool = False                                     # refuse what can no longer meet its TTFT
    admission_margin: float = 0.0                                   # refuse arrivals the queue makes late (slo; 0: off)
    fair: FairSettings | None = None                                # tenant shares, costs, deficit bound (fair)


class Policy:
    """First come, first served (the base: arrival order, and every hook's default)."""

    name = "fcfs"
    preempts_for_waiting = False   # may a better waiting request preempt a running one?
    preempts_for_budget = True     # ... also for the step's token share (not only seats / KV)?
    dynamic = False                # keys change between steps: the queue re-keys every step
    default_max_queue_delay: float | None = None

    @classmethod
    def from_context(cls, context: PolicyContext | None) -> Policy:
        """The policy built from the scheduler's collaborators (None: a bare policy, for tests)."""
        return cls()

    def overrides(self, hook: str) -> bool:
        """Whether this policy replaces the default of `hook` (the scheduler's per-row loops skip
        calling a no-op default, such as `account` or `prefill_cap`, for every request of every step)."""
        return getattr(type(self), hook) is not getattr(Policy, hook)

    # ---------------------------------------------------------------- ordering

    def key(self, r: Request) -> Key:
        return (r.arrival_time, r.arrival_seq)

    def sort_key(self) -> Callable[[Request], Key]:
        """`key` as the function to sort by: the base's own tuples built in C (the running
        requests are sorted every step), an overriding policy's `key` as it is."""
        return self.key if self.overrides("key") else ARRIVAL_KEY

    def victim_key(self, r: Request) -> Key:
        """Preemption order among running requests: the largest goes first."""
        return self.key(r)

    def outranks(self, a: Request, b: Request) -> bool:
        """Whether `a` is strictly more important than `b` (for preemption by a waiting request)."""
        return self.preempts_for_waiting and a.priority < b.priority

    def head_index(self, items: list[tuple[Key, Request]], now: float) -> int:
        """Which of the sorted waiting items is served first (the slo policy skips hopeless ones)."""
        return 0

    def serves_before(self, waiting: Request, partial: Request) -> bool:
        """Whether a waiting request takes the step's prefill share before a running request's
        partial prefill (the slo policy: by slack; the others finish what they started)."""
        return False

    def recompute_allowance(self, req: Request, now: float) -> int:
        """Prompt tokens `req` may compute beyond its floor of a reused segment's recomputation
        (`segment_recompute`) without missing its targets (the slo policy: from its TTFT slack;
        the others: none, so the floor is exact)."""
        return 0

    def prefill_cap(self, req: Request, cap: int) -> int:
        """The most prompt tokens `req` may prefill in one step (`cap`: the scheduler's chunk
        limit; the fair policy chunks a tenant holding more than its share of the seats finer)."""
        return cap

    def refresh(self, queue: WaitingQueue, now: float) -> None:
        """Called once per step before scheduling (dynamic policies re-key here)."""

    def service_ledger(self) -> ServiceLedger | None:
        """The ledger the policy orders by, charged in `account` (the fair policies); None: the
        scheduler keeps its own, for reports only."""
        return None

    def account(self, r: Request, num_prefill: int, num_cached: int, num_decode: int) -> None:
        """What a scheduled request costs this step: prompt tokens computed, taken from the
        prefix cache (on admission), decoded (the fair policies charge its tenant). None here."""

    # ---------------------------------------------------------------- shedding and step limits

    def shed(self, waiting: Iterable[Request], now: float) -> list[Request]:
        """The waiting requests to refuse now, before they cost anything, in queue order (the
        scheduler finishes each as shed: `RequestMetrics.shed`, FinishReason.ABORT). None here."""
        return []

    def step_limit(self, step: StepPlan, decodes: list[Request], partial: list[Request], waiting: WaitingQueue,
                   now: float) -> StepLimit | None:
        """A cap on the rest of a chunked step, asked once its decodes are scheduled (`step`: read
        it, never write it; `decodes` and `partial`: the running decodes, those the step took
        among them, and partial prefills, in key order). None: the token budget alone."""
        return None


class PrioritySchedulingPolicy(Policy):
    name = "priority"
    preempts_for_waiting = True

    def key(self, r: Request) -> Key:
        return (r.priority, r.arrival_time, r.arrival_seq)


class SjfPolicy(Policy):
    """Shortest (prompt + predicted output: max_tokens, or less with a thinking budget) first: sorted batching for throughput; starves long jobs
    without aging."""

    name = "sjf"
    default_max_queue_delay = DEFAULT_MAX_QUEUE_DELAY_S

    def key(self, r: Request) -> Key:
        return (r.num_prompt_tokens + predicted_output_tokens(r.sampling_params), r.arrival_time, r.arrival_seq)


class LpmPolicy(Policy):
    """Longest cached prefix first (cache locality). Matches are looked up, never taken, each
    step; past LPM_MAX_QUEUE waiting requests the order falls back to fcfs."""

    name = "lpm"
    dynamic = True
    default_max_queue_delay = DEFAULT_MAX_QUEUE_DELAY_S

    def __init__(self, cached_prefix_tokens: Callable[[Request], int] | None = None) -> None:
        self.cached_prefix_tokens = cached_prefix_tokens or (lambda r: 0)
        self._fcfs = False

    @classmethod
    def from_context(cls, context: PolicyContext | None) -> Policy:
        return cls(None if context is None else context.cached_prefix_tokens)

    def key(self, r: Request) -> Key:
        if self._fcfs or r.num_computed_tokens:
            return (0.0, r.arrival_time, r.arrival_seq)
        return (-float(self.cached_prefix_tokens(r)), r.arrival_time, r.arrival_seq)

    def refresh(self, queue: WaitingQueue, now: float) -> None:
        self._fcfs = len(queue) > LPM_MAX_QUEUE
        queue.rekey()


class RunningOrder:
    """The running requests sorted by a policy's sort key. Arrival keys never change, so while the
    same requests run (most steps) the last sort is the answer, without reading a key."""

    def __init__(self) -> None:
        self._of: list[Request] = []       # the running requests when `_sorted` was sorted by arrival
        self._sorted: list[Request] = []

    def sorted(self, running: list[Request], key: Callable[[Request], Key]) -> list[Request]:
        if key is ARRIVAL_KEY and running == self._of:   # the same requests, in the same order
            return self._sorted
        ordered = sorted(running, key=key)
        if key is ARRIVAL_KEY:
            self._of, self._sorted = list(running), ordered
        return ordered


class WaitingQueue:
    """Requests kept sorted by the policy key (a preempted request returns to its place), with
    aging: the oldest request is served first once it has waited `max_queue_delay` seconds."""

    def __init__(self, policy: Policy, max_queue_delay: float | None = None) -> None:
        if max_queue_delay is not None and not max_queue_delay > 0:
            raise ValueError(f"max_queue_delay must be > 0 seconds (or None for off), got {max_queue_delay!r}")
        self.policy = policy
        self.max_queue_delay = None if max_queue_delay is None or math.isinf(max_queue_delay) else max_queue_delay
        self._items: list[tuple[Key, Request]] = []
        self._peeked = 0   # where `peek` found its request (`take` looks there first)
        self._by_arrival: list[tuple[float, int, Request]] = []   # kept only with aging
        self._not_ready: set[str] = set()   # ids of queued requests not ready to run
        self._deferred: set[str] = set()    # of them, those sitting out this step only (defer)
        self._now = -math.inf

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Request]:
        return (r for _, r in self._items)

    @property
    def num_ready(self) -> int:
        return len(self._items) - len(self._not_ready)

    @property
    def num_not_ready(self) -> int:
        return len(self._not_ready)

    def is_ready(self, req: Request) -> bool:
        return req.request_id not in self._not_ready

    def mark_ready(self, req: Request) -> bool:
        """A not-ready request may now be served (status WAITING); False if it was not waiting so."""
        if req.request_id not in self._not_ready:
            return False
        self._not_ready.discard(req.request_id)
        req.status = RequestStatus.WAITING
        return True

    def add(self, req: Request, ready: bool = True) -> None:
        if not ready:
            self._not_ready.add(req.request_id)
        insort(self._items, (self.policy.key(req), req), key=lambda item: item[0])
        if self.max_queue_delay is not None:
            insort(self._by_arrival, (req.arrival_time, req.arrival_seq, req), key=lambda item: item[:2])

    def defer(self, req: Request) -> None:
        """`req` (ready) sits out the rest of this step: not served until the next `refresh`."""
        self._not_ready.add(req.request_id)
        self._deferred.add(req.request_id)

    def refresh(self, now: float) -> None:
        """Start of a step: the time aging and slack are judged at; dynamic policies re-key;
        requests deferred last step are ready again."""
        if self._deferred:
            self._not_ready -= self._deferred
            self._deferred.clear()
        self._now = now
        self.policy.refresh(self, now)

    def rekey(self) -> None:
        self._items = sorted(((self.policy.key(r), r) for _, r in self._items), key=lambda item: item[0])

    def is_aged(self, req: Request) -> bool:
        return self.max_queue_delay is not None and self._now - req.arrival_time > self.max_queue_delay

    def _head(self) -> int:
        """Index of the request served first, among the ready ones (there must be one)."""
        if not self._not_ready:
            items, index = self._items, None
        else:
            index = [i for i, (_, r) in enumerate(self._items) if r.request_id not in self._not_ready]
            items = [self._items[i] for i in index]
        oldest = next((r for _, _, r in self._by_arrival if r.request_id not in self._not_ready), None)
        if oldest is not None and self.is_aged(oldest):
            return next(i for i, (_, r) in enumerate(self._items) if r is oldest)
        head = self.policy.head_index(items, self._now)
        return head if index is None else index[head]

    def peek(self) -> Request:
        """The ready request served first (callers check `num_ready` first)."""
        self._peeked = self._head()
        return self._items[self._peeked][1]

    def pop(self) -> Request:
        req = self._items.pop(self._head())[1]
        self._drop_arrival(req)
        return req   # ready: _head never picks another

    def take(self, req: Request) -> None:
        """Remove `req`, the request `peek` returned, from where `peek` found it (not the head
        again: admitting it may change the policy's choice, its cached prefix counted as computed
        changing its predicted prefill, and a slack-based head may move), else wherever it sits."""
        i = self._peeked
        if i < len(self._items) and self._items[i][1] is req:
            del self._items[i]
            self._drop_arrival(req)
        elif not self.remove(req):
            raise ValueError(f"{req.request_id} is not waiting")

    def remove(self, req: Request) -> bool:
        for i, (_, r) in enumerate(self._items):
            if r is req:
                del self._items[i]
                self._drop_arrival(req)
                self._not_ready.discard(req.request_id)
                self._deferred.discard(req.request_id)
                return True
        return False

    def _drop_arrival(self, req: Request) -> None:
        for i, (_, _, r) in enumerate(self._by_arrival):
            if r is req:
                del self._by_arrival[i]
                return
