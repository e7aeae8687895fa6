"""The segment store: KV of prompt spans kept for reuse away from their prefix. Pure Python.

A segment is a span of a prompt (a tool output, a document) that other requests may carry at
another position after another history; the prefix cache cannot share it because its blocks never
match as a prefix. The store keeps one copy of a segment's KV in its own paged blocks of the same
pool, block-aligned from the segment's first token, keyed by a fingerprint of its owner namespace
(tenant isolation and cache salt, as the prefix cache's) and its tokens. The tokens are kept too:
a look-up compares them, so a fingerprint collision never hands out another segment's KV, and a
look-up only sees the namespaces the caller passes (a request's readable owners), so reuse never
crosses tenants.

Contract (the prefix cache's): `find` takes no references; `adopt` takes blocks the caller
allocated (the store becomes their one holder); `lock`/`unlock` keep an entry from eviction while
a copy out of it is pending; `evict(n)` drops least recently used unlocked entries and `expire()`
those unused for longer than the TTL (the prefix cache's `cache_ttl`), each returning their block
ids, which the caller frees (with a host tier, `on_drop` demotes each dropped segment first:
`pacer.kv.tiers.segment_offload`). The store never touches the pool or requests. Evictable
and cached block counts are kept incrementally (O(1) "can I admit this?").
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from pacer.kv.events import (
    HASH_MASK,
    MEDIUM_SEGMENT,
    BlockEventLog,
    BlockRemovedEvent,
    BlockStoredEvent,
    chain_hashes,
    namespace_keys,
)

__all__ = ["SegmentEntry", "SegmentStore", "SegmentCopy", "segment_fingerprint", "token_slots"]



def segment_fingerprint(owner: str, token_ids: Sequence[int]) -> int:
    """A stable 64-bit fingerprint of a segment's tokens inside one owner namespace."""
    h = hashlib.blake2b(owner.encode(), digest_size=8)
    h.update(b"\0")
    h.update(b"".join(t.to_bytes(4, "little") for t in token_ids))
    return int.from_bytes(h.digest(), "little")


@dataclass(slots=True, eq=False)
class SegmentEntry:
    """One stored segment: its tokens' KV in `block_ids` (token i at block i // block_size,
    offset i % block_size), computed at positions `position`, `position + 1`, ..."""

    fingerprint: int
    owner: str
    token_ids: tuple[int, ...]
    block_ids: list[int]
    position: int
    lock_ref: int = 0
    num_reuses: int = 0
    last_used: float = field(default=0.0)
    hashes: tuple[int, ...] = ()   # its whole blocks' identities in KV events (when the engine publishes them)
    written: bool = True           # False from a store until the step carrying its save copy is handed out

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(slots=True)
class SegmentStats:
    """Monotonic counters (`Engine.snapshot()` may export them)."""

    stored: int = 0             # segments adopted
    stored_tokens: int = 0
    reuses: int = 0             # fills out of the store
    reused_tokens: int = 0      # tokens copied (re-rotated) instead of computed
    recomputed_tokens: int = 0  # of the reused segments, the tokens computed before each fill
    evicted: int = 0
    demoted: int = 0            # evicted segments kept whole in the host tier (kv_offloading_size)
    promoted: int = 0           # segments copied back from the host tier on a look-up

    def uncount_fill(self, num_tokens: int, recomputed: int) -> None:
        """A counted fill was cancelled before it ran (its request preempted in the same step)."""
        self.reuses -= 1
        self.reused_tokens -= num_tokens
        self.recomputed_tokens -= recomputed


