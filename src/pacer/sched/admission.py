"""Admission control: a cap on the waiting queue, per-tenant shares of it, priority shedding,
refusal reasons. Pure Python.

The controller sees requests from arrival until they *start* (their first output token) and
decides, for each arrival, whether it may join the queue. Below `max_waiting` every arrival
is admitted (the queue is work-conserving: one tenant may use places nobody else wants).
When the queue is full, places are shared between the tenants that are waiting, in
proportion to `tenant_weights` (1 by default): a tenant's share is
`max_waiting * w / (sum of w over tenants waiting, itself included)`.

- An arrival whose tenant holds fewer places than its share takes one from the tenant that
  is furthest over its own share (that tenant's worst request is displaced), so one tenant's
  burst cannot keep another out.
- An arrival whose tenant already holds its share competes only inside that share: it
  displaces its own tenant's worst waiting request if it outranks it (lower `priority` value
  = more important, as in vLLM), and is refused otherwise. Priority never displaces another
  tenant's request.

"Worst" is the highest priority value, latest arrival first. With one tenant this is plain
priority shedding. It never touches requests, the engine or time itself: the caller passes
`now` (seconds on any monotonic scale) for the Retry-After estimate.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["AdmissionController", "AdmissionDecision", "REFUSAL_REASONS", "DEFAULT_TENANT"]

# reasons a request can be refused; servers label their refusal counters with these
REFUSAL_REASONS = ("queue_full", "displaced", "context_length_exceeded", "draining",
                   "rate_limited", "concurrency_limit", "request_too_large")
DEFAULT_TENANT = "default"


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    admitted: bool
    reason: str | None = None          # set when refused: one of REFUSAL_REASONS
    displaced_id: str | None = None    # admitted by displacing this waiting request
    displaced_tenant: str | None = None
    retry_after_s: int = 1             # hint for a refused client (HTTP Retry-After)


class AdmissionController:
    """Tracks waiting requests per tenant by (priority, arrival order); O(log n) admit
    (plus O(tenants waiting) when the queue is full)."""

    def __init__(self, max_waiting: int | None = None, rate_window: int = 64,
                 tenant_weights: Mapping[str, float] | None = None) -> None:
        if max_waiting is not None and (isinstance(max_waiting, bool) or not isinstance(max_waiting, int)
                                        or max_waiting < 0):
            raise ValueError(f"max_waiting must be an integer >= 0 or None, got {max_waiting!r}")
        for tenant, w in (tenant_weights or {}).items():
            if isinstance(w, bool) or not isinstance(w, int | float) or not 0 < w < math.inf:
                raise ValueError(f"tenant_weights[{tenant!r}] must be a number > 0, got {w!r}")
        self.max_waiting = max_waiting
        self.tenant_weights = dict(tenant_weights or {})
        self._waiting: dict[str, tuple[str, int, int]] = {}   # request id -> (tenant, priority, seq)
        self._by_tenant: dict[str, int] = {}                   # tenant -> number waiting (> 0 only)
        self._worst: dict[str, list[tuple[int, int, str]]] = {}  # per tenant: max-heap by (priority, seq)
        self._seq = 0
        self._start_times: deque[float] = deque(maxlen=rate_window)
        self.num_refused: dict[str, int] = {}

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def num_waiting_of(self, tenant: str) -> int:
        return self._by_tenant.get(tenant, 0)

    def is_waiting(self, request_id: str) -> bool:
        return request_id in self._waiting

    def share(self, tenant: str, arriving: str | None = None) -> float:
        """Places `tenant` is entitled to while the queue is full, among the tenants waiting
        plus `arriving` (see the module docstring)."""
        if self.max_waiting is None:
            return math.inf
        tenants = set(self._by_tenant) | {tenant} | ({arriving} if arriving is not None else set())
        return self.max_waiting * self._weight(tenant) / sum(self._weight(t) for t in tenants)

    def try_admit(self, request_id: str, priority: int, now: float,
                  tenant: str = DEFAULT_TENANT) -> AdmissionDecision:
        """Admit `request_id` to the waiting set, possibly displacing a waiting one."""
        if request_id in self._waiting:
            raise ValueError(f"request_id {request_id!r} is already waiting")
        if self.max_waiting is None or len(self._waiting) < self.max_waiting:
            self._add(request_id, tenant, priority)
            return AdmissionDecision(True)
        victim = self._victim(tenant, priority)
        if victim is None:
            self._count("queue_full")
            return AdmissionDecision(False, reason="queue_full", retry_after_s=self.retry_after(now))
        victim_tenant = self._remove(victim)
        self._add(request_id, tenant, priority)
        self._count("displaced")
        return AdmissionDecision(True, displaced_id=victim, displaced_tenant=victim_tenant)

    def mark_started(self, request_id: str, now: float) -> None:
        """The request left the queue (produced its first token); frees its place."""
        if self._remove(request_id) is not None:
            self._start_times.append(now)

    def release(self, request_id: str) -> None:
        """The request ended (finished, aborted or failed) before or after starting."""
        self._remove(request_id)

    def refuse(self, reason: str) -> None:
        """Count a refusal decided elsewhere (e.g. context length, draining, rate limits)."""
        self._count(reason)

    def retry_after(self, now: float) -> int:
        """Seconds until the queue has likely drained by one place, from the recent start rate."""
        times = self._start_times
        if len(times) < 2 or now <= times[0]:
            return 1
        rate = len(times) / (now - times[0])   # starts per second over the recent window
        return int(min(60, max(1, math.ceil(1.0 / rate))))

    # ------------------------------------------------------------------ internals

    def _weight(self, tenant: str) -> float:
        return self.tenant_weights.get(tenant, 1.0)

    def _victim(self, tenant: str, priority: int) -> str | None:
        """Whom a full queue gives up for this arrival, or None (refuse it)."""
        if self._by_tenant.get(tenant, 0) < self.share(tenant):
            over = [(self._by_tenant[t] / self._weight(t), t) for t in self._by_tenant
                    if t != tenant and self._by_tenant[t] > self.share(t, arriving=tenant)]
            if over:
                return self._peek_worst(max(over)[1])
        own = self._peek_worst(tenant)
        if own is not None and priority < self._waiting[own][1]:
            return own
        return None

    def _add(self, request_id: str, tenant: str, priority: int) -> None:
        self._seq += 1
        self._waiting[request_id] = (tenant, priority, self._seq)
        self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + 1
        heap = self._worst.setdefault(tenant, [])
        heapq.heappush(heap, (-priority, -self._seq, request_id))
        if len(heap) > 4 * self._by_tenant[tenant] + 64:   # drop stale entries now and then
            heap[:] = [(-p, -s, r) for r, (t, p, s) in self._waiting.items() if t == tenant]
            heapq.heapify(heap)

    def _remove(self, request_id: str) -> str | None:
        entry = self._waiting.pop(request_id, None)
        if entry is None:
            return None
        tenant = entry[0]
        left = self._by_tenant[tenant] - 1
        if left:
            self._by_tenant[tenant] = left
        else:   # nobody of this tenant waits: forget it (and its stale heap entries)
            del self._by_tenant[tenant]
            del self._worst[tenant]
        return tenant

    def _peek_worst(self, tenant: str) -> str | None:
        heap = self._worst.get(tenant, [])
        while heap:
            neg_p, neg_s, rid = heap[0]
            if self._waiting.get(rid) == (tenant, -neg_p, -neg_s):
                return rid
            heapq.heappop(heap)   # stale: started, released or displaced
        return None

    def _count(self, reason: str) -> None:
        self.num_refused[reason] = self.num_refused.get(reason, 0) + 1
