"""Segment reuse as a scheduling decision (pure Python): where a prefilling request's chunk stops,
when its blocks are filled from the segment store instead of computed, and which computed segments
are stored.

A request carries segments (prompt spans: tool outputs, documents; `Request.segments`). When the
KV manager's segment store (`pacer.kv.segment_store`) holds a segment's tokens in a namespace the
request may read, the request computes its tokens up to the segment's start plus `k` recomputed
tokens (the first tokens of the segment, with the real context before them: EPIC's rule, which
restores the attention sink at the segment's start), then takes the rest of the segment from the
store in one fill (a copy the executor runs before the step's forward, K re-rotated by RoPE to the
new positions), and computes everything after the segment normally. The one token rule holds: a
fill advances `num_computed_tokens` without computing, like a prefix-cache hit in the middle.

How many tokens to recompute is a scheduling decision above the operator's floor: `k` is at least
`ceil(recompute * length)` (with `auto`, `AUTO_RECOMPUTE` of it), and grows toward
`MAX_RECOMPUTE` of the segment by what the policy allows the request (`recompute_allowance`: the
slo policy spends a share of its TTFT slack; the others nothing, so their `k` is the floor), never
past this step's chunk for it (a larger `k` never costs the request a step). The last prompt token
is always computed (its logits are needed). A segment a request computes in full
(none stored yet, or reuse off for it) is stored after the step that completes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from pacer.kv.manager import KVCacheManager, PrefixHit
from pacer.kv.segment_store import SegmentCopy, SegmentEntry
from pacer.request import Request
from pacer.sched.contract import ScheduledRequest

if TYPE_CHECKING:
    from pacer.clock import Clock
    from pacer.sched.policy import Policy

__all__ = ["SegmentPlanner", "AUTO_RECOMPUTE", "MAX_RECOMPUTE", "FillPlan"]

# fraction recomputed with segment_recompute="auto": on the agent benchmark KL to full prefill halves
# from k = 0 to 5% and barely moves past it (docs/features/segment-reuse.md)
AUTO_RECOMPUTE = 0.05
# the most of a segment the scheduler recomputes on its own (more buys little: 15% -> 30% moves KL
# 0.0071 -> 0.0064 on the agent benchmark); a higher floor is the operator's
MAX_RECOMPUTE = 0.3

FillPlan = tuple[int, int, SegmentEntry | None, int]   # (tokens filled, tokens computed, entry, offset in it)


class SegmentPlanner:
    """The scheduler's segment decisions for one engine; a no-op when the store is off."""

    def __init__(self, kv: KVCacheManager, recompute: float | str = "auto", policy: Policy | None = None,
                 clock: Clock | None = None) -> None:
        """`policy` and `clock`: whose `recompute_allowance` lifts `k` above the floor (None: never)."""
        self.kv = kv
        self.policy, self.clock = policy, clock
        self.enabled = kv.segments.enabled
        self.fraction = AUTO_RECOMPUTE if recompute == "auto" else float(recompute)
        self._fills: dict[str, tuple[SegmentCopy, SegmentEntry, int, int]] = {}   # this step's, by request
        self._saves: list[SegmentCopy] = []
        self._locked: list[SegmentEntry] = []

    def active(self, req: Request) -> bool:
        return self.enabled and bool(req.segments) and req.segment_reuse != "off"

    def recompute_tokens(self, num_tokens: int, extra: int = 0) -> int:
        """k: tokens of a reused segment of `num_tokens` computed with the real context: the floor,
        plus up to `extra` more while under `MAX_RECOMPUTE` of it."""
        floor = min(num_tokens, math.ceil(self.fraction * num_tokens))
        top = max(floor, math.ceil(MAX_RECOMPUTE * num_tokens))
        return min(num_tokens, floor + max(0, min(extra, top - floor)))

    def allowance(self, req: Request) -> int:
        """Tokens the policy lets `req` recompute above the floor now."""
        if self.policy is None or self.clock is None:
            return 0
        return self.policy.recompute_allowance(req, self.clock.now())

    def end_step(self) -> None:
        """The step's fills have run: their segments may be evicted again."""
        if not self._locked and not self._fills:
            return
        for entry in self._locked:
            self.kv.segments.unlock(entry)
        self._locked.clear()
        self._fills.clear()

    def plan(self, req: Request, computed: int, n: int) -> FillPlan:
        """Of a chunk of `n` tokens from `computed`: how many tokens to fill first from which stored
        segment (and from where in it), and how many to compute after (never past the next reused
        segment's recompute boundary)."""
        fill, entry, offset = 0, None, 0
        last = req.num_prompt_tokens - 1   # the last prompt token is always computed
        allowance: int | None = None
        for start, length in req.segments:   # sorted, disjoint
            at = computed + fill
            end = min(start + length, last)
            if end <= at:
                continue
            if start >= at + n:
                break
            k = self.recompute_tokens(length)
            if start + k >= end:
                continue
            found = self.kv.find_segment(req, req.prompt_token_ids[start:start + length])
            if found is None:
                continue   # computed in full here, and stored after
            if at < start + k < at + n:   # this step's chunk reaches past the floor: recompute more?
                allowance = self.allowance(req) if allowance is None else allowance
                k = self.recompute_tokens(length, min(allowance, at + n - start - k))
            boundary = min(start + k, end - 1)
            if at < boundary:
                return fill, min(n, boundary - at), entry, offset
            if fill:
                break   # one fill a step
            fill, entry, offset = end - at, found, at - start
            n = min(n, req.num_tokens - end)
        return fill, n, entry, offset

    def fill_or_stop(self, req: Request, computed: int, n: int, hit: PrefixHit | None
                     ) -> tuple[list[int] | None, int]:
        """A chunk of `n` tokens of `req` from `computed` (its looked-up `hit`, when admitted): with a
        fill that fits, the blocks allocated for it and the chunk after it (the fill committed, the
        hit too); else None and the chunk to compute, stopped at the next reused segment's boundary
        (a fill that does not fit is computed instead)."""
        if not self.active(req):
            return None, n
        plan = self.plan(req, computed, n)
        if not plan[0]:
            return None, plan[1]
        blocks = self._allocate_fill(req, plan, hit, computed)
        return blocks, plan[1] if blocks is not None else n

    def _allocate_fill(self, req: Request, plan: FillPlan, hit: PrefixHit | None, computed: int) -> list[int] | None:
        """Blocks for a planned fill and the chunk after it, its segment locked through the
        allocation (look up, then commit); never preempting: the request and the segment it copies
        may not fit together. None: nothing changed."""
        self.hold(plan)
        blocks = self.kv.allocate_slots(req, plan[0] + plan[1], hit)
        if blocks is None:
            self.release(req, plan)
            return None
        req.num_computed_tokens = computed
        self.commit(req, plan)
        return blocks

    def hold(self, plan: FillPlan) -> None:
        """Lock a planned fill's segment through the allocation for it (which may evict what is
        unlocked): then `commit`, or `release` when the allocation failed."""
        if plan[2] is not None:
            self.kv.segments.lock(plan[2])
            self._locked.append(plan[2])

    def release(self, req: Request, plan: FillPlan) -> None:
        """The allocation for `req`'s held fill failed: its segment may be evicted again."""
        if plan[2] is not None:
            self._locked.remove(plan[2])
            self.kv.segments.unlock(plan[2])

    def commit(self, req: Request, plan: FillPlan) -> None:
        """The held fill's blocks are allocated: record the copy (its segment stays locked until it
        has run) and advance the request's computed tokens past it."""
        fill, _, entry, offset = plan
        if not fill or entry is None:
            return
        copy = self.kv.fill_segment(req, entry, offset, fill)
        self._fills[req.request_id] = (copy, entry, fill, offset)
        req.num_computed_tokens += fill
        req.metrics.segment_reused_tokens += fill
        req.metrics.segment_recomputed_tokens += offset

    def cancel(self, req: Request) -> None:
        """`req` is preempted in the step that planned its fill: the copy is dropped and its
        computed tokens rolled back (a swap-out keeps only KV that exists)."""
        got = self._fills.pop(req.request_id, None) if self._fills else None
        if got is None:
            return
        _, entry, fill, offset = got
        req.num_computed_tokens -= fill
        req.metrics.segment_reused_tokens -= fill
        req.metrics.segment_recomputed_tokens -= offset
        self.kv.segments.stats.uncount_fill(fill, offset)
        self._locked.remove(entry)
        self.kv.segments.unlock(entry)

    def after_step(self, rows: list[ScheduledRequest], get: Callable[[str], Request | None]) -> None:
        """The step's fills ran (their segments are unlocked); each segment a prefill chunk of the
        step completed is stored (`get`: the request of an id, None once it is gone)."""
        if not self.enabled:
            return
        self.end_step()
        for sr in rows:
            req = get(sr.request_id) if sr.is_prefill else None
            if req is None or not req.segments:
                continue
            chunk_start, chunk_end = sr.start_position, sr.start_position + sr.num_tokens
            for start, length in req.segments:
                if chunk_start < start + length <= chunk_end:
                    copy = self.kv.store_segment(req, start, length)
                    if copy is not None:
                        self._saves.append(copy)

    def take_copies(self) -> tuple[list[SegmentCopy], list[SegmentCopy]]:
        """The copies for this step's executor: saves (queued since the last step), then fills."""
        if not self._saves and not self._fills:
            return [], []
        saves, self._saves = self._saves, []
        self.kv.segments.saves_taken()
        return saves, [copy for copy, _, _, _ in self._fills.values()]