class SegmentStore:
    """Stored segments by fingerprint; `enabled=False` is the null store (finds nothing, adopts nothing)."""

    def __init__(self, block_size: int, now: Callable[[], float], enabled: bool = True,
                 recompute: float | str = "auto", ttl: float | None = None) -> None:
        """`recompute`: the operator's `segment_recompute` (the scheduler's planner reads it);
        `ttl`: seconds an unlocked segment may go unused before `expire` drops it (None: never)."""
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        if ttl is not None and not ttl > 0:
            raise ValueError(f"segment ttl must be > 0 seconds, got {ttl!r}")
        self.ttl = ttl
        self.block_size = block_size
        self.enabled = enabled
        self.recompute = recompute
        self._now = now
        self._entries: dict[int, SegmentEntry] = {}
        self._evictable: OrderedDict[int, SegmentEntry] = OrderedDict()   # unlocked, least recently used first
        self.num_cached_blocks = 0
        self.num_evictable_blocks = 0
        self.stats = SegmentStats()
        self.events: BlockEventLog | None = None   # KV events (medium SEGMENT), when the engine publishes them
        self.on_drop: Callable[[SegmentEntry], None] | None = None   # the host tier's demotion, when there is one
        self._unwritten: list[SegmentEntry] = []   # stored, their save copies not handed to an executor yet

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, token_ids: Sequence[int], owners: Sequence[str]) -> SegmentEntry | None:
        """The stored segment with exactly these tokens in one of `owners` (first wins); no refs."""
        if not self._entries:
            return None
        tokens = tuple(token_ids)
        for owner in owners:
            entry = self._entries.get(segment_fingerprint(owner, tokens))
            if entry is not None and entry.owner == owner and entry.token_ids == tokens:
                return entry
        return None

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def adopt(self, owner: str, token_ids: Sequence[int], block_ids: list[int], position: int,
              promoted: bool = False) -> SegmentEntry:
        """Keep `block_ids` (the caller allocated them, one ref each, and copies the KV in) as the
        segment `token_ids` of `owner` computed from `position` (`promoted`: copied back from the
        host tier, counted there, not as stored). Raises ValueError when the store is off, the
        blocks do not fit the tokens, or the segment is stored already."""
        tokens = tuple(token_ids)
        if not self.enabled:
            raise ValueError("segment store is off (segment_reuse != 'approximate')")
        if not tokens or len(block_ids) != self.blocks_for(len(tokens)):
            raise ValueError(f"segment of {len(tokens)} tokens needs {self.blocks_for(len(tokens))} blocks, "
                             f"got {len(block_ids)}")
        fp = segment_fingerprint(owner, tokens)
        if fp in self._entries:
            raise ValueError(f"segment {fp:016x} is stored already")
        entry = SegmentEntry(fp, owner, tokens, list(block_ids), position, last_used=self._now())
        self._entries[fp] = entry
        self._evictable[fp] = entry
        self.num_cached_blocks += len(block_ids)
        self.num_evictable_blocks += len(block_ids)
        if not promoted:
            self.stats.stored += 1
            self.stats.stored_tokens += len(tokens)
        if self.events is not None:
            self._record_stored(entry)
        return entry

    def await_save(self, entry: SegmentEntry) -> None:
        """`entry`'s KV is copied in by a save the next step runs: until then it holds nothing to demote."""
        entry.written = False
        self._unwritten.append(entry)

    def saves_taken(self) -> None:
        """The queued save copies went into a step (they run before anything later reads the blocks)."""
        for entry in self._unwritten:
            entry.written = True
        self._unwritten.clear()

    def record_events(self, log: BlockEventLog | None) -> None:
        """Report stores and removals to `log` from now on (None: stop); the segments stored
        already are reported as stored at once, so a consumer's view starts complete."""
        self.events = log
        if log is not None:
            for entry in self._entries.values():
                if not entry.hashes:
                    self._record_stored(entry)

    def _record_stored(self, entry: SegmentEntry) -> None:
        whole = entry.num_tokens // self.block_size * self.block_size   # events name whole blocks only
        if not whole or self.events is None:
            return
        root = entry.fingerprint & HASH_MASK
        entry.hashes = tuple(chain_hashes(root, entry.token_ids[:whole], self.block_size, entry.owner))
        self.events.append(BlockStoredEvent(entry.hashes, None, entry.token_ids[:whole], self.block_size,
                                            namespace_keys(entry.owner), MEDIUM_SEGMENT))

    def lock(self, entry: SegmentEntry) -> None:
        if self._entries.get(entry.fingerprint) is not entry:
            raise ValueError(f"segment {entry.fingerprint:016x} is not stored")
        if entry.lock_ref == 0:
            del self._evictable[entry.fingerprint]
            self.num_evictable_blocks -= len(entry.block_ids)
        entry.lock_ref += 1
        entry.last_used = self._now()

    def unlock(self, entry: SegmentEntry) -> None:
        if entry.lock_ref <= 0:
            raise ValueError(f"segment {entry.fingerprint:016x} is not locked")
        entry.lock_ref -= 1
        entry.last_used = self._now()
        if entry.lock_ref == 0:
            self._evictable[entry.fingerprint] = entry   # most recently used: at the end (last_used order)
            self.num_evictable_blocks += len(entry.block_ids)

    def evict(self, n: int) -> list[int]:
        """Drop least recently used unlocked segments until at least `n` blocks are freed (or none
        is left); returns their block ids (the caller drops the store's ref on each)."""
        freed: list[int] = []
        while len(freed) < n and self._evictable:
            _, entry = self._evictable.popitem(last=False)
            freed.extend(self._drop(entry))
        return freed

    def expire(self) -> list[int]:
        """Drop the unlocked segments unused for longer than the TTL; returns their block ids.
        The evictable order is last-use order (adopt and unlock append), so the scan stops at
        the first one still fresh."""
        freed: list[int] = []
        if self.ttl is None or not self._evictable:
            return freed
        deadline = self._now() - self.ttl
        while self._evictable:
            fp, entry = next(iter(self._evictable.items()))
            if entry.last_used >= deadline:
                break
            del self._evictable[fp]
            freed.extend(self._drop(entry))
        return freed

    def clear(self) -> list[int]:
        """Drop every unlocked segment; returns their block ids."""
        return self.evict(self.num_evictable_blocks)

    def _drop(self, entry: SegmentEntry) -> list[int]:
        del self._entries[entry.fingerprint]
        if self.events is not None and entry.hashes:
            self.events.append(BlockRemovedEvent(entry.hashes, MEDIUM_SEGMENT))
        self.num_cached_blocks -= len(entry.block_ids)
        self.num_evictable_blocks -= len(entry.block_ids)
        self.stats.evicted += 1
        if self.on_drop is not None:
            self.on_drop(entry)
        return entry.block_ids

    def iter_entries(self) -> Iterator[SegmentEntry]:
        return iter(self._entries.values())

    def check_invariants(self) -> None:
        """Raises AssertionError when the incremental counts disagree with the entries."""
        cached = sum(len(e.block_ids) for e in self._entries.values())
        evictable = sum(len(e.block_ids) for e in self._entries.values() if e.lock_ref == 0)
        if (cached, evictable) != (self.num_cached_blocks, self.num_evictable_blocks):
            raise AssertionError(f"segment counts ({self.num_cached_blocks}, {self.num_evictable_blocks}) != "
                                 f"entries ({cached}, {evictable})")
        for fp, e in self._entries.items():
            if e.lock_ref < 0 or (e.lock_ref == 0) != (fp in self._evictable):
                raise AssertionError(f"segment {fp:016x}: lock_ref {e.lock_ref}, evictable {fp in self._evictable}")
            if e.fingerprint != fp or fp != segment_fingerprint(e.owner, e.token_ids):
                raise AssertionError(f"segment {fp:016x}: fingerprint does not match its owner and tokens")
            if len(e.block_ids) != self.blocks_for(e.num_tokens):
                raise AssertionError(f"segment {fp:016x}: {len(e.block_ids)} blocks for {e.num_tokens} tokens")
        if len(self._evictable) > len(self._entries):
            raise AssertionError("an evictable segment is not stored")


@dataclass(frozen=True, slots=True)
class SegmentCopy:
    """KV the executor copies before a step's forward, token by token (cache slot = block *
    block_size + offset): from `src_slots` to `dst_slots`, K re-rotated by RoPE from each
    source position to `position_delta` later (0: a plain copy, as when a segment is stored;
    V never changes). Saves run before swap-ins (their sources may be reused blocks), fills after."""

    src_slots: tuple[int, ...]
    dst_slots: tuple[int, ...]
    position_delta: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.src_slots)


def token_slots(block_ids: Sequence[int], start: int, num_tokens: int, block_size: int) -> tuple[int, ...]:
    """Cache slots of positions [start, start + num_tokens) of a block table."""
    return tuple(block_ids[p // block_size] * block_size + p % block_size for p in range(start, start + num_tokens))
