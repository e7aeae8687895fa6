"""Admission control: a cap on the waiting queue, priority shedding, refusal reasons. Pure Python.

The controller sees requests from arrival until they *start* (their first output token) and
decides, for each arrival, whether it may join the queue. Past `max_waiting` an arrival is
refused, unless it outranks the worst waiting request (lower `priority` value = more
important, as in vLLM); then that one is displaced instead, so during a spike low-priority
traffic is shed first. It never touches requests, the engine or time itself: the caller
passes `now` (seconds on any monotonic scale) for the Retry-After estimate.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

__all__ = ["AdmissionController", "AdmissionDecision", "REFUSAL_REASONS"]

# reasons a request can be refused; servers label their refusal counters with these
REFUSAL_REASONS = ("queue_full", "displaced", "context_length_exceeded", "draining")


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    admitted: bool
    reason: str | None = None          # set when refused: one of REFUSAL_REASONS
    displaced_id: str | None = None    # admitted by displacing this waiting request
    retry_after_s: int = 1             # hint for a refused client (HTTP Retry-After)


class AdmissionController:
    """Tracks waiting requests by (priority, arrival order); O(log n) admit."""

    def __init__(self, max_waiting: int | None = None, rate_window: int = 64) -> None:
        if max_waiting is not None and (isinstance(max_waiting, bool) or not isinstance(max_waiting, int)
                                        or max_waiting < 0):
            raise ValueError(f"max_waiting must be an integer >= 0 or None, got {max_waiting!r}")
        self.max_waiting = max_waiting
        self._waiting: dict[str, tuple[int, int]] = {}    # request id -> (priority, seq)
        self._worst: list[tuple[int, int, str]] = []      # max-heap by (priority, seq) via negation
        self._seq = 0
        self._start_times: deque[float] = deque(maxlen=rate_window)
        self.num_refused: dict[str, int] = {}

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def is_waiting(self, request_id: str) -> bool:
        return request_id in self._waiting

    def try_admit(self, request_id: str, priority: int, now: float) -> AdmissionDecision:
        """Admit `request_id` to the waiting set, possibly displacing the worst waiting one."""
        if request_id in self._waiting:
            raise ValueError(f"request_id {request_id!r} is already waiting")
        if self.max_waiting is None or len(self._waiting) < self.max_waiting:
            self._add(request_id, priority)
            return AdmissionDecision(True)
        worst = self._peek_worst()
        if worst is not None and priority < self._waiting[worst][0]:
            self._waiting.pop(worst)
            self._add(request_id, priority)
            self._count("displaced")
            return AdmissionDecision(True, displaced_id=worst)
        self._count("queue_full")
        return AdmissionDecision(False, reason="queue_full", retry_after_s=self.retry_after(now))

    def mark_started(self, request_id: str, now: float) -> None:
        """The request left the queue (produced its first token); frees its place."""
        if self._waiting.pop(request_id, None) is not None:
            self._start_times.append(now)

    def release(self, request_id: str) -> None:
        """The request ended (finished, aborted or failed) before or after starting."""
        self._waiting.pop(request_id, None)

    def refuse(self, reason: str) -> None:
        """Count a refusal decided elsewhere (e.g. context length, draining)."""
        self._count(reason)

    def retry_after(self, now: float) -> int:
        """Seconds until the queue has likely drained by one place, from the recent start rate."""
        times = self._start_times
        if len(times) < 2 or now <= times[0]:
            return 1
        rate = len(times) / (now - times[0])   # starts per second over the recent window
        return int(min(60, max(1, math.ceil(1.0 / rate))))

    def _add(self, request_id: str, priority: int) -> None:
        self._seq += 1
        self._waiting[request_id] = (priority, self._seq)
        heapq.heappush(self._worst, (-priority, -self._seq, request_id))
        if len(self._worst) > 4 * len(self._waiting) + 64:   # drop stale entries now and then
            self._worst = [(-p, -s, r) for r, (p, s) in self._waiting.items()]
            heapq.heapify(self._worst)

    def _peek_worst(self) -> str | None:
        while self._worst:
            neg_p, neg_s, rid = self._worst[0]
            if self._waiting.get(rid) == (-neg_p, -neg_s):
                return rid
            heapq.heappop(self._worst)   # stale: started, released or displaced
        return None

    def _count(self, reason: str) -> None:
        self.num_refused[reason] = self.num_refused.get(reason, 0) + 1
