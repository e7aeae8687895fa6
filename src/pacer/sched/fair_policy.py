"""Fair share as a policy and as a layer: `fair` (VTC in the engine), `lpm` with a deficit bound
(DLPM) and `slo` with tenant ties. Pure Python.

Each reads a `ServiceLedger` (pacer.sched.fair_share) the scheduler charges once per step through
the `account` hook, with the exact tokens each request computed, took from the cache and decoded.

- **fair**: seats first, then service. A waiting tenant holding SEAT_MARGIN fewer of the last
  step's seats than another (for their weights) is admitted ahead and takes a seat from the
  seat-richest tenant, within one prompt's cost (or the deficit bound) of the least served.
  Otherwise the queue is ordered by each request's *projected* normalized service: its tenant's
  counter plus the prompt cost of the tenant's requests queued ahead of it (divided by the
  tenant's weight), so one step's admissions interleave tenants. A tenant above its seat share
  prefills in FAIR_CHUNK-token chunks (short steps for the others' arrivals).
- **lpm + deficit bound**: a request whose projected service stays within `deficit_bound` cost
  units of the least served backlogged tenant's is *in bound*, and among those the longest
  cached prefix goes first (locality); the rest wait behind them in service order, each tenant's
  own requests still by cached prefix.
- **slo + deficit bound**: tenant service breaks ties among requests whose deadlines are within
  the slo policy's margin of each other (FairSloPolicy).

Aging keeps its bound when asked; fair has none by default (no request of it can starve).
"""

from __future__ import annotations

from collections.abc import Callable

from pacer.config.fair import FairSettings
from pacer.request import Request
from pacer.sched.fair_share import ServiceCosts, ServiceLedger
from pacer.sched.policy import (
    LPM_MAX_QUEUE,
    Key,
    LpmPolicy,
    Policy,
    PolicyContext,
    WaitingQueue,
)
from pacer.sched.slo_policy import PREEMPT_MARGIN_S, SloPolicy
from pacer.sched.step_cost import StepCostModel

__all__ = ["FairPolicy", "FairLpmPolicy", "FairSloPolicy", "ledger_from", "SEAT_MARGIN"]

FAIR_CHUNK = 128   # prompt tokens per step of a tenant above its share of the seats
SEAT_MARGIN = 2   # running requests a tenant must hold beyond a waiting tenant's before it gives one up


def ledger_from(settings: FairSettings | None) -> ServiceLedger:
    s = settings or FairSettings()
    return ServiceLedger(ServiceCosts(s.cost_prefill, s.cost_cached, s.cost_decode), dict(s.weights))


