"""Which offloaded blocks leave the host KV tier, and in what order: the half of `HostKVTier`
(pacer.kv.tiers.host) that keeps its eviction state. Pure Python; a mixin over the tier's
attributes, as `PrefixEviction` is over the prefix cache's.

- **Quotas**: each entry counts against its owner's quota group; a group at its quota makes
  room by evicting its own entries only (reason "quota"), the pool by evicting anyone's.
- **Order**: a touch pushes the entry on its group's heap under the policy's key (lru: last
  access; weighted-lru: GreedyDual priority over tenant weights); heaps are pruned lazily
  (an item whose tick is not its entry's is stale), and entries locked for this step's copies
  are set aside, never evicted.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pacer.kv.block_pool import BlockPool

__all__ = ["HostEntry", "HostEviction"]


@dataclass(slots=True)
class HostEntry:
    """One offloaded block: its host slot, chain (parent key, owner, tokens), quota group and
    eviction key (last access, GreedyDual priority, the tick of its live heap item)."""

    slot: int
    parent: int
    owner: str
    tokens: tuple[int, ...]
    tenant: str
    group: str
    last_access: float
    priority: float
    tick: int


class HostEviction:
    """Quotas, touches and eviction of `HostKVTier` (a mixin: the attributes are the tier's)."""

    pool: BlockPool
    _now: Callable[[], float]
    _policy: str
    _weights: Mapping[str, float]
    _inflation: float
    _tick: int
    _entries: dict[int, HostEntry]
    _quotas: dict[str, int]
    _group_sizes: dict[str, int]
    _heaps: dict[str, list[tuple[float, int, int]]]
    _locked: set[int]
    _drop: Callable[[int, str], None]

    def quota(self, group: str) -> int | None:
        """Most offloaded blocks `group` may hold; None: no limit."""
        if not self._quotas or group == "":
            return None
        return self._quotas.get(group, self._quotas.get("*", 0))

    def group_size(self, group: str) -> int:
        return self._group_sizes.get(group, 0)

    def _make_room(self, group: str) -> bool:
        """A free slot for one more block of `group`: within its quota (evicting its own entries)
        and within the pool (evicting anyone's, in eviction order)."""
        limit = self.quota(group)
        if limit is not None and self.group_size(group) >= limit:
            over = self.group_size(group) - limit + 1
            if self._evict(over, "quota", group) < over:
                return False
        return bool(self.pool.num_free_blocks) or bool(self._evict(1, "capacity"))

    def _touch(self, key: int, entry: HostEntry) -> None:
        self._tick += 1
        entry.tick = self._tick
        entry.last_access = self._now()
        if self._policy == "weighted-lru":
            entry.priority = self._inflation + self._weights.get(entry.tenant, 1.0)
            sort_key = entry.priority
        else:
            sort_key = entry.last_access
        heapq.heappush(self._heaps.setdefault(entry.group, []), (sort_key, entry.tick, key))

    def _next_victim(self, group: str | None, skipped: list[tuple[str, tuple[float, int, int]]]
                     ) -> tuple[str, tuple[float, int, int]] | None:
        """The best eviction candidate (of `group`, or of any group): stale items are pruned,
        locked ones set aside in `skipped` (pushed back by the caller)."""
        best: str | None = None
        for g in [group] if group is not None else list(self._heaps):
            heap = self._heaps.get(g)
            while heap:
                _, tick, key = heap[0]
                entry = self._entries.get(key)
                if entry is None or entry.tick != tick:
                    heapq.heappop(heap)          # a stale heap item
                elif key in self._locked:
                    skipped.append((g, heapq.heappop(heap)))
                else:
                    break
            if heap and (best is None or heap[0][:2] < self._heaps[best][0][:2]):
                best = g
        return None if best is None else (best, heapq.heappop(self._heaps[best]))

    def _evict(self, n: int, reason: str, group: str | None = None) -> int:
        """Drop up to n unlocked offloaded blocks (of `group` only, when given), best eviction
        key first; returns how many."""
        dropped = 0
        skipped: list[tuple[str, tuple[float, int, int]]] = []
        while dropped < n:
            victim = self._next_victim(group, skipped)
            if victim is None:
                break
            key = victim[1][2]
            entry = self._entries[key]
            if self._policy == "weighted-lru":
                self._inflation = max(self._inflation, entry.priority)
            self._drop(key, reason)
            dropped += 1
        for g, item in skipped:
            heapq.heappush(self._heaps[g], item)
        return dropped
