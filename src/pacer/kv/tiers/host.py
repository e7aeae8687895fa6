"""The host KV tier: one pool of host-memory block slots shared by swap preemption and the
prefix-cache offload tier (`kv_offloading_size`), with one accounting. Pure Python.

Slots are held either by a swapped-out request (its computed blocks, until it resumes or
ends) or by a demoted prefix block (a block the radix tree evicted from the device, kept here
instead of dropped). Swap takes precedence: when the pool is full, offloaded blocks are
evicted (in the tier's eviction order) to make room for a swap-out; a demotion never evicts a
swapped request's slots.

Offloaded blocks are found by a chain key: block i of a token sequence under one owner
namespace has key ``block_key(key of block i-1, owner, its tokens)``: the KV events' stable block
hash (sha256; the same in every process, so the disk tier can keep keys across a restart). An
entry keeps its parent key and tokens, and a lookup checks both, so a hash collision reads as a miss, never as wrong KV. A
promotion is a copy: the entry stays (and is touched), so a later device eviction of the same
prefix need not copy it again. Entries promoted or demoted in the current step are locked
until the step's copies are taken, so a slot is never reused while a copy still reads it.

Eviction order (`HostEviction`, pacer.kv.tiers.host_eviction, mixed in): lru (oldest touch first), ttl (lru, and entries idle longer than the TTL are
dropped when the tier is next used), weighted-lru (GreedyDual over tenant weights, as the
device tier). Tenants and quotas as on the device (`tenant_isolation="partitioned"`): each
entry counts against its owner's quota group, a group at its quota makes room by evicting its
own entries only (reason "quota"), and a group with no room keeps nothing here. Pinned
prefixes never leave the device, so they are never demoted. This room never sees tensors: callers turn the copies it reports into
`SchedulerOutput.swap_out` / `swap_in` pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pacer.config import EVICTION_POLICIES
from pacer.kv.block_pool import BlockPool
from pacer.kv.events import (
    MEDIUM_HOST,
    SALT_SEPARATOR,
    BlockEventLog,
    BlockRemovedEvent,
    BlockStoredEvent,
    block_hash,
    namespace_keys,
)
from pacer.kv.tenancy import host_quotas
from pacer.kv.tiers.host_eviction import HostEntry, HostEviction

if TYPE_CHECKING:
    from pacer.config import CacheConfig

__all__ = ["HostKVTier", "HostTierStats", "ROOT_KEY", "chain_keys", "block_key"]

ROOT_KEY = 0


def block_key(parent: int, owner: str, tokens: Sequence[int]) -> int:
    """The chain key of a block after the block of key `parent` (ROOT_KEY: the first block)."""
    return block_hash(None if parent == ROOT_KEY else parent, tokens, owner)


def chain_keys(owner: str, token_ids: Sequence[int], block_size: int, n_blocks: int) -> list[int]:
    """The chain keys of the first `n_blocks` whole blocks of `token_ids` under `owner`."""
    keys: list[int] = []
    parent = ROOT_KEY
    for i in range(n_blocks):
        parent = block_key(parent, owner, token_ids[i * block_size:(i + 1) * block_size])
        keys.append(parent)
    return keys


@dataclass(slots=True)
class HostTierStats:
    """Offload-tier counters (monotonic) for Engine.snapshot() / metrics."""

    demotions: int = 0            # blocks copied device -> host on radix eviction
    promotions: int = 0           # blocks copied host -> device on a prefix match
    hit_tokens: int = 0           # prompt tokens served by promotion (not recomputed)
    evictions: dict[str, int] = field(default_factory=lambda: {"capacity": 0, "ttl": 0, "swap": 0, "quota": 0})
    demotions_skipped: int = 0    # evicted device blocks dropped because the tier was full of swap


class HostKVTier(HostEviction):
    def __init__(self, num_blocks: int, block_size: int, now: Callable[[], float], *,
                 eviction_policy: str = "lru", ttl: float | None = None,
                 tenant_weights: Mapping[str, float] | None = None, offload: bool = True,
                 group_of: Callable[[str], str] | None = None, quotas: Mapping[str, int] | None = None) -> None:
        """`group_of` maps an owner namespace to its quota group; `quotas` (group -> most
        offloaded blocks, "*" for groups not listed) applies to every group but the public one."""
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
        self._entries: dict[int, HostEntry] = {}
        self._group_of = group_of or (lambda owner: "")
        self._quotas = dict(quotas or {})
        self._group_sizes: dict[str, int] = {}
        # per quota group: (eviction key, tick, chain key), lazily pruned
        self._heaps: dict[str, list[tuple[float, int, int]]] = {}
        self._locked: set[int] = set()                  # chain keys copied this step
        self.swap_slots = 0                              # slots held by swapped-out requests
        self._demoted: list[int] | None = None           # keys demoted since `take_demoted`, when tracked
        self.transient: set[int] = set()                 # keys of entries kept in memory only (segments)
        self.events: BlockEventLog | None = None         # KV events (medium CPU), when the engine publishes them
        self.stats = HostTierStats()

    @classmethod
    def from_config(cls, config: CacheConfig, now: Callable[[], float], block_bytes: int | None,
                    num_device_blocks: int = 0) -> HostKVTier | None:
        """The tier `kv_offloading_size` asks for (None when it is 0 or unset): `num_cpu_blocks`
        slots when given, else kv_offloading_size GiB of `block_bytes` blocks. Partitioned
        tenants keep the same share of it as of the device's `num_device_blocks`."""
        if not config.kv_offloading_size:
            return None
        num_host = config.num_cpu_blocks
        if num_host is None:
            if not block_bytes:
                raise ValueError("kv_offloading_size needs the executor's KV block size in bytes")
            num_host = int(config.kv_offloading_size * 1024**3 // block_bytes)
        num_host = max(1, num_host)
        return cls(num_host, config.block_size, now, eviction_policy=config.eviction_policy,
                   ttl=config.cache_ttl, tenant_weights=config.tenant_weights, offload=config.enable_prefix_caching,
                   **host_quotas(config, num_device_blocks, num_host))

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
               device_blocks: Sequence[int], transient: bool = False) -> list[tuple[int, int]]:
        """Keep evicted device blocks: `device_blocks[i]` holds tokens
        `token_ids[i*bs:(i+1)*bs]`, the first following the block of chain key `parent`.
        Returns the (device block, host slot) copies to run before the device blocks are reused.
        `transient`: kept in memory only (a segment's chain): never written to disk nor published."""
        copies: list[tuple[int, int]] = []
        if not self.offload:
            return copies
        self.expire()
        bs = self.block_size
        group = self._group_of(owner)
        chain: list[tuple[int, HostEntry]] = []
        for i, dev in enumerate(device_blocks):
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            key = block_key(parent, owner, tokens)
            entry = self._entries.get(key)
            if entry is None:
                if not self._make_room(group):
                    self.stats.demotions_skipped += len(device_blocks) - i
                    break
                entry = HostEntry(self.pool.allocate(1)[0], parent, owner, tokens, tenant, group, 0.0, 0.0, 0)
                self._entries[key] = entry
                self._group_sizes[group] = self._group_sizes.get(group, 0) + 1
                if transient:
                    self.transient.add(key)
                self._stored(key, entry)
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
                key = block_key(parent, owner, tokens)
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

    def adopt(self, key: int, parent: int, owner: str, tokens: Sequence[int]) -> int | None:
        """Keep a block read back from the disk tier, in a free slot the caller fills (no copy is
        planned, nothing is evicted); None when it is here already or there is no room for it."""
        group = self._group_of(owner)
        limit = self.quota(group)
        if key in self._entries or not self.pool.num_free_blocks or (limit is not None and self.group_size(group) >= limit):
            return None
        tenant = owner.partition(SALT_SEPARATOR)[0]
        entry = HostEntry(self.pool.allocate(1)[0], parent, owner, tuple(tokens), tenant, group, 0.0, 0.0, 0)
        self._entries[key] = entry
        self._group_sizes[group] = self._group_sizes.get(group, 0) + 1
        self._touch(key, entry)
        self._stored(key, entry, demoted=False)
        return entry.slot

    def entries(self) -> list[tuple[int, int, int, str, tuple[int, ...]]]:
        """(key, slot, parent key, owner, tokens) of every offloaded block."""
        return [(k, e.slot, e.parent, e.owner, e.tokens) for k, e in self._entries.items()]

    def entry(self, key: int) -> tuple[int, int, str, tuple[int, ...]] | None:
        """(slot, parent key, owner, tokens) of one offloaded block; None: not here."""
        e = self._entries.get(key)
        return None if e is None else (e.slot, e.parent, e.owner, e.tokens)

    def track_demotions(self) -> None:
        """Keep the chain keys of the blocks demoted from now on, for `take_demoted` (the disk
        tier writes them through)."""
        if self._demoted is None:
            self._demoted = []

    def take_demoted(self) -> list[int]:
        """The keys demoted since the last call, in order ([] unless `track_demotions`)."""
        if self._demoted is None:
            return []
        taken, self._demoted = self._demoted, []
        return taken

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

    def _stored(self, key: int, entry: HostEntry, demoted: bool = True) -> None:
        if key in self.transient:
            return
        if demoted and self._demoted is not None:
            self._demoted.append(key)
        if self.events is not None:
            self.events.append(BlockStoredEvent((key,), None if entry.parent == ROOT_KEY else entry.parent,
                                                entry.tokens, self.block_size, namespace_keys(entry.owner),
                                                MEDIUM_HOST))

    def _drop(self, key: int, reason: str) -> None:
        entry = self._entries.pop(key)
        if self.events is not None and key not in self.transient:
            self.events.append(BlockRemovedEvent((key,), MEDIUM_HOST))
        self._group_sizes[entry.group] -= 1
        self.pool.free([entry.slot])
        self.stats.evictions[reason] = self.stats.evictions.get(reason, 0) + 1
        self.transient.discard(key)

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
        sizes: dict[str, int] = {}
        for e in self._entries.values():
            sizes[e.group] = sizes.get(e.group, 0) + 1
        if sum(self._group_sizes.values()) != len(self._entries):
            raise AssertionError("host tier group sizes do not add up to its entries")
        for group, size in sizes.items():
            limit = self.quota(group)
            if size != self.group_size(group) or (limit is not None and size > limit):
                raise AssertionError(f"host tier group {group!r}: {size} blocks, counted {self.group_size(group)}, "
                                     f"quota {limit}")

