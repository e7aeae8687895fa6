"""What the source's timestamps say about interference: other requests' long prefills (the
head-of-line block and the ITL stalls they cause) and the number running over time (whether a
request waited while fewer than max_num_seqs ran, i.e. KV or the budget held admissions)."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence

from pacer.diagnose.records import Record

__all__ = ["long_prefills", "covered", "RunningTimeline", "LONG_PREFILL_FACTOR", "LONG_PREFILL_MIN"]

LONG_PREFILL_FACTOR, LONG_PREFILL_MIN = 4, 256


def long_prefills(records: Sequence[Record]) -> list[tuple[float, float, int]]:
    """(start, end, index) of the prefill phases of long prompts (>= 4x the median uncached prompt
    and >= 256 tokens), from the source's timestamps."""
    if not records or any(r.arrival is None for r in records):
        return []
    med = statistics.median(r.uncached_prompt_tokens for r in records)
    limit = max(LONG_PREFILL_MIN, LONG_PREFILL_FACTOR * med)
    out = []
    for i, r in enumerate(records):
        if r.uncached_prompt_tokens >= limit:
            start = r.scheduled_at if r.scheduled_at is not None else r.arrival
            end = r.first_token_at
            if start is not None and end is not None and end > start:
                out.append((start, end, i))
    return out


def covered(a: float, b: float, intervals: Sequence[tuple[float, float, int]], skip: int) -> float:
    """Fraction of [a, b] covered by the union of `intervals` (leaving out index `skip`)."""
    if b <= a:
        return 0.0
    spans = sorted((max(a, s), min(b, e)) for s, e, i in intervals if i != skip and e > a and s < b)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total / (b - a)


class RunningTimeline:
    """Requests between first scheduled and finish, as a step function of time."""

    def __init__(self, records: Sequence[Record]) -> None:
        events: list[tuple[float, int]] = []
        for r in records:
            if r.scheduled_at is not None and r.finished_at is not None:
                events += [(r.scheduled_at, 1), (r.finished_at, -1)]
        events.sort(key=lambda e: (e[0], e[1]))
        self.times: list[float] = []
        self.counts: list[int] = []
        cur = 0
        for t, d in events:
            cur += d
            if self.times and self.times[-1] == t:
                self.counts[-1] = cur
            else:
                self.times.append(t)
                self.counts.append(cur)

    @property
    def peak(self) -> int:
        return max(self.counts, default=0)

    def share_below(self, a: float, b: float, limit: int) -> float:
        """Fraction of [a, b] during which fewer than `limit` requests ran."""
        if b <= a:
            return 0.0
        lo, hi = bisect.bisect_right(self.times, a), bisect.bisect_left(self.times, b)
        points = [a, *self.times[lo:hi], b]
        below = 0.0
        for s, e in zip(points, points[1:]):
            k = bisect.bisect_right(self.times, s) - 1
            if (self.counts[k] if k >= 0 else 0) < limit:
                below += e - s
        return below / (b - a)
