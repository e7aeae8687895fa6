"""KV cache manager: which blocks each request holds. Pure Python.

Owns the `BlockPool`, the per-request block tables, the prefix cache and the CPU swap tier
(`pacer.kv.tiers.swap`). The prefix cache is always there: the radix tree, or with
`enable_prefix_caching=False` the null cache that keeps nothing (`pacer.kv.interface` declares
both seams, and the host-tier offload's). The scheduler looks up cached prefixes (`lookup_prefix`,
which takes no references), asks for slots (`allocate_slots`, which commits a looked-up hit
with the allocation, or changes nothing) and returns blocks (`free`, `swap_out`); "can this
fit?" is O(1). The prefix-cache operations live in `pacer.kv.prefix_slots` and the segment
store's in `pacer.kv.segment_slots` (mixins of the manager, over its attributes).

Holders of a block: each request whose table lists it, plus the cache node that owns it.
The manager is the only one that changes ref counts: a committed hit adds the request's ref,
`insert` reports the blocks the cache adopted (one ref each), eviction drops the cache's
ref. A running request's full computed blocks are inserted as soon as they are computed
(its lock moves down the path), and the rest when it finishes, aborts or is preempted by
recompute, so concurrent requests, the next turn of a conversation and the resumed
request hit them.

Tenants (namespaces, quotas, eviction groups): `pacer.kv.tenancy`. The host tier of
`kv_offloading_size` (`pacer.kv.tiers.host`, glued to the tree by `pacer.kv.tiers.offload`):
evicted blocks are demoted to it, and a look-up continues a device match there (promoted when
committed); without one the offload is the null one, which finds nothing.

Agent sessions (`pacer.kv.retention`): a finished turn of a named session opens a retention
window on its cached conversation (an eviction tier, not a pin); the session's next turn closes
it when it commits its hit, counting the tokens the window kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from pacer.kv.block_pool import BlockPool, kept_blocks
from pacer.kv.checks import check_kv_invariants
from pacer.kv.interface import PrefixCacheProtocol, PrefixOffloadProtocol
from pacer.kv.null_cache import NullPrefixCache
from pacer.kv.prefix_cache import PrefixCache, PrefixMatch
from pacer.kv.prefix_slots import KVStats, PrefixHit, PrefixSlots
from pacer.kv.retention import SessionRetention
from pacer.kv.segment_slots import SegmentSlots
from pacer.kv.segment_store import SegmentStore
from pacer.kv.tenancy import OTHER_TENANTS, TenantSpaces, group_fn
from pacer.kv.tiers.host import HostKVTier
from pacer.kv.tiers.offload import NullOffload, PrefixOffload
from pacer.kv.tiers.segment_offload import SegmentOffload
from pacer.kv.tiers.swap import CpuSwapTier, SwapPairs
from pacer.request import Request

if TYPE_CHECKING:
    from pacer.config import CacheConfig

__all__ = ["KVCacheManager", "KVStats", "PrefixHit", "OTHER_TENANTS"]


class KVCacheManager(PrefixSlots, SegmentSlots):
    def __init__(self, num_blocks: int, block_size: int, prefix_cache: PrefixCacheProtocol | None = None, *,
                 tenant_isolation: str = "shared", tenant_quotas: Mapping[str, int] | None = None,
                 num_cpu_blocks: int = 0, reserve_blocks: int = 0, host_tier: HostKVTier | None = None,
                 retention: SessionRetention | None = None, queue_aware_eviction: bool = True,
                 segments: SegmentStore | None = None) -> None:
        """`prefix_cache` None: no prefix caching (the null cache). `retention` None: no
        session retention. `queue_aware_eviction`: see `cached_prefix_tokens`. `segments` None:
        no segment store (the null one: `pacer.kv.segment_slots`)."""
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.cache: PrefixCacheProtocol = prefix_cache if prefix_cache is not None else NullPrefixCache(block_size)
        self.tenants = TenantSpaces(tenant_isolation, tenant_quotas, num_blocks, reserve_blocks)
        # one host pool for swap and the offload tier when there is a host tier (kv_offloading_size)
        self.host_tier = host_tier
        self.swap = CpuSwapTier(num_cpu_blocks, host_tier)
        self.offload: PrefixOffloadProtocol = (
            PrefixOffload(host_tier, self.cache) if host_tier is not None and isinstance(self.cache, PrefixCache)
            else NullOffload())
        self._handles: dict[str, PrefixMatch] = {}
        self._public_ids: set[str] = set()              # prewarm requests inserted as PUBLIC
        self._pin_ids: set[str] = set()                 # prewarm requests whose prefix is pinned
        self.pins: dict[tuple[int, ...], PrefixMatch] = {}
        self._deferred_quota: list[str] = []
        self.stats = KVStats()
        self.retention = retention if retention is not None else SessionRetention(None, lambda: 0.0, enabled=False)
        self.queue_aware_eviction = queue_aware_eviction
        self.segments = segments if segments is not None else SegmentStore(block_size, lambda: 0.0, enabled=False)
        # evicted segments demoted to the host tier and promoted back on a look-up, when there is one
        self.segment_offload = (SegmentOffload(host_tier, self.segments)
                                if host_tier is not None and self.segments.enabled else None)
        self._exact_limits: dict[str, int] = {}

    @classmethod
    def from_config(cls, config: CacheConfig, num_blocks: int, now: Callable[[], float],
                    block_bytes: int | None = None, max_model_len: int = 0) -> KVCacheManager:
        """Build from a CacheConfig; `block_bytes` (bytes of one KV block) sizes the swap tier;
        in partitioned mode the quotas must leave one `max_model_len` request's blocks free."""
        cache: PrefixCacheProtocol = NullPrefixCache(config.block_size)
        if config.enable_prefix_caching:
            group_of = group_fn(config.tenant_isolation, dict(config.tenant_quotas or {}))
            cache = PrefixCache.from_config(config, now, group_of)
        num_cpu = config.num_cpu_blocks
        if num_cpu is None:
            num_cpu = int(config.swap_space * 1024**3 // block_bytes) if block_bytes else 0
        host = HostKVTier.from_config(config, now, block_bytes, num_blocks)
        retention = SessionRetention(
            cache if isinstance(cache, PrefixCache) else None, now, enabled=config.session_retention,
            default_ttl=config.session_retention_ttl, max_ttl=config.session_retention_max_ttl,
            max_blocks=config.session_retention_max_blocks)
        return cls(num_blocks, config.block_size, cache, tenant_isolation=config.tenant_isolation,
                   tenant_quotas=config.tenant_quotas if config.enable_prefix_caching else None,
                   num_cpu_blocks=num_cpu, reserve_blocks=-(-max_model_len // config.block_size), host_tier=host,
                   retention=retention, queue_aware_eviction=config.queue_aware_eviction,
                   segments=SegmentStore(config.block_size, now, enabled=config.segment_reuse == "approximate",
                                         recompute=config.segment_recompute, ttl=config.resolved_ttl()))

    # ------------------------------------------------------------------ sizes

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.block_size

    @property
    def prefix_caching(self) -> bool:
        """Whether prefix caching is on (`enable_prefix_caching`): the cache can keep blocks."""
        return self.cache.enabled

    @property
    def num_cached_blocks(self) -> int:
        return self.cache.num_cached_blocks

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks no request holds (eviction may take them)."""
        return self.cache.num_evictable_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests or pinned (evictable cached blocks count as free)."""
        return 1.0 - self.num_available_blocks() / self.pool.num_blocks

    def num_available_blocks(self, tenant: str | None = None) -> int:
        """Blocks that can be handed out now: free, plus what the cache may evict for
        `tenant` (in partitioned mode only the tenant's own cache; otherwise all of it)."""
        return (self.pool.num_free_blocks + self.cache.evictable_blocks(self.tenants.evict_groups(tenant))
                + self.segments.num_evictable_blocks)

    # ------------------------------------------------------------------ allocation

    def allocate_slots(self, req: Request, num_new_tokens: int, hit: PrefixHit | None = None) -> list[int] | None:
        """Ensure room for `num_new_tokens` more tokens (after `hit`'s, when a looked-up hit is
        given: it is committed here), evicting cached blocks on demand; returns the blocks
        added, or None (and changes nothing) when they cannot be had. A swapped-out request
        gets its CPU blocks scheduled for swap-in here."""
        rid, bs = req.request_id, self.block_size
        table = self.block_tables.get(rid)
        if table is not None:
            computed = req.num_computed_tokens
            if table:   # _cache_progress when a block may have completed (its own checks are the same)
                old = self._handles.get(rid)
                cached = len(old.block_ids) if old is not None else 0
                if computed // bs > cached and len(table) > cached:   # min(full blocks, table) > cached
                    self._cache_progress(req)
            if hit is None and computed + num_new_tokens <= len(table) * bs:   # the common case: room in its blocks
                if rid in self.swap.held_ids:   # else plan_swap_in has nothing to plan
                    self.swap.plan_swap_in(rid, table)
                return []
        groups = self.tenants.evict_groups(req.tenant)
        available = self.num_available_blocks(req.tenant)
        computed, held = req.num_computed_tokens, len(self.block_tables.get(req.request_id, ()))
        if hit is not None:   # locking the hit protects its own evictable blocks: they cannot be handed out too
            computed, held = hit.num_tokens, hit.match.num_blocks
            available -= self.cache.evictable_on_path(hit.match, groups)
        need = max(0, -(-(computed + num_new_tokens) // self.block_size) - held)
        if need > available:
            return None
        if hit is not None:
            self._commit_hit(req, hit)
        short = need - self.pool.num_free_blocks
        if short > 0:
            self._release(self.cache.evict(short, groups), "capacity")
            short = need - self.pool.num_free_blocks
            if short > 0:   # then stored segments (counted as available)
                self._release(self.segments.evict(short), "capacity")
        new_blocks = self.pool.allocate(need) if need else []
        if hit is not None and hit.promoted:   # the first new blocks are filled by this step's promotions
            self.offload.bind(req.request_id, new_blocks[:len(hit.promoted)])
        table = self.block_tables.setdefault(req.request_id, [])
        table.extend(new_blocks)
        self.swap.plan_swap_in(req.request_id, table)
        return new_blocks

    def allocate_decodes(self, reqs: Sequence[Request], start: int, stop: int) -> int:
        """`allocate_slots(req, 1)` for `reqs[start:stop]` in turn while each has room for the token
        in its blocks (each one's effects as there: its completed blocks cached, a swap-in planned;
        each gets no new block); returns the index of the first that has no room (`stop`: none), left
        untouched for `allocate_slots`. One loop for a step's run of decode rows, not a call each."""
        tables, handles, bs, held = self.block_tables, self._handles, self.block_size, self.swap.held_ids
        for i in range(start, stop):
            req = reqs[i]
            rid = req.request_id
            table = tables.get(rid)
            computed = req.num_computed_tokens
            if not table or computed >= len(table) * bs:   # none yet, or its blocks are full
                return i
            old = handles.get(rid)
            cached = len(old.block_ids) if old is not None else 0
            if computed // bs > cached and len(table) > cached:   # as in allocate_slots
                self._cache_progress(req)
            if rid in held:
                self.swap.plan_swap_in(rid, table)
        return stop

    def trim_to_computed(self, req: Request) -> None:
        """After verifying drafts: free the blocks past those holding the request's computed
        (verified) tokens; only rejected drafts used them, so none is cached or shared."""
        table = self.block_tables.get(req.request_id)
        if not table:
            return
        keep = kept_blocks(req.num_computed_tokens, self.block_size)
        if len(table) > keep:
            extra = table[keep:]
            del table[keep:]
            self.pool.free(extra)

    def block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    def free(self, req: Request) -> None:
        """Drop the request's hold on all its blocks (finish, abort or recompute preemption),
        caching its full computed blocks first."""
        rid = req.request_id
        table = self.block_tables.pop(rid, None)
        match = self._handles.pop(rid, None)
        swapping_in = self.swap.drop(rid)   # then its blocks hold no KV yet
        handle = None
        if table and not swapping_in:
            handle = self._cache_request(req, table, match)
        if match is not None:
            self.cache.unlock(match)
        if table:
            self.pool.free(table)
        self._retain_session(req, handle)
        # admitted and preempted in one step: blocks the tree kept still get their copy
        self.offload.cancel(rid, lambda b: self.pool.ref_count(b) > 0)
        self._enforce_quotas()
        self._public_ids.discard(rid)
        self._pin_ids.discard(rid)
        self._exact_limits.pop(rid, None)

    # ------------------------------------------------------------------ swap

    def swap_out(self, req: Request) -> bool:
        """Preempt by swapping: reserve CPU slots for the request's computed blocks and free
        its device blocks, keeping `num_computed_tokens`. False (nothing changed) when the
        CPU tier cannot hold them; the caller then recomputes."""
        rid = req.request_id
        if self.swap.is_swapping_in(rid):   # resumed earlier in this same step: its KV is still on CPU
            self.swap.cancel_swap_in(rid)
            self._drop_device_blocks(req)
            self.stats.swap_out_requests += 1
            return True
        n = -(-req.num_computed_tokens // self.block_size)
        table = self.block_tables.get(rid, [])
        promoting = self.offload.is_promoting(rid)   # its KV is not there yet
        if n == 0 or n > len(table) or promoting or not self.swap.reserve(rid, table[:n]):
            self.stats.swap_fallbacks += 1
            return False
        self._drop_device_blocks(req)
        self.stats.swap_out_requests += 1
        self.stats.swap_out_blocks += n
        return True

    def _drop_device_blocks(self, req: Request) -> None:
        table = self.block_tables.pop(req.request_id, None)
        match = self._handles.pop(req.request_id, None)
        if match is not None:
            self.cache.unlock(match)
        if table:
            self.pool.free(table)
        if match is not None and self.tenants.partitioned:
            self._deferred_quota.append(self.tenants.quota_group(req.tenant))   # its blocks became evictable
            self._enforce_quotas()

    def take_swap_ops(self) -> tuple[SwapPairs, SwapPairs]:
        """The step's copies, in execution order: swap-outs (device, cpu) first, then
        swap-ins (cpu, device)."""
        out, ins_by_request = self.swap.take_ops()
        ins: SwapPairs = []
        for pairs in ins_by_request.values():
            ins.extend(pairs)
            self.stats.swap_in_requests += 1
            self.stats.swap_in_blocks += len(pairs)
        demoted, promoted = self.offload.take_ops()   # demotions after swap-outs, promotions after swap-ins
        out.extend(demoted)
        ins.extend(promoted)
        if self.segment_offload is not None:          # then the segments': before the step's segment fills
            demoted, promoted = self.segment_offload.take_ops()
            out.extend(demoted)
            ins.extend(promoted)
        return out, ins

    # ------------------------------------------------------------------ checks

    def check_invariants(self) -> None:
        """free + cached + held == total; each block's ref count == its holders (request
        tables + one cache node); cache counts match its tree (see `pacer.kv.checks`)."""
        check_kv_invariants(self.pool, self.block_tables, self.cache, set(self._handles), self._segment_blocks())
        self.segments.check_invariants()
        self.swap.check_invariants()   # with a host tier: free + offloaded + swapped == total