class _FairState:
    """The ledger, and each waiting request's projected service (rebuilt once per step)."""

    def __init__(self, ledger: ServiceLedger, slack: float | None = None) -> None:
        self.ledger = ledger
        self.projected: dict[str, float] = {}
        self.seats: dict[str, int] = {}      # requests each tenant ran in the last step
        self._seats_now: dict[str, int] = {}
        self._seen: set[str] = set()
        self.seat_poor: frozenset[str] = frozenset()
        self.slack = slack

    def rebuild(self, queue: WaitingQueue) -> None:
        ledger = self.ledger
        self.seats, self._seats_now, self._seen = self._seats_now, {}, set()
        ledger.set_backlogged(r.tenant for r in queue)
        ahead: dict[str, float] = {}
        self.projected = {}
        for r in sorted(queue, key=lambda q: (q.arrival_time, q.arrival_seq)):
            t = r.tenant
            start = ledger.normalized(t) + ahead.get(t, 0.0)
            self.projected[r.request_id] = start
            cost = ledger.costs.prefill * max(0, r.num_tokens - r.num_computed_tokens)
            ahead[t] = ahead.get(t, 0.0) + cost / ledger.weight(t)
        self.seat_poor = self._seat_poor({r.tenant for r in queue})

    def _holds_more(self, b: str, a: str) -> bool:
        """Whether tenant b holds SEAT_MARGIN more of the last step's seats than a, for their weights."""
        seats, w = self.seats, self.ledger.weight
        return (seats.get(b, 0) - SEAT_MARGIN / 2) / w(b) >= (seats.get(a, 0) + SEAT_MARGIN / 2) / w(a)

    def _seat_poor(self, waiting: set[str]) -> frozenset[str]:
        """The waiting tenants another waiting tenant holds SEAT_MARGIN more seats than."""
        return frozenset(a for a in waiting if any(b != a and self._holds_more(b, a) for b in waiting))

    def first(self, r: Request) -> bool:
        """Whether `r` is admitted ahead of service order: its tenant holds fewer seats than
        another waiting tenant, and `r` would not take it past the floor by more than the slack."""
        return r.tenant in self.seat_poor and self.of(r) - self.ledger.floor() <= self._slack(r)

    def _slack(self, r: Request) -> float:
        """How far `r` may take its tenant past the floor to get a seat: the configured bound, else
        the cost of its own prompt (one request's worth, as VTC's own bound)."""
        if self.slack is not None:
            return self.slack
        return self.ledger.costs.prefill * max(0, r.num_tokens - r.num_computed_tokens) / self.ledger.weight(r.tenant)

    def of(self, r: Request) -> float:
        return self.projected.get(r.request_id, self.ledger.normalized(r.tenant))

    def account(self, r: Request, num_prefill: int, num_cached: int, num_decode: int) -> None:
        self.ledger.charge(r.tenant, num_prefill, num_cached, num_decode)
        if r.request_id not in self._seen:
            self._seen.add(r.request_id)
            self._seats_now[r.tenant] = self._seats_now.get(r.tenant, 0) + 1

    def outranks(self, a: Request, b: Request) -> bool:
        """Waiting `a` may take running `b`'s seat when b's tenant holds SEAT_MARGIN more seats
        and is not behind a's tenant in service (the tenant furthest above its share gives one up)."""
        if a.tenant == b.tenant:
            return False
        if not self._holds_more(b.tenant, a.tenant) or self.of(a) - self.ledger.floor() > self._slack(a):
            return False
        seats = self.seats
        seats[b.tenant] = seats.get(b.tenant, 0) - 1   # the seat moves: at most a few preemptions a step
        seats[a.tenant] = seats.get(a.tenant, 0) + 1
        return True

    def victim_key(self, r: Request) -> Key:
        """The victim is the latest request of the tenant holding the most seats for its weight
        (then the most service): the tenant furthest above its share gives up a seat."""
        return (self.seats.get(r.tenant, 0) / self.ledger.weight(r.tenant), self.ledger.normalized(r.tenant),
                r.arrival_time, r.arrival_seq)

    def prefill_cap(self, req: Request, cap: int) -> int:
        """A tenant holding more than its weighted share of the last step's seats, while another
        tenant runs or waits, prefills in chunks of at most FAIR_CHUNK tokens: steps stay short,
        so a less-served tenant's arrival waits less for the step in flight."""
        seats = self.seats
        tenants = set(seats) | self.ledger.backlogged
        if len(tenants) < 2 or cap <= FAIR_CHUNK:
            return cap
        total_w = sum(self.ledger.weight(t) for t in tenants)
        total_s = sum(seats.values())
        if total_s and seats.get(req.tenant, 0) / total_s > self.ledger.weight(req.tenant) / total_w:
            return FAIR_CHUNK
        return cap

    def serves_before(self, waiting: Request, partial: Request) -> bool:
        """A newcomer of a tenant behind the partial prefill's tenant takes the step's prefill
        share first (its prompt is what the less-served tenant waits on)."""
        return waiting.tenant != partial.tenant and \
            self.ledger.normalized(waiting.tenant) < self.ledger.normalized(partial.tenant)


class _Ledgered:
    """What the fair policies share: their `_FairState`, its ledger (the scheduler charges it
    through `account`) and `service_ledger`, which hands it to the scheduler."""

    fair: _FairState

    @property
    def ledger(self) -> ServiceLedger:
        return self.fair.ledger

    def service_ledger(self) -> ServiceLedger | None:
        return self.fair.ledger

    def account(self, r: Request, num_prefill: int, num_cached: int, num_decode: int) -> None:
        self.fair.account(r, num_prefill, num_cached, num_decode)


def _bound(settings: FairSettings | None) -> float:
    return 0.0 if settings is None or settings.deficit_bound is None else settings.deficit_bound


class FairPolicy(_Ledgered, Policy):
    """Least normalized tenant service first (VTC with the engine's exact costs)."""

    name = "fair"
    dynamic = True
    # no aging unless asked (--max-queue-delay): each tenant's requests go in arrival order and the
    # least served tenant first, so none starves; aging past a long backlog would be fcfs again
    default_max_queue_delay = None

    def __init__(self, ledger: ServiceLedger | None = None, slack: float | None = None) -> None:
        self.fair = _FairState(ledger or ServiceLedger(), slack)


    @classmethod
    def from_context(cls, context: PolicyContext | None) -> Policy:
        settings = None if context is None else context.fair
        return cls(ledger_from(settings), None if settings is None else settings.deficit_bound)

    def key(self, r: Request) -> Key:
        return (float(not self.fair.first(r)), self.fair.of(r), r.arrival_time, r.arrival_seq)

    def victim_key(self, r: Request) -> Key:
        return self.fair.victim_key(r)

    preempts_for_waiting = True    # seats or KV, for a tenant holding fewer seats (see outranks)
    preempts_for_budget = False    # never for a step's token share

    def outranks(self, a: Request, b: Request) -> bool:
        return self.fair.outranks(a, b)

    def serves_before(self, waiting: Request, partial: Request) -> bool:
        return self.fair.serves_before(waiting, partial)

    def prefill_cap(self, req: Request, cap: int) -> int:
        return self.fair.prefill_cap(req, cap)

    def refresh(self, queue: WaitingQueue, now: float) -> None:
        self.fair.rebuild(queue)
        queue.rekey()



