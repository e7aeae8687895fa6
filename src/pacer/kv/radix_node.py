"""The prefix cache's tree node and match handle, the owner every tenant may match (`PUBLIC`),
the eviction keys it orders leaves by, and its index of evictable leaves. Pure Python."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

__all__ = ["RadixNode", "PrefixMatch", "PUBLIC", "EVICTION_KEYS", "Key", "TieredKey", "Touch", "EvictableLeaves",
           "retention_tiered", "merge_touches", "settle", "WALK_TICKS"]

Key = tuple[float, int]
Touch = tuple[float, int, float]   # (when, tick, priority floor) of a touch
TieredKey = tuple[int, float, float]   # (retained?, key): retained leaves go after every unretained one
PUBLIC = ""  # owner of nodes every tenant may match (shared mode, public prewarmed prefixes)
# ticks per touch: a touch's walk from a node up to the root ticks its nodes walk * WALK_TICKS + 0, 1,
# 2, ... (deeper first), so ticks order as one counter over every node walked would (no path is deeper)
WALK_TICKS = 1 << 32


class RadixNode:
    """A run of whole cached blocks (token ids + block ids) under one owner, and its place in the tree."""

    __slots__ = ("id", "parent", "owner", "group", "key", "tokens", "block_ids", "children", "lock_ref",
                 "last_access", "tick", "priority", "version", "is_leaf_candidate", "hashes", "retain_ref",
                 "next_use", "pending")

    def __init__(self, node_id: int, parent: RadixNode | None, owner: str, group: str,
                 tokens: list[int], block_ids: list[int]) -> None:
        self.id = node_id
        self.parent = parent
        self.owner = owner
        self.group = group
        self.key: tuple[str, tuple[int, ...]] = (owner, ())  # its key in parent.children
        self.tokens = tokens
        self.block_ids = block_ids
        self.children: dict[tuple[str, tuple[int, ...]], RadixNode] = {}
        self.lock_ref = 0
        self.last_access = 0.0
        self.tick = 0
        self.priority = 0.0
        self.version = 0
        self.is_leaf_candidate = False  # in its group's evictable-leaf set
        self.hashes: list[int] = []     # block identities (pacer.kv.events), kept only when events are on
        self.retain_ref = 0             # open session retention windows over this node (pacer.kv.retention)
        self.next_use = 0.0             # while retained: when its session is expected back (the soonest window's)
        # a touch of a locked path not yet written to it: (when, tick here, priority floor) for this
        # node and, a tick higher per level, its ancestors (`PrefixCache.touch_locked`, `settle`)
        self.pending: Touch | None = None


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Handle of a match or insert: the deepest node and the blocks along its path (for the
    null cache, which has no path, the caller's own blocks of the prefix it offered)."""

    node: RadixNode
    block_ids: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


def merge_touches(a: Touch | None, b: Touch) -> Touch:
    """The later of two touches (by tick) with the higher of their floors: what both, written in
    turn, leave on a node."""
    if a is None:
        return b
    later = a if a[1] > b[1] else b
    return (later[0], later[1], a[2] if a[2] > b[2] else b[2])


def settle(node: RadixNode) -> None:
    """Write the node's pending touch to it (its eviction key is about to be read)."""
    p = node.pending
    if p is not None:
        if p[1] > node.tick:
            node.last_access, node.tick = p[0], p[1]
        if p[2] > node.priority:
            node.priority = p[2]


def _lru_key(node: RadixNode) -> Key:
    return (node.last_access, node.tick)


def _weighted_key(node: RadixNode) -> Key:
    return (node.priority, node.tick)


EVICTION_KEYS: dict[str, Callable[[RadixNode], Key]] = {"lru": _lru_key, "ttl": _lru_key, "weighted-lru": _weighted_key}


def retention_tiered(key: Callable[[RadixNode], Key]) -> Callable[[RadixNode], TieredKey]:
    """An eviction key with session retention as a tier above it: a leaf some retention window
    covers sorts after every unretained leaf (pinned leaves are locked, so they come after
    both). Unretained leaves keep `key`'s order; retained ones go farthest expected return
    first (Belady's rule on the learned tool times: the conversation needed last is dropped
    first, so a cyclic agent loop does not thrash as LRU does)."""
    def tiered(node: RadixNode) -> TieredKey:
        if node.retain_ref:
            return (1, -node.next_use, -node.tick)
        a, b = key(node)
        return (0, a, b)
    return tiered


class EvictableLeaves:
    """Per eviction group, the eviction candidates (unlocked, childless, non-root nodes), each
    with a lazily invalidated heap by the eviction key: a node re-keyed or dropped leaves a
    stale item behind, skipped by its version (and the heap is rebuilt when mostly stale)."""

    def __init__(self, key: Callable[[RadixNode], TieredKey]) -> None:
        self.key = key
        self._leaves: dict[str, set[RadixNode]] = {}
        self._heaps: dict[str, list[tuple[TieredKey, int, int, RadixNode]]] = {}

    def update(self, node: RadixNode, on: bool, push: bool = True) -> None:
        """Add `node` to (on, when it qualifies) or remove it from its group's candidates.
        `push` False: the caller keys a new candidate itself right after (`push`)."""
        on = on and node.parent is not None and node.lock_ref == 0 and not node.children
        if on == node.is_leaf_candidate:
            return
        node.is_leaf_candidate = on
        leaves = self._leaves.setdefault(node.group, set())
        if on:
            settle(node)   # a candidate's key is read: touches of it while it was locked are written now
            leaves.add(node)
            if push:
                self.push(node)
        else:
            leaves.discard(node)

    def push(self, node: RadixNode) -> None:
        """(Re-)key a candidate, e.g. after a touch."""
        node.version += 1
        heap = self._heaps.setdefault(node.group, [])
        heapq.heappush(heap, (self.key(node), node.id, node.version, node))
        if len(heap) > 4 * len(self._leaves.get(node.group, ())) + 64:
            live = [(self.key(n), n.id, n.version, n) for n in self._leaves[node.group]]
            heapq.heapify(live)
            self._heaps[node.group] = live

    def best(self, groups: Sequence[str] | None) -> RadixNode | None:
        """The candidate with the smallest key among `groups` (all when None)."""
        best: RadixNode | None = None
        for g in (list(self._heaps) if groups is None else groups):
            cand = self._peek(g)
            if cand is not None and (best is None or self.key(cand) < self.key(best)):
                best = cand
        return best

    def _peek(self, group: str) -> RadixNode | None:
        heap = self._heaps.get(group)
        while heap:
            _, _, version, node = heap[0]
            if node.is_leaf_candidate and node.version == version:
                return node
            heapq.heappop(heap)
        return None

    def __contains__(self, node: RadixNode) -> bool:
        return node in self._leaves.get(node.group, ())

    def __iter__(self) -> Iterator[RadixNode]:
        for leaves in self._leaves.values():
            yield from leaves
