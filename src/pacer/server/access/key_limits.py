"""The serving side of per-key limits: one `KeyLimiter` (pacer.server.access.rate_limit) per API key
that has limits, made on the key's first request; refusals become OpenAI-shaped 429s with
`Retry-After` computed from the bucket. Runs on the event loop only (no locking).
"""

from __future__ import annotations

from pacer.server.access.keys import APIKey
from pacer.server.access.rate_limit import KeyLimiter, LimitRefusal
from pacer.server.api.errors import APIError

__all__ = ["KeyLimiters"]


class KeyLimiters:
    def __init__(self) -> None:
        self._by_name: dict[str, KeyLimiter] = {}

    def acquire_requests(self, key: APIKey | None, num_requests: int, now: float) -> str | None:
        """Charge the key's places for `num_requests` engine requests, before any work on them;
        returns the limiter's name (for `acquire_tokens`, `cancel` and `release`), or None when
        the key has no limits. Raises a 429 APIError (nothing charged)."""
        limiter = self._limiter(key, now)
        if limiter is None:
            return None
        refusal = limiter.try_acquire_requests(num_requests, now)
        if refusal is not None:
            raise _refusal_error(refusal)
        return key.name if key is not None else None

    def acquire_tokens(self, name: str | None, num_tokens: int, now: float) -> None:
        """Charge `num_tokens` (prompt plus max_tokens, summed over the requests) to the key the
        requests were charged to; raises a 429 APIError (the tokens not charged)."""
        limiter = self._by_name.get(name) if name is not None else None
        if limiter is not None:
            refusal = limiter.try_acquire_tokens(num_tokens, now)
            if refusal is not None:
                raise _refusal_error(refusal)

    def cancel(self, name: str | None, num_requests: int, num_tokens: int, now: float) -> None:
        """Undo a charge whose requests never reached the engine (`num_tokens` of it taken)."""
        limiter = self._by_name.get(name) if name is not None else None
        if limiter is not None:
            limiter.cancel(num_requests, num_tokens, now)

    def debit_tokens(self, name: str | None, num_tokens: int, now: float) -> None:
        limiter = self._by_name.get(name) if name is not None else None
        if limiter is not None:
            limiter.debit_tokens(num_tokens, now)

    def _limiter(self, key: APIKey | None, now: float) -> KeyLimiter | None:
        if key is None or not key.has_limits:
            return None
        limiter = self._by_name.get(key.name)
        if limiter is None:
            limiter = self._by_name[key.name] = KeyLimiter(key.limits, now)
        return limiter

    def release(self, name: str | None, unused_tokens: int, now: float, refund_request: bool = False) -> None:
        """One engine request of the key ended, `unused_tokens` of its charge not used."""
        limiter = self._by_name.get(name) if name is not None else None
        if limiter is not None:
            limiter.release(unused_tokens, now, refund_request)

    def num_in_flight(self, name: str) -> int:
        limiter = self._by_name.get(name)
        return 0 if limiter is None else limiter.num_in_flight


def _refusal_error(r: LimitRefusal) -> APIError:
    headers = {} if r.retry_after_s is None else {"Retry-After": str(r.retry_after_s)}
    return APIError(429, r.message, "rate_limit_error", None, r.reason, headers)