class FairLpmPolicy(_Ledgered, LpmPolicy):
    """Longest cached prefix first among the requests within the deficit bound (DLPM)."""

    def __init__(self, cached_prefix_tokens: Callable[[Request], int] | None = None,
                 ledger: ServiceLedger | None = None, deficit_bound: float = 0.0) -> None:
        super().__init__(cached_prefix_tokens)
        self.fair = _FairState(ledger or ServiceLedger())
        self.deficit_bound = deficit_bound


    @classmethod
    def from_context(cls, context: PolicyContext | None) -> Policy:
        settings = None if context is None else context.fair
        return cls(None if context is None else context.cached_prefix_tokens, ledger_from(settings), _bound(settings))

    def key(self, r: Request) -> Key:
        projected = self.fair.of(r)
        if r.num_computed_tokens:   # running, or a swapped resume: service order
            return (1.0, projected, 0.0, r.arrival_time, r.arrival_seq)
        if self._fcfs:
            return (1.0, projected, 0.0, r.arrival_time, r.arrival_seq)
        if projected - self.ledger.floor() > self.deficit_bound:
            # past the bound: tenants in service order, each tenant's own requests by cached prefix
            # (which of its requests goes first moves no tenant's share)
            return (1.0, self.ledger.normalized(r.tenant), -float(self.cached_prefix_tokens(r)), r.arrival_time,
                    r.arrival_seq)
        return (0.0, -float(self.cached_prefix_tokens(r)), 0.0, r.arrival_time, r.arrival_seq)

    def victim_key(self, r: Request) -> Key:
        return self.fair.victim_key(r)

    def refresh(self, queue: WaitingQueue, now: float) -> None:
        self._fcfs = len(queue) > LPM_MAX_QUEUE
        self.fair.rebuild(queue)
        queue.rekey()



TIE_SCAN = 64   # waiting requests a tie-break looks at past the slo head


class FairSloPolicy(_Ledgered, SloPolicy):
    """`slo` with tenant shares breaking ties: among the waiting requests due within
    PREEMPT_MARGIN_S of the head the slo policy picks (a difference it treats as noise), and only
    while that one has at least that much slack, the request of the tenant least served (within
    the deficit bound first) goes first. Requests without targets all tie."""

    def __init__(self, cost_model: StepCostModel, max_num_batched_tokens: int, prefill_chunk: int,
                 cached_prefix_tokens: Callable[[Request], int] | None = None, arrival_ttft_s: float | None = None,
                 shed_hopeless: bool = False, ledger: ServiceLedger | None = None, deficit_bound: float = 0.0,
                 admission_margin: float = 0.0, planned_step_s: float | None = None) -> None:
        super().__init__(cost_model, max_num_batched_tokens, prefill_chunk, cached_prefix_tokens, arrival_ttft_s,
                         shed_hopeless, admission_margin, planned_step_s)
        self.fair = _FairState(ledger or ServiceLedger())
        self.deficit_bound = deficit_bound


    @classmethod
    def from_context(cls, context: PolicyContext | None) -> Policy:
        base = SloPolicy.from_context(context)   # raises without a cost model
        assert isinstance(base, SloPolicy) and context is not None
        return cls(base.cost_model, base.max_num_batched_tokens, base.prefill_chunk, base.cached_prefix_tokens,
                   base.arrival_ttft_s, base.shed_hopeless, ledger_from(context.fair), _bound(context.fair),
                   base.admission_margin, base.planned_step_s)

    def head_index(self, items: list[tuple[Key, Request]], now: float) -> int:
        head = super().head_index(items, now)
        first = items[head][0][0] if items else None
        if first is None or self.latest_start(items[head][1]) < now + PREEMPT_MARGIN_S or \
                items[head][1].num_output_tokens:
            return head   # the head cannot wait (or is an overdue resume, or nothing is feasible)
        ledger, floor = self.ledger, self.ledger.floor()

        def rank(i: int) -> tuple[bool, float, int]:
            n = ledger.normalized(items[i][1].tenant)
            return (n - floor > self.deficit_bound, n, i)

        window = range(head, min(len(items), head + TIE_SCAN))
        return min((i for i in window if items[i][0][0] <= first + PREEMPT_MARGIN_S), key=rank)

    def refresh(self, queue: WaitingQueue, now: float) -> None:
        super().refresh(queue, now)
        self.fair.rebuild(queue)

    def account(self, r: Request, num_prefill: int, num_cached: int, num_decode: int) -> None:
        _Ledgered.account(self, r, num_prefill, num_cached, num_decode)
        SloPolicy.account(self, r, num_prefill, num_cached, num_decode)   # the measured prefill rate

