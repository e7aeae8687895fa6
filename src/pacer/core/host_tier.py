"""The host KV tier: one pool of host-memory block slots shared by swap preemption and the
prefix-cache offload tier (`kv_offloading_size`), with one accounting. Pure Python.

Slots are held either by a swapped-out request (its computed blocks, until it resumes or
ends) or by a demoted prefix block (a block the radix tree evicted from the device, kept here
instead of dropped). Swap takes precedence: when the pool is full, offloaded blocks are
evicted (in the tier's eviction order) to make room for a swap-out; a demotion never evicts a
swapped request's slots.

Offloaded blocks are found by a chain key: block i of a token sequence under one owner
namespace has key ``hash((key of block i-1, owner, its tokens))``; an entry keeps its parent key and
tokens, and a lookup checks both, so a hash collision reads as a miss, never as wrong KV. A
promotion is a copy: the entry stays (and is touched), so a later device eviction of the same
prefix need not copy it again. Entries promoted or demoted in the current step are locked
until the step's copies are taken, so a slot is never reused while a copy still reads it.

Eviction order: lru (oldest touch first), ttl (lru, and entries idle longer than the TTL are
dropped when the tier is next used), weighted-lru (GreedyDual over tenant weights, as the
device tier). This room never sees tensors: callers turn the copies it reports into
`SchedulerOutput.swap_out` / `swap_in` pairs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pacer.config import EVICTION_POLICIES
from pacer.core.block_pool import BlockPool, OutOfBlocksError

if TYPE_CHECKING:
    from pacer.config import CacheConfig

__all__ = ["HostKVTier", "HostTierStats", "SwapSlots", "ROOT_KEY", "chain_keys"]

ROOT_KEY = 0


def chain_keys(owner: str, token_ids: Sequence[int], block_size: int, n_blocks: int) -> list[int]:
    """The chain keys of the first `n_blocks` whole blocks of `token_ids` under `owner`."""
    keys: list[int] = []
    parent = ROOT_KEY
    for i in range(n_blocks):
        parent = hash((parent, owner, tuple(token_ids[i * block_size:(i + 1) * block_size])))
        keys.append(parent)
    return keys


@dataclass(slots=True)
class _Entry:
    slot: int
    parent: int
    owner: str
    tokens: tuple[int, ...]
    tenant: str
    last_access: float
    priority: float
    tick: int


@dataclass(slots=True)
class HostTierStats:
    """Offload-tier counters (monotonic) for Engine.snapshot() / metrics."""

    demotions: int = 0            # blocks copied device -> host on radix eviction
    promotions: int = 0           # blocks copied host -> device on a prefix match
    hit_tokens: int = 0           # prompt tokens served by promotion (not recomputed)
    evictions: dict[str, int] = field(default_factory=lambda: {"capacity": 0, "ttl": 0, "swap": 0})
    demotions_skipped: int = 0    # evicted device blocks dropped because the tier was full of swap


class HostKVTier:
    def __init__(self, num_blocks: int, block_size: int, now: Callable[[], float], *,
                 eviction_policy: str = "lru", ttl: float | None = None,
                 tenant_weights: Mapping[str, float] | None = None, offload: bool = True) -> None:
        if eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"eviction_policy must be one of {', '.join(EVICTION_POLICIES)}; got {eviction_policy!r}")
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.offload = offload
        self._now = now
        self._policy = eviction_policy
        self._ttl = ttl if ttl is not None else (1800.0 if eviction_policy == "ttl" else None)
        self._weights = dict(tenant_weights or {})
        self._inflation = 0.0
        self._tick = 0
        self._entries: dict[int, _Entry] = {}
        self._heap: list[tuple[float, int, int]] = []   # (eviction key, tick, chain key); lazily pruned
        self._locked: set[int] = set()                  # chain keys copied this step
        self.swap_slots = 0                              # slots held by swapped-out requests
        self.stats = HostTierStats()

    @classmethod
    def from_config(cls, config: CacheConfig, now: Callable[[], float], block_bytes: int | None) -> HostKVTier | None:
        """The tier `kv_offloading_size` asks for (None when it is 0 or unset): `num_cpu_blocks`
        slots when given, else kv_offloading_size GiB of `block_bytes` blocks."""
        if not config.kv_offloading_size:
            return None
        num_host = config.num_cpu_blocks
        if num_host is None:
            if not block_bytes:
                raise ValueError("kv_offloading_size needs the executor's KV block size in bytes")
            num_host = int(config.kv_offloading_size * 1024**3 // block_bytes)
        return cls(max(1, num_host), config.block_size, now, eviction_policy=config.eviction_policy,
                   ttl=config.cache_ttl, tenant_weights=config.tenant_weights, offload=config.enable_prefix_caching)

    # ------------------------------------------------------------------ sizes

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_offloaded_blocks(self) -> int:
        return len(self._entries)

    def available_for_swap(self) -> int:
        """Slots a swap-out can have now: free ones plus offloaded blocks it may evict."""
        return self.pool.num_free_blocks + len(self._entries) - len(self._locked & self._entries.keys())

    # ------------------------------------------------------------------ swap

    def allocate_swap(self, n: int) -> list[int] | None:
        """n slots for a swapped-out request, evicting offloaded blocks if needed; None (and
        nothing changed) when even that is not enough."""
        if n > self.available_for_swap():
            return None
        self._evict(n - self.pool.num_free_blocks, "swap")
        self.swap_slots += n
        return self.pool.allocate(n)

    def free_swap(self, slots: Sequence[int]) -> None:
        self.swap_slots -= len(slots)
        self.pool.free(slots)

    # ------------------------------------------------------------------ offload

    def demote(self, owner: str, tenant: str, parent: int, token_ids: Sequence[int],
               device_blocks: Sequence[int]) -> list[tuple[int, int]]:
        """Keep evicted device blocks: `device_blocks[i]` holds tokens
        `token_ids[i*bs:(i+1)*bs]`, the first following the block of chain key `parent`.
        Returns the (device block, host slot) copies to run before the device blocks are reused."""
        copies: list[tuple[int, int]] = []
        if not self.offload:
            return copies
        self.expire()
        bs = self.block_size
        chain: list[tuple[int, _Entry]] = []
        for i, dev in enumerate(device_blocks):
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            key = hash((parent, owner, tokens))
            entry = self._entries.get(key)
            if entry is None:
                if not self.pool.num_free_blocks and not self._evict(1, "capacity"):
                    self.stats.demotions_skipped += len(device_blocks) - i
                    break
                entry = _Entry(self.pool.allocate(1)[0], parent, owner, tokens, tenant, 0.0, 0.0, 0)
                self._entries[key] = entry
                copies.append((dev, entry.slot))
                self.stats.demotions += 1
            elif entry.parent != parent or entry.tokens != tokens:
                break                            # a colliding key: keep what is there
            self._locked.add(key)                # (an entry already here was promoted earlier: no copy)
            chain.append((key, entry))
            parent = key
        for key, entry in reversed(chain):       # tail first, so the tail is evicted first
            self._touch(key, entry)
        return copies

    def lookup(self, owners: Sequence[str], parent: int, token_ids: Sequence[int], max_blocks: int
               ) -> list[tuple[int, int]]:
        """Offloaded blocks continuing the block of chain key `parent` (owners in order of
        preference, as the device tier matches): [(chain key, host slot)], no side effects."""
        self.expire()
        bs = self.block_size
        found: list[tuple[int, int]] = []
        for i in range(max_blocks):
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            if len(tokens) < bs:
                break
            for owner in owners:
                key = hash((parent, owner, tokens))
                entry = self._entries.get(key)
                if entry is not None and entry.parent == parent and entry.tokens == tokens:
                    found.append((key, entry.slot))
                    parent = key
                    break
            else:
                break
        return found

    def promote(self, keys: Sequence[int]) -> None:
        """Commit a lookup: its blocks are being copied to the device this step (a copy; the
        entries stay, touched and locked until `end_step`)."""
        for key in reversed(keys):
            self._touch(key, self._entries[key])
            self._locked.add(key)
        self.stats.promotions += len(keys)
        self.stats.hit_tokens += len(keys) * self.block_size

    def end_step(self) -> None:
        """The step's copies were handed to the executor: slots may be reused from now on."""
        self._locked.clear()

    def expire(self) -> None:
        if self._ttl is None:
            return
        deadline = self._now() - self._ttl
        stale = [k for k, e in self._entries.items() if e.last_access < deadline and k not in self._locked]
        for key in stale:
            self._drop(key, "ttl")

    # ------------------------------------------------------------------ internals

    def _touch(self, key: int, entry: _Entry) -> None:
        self._tick += 1
        entry.tick = self._tick
        entry.last_access = self._now()
        if self._policy == "weighted-lru":
            entry.priority = self._inflation + self._weights.get(entry.tenant, 1.0)
            sort_key = entry.priority
        else:
            sort_key = entry.last_access
        heapq.heappush(self._heap, (sort_key, entry.tick, key))

    def _evict(self, n: int, reason: str) -> int:
        """Drop up to n unlocked offloaded blocks, best eviction key first; returns how many."""
        dropped = 0
        skipped: list[tuple[float, int, int]] = []
        while dropped < n and self._heap:
            item = heapq.heappop(self._heap)
            _, tick, key = item
            entry = self._entries.get(key)
            if entry is None or entry.tick != tick:
                continue                         # a stale heap item
            if key in self._locked:
                skipped.append(item)
                continue
            if self._policy == "weighted-lru":
                self._inflation = max(self._inflation, entry.priority)
            self._drop(key, reason)
            dropped += 1
        for item in skipped:
            heapq.heappush(self._heap, item)
        return dropped

    def _drop(self, key: int, reason: str) -> None:
        entry = self._entries.pop(key)
        self.pool.free([entry.slot])
        self.stats.evictions[reason] = self.stats.evictions.get(reason, 0) + 1

    # ------------------------------------------------------------------ checks

    def check_invariants(self) -> None:
        """free + offloaded + swap-held == total; every entry's slot is held once."""
        self.pool.check_invariants()
        slots = [e.slot for e in self._entries.values()]
        if len(set(slots)) != len(slots):
            raise AssertionError("two offloaded blocks share a host slot")
        if self.pool.num_free_blocks + len(slots) + self.swap_slots != self.pool.num_blocks:
            raise AssertionError(f"host tier: {self.pool.num_free_blocks} free + {len(slots)} offloaded + "
                                 f"{self.swap_slots} swapped != {self.pool.num_blocks}")
        for s in slots:
            if self.pool.ref_count(s) != 1:
                raise AssertionError(f"offloaded slot {s} has ref count {self.pool.ref_count(s)}")


class SwapSlots:
    """The host tier seen by swap preemption: BlockPool's interface over the shared pool
    (free means free or held by an offloaded block a swap-out may evict)."""

    def __init__(self, tier: HostKVTier) -> None:
        self.tier = tier

    @property
    def num_blocks(self) -> int:
        return self.tier.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.tier.available_for_swap()

    @property
    def num_used_blocks(self) -> int:
        return self.tier.swap_slots

    def allocate(self, n: int) -> list[int]:
        slots = self.tier.allocate_swap(n)
        if slots is None:
            raise OutOfBlocksError(f"asked for {n} host slots, {self.tier.available_for_swap()} available")
        return slots

    def free(self, slots: Sequence[int]) -> int:
        self.tier.free_swap(slots)
        return len(slots)

    def check_invariants(self) -> None:
        self.tier.check_invariants()
