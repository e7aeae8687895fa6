"""Per-key limits: token buckets for request and token rates, and a cap on concurrent
requests. Pure Python; the caller passes `now` (seconds on any monotonic scale).

A charge comes in two halves, so a request is refused before it costs the server any work:
its places (`max_concurrent`, the request rate) before the body is tokenized, its tokens once
it is. Rule for the token rate: a request is charged `prompt tokens + max_tokens` when it is
admitted (what it may use), and what it did not generate is refunded when it finishes
(`release`), so a client that asks for a large `max_tokens` but stops early pays for what it
used. A refused request is charged nothing. Work whose size is known only afterwards
(/tokenize) is debited afterwards, and may take the bucket below empty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["TokenBucket", "KeyLimits", "KeyLimiter", "LimitRefusal"]


class TokenBucket:
    """`rate` units per second, holding at most `capacity`; starts full."""

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        if not rate > 0 or not capacity > 0:
            raise ValueError(f"a token bucket needs rate > 0 and capacity > 0, got {rate!r}, {capacity!r}")
        self.rate = float(rate)
        self.capacity = float(capacity)
        self._level = self.capacity
        self._at = now

    def level(self, now: float) -> float:
        if now > self._at:
            self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
            self._at = now
        return self._level

    def wait_time(self, amount: float, now: float) -> float:
        """Seconds until `amount` can be taken (0: now; inf: never, it exceeds the capacity)."""
        if amount > self.capacity:
            return math.inf
        return max(0.0, (amount - self.level(now)) / self.rate)

    def take(self, amount: float, now: float) -> None:
        self._level = self.level(now) - amount

    def give_back(self, amount: float, now: float) -> None:
        self._level = min(self.capacity, self.level(now) + amount)


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """One key's limits; None is unlimited. Buckets hold one minute's worth unless `burst_*`."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrent: int | None = None
    burst_requests: float | None = None
    burst_tokens: float | None = None


@dataclass(frozen=True, slots=True)
class LimitRefusal:
    reason: str               # "rate_limited" | "concurrency_limit" | "request_too_large"
    limit: str                # which limit: requests_per_minute | tokens_per_minute | max_concurrent
    message: str
    retry_after_s: int | None  # None: retrying the same request never helps


class KeyLimiter:
    """The buckets and the in-flight count of one key."""

    def __init__(self, limits: KeyLimits, now: float) -> None:
        self.limits = limits
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        self.requests = None if rpm is None else TokenBucket(rpm / 60.0, limits.burst_requests or rpm, now)
        self.tokens = None if tpm is None else TokenBucket(tpm / 60.0, limits.burst_tokens or tpm, now)
        self.num_in_flight = 0

    def try_acquire(self, num_requests: int, num_tokens: int, now: float) -> LimitRefusal | None:
        """Charge `num_requests` engine requests costing `num_tokens` in all, or say why not
        (then nothing is charged)."""
        refusal = self.try_acquire_requests(num_requests, now)
        if refusal is not None:
            return refusal
        refusal = self.try_acquire_tokens(num_tokens, now)
        if refusal is not None:
            self.cancel(num_requests, 0, now)
        return refusal

    def try_acquire_requests(self, num_requests: int, now: float) -> LimitRefusal | None:
        """The first half of a charge, before any work on the request: its places under
        `max_concurrent` and in the request rate (nothing charged when refused)."""
        cap = self.limits.max_concurrent
        if cap is not None and self.num_in_flight + num_requests > cap:
            if num_requests > cap:
                return LimitRefusal("request_too_large", "max_concurrent",
                                    f"the request needs {num_requests} concurrent sequences; this key may run "
                                    f"at most {cap} at once (max_concurrent)", None)
            return LimitRefusal("concurrency_limit", "max_concurrent",
                                f"this key already has {self.num_in_flight} requests in flight; its limit is "
                                f"{cap} (max_concurrent)", 1)
        refusal = _bucket_refusal(self.requests, num_requests, "requests_per_minute", now)
        if refusal is not None:
            return refusal
        if self.requests is not None:
            self.requests.take(num_requests, now)
        self.num_in_flight += num_requests
        return None

    def try_acquire_tokens(self, num_tokens: int, now: float) -> LimitRefusal | None:
        """The second half, once the prompt is tokenized: the token rate (nothing charged when
        refused; the caller then `cancel`s the first half)."""
        refusal = _bucket_refusal(self.tokens, num_tokens, "tokens_per_minute", now)
        if refusal is None and self.tokens is not None:
            self.tokens.take(num_tokens, now)
        return refusal

    def cancel(self, num_requests: int, num_tokens: int, now: float) -> None:
        """Undo a charge of requests that never reached the engine (`num_tokens` of it taken)."""
        self.num_in_flight = max(0, self.num_in_flight - num_requests)
        if self.requests is not None and num_requests:
            self.requests.give_back(num_requests, now)
        if self.tokens is not None and num_tokens:
            self.tokens.give_back(num_tokens, now)

    def debit_tokens(self, num_tokens: int, now: float) -> None:
        """Take tokens counted after the work (e.g. /tokenize's): never refused, so the bucket
        may go below empty and the key's next requests wait until it refills."""
        if self.tokens is not None and num_tokens > 0:
            self.tokens.take(num_tokens, now)

    def release(self, unused_tokens: int, now: float, refund_request: bool = False) -> None:
        """One engine request ended; refund the tokens it was charged but did not use (and,
        with `refund_request`, its place in the request rate: it never reached the engine)."""
        self.num_in_flight = max(0, self.num_in_flight - 1)
        if self.tokens is not None and unused_tokens > 0:
            self.tokens.give_back(unused_tokens, now)
        if self.requests is not None and refund_request:
            self.requests.give_back(1, now)


def _bucket_refusal(bucket: TokenBucket | None, amount: float, name: str, now: float) -> LimitRefusal | None:
    if bucket is None:
        return None
    wait = bucket.wait_time(amount, now)
    if math.isinf(wait):
        return LimitRefusal("request_too_large", name,
                            f"the request needs {amount:g} against {name}; this key's bucket holds at "
                            f"most {bucket.capacity:g}", None)
    if wait > 0:
        return LimitRefusal("rate_limited", name,
                            f"rate limit reached for {name} (limit {bucket.rate * 60:g}/min, this "
                            f"request needs {amount:g}); retry after {math.ceil(wait)} s",
                            max(1, math.ceil(wait)))
    return None
