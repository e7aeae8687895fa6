"""KV cache manager: which blocks each request holds. Pure Python.

Owns the `BlockPool`, the per-request block tables, the prefix cache (optional) and the
CPU swap tier. The scheduler asks it for slots (`allocate_slots`), cached prefixes
(`match_prefix`) and returns blocks (`free`, `swap_out`); "can this fit?" is O(1).

Holders of a block: each request whose table lists it, plus the cache node that owns it.
The manager is the only one that changes ref counts: a cache hit adds the request's ref,
`insert` reports the blocks the cache adopted (one ref each), eviction drops the cache's
ref. A running request's full computed blocks are inserted as soon as they are computed
(its lock moves down the path), and the rest when it finishes, aborts or is preempted by
recompute, so concurrent requests, the next turn of a conversation and the resumed
request hit them.

Tenants: `shared` puts every block in one namespace; `isolated` gives each tenant its own
namespace (only public, prewarmed prefixes are shared); `partitioned` adds hard per-tenant
quotas on cached blocks: a tenant's inserts and allocations evict only its own cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pacer.core.block_events import SALT_SEPARATOR, BlockEvent, BlockEventLog, namespace
from pacer.core.block_pool import BlockPool
from pacer.core.host_tier import HostKVTier, SwapSlots
from pacer.core.offload import PrefixOffload
from pacer.core.prefix_cache import PUBLIC, PrefixCache, PrefixMatch
from pacer.core.spec_decode import kept_blocks
from pacer.request import Request

if TYPE_CHECKING:
    from pacer.config import CacheConfig

__all__ = ["KVCacheManager", "KVStats", "TENANT_ISOLATION_MODES", "OTHER_TENANTS"]

TENANT_ISOLATION_MODES = ("shared", "isolated", "partitioned")
OTHER_TENANTS = "*"  # tenant_quotas key for every tenant not listed (one quota shared by all of them)
SwapPairs = list[tuple[int, int]]


@dataclass(slots=True)
class KVStats:
    """Engine-level counters (monotonic); `Engine.cache_stats()` exports them."""

    queried_tokens: int = 0       # tokens looked up in the prefix cache at admission
    hit_tokens: int = 0           # of those, served from the cache
    evicted_blocks: dict[str, int] = field(default_factory=lambda: {"capacity": 0, "ttl": 0, "quota": 0})
    swap_out_requests: int = 0
    swap_out_blocks: int = 0
    swap_in_requests: int = 0
    swap_in_blocks: int = 0
    swap_fallbacks: int = 0       # swap preemptions that had to recompute (tier full)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_cache: PrefixCache | None = None, *,
                 tenant_isolation: str = "shared", tenant_quotas: Mapping[str, int] | None = None,
                 num_cpu_blocks: int = 0, reserve_blocks: int = 0, host_tier: HostKVTier | None = None) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        if tenant_isolation not in TENANT_ISOLATION_MODES:
            raise ValueError(f"tenant_isolation must be one of {', '.join(TENANT_ISOLATION_MODES)}; "
                             f"got {tenant_isolation!r}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.cache = prefix_cache
        self.isolation = tenant_isolation
        self.quotas = dict(tenant_quotas or {})
        if self.quotas and tenant_isolation != "partitioned":
            raise ValueError("tenant_quotas apply only with tenant_isolation='partitioned'")
        reserve_blocks = min(reserve_blocks, num_blocks)
        if tenant_isolation == "partitioned" and sum(self.quotas.values()) + reserve_blocks > num_blocks:
            raise ValueError(
                f"tenant_quotas sum to {sum(self.quotas.values())} blocks; with {reserve_blocks} blocks kept "
                f"free for one max_model_len request that exceeds the {num_blocks} KV blocks")
        # one host pool for swap and the offload tier when there is a host tier (kv_offloading_size)
        self.host_tier = host_tier
        self.cpu_pool: BlockPool | SwapSlots | None = (
            SwapSlots(host_tier) if host_tier is not None else BlockPool(num_cpu_blocks) if num_cpu_blocks > 0 else None)
        self.offload = PrefixOffload(host_tier, prefix_cache) if host_tier and prefix_cache else None
        self._handles: dict[str, PrefixMatch] = {}
        self._swapped: dict[str, list[int]] = {}       # request id -> CPU slots holding its KV
        self._pending_in: dict[str, SwapPairs] = {}     # swap-ins decided this step: (cpu, device)
        self._pending_out: SwapPairs = []               # swap-outs decided this step: (device, cpu)
        self._public_ids: set[str] = set()              # prewarm requests inserted as PUBLIC
        self._pin_ids: set[str] = set()                 # prewarm requests whose prefix is pinned
        self.pins: dict[tuple[int, ...], PrefixMatch] = {}
        self._deferred_quota: list[str] = []
        self.stats = KVStats()

    @classmethod
    def from_config(cls, config: CacheConfig, num_blocks: int, now: Callable[[], float],
                    block_bytes: int | None = None, max_model_len: int = 0) -> KVCacheManager:
        """Build from a CacheConfig; `block_bytes` (bytes of one KV block) sizes the swap tier;
        in partitioned mode the quotas must leave one `max_model_len` request's blocks free."""
        cache = None
        if config.enable_prefix_caching:
            quotas = dict(config.tenant_quotas or {})
            group_of = _group_fn(config.tenant_isolation, quotas)
            ttl = config.cache_ttl
            if ttl is None and config.eviction_policy == "ttl":
                ttl = 1800.0
            cache = PrefixCache(config.block_size, now, config.eviction_policy,
                                tenant_weights=config.tenant_weights, ttl=ttl, group_of=group_of)
        num_cpu = config.num_cpu_blocks
        if num_cpu is None:
            num_cpu = int(config.swap_space * 1024**3 // block_bytes) if block_bytes else 0
        host = None
        if config.kv_offloading_size:   # one host pool: num_cpu_blocks, else kv_offloading_size GiB
            num_host = config.num_cpu_blocks
            if num_host is None:
                if not block_bytes:
                    raise ValueError("kv_offloading_size needs the executor's KV block size in bytes")
                num_host = int(config.kv_offloading_size * 1024**3 // block_bytes)
            host = HostKVTier(max(1, num_host), config.block_size, now,
                              eviction_policy=config.eviction_policy, ttl=config.cache_ttl,
                              tenant_weights=config.tenant_weights, offload=config.enable_prefix_caching)
        return cls(num_blocks, config.block_size, cache, tenant_isolation=config.tenant_isolation,
                   tenant_quotas=config.tenant_quotas if config.enable_prefix_caching else None,
                   num_cpu_blocks=num_cpu, reserve_blocks=-(-max_model_len // config.block_size), host_tier=host)

    # ------------------------------------------------------------------ sizes

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.block_size

    @property
    def num_cached_blocks(self) -> int:
        return self.cache.num_cached_blocks if self.cache else 0

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests or pinned (evictable cached blocks count as free)."""
        return 1.0 - self.num_available_blocks() / self.pool.num_blocks

    def num_available_blocks(self, tenant: str | None = None) -> int:
        """Blocks that can be handed out now: free, plus what the cache may evict for
        `tenant` (in partitioned mode only the tenant's own cache; otherwise all of it)."""
        if self.cache is None:
            return self.pool.num_free_blocks
        return self.pool.num_free_blocks + self.cache.evictable_blocks(self._evict_groups(tenant))

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        held = len(self.block_tables.get(req.request_id, ()))
        total = req.num_computed_tokens + num_new_tokens
        need = -(-total // self.block_size)
        return max(0, need - held)

    # ------------------------------------------------------------------ tenants

    def _owner(self, req: Request) -> str:
        """The namespace the request's blocks are cached under: public in shared mode, its
        tenant otherwise; a `cache_salt` makes it private to requests with the same salt."""
        if req.request_id in self._public_ids:
            return PUBLIC
        return namespace(PUBLIC if self.isolation == "shared" else req.tenant, req.cache_salt)

    def _owners(self, req: Request) -> tuple[str, ...]:
        owner = self._owner(req)
        if owner == PUBLIC or req.cache_salt:   # a salted request shares nothing unsalted (vLLM)
            return (owner,)
        return (owner, PUBLIC)

    def _quota_group(self, tenant: str) -> str:
        return tenant if tenant in self.quotas else OTHER_TENANTS

    def _evict_groups(self, tenant: str | None) -> list[str] | None:
        if self.isolation != "partitioned" or tenant is None:
            return None
        return [self._quota_group(tenant), PUBLIC]

    # ------------------------------------------------------------------ prefix cache

    def match_prefix(self, req: Request) -> int:
        """On admission (or resume after recompute preemption): take the longest cached
        prefix of the request's tokens, in whole blocks and short of its last token (whose
        logits are needed). The request holds and locks those blocks; returns tokens reused."""
        if self.cache is None or req.request_id in self.block_tables:
            return 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        tokens = req.token_ids_slice(0, req.num_tokens)
        match = self.cache.match_prefix(tokens, self._owners(req), max_blocks, req.tenant)
        self.stats.queried_tokens += req.num_tokens
        if match.block_ids:   # locked first: promotion below may evict
            self.cache.lock(match)
            self._handles[req.request_id] = match
            self.pool.incref(match.block_ids)
        table = list(match.block_ids) + self._promote(req, match, tokens, max_blocks)
        if not table:
            return 0
        self.block_tables[req.request_id] = table
        num_tokens = len(table) * self.block_size
        self.stats.hit_tokens += num_tokens
        return num_tokens

    def _promote(self, req: Request, match: PrefixMatch, tokens: list[int], max_blocks: int) -> list[int]:
        """Device blocks for the host tier's continuation of `match`, filled by this step's copies."""
        if self.offload is None or self.cache is None:
            return []
        hits = self.offload.lookup(match.node, match.num_blocks, tokens, self._owners(req), max_blocks)
        hits = hits[:self.num_available_blocks(req.tenant)]
        if not hits:
            return []
        self.offload.commit(req.request_id, hits)
        short = len(hits) - self.pool.num_free_blocks
        if short > 0:
            self._release(self.cache.evict(short, self._evict_groups(req.tenant)), "capacity")
        blocks = self.pool.allocate(len(hits))
        self.offload.bind(req.request_id, blocks)
        return blocks
    def cached_prefix_tokens(self, req: Request) -> int:
        """Tokens `match_prefix` would reuse for `req` now, looked up only (for ordering by it)."""
        if self.cache is None or req.request_id in self.block_tables:
            return 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        tokens = req.token_ids_slice(0, req.num_tokens)
        return self.cache.lookup_blocks(tokens, self._owners(req), max_blocks) * self.block_size

    def cancel_match(self, req: Request) -> None:
        """Undo `match_prefix` for a request that could not be admitted after all."""
        if self.cache is None:
            return
        self.stats.queried_tokens -= req.num_tokens
        match = self._handles.pop(req.request_id, None)
        table = self.block_tables.pop(req.request_id, None)
        if match is not None:
            self.cache.unlock(match)
        if table:
            self.stats.hit_tokens -= len(table) * self.block_size
            self.pool.free(table)
        if self.offload is not None:   # promoted blocks the tree adopted meanwhile still get their copy
            self.offload.cancel(req.request_id, lambda b: self.pool.ref_count(b) > 0)
        if match is not None and self.isolation == "partitioned":
            self._deferred_quota.append(self._quota_group(req.tenant))   # its blocks became evictable
            self._enforce_quotas()

    def mark_prewarm(self, request_id: str, public: bool, pin: bool = True) -> None:
        """Before the request is first scheduled: when it finishes, its prompt's blocks are
        cached as public (visible to every tenant) and/or pinned (never evicted)."""
        if public:
            self._public_ids.add(request_id)
        if pin:
            self._pin_ids.add(request_id)

    def unpin(self, token_ids: list[int] | None = None) -> int:
        """Unpin one prewarmed prefix (by its token ids) or all; returns how many."""
        if self.cache is None:
            return 0
        keys = list(self.pins) if token_ids is None else [k for k in self.pins if list(k) == list(token_ids)]
        for key in keys:
            self.cache.unpin(self.pins.pop(key))
        return len(keys)

    def enable_events(self) -> BlockEventLog | None:
        """Start recording the prefix cache's store/remove events (None without a cache)."""
        if self.cache is None:
            return None
        if self.cache.events is None:
            self.cache.enable_events(BlockEventLog())
        return self.cache.events

    def take_events(self) -> list[BlockEvent]:
        """The store/remove events since the last call, in order (empty when not enabled)."""
        return self.cache.events.take() if self.cache is not None and self.cache.events is not None else []

    def reset_prefix_cache(self) -> int:
        """Drop every cached block no request uses (vLLM's reset_prefix_cache; pinned prefixes
        stay). Each dropped block is reported as removed. Returns how many were dropped."""
        if self.cache is None:
            return 0
        freed = self.cache.evict(self.cache.num_evictable_blocks)
        self._release(freed, "capacity")
        return len(freed)

    def drop_expired(self) -> None:
        """Proactively drop cache nodes idle longer than the TTL (cheap when nothing is due)."""
        if self.cache is not None:
            self._release(self.cache.expire(), "ttl")

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
        if self.cache is None or not table or rid in self._swapped or rid in self._public_ids:
            return
        n_full = min(req.num_computed_tokens // self.block_size, len(table))
        old = self._handles.get(rid)
        if n_full <= (old.num_blocks if old else 0):
            return
        tokens = req.token_ids_slice(0, n_full * self.block_size)
        adopted, handle = self.cache.insert(tokens, table[:n_full], self._owner(req), req.tenant, start=old,
                                            owners=self._owners(req))
        self.pool.incref(adopted)
        self.cache.lock(handle)
        if old is not None:
            self.cache.unlock(old)
        self._handles[rid] = handle

    def _cache_request(self, req: Request, table: list[int], start: PrefixMatch | None) -> None:
        assert self.cache is not None
        n_full = min(req.num_computed_tokens // self.block_size, len(table))
        rid = req.request_id
        owner = self._owner(req)
        self._public_ids.discard(rid)
        if n_full == 0:
            self._pin_ids.discard(rid)
            return
        tokens = req.token_ids_slice(0, n_full * self.block_size)
        adopted, handle = self.cache.insert(tokens, table[:n_full], owner, req.tenant, start=start,
                                            owners=self._owners(req))
        self.pool.incref(adopted)
        if rid in self._pin_ids:
            self._pin_ids.discard(rid)
            key = tuple(req.prompt_token_ids[: n_full * self.block_size])
            if key not in self.pins and handle.block_ids:
                self.cache.pin(handle)
                self.pins[key] = handle
        if self.isolation == "partitioned" and owner != PUBLIC:
            group = self._quota_group(req.tenant)
            over = self.cache.cached_blocks(group) - self.quotas.get(group, self._other_quota())
            if over > 0:
                self._deferred_quota.append(group)

    def _other_quota(self) -> int:
        return self.quotas.get(OTHER_TENANTS, 0)

    def _enforce_quotas(self) -> None:
        assert self.cache is not None
        while self._deferred_quota:
            group = self._deferred_quota.pop()
            over = self.cache.cached_blocks(group) - self.quotas.get(group, self._other_quota())
            if over > 0:
                self._release(self.cache.evict(over, [group]), "quota")

    # ------------------------------------------------------------------ allocation

    def allocate_slots(self, req: Request, num_new_tokens: int) -> list[int] | None:
        """Ensure room for `num_new_tokens` more tokens, evicting cached blocks on demand;
        returns the blocks added, or None (and changes nothing) when they cannot be had.
        A swapped-out request gets its CPU blocks scheduled for swap-in here."""
        self._cache_progress(req)
        need = self.blocks_needed(req, num_new_tokens)
        if need > self.num_available_blocks(req.tenant):
            return None
        short = need - self.pool.num_free_blocks
        if short > 0 and self.cache is not None:
            self._release(self.cache.evict(short, self._evict_groups(req.tenant)), "capacity")
        new_blocks = self.pool.allocate(need) if need else []
        table = self.block_tables.setdefault(req.request_id, [])
        table.extend(new_blocks)
        cpu = self._swapped.get(req.request_id)
        if cpu is not None and req.request_id not in self._pending_in:
            self._pending_in[req.request_id] = list(zip(cpu, table))
        return new_blocks

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
        swapping_in = self._pending_in.pop(rid, None) is not None   # its blocks hold no KV yet
        cpu = self._swapped.pop(rid, None)
        if cpu is not None and self.cpu_pool is not None:
            self.cpu_pool.free(cpu)
        if self.cache is not None and table and not swapping_in:
            self._cache_request(req, table, match)
        if match is not None and self.cache is not None:
            self.cache.unlock(match)
        if table:
            self.pool.free(table)
        if self.cache is not None:
            self._enforce_quotas()
        self._public_ids.discard(rid)
        self._pin_ids.discard(rid)

    # ------------------------------------------------------------------ swap

    def swap_out(self, req: Request) -> bool:
        """Preempt by swapping: reserve CPU slots for the request's computed blocks and free
        its device blocks, keeping `num_computed_tokens`. False (nothing changed) when the
        CPU tier cannot hold them; the caller then recomputes."""
        rid = req.request_id
        if rid in self._pending_in:   # resumed earlier in this same step: its KV is still on CPU
            del self._pending_in[rid]
            self._drop_device_blocks(req)
            self.stats.swap_out_requests += 1
            return True
        n = -(-req.num_computed_tokens // self.block_size)
        table = self.block_tables.get(rid, [])
        if n == 0 or self.cpu_pool is None or self.cpu_pool.num_free_blocks < n or n > len(table):
            self.stats.swap_fallbacks += 1
            return False
        cpu = self.cpu_pool.allocate(n)
        self._pending_out.extend(zip(table[:n], cpu))
        self._swapped[rid] = cpu
        self._drop_device_blocks(req)
        self.stats.swap_out_requests += 1
        self.stats.swap_out_blocks += n
        return True

    def _drop_device_blocks(self, req: Request) -> None:
        table = self.block_tables.pop(req.request_id, None)
        match = self._handles.pop(req.request_id, None)
        if match is not None and self.cache is not None:
            self.cache.unlock(match)
        if table:
            self.pool.free(table)
        if match is not None and self.cache is not None and self.isolation == "partitioned":
            self._deferred_quota.append(self._quota_group(req.tenant))   # its blocks became evictable
            self._enforce_quotas()

    def is_swapped(self, request_id: str) -> bool:
        return request_id in self._swapped

    def take_swap_ops(self) -> tuple[SwapPairs, SwapPairs]:
        """The step's copies, in execution order: swap-outs (device, cpu) first, then
        swap-ins (cpu, device). Swapped-in CPU slots are released here."""
        out, self._pending_out = self._pending_out, []
        ins: SwapPairs = []
        for rid, pairs in self._pending_in.items():
            ins.extend(pairs)
            cpu = self._swapped.pop(rid)
            if self.cpu_pool is not None:
                self.cpu_pool.free(cpu)
            self.stats.swap_in_requests += 1
            self.stats.swap_in_blocks += len(pairs)
        self._pending_in.clear()
        if self.offload is not None:   # demotions after swap-outs, promotions after swap-ins
            demoted, promoted = self.offload.take_ops()
            out.extend(demoted)
            ins.extend(promoted)
        return out, ins

    # ------------------------------------------------------------------ checks

    def check_invariants(self) -> None:
        """free + cached + held == total; each block's ref count == its holders
        (request tables + one cache node); cache counts match its tree."""
        self.pool.check_invariants()
        holders = [0] * self.pool.num_blocks
        for table in self.block_tables.values():
            for b in table:
                holders[b] += 1
        cached: set[int] = set()
        if self.cache is not None:
            self.cache.check_invariants()
            for node in self.cache.iter_nodes():
                for b in node.block_ids:
                    if b in cached:
                        raise AssertionError(f"block {b} owned by two cache nodes")
                    cached.add(b)
                    holders[b] += 1
                    if node.lock_ref == 0 and self.pool.ref_count(b) != 1:
                        raise AssertionError(f"evictable block {b} has ref count {self.pool.ref_count(b)}")
        for b, n in enumerate(holders):
            if self.pool.ref_count(b) != n:
                raise AssertionError(f"block {b}: ref count {self.pool.ref_count(b)} != holders {n}")
        held = {b for t in self.block_tables.values() for b in t}
        if self.pool.num_free_blocks + len(cached - held) + len(held) != self.pool.num_blocks:
            raise AssertionError("free + cached + held != total")
        if set(self._handles) - set(self.block_tables):
            raise AssertionError("a lock is held by a request with no blocks")
        if self.cpu_pool is not None:
            self.cpu_pool.check_invariants()   # with a host tier: free + offloaded + swapped == total
            used = sum(len(c) for c in self._swapped.values())
            if used != self.cpu_pool.num_used_blocks:
                raise AssertionError(f"CPU tier: {self.cpu_pool.num_used_blocks} used, {used} held")


def _group_fn(isolation: str, quotas: Mapping[str, int]) -> Callable[[str], str]:
    if isolation != "partitioned":
        return lambda owner: PUBLIC
    def group(owner: str) -> str:
        tenant = owner.partition(SALT_SEPARATOR)[0]   # a salted namespace counts against its tenant
        return tenant if tenant == PUBLIC or tenant in quotas else OTHER_TENANTS
    return group
