"""KV cache manager: which blocks each request holds. Pure Python.

Owns the `BlockPool`, the per-request block tables, the prefix cache and the CPU swap tier
(`pacer.kv.tiers.swap`). The prefix cache is always there: the radix tree, or with
`enable_prefix_caching=False` the null cache that keeps nothing (`pacer.kv.interface` declares
both seams, and the host-tier offload's). The scheduler looks up cached prefixes (`lookup_prefix`,
which takes no references), asks for slots (`allocate_slots`, which commits a looked-up hit
with the allocation, or changes nothing) and returns blocks (`free`, `swap_out`); "can this
fit?" is O(1).

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pacer.kv.block_pool import BlockPool, kept_blocks
from pacer.kv.checks import check_kv_invariants
from pacer.kv.events import BlockEvent, BlockEventLog
from pacer.kv.interface import PrefixCacheProtocol, PrefixOffloadProtocol
from pacer.kv.null_cache import NullPrefixCache
from pacer.kv.prefix_cache import PUBLIC, PrefixCache, PrefixMatch
from pacer.kv.retention import SessionRetention
from pacer.kv.segment_slots import SegmentSlots
from pacer.kv.segment_store import SegmentStore
from pacer.kv.tenancy import OTHER_TENANTS, TenantSpaces, group_fn
from pacer.kv.tiers.host import HostKVTier
from pacer.kv.tiers.offload import NullOffload, PrefixOffload
from pacer.kv.tiers.segment_offload import SegmentOffload
from pacer.kv.tiers.swap import CpuSwapTier, SwapPairs
from pacer.request import FinishReason, Request, TokenPrefix

if TYPE_CHECKING:
    from pacer.config import CacheConfig

__all__ = ["KVCacheManager", "KVStats", "PrefixHit", "OTHER_TENANTS"]


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


class KVCacheManager(SegmentSlots):
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

    # ------------------------------------------------------------------ prefix cache

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

