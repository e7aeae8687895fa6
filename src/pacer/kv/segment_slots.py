"""The KV manager's segment operations (`KVCacheManager` inherits them): store a computed span of a
request's prompt in the segment store (`pacer.kv.segment_store`), fill a request's blocks from a
stored segment, and keep approximate KV out of the prefix cache. Pure Python.

A filled request's KV from the fill on is approximate (the segment's K re-rotated, computed after
another history), so its blocks from the one holding the fill's first token on are never inserted
into the prefix cache: a later request matching the same prefix gets exact KV or computes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pacer.kv.block_pool import BlockPool
from pacer.kv.interface import PrefixCacheProtocol
from pacer.kv.segment_store import SegmentCopy, SegmentEntry, SegmentStore, token_slots
from pacer.kv.tiers.segment_offload import SegmentOffload
from pacer.request import Request

__all__ = ["SegmentSlots"]


class SegmentSlots:
    """Mixed into `KVCacheManager`, whose attributes these are."""

    block_size: int
    pool: BlockPool
    cache: PrefixCacheProtocol
    segments: SegmentStore
    segment_offload: SegmentOffload | None
    block_tables: dict[str, list[int]]
    _exact_limits: dict[str, int]   # request id -> tokens of its KV that are exact (cacheable)

    if TYPE_CHECKING:   # the manager's
        def _owner(self, req: Request) -> str: ...
        def _owners(self, req: Request) -> tuple[str, ...]: ...
        def _release(self, block_ids: list[int], reason: str) -> None: ...

    def find_segment(self, req: Request, token_ids: Sequence[int]) -> SegmentEntry | None:
        """The stored segment with these tokens that `req` may read (its own namespaces only); one
        the host tier holds is promoted back into the store first (fresh blocks taken from the free
        list or the prefix cache's evictable ones, filled by this step's copies), when they fit."""
        found = self.segments.find(token_ids, self._owners(req))
        if found is not None or self.segment_offload is None:
            return found
        demoted = self.segment_offload.find(token_ids, self._owners(req))
        if demoted is None:
            return None
        blocks = self._store_blocks(len(token_ids))
        return None if blocks is None else self.segment_offload.promote(*demoted, blocks)

    def _store_blocks(self, num_tokens: int) -> list[int] | None:
        """Blocks for a segment of `num_tokens` tokens from the free list or the prefix cache's
        evictable ones (never another segment's or a request's); None: they do not fit."""
        need = self.segments.blocks_for(num_tokens)
        if need > self.pool.num_free_blocks + self.cache.num_evictable_blocks:
            return None
        short = need - self.pool.num_free_blocks
        if short > 0:
            self._release(self.cache.evict(short), "capacity")
        return self.pool.allocate(need)

    def store_segment(self, req: Request, start: int, num_tokens: int) -> SegmentCopy | None:
        """After a step that computed `req`'s prompt span [start, start + num_tokens): keep a copy
        of its KV in the segment store, in blocks taken from the free list or the prefix cache's
        evictable ones (never from another segment or a request). None: nothing to store (off,
        stored already, not computed, approximate itself, or no room)."""
        store, bs, rid = self.segments, self.block_size, req.request_id
        table = self.block_tables.get(rid)
        end = start + num_tokens
        if not store.enabled or not table or num_tokens < 1 or end > min(req.num_computed_tokens, len(table) * bs):
            return None
        if end > self._exact_limits.get(rid, end):
            return None   # its KV there is a fill: the store has the segment it came from
        tokens = req.prompt_token_ids[start:end]
        owner = self._owner(req)
        if store.find(tokens, (owner,)) is not None:
            return None
        blocks = self._store_blocks(num_tokens)
        if blocks is None:
            return None
        store.await_save(store.adopt(owner, tokens, blocks, start))
        return SegmentCopy(token_slots(table, start, num_tokens, bs), token_slots(blocks, 0, num_tokens, bs), 0)

    def fill_segment(self, req: Request, entry: SegmentEntry, offset: int, num_tokens: int) -> SegmentCopy:
        """`req`'s next `num_tokens` positions (from its computed tokens; its blocks allocated) take
        `entry`'s tokens [offset, offset + num_tokens), K re-rotated to the new positions. Its KV
        is approximate from here on: no block from the fill's first on enters the prefix cache.
        The caller locks `entry` until the copy has run."""
        rid, bs, start = req.request_id, self.block_size, req.num_computed_tokens
        table = self.block_tables.get(rid, [])
        if offset < 0 or num_tokens < 1 or offset + num_tokens > entry.num_tokens:
            raise ValueError(f"fill of tokens [{offset}, {offset + num_tokens}) of a {entry.num_tokens}-token segment")
        if start + num_tokens > len(table) * bs:
            raise ValueError(f"request {rid}: fill to {start + num_tokens} tokens past its {len(table)} blocks")
        self._exact_limits[rid] = min(self._exact_limits.get(rid, start), start)
        self.segments.stats.reuses += 1
        self.segments.stats.reused_tokens += num_tokens
        self.segments.stats.recomputed_tokens += offset   # the segment's tokens before the fill were computed
        return SegmentCopy(token_slots(entry.block_ids, offset, num_tokens, bs), token_slots(table, start, num_tokens, bs),
                           start - (entry.position + offset))

    def exact_blocks(self, request_id: str, num_blocks: int) -> int:
        """Of a request's first `num_blocks` blocks, how many hold only exact KV (cacheable)."""
        limit = self._exact_limits.get(request_id)
        return num_blocks if limit is None else min(num_blocks, limit // self.block_size)

    def exact_tokens(self, req: Request) -> int:
        """Tokens of `req` whose KV is (or will be) exact: all of them until a fill."""
        return self._exact_limits.get(req.request_id, req.num_tokens)

    def _segment_blocks(self) -> list[int]:
        return [b for e in self.segments.iter_entries() for b in e.block_ids]
