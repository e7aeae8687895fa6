"""The KV manager's prefix-cache operations (`KVCacheManager` inherits them): look up a waiting
request's cached prefix (`lookup_prefix`, no references taken) and commit it with the allocation,
share a running request's completed blocks as they are computed and the rest when it lets them go,
prewarmed and pinned prefixes, session retention, quotas, resets, TTL expiry and the block events.
Pure Python.

Holders of a block: each request whose table lists it, plus the cache node that owns it. Only the
manager changes ref counts: a committed hit adds the request's ref, `insert` reports the blocks the
cache adopted (one ref each), eviction drops the cache's ref (`_release`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pacer.kv.block_pool import BlockPool
from pacer.kv.events import BlockEvent, BlockEventLog
from pacer.kv.interface import PrefixCacheProtocol, PrefixOffloadProtocol
from pacer.kv.prefix_cache import PUBLIC, PrefixMatch
from pacer.kv.retention import SessionRetention
from pacer.kv.segment_store import SegmentStore
from pacer.kv.tenancy import TenantSpaces
from pacer.kv.tiers.swap import CpuSwapTier
from pacer.request import FinishReason, Request, TokenPrefix

__all__ = ["KVStats", "PrefixHit", "PrefixSlots"]


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """A looked-up cached prefix of a waiting request: no references taken until
    `allocate_slots` commits it (with the allocation), so a request that cannot be admitted
    after all has nothing to give back."""

    match: PrefixMatch
    num_tokens: int            # tokens it serves (whole blocks, short of the request's last token)
    num_queried_tokens: int    # the request's tokens looked up (counted when committed; 0 without a cache)
    promoted: tuple[tuple[int, int], ...] = ()   # host-tier blocks continuing `match`: (chain key, host slot)



@dataclass(slots=True)
class KVStats:
    """Engine-level counters (monotonic); `Engine.snapshot()` exports them."""

    queried_tokens: int = 0       # tokens looked up in the prefix cache at admission
    hit_tokens: int = 0           # of those, served from the cache
    evicted_blocks: dict[str, int] = field(default_factory=lambda: {"capacity": 0, "ttl": 0, "quota": 0,
                                                                 "release": 0})
    swap_out_requests: int = 0
    swap_out_blocks: int = 0
    swap_in_requests: int = 0
    swap_in_blocks: int = 0
    swap_fallbacks: int = 0       # swap preemptions that had to recompute (tier full)


class PrefixSlots:
    """Mixed into `KVCacheManager`, whose attributes these are."""

    block_size: int
    pool: BlockPool
    cache: PrefixCacheProtocol
    offload: PrefixOffloadProtocol
    tenants: TenantSpaces
    retention: SessionRetention
    segments: SegmentStore
    swap: CpuSwapTier
    stats: KVStats
    queue_aware_eviction: bool
    block_tables: dict[str, list[int]]
    pins: dict[tuple[int, ...], PrefixMatch]
    _handles: dict[str, PrefixMatch]
    _public_ids: set[str]
    _pin_ids: set[str]
    _deferred_quota: list[str]
    _exact_limits: dict[str, int]

    if TYPE_CHECKING:   # the manager's and SegmentSlots'
        def num_available_blocks(self, tenant: str | None = None) -> int: ...
        def exact_blocks(self, request_id: str, num_blocks: int) -> int: ...

    def cache_owner(self, req: Request) -> str:
        """The cache namespace the request's blocks are stored under (tenant isolation, salt)."""
        return self._owner(req)

    def cache_owners(self, req: Request) -> tuple[str, ...]:
        """The namespaces the request may read cached blocks from."""
        return self._owners(req)

    def _owner(self, req: Request) -> str:
        return self.tenants.owner(req, req.request_id in self._public_ids)

    def _owners(self, req: Request) -> tuple[str, ...]:
        return self.tenants.owners(req, req.request_id in self._public_ids)

    def lookup_prefix(self, req: Request) -> PrefixHit | None:
        """On admission (or resume after recompute preemption): the longest cached prefix of
        the request's tokens, in whole blocks and short of its last token (whose logits are
        needed), continued by the host tier's blocks. Takes no references; None when the
        request holds blocks."""
        if req.request_id in self.block_tables:
            return None
        max_blocks = (req.num_tokens - 1) // self.block_size
        tokens = req.token_ids_slice(0, req.num_tokens)
        match = self.cache.match_prefix(tokens, self._owners(req), max_blocks, req.tenant)
        promoted: tuple[tuple[int, int], ...] = ()
        hits = self.offload.lookup(match.node, match.num_blocks, tokens, self._owners(req), max_blocks)
        if hits:
            room = self.num_available_blocks(req.tenant) - self.cache.evictable_on_path(
                match, self.tenants.evict_groups(req.tenant))   # what is left once the match is locked
            promoted = tuple(hits[:max(0, room)])
        num_tokens = (match.num_blocks + len(promoted)) * self.block_size
        return PrefixHit(match, num_tokens, req.num_tokens if self.cache.enabled else 0, promoted)

    def cached_prefix_tokens(self, req: Request) -> int:
        """Device-tier tokens `lookup_prefix` would find for `req` now, without splitting the
        tree or taking references (for ordering by it). With `queue_aware_eviction` the look-up
        touches the matched path for the request's tenant: the queue's demand keeps its
        prefixes recent, so a prefix a waiting request will read is evicted after those no one
        waits for."""
        if req.request_id in self.block_tables:
            return 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        tokens = req.token_ids_slice(0, req.num_tokens)
        demand = req.tenant if self.queue_aware_eviction else None
        return self.cache.lookup_blocks(tokens, self._owners(req), max_blocks, demand) * self.block_size

    def _commit_hit(self, req: Request, hit: PrefixHit) -> None:
        """The request holds and locks the hit's device blocks, and its host-tier blocks are
        promoted (locked before the allocation that follows may evict and demote); the
        look-up counts in the stats."""
        self.stats.queried_tokens += hit.num_queried_tokens
        self.stats.hit_tokens += hit.num_tokens
        if req.session is not None:
            req.metrics.retention_hit_tokens = self.retention.on_return(
                req.tenant, req.session, hit.num_tokens, self.block_size)
        if hit.match.block_ids:
            self.cache.lock(hit.match)
            self._handles[req.request_id] = hit.match
            self.pool.incref(hit.match.block_ids)
            self.block_tables[req.request_id] = list(hit.match.block_ids)
        if hit.promoted:
            self.offload.commit(req.request_id, list(hit.promoted))

    def mark_prewarm(self, request_id: str, public: bool, pin: bool = True) -> None:
        """Before the request is first scheduled: when it finishes, its prompt's blocks are
        cached as public (visible to every tenant) and/or pinned (never evicted)."""
        if public:
            self._public_ids.add(request_id)
        if pin:
            self._pin_ids.add(request_id)

    def unpin(self, token_ids: list[int] | None = None) -> int:
        """Unpin one prewarmed prefix (by its token ids) or all; returns how many."""
        keys = list(self.pins) if token_ids is None else [k for k in self.pins if list(k) == list(token_ids)]
        for key in keys:
            self.cache.unpin(self.pins.pop(key))
        return len(keys)

    def enable_events(self) -> BlockEventLog | None:
        """Start recording the prefix cache's store/remove events, the host tier's (medium CPU)
        and the segment store's (medium SEGMENT) in the same log; None without prefix caching
        (no events to record)."""
        log = self.cache.enable_events()
        self.offload.record_events(log)
        self.segments.record_events(log)
        return log

    def take_events(self) -> list[BlockEvent]:
        """The store/remove events since the last call, in order (empty when not enabled)."""
        return self.cache.take_events()

    def reset_prefix_cache(self) -> int:
        """Drop every cached block no request uses (vLLM's reset_prefix_cache; pinned prefixes
        stay). Each dropped block is reported as removed. Returns how many were dropped."""
        freed = self.cache.evict(self.cache.num_evictable_blocks) + self.segments.clear()
        self._release(freed, "capacity")
        return len(freed)

    def drop_expired(self) -> None:
        """Proactively drop cache nodes idle longer than the TTL (cheap when nothing is due)."""
        self.retention.expire()
        self._release(self.cache.expire() + self.segments.expire(), "ttl")
        self.retention.sync_dropped()

    def release_session(self, tenant: str, session: str) -> int:
        """Close the session's retention window and free its conversation's unused blocks now
        (what a `kv_retention: {"release": true}` hint does); returns how many were freed."""
        freed = self.retention.release(tenant, session)
        self._release(freed, "release")
        return len(freed)

    def _release(self, block_ids: list[int], reason: str) -> None:
        if block_ids:
            self.pool.free(block_ids)
            self.stats.evicted_blocks[reason] = self.stats.evicted_blocks.get(reason, 0) + len(block_ids)

    def _cache_progress(self, req: Request) -> None:
        """Share a running request's newly completed blocks at once (not only when it
        finishes), so requests admitted meanwhile hit them. The request's lock moves to the
        deeper node, keeping what it uses out of eviction."""
        rid = req.request_id
        table = self.block_tables.get(rid)
        if not table:
            return
        n_full = min(req.num_computed_tokens // self.block_size, len(table))
        if self._exact_limits:
            n_full = self.exact_blocks(rid, n_full)
        old = self._handles.get(rid)
        if n_full <= (old.num_blocks if old else 0) or self.swap.holds(rid) or rid in self._public_ids:
            return   # the common case first: no block completed since the last step
        # locked as inserted: old's lock moves down (relock: lock(handle) then unlock(old), walking only the new nodes)
        self._handles[rid] = self._insert(req, table, n_full, old, self._owner(req), self._owners(req), lock=True)

    def _insert(self, req: Request, table: list[int], n_full: int, start: PrefixMatch | None,
                owner: str, owners: tuple[str, ...], lock: bool = False) -> PrefixMatch:
        """Cache the request's first `n_full` blocks under `owner`, reusing nodes of `owners`
        (the cache adopts the blocks it lacks); `lock`: see `PrefixCacheProtocol.insert`."""
        tokens = TokenPrefix(req.prompt_token_ids, req.output_token_ids, n_full * self.block_size)   # no copy
        adopted, handle = self.cache.insert(tokens, table, owner, req.tenant, start=start, owners=owners, lock=lock)
        self.pool.incref(adopted)
        return handle

    def _cache_request(self, req: Request, table: list[int], start: PrefixMatch | None) -> PrefixMatch | None:
        rid = req.request_id
        n_full = self.exact_blocks(rid, min(req.num_computed_tokens // self.block_size, len(table)))
        owner, owners = self._owner(req), self._owners(req)   # a public prewarm walks public nodes only
        self._public_ids.discard(rid)
        if n_full == 0:
            self._pin_ids.discard(rid)
            return None
        handle = self._insert(req, table, n_full, start, owner, owners)
        if rid in self._pin_ids:
            self._pin_ids.discard(rid)
            key = tuple(req.prompt_token_ids[: n_full * self.block_size])
            if key not in self.pins and self.cache.pin(handle):
                self.pins[key] = handle
        if self.tenants.partitioned and owner != PUBLIC:
            group = self.tenants.quota_group(req.tenant)
            if self.cache.cached_blocks(group) > self.tenants.quota(group):
                self._deferred_quota.append(group)
        return handle

    def _retain_session(self, req: Request, handle: PrefixMatch | None) -> None:
        """A finished turn of a named session retains its conversation; with a release hint it
        closes the session's window and drops the conversation's unused blocks now."""
        if req.session is None or req.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH):
            return
        if req.retention_release:
            node = handle.node if handle is not None and handle.num_blocks else None
            self._release(self.retention.release(req.tenant, req.session, node), "release")
        elif handle is not None:
            self.retention.open(req.tenant, req.session, handle, req.retention_ttl)

    def _enforce_quotas(self) -> None:
        while self._deferred_quota:
            group = self._deferred_quota.pop()
            over = self.cache.cached_blocks(group) - self.tenants.quota(group)
            if over > 0:
                self._release(self.cache.evict(over, [group]), "quota")
