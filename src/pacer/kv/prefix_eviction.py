"""Which cached blocks may leave the prefix cache, and in what order: the half of `PrefixCache`
(pacer.kv.prefix_cache) that keeps its eviction state. Pure Python; a mixin over the cache's
attributes, as the KV manager's `PrefixSlots` is over the manager's.

- **Touches** key a path for eviction (`_touch`: recency, tick, GreedyDual priority for the
  accessing tenant); a locked path's touch waits on its deepest node (`_touch_locked`).
- **Locks and pins** protect a path (`lock`, `relock`, `unlock`, `pin`, `unpin`); the
  evictable counts (per eviction group too) move as paths lock and unlock, so "how many
  blocks could I get?" is O(1) (`evictable_on_path` for one path).
- **Eviction** takes blocks from the tail of the best unlocked leaf under the policy's key,
  from a lazily invalidated heap per group (`evict`), drops leaves idle past the TTL
  (`expire`) and a released session's own path (`drop_path`); the host tier sees each drop
  first (`on_drop`), the event log after.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pacer.kv.events import BlockEventLog, BlockRemovedEvent
from pacer.kv.radix_node import WALK_TICKS, EvictableLeaves, PrefixMatch, RadixNode, merge_touches

__all__ = ["PrefixEviction"]


class PrefixEviction:
    """Touches, locks, pins and eviction of `PrefixCache` (a mixin: the attributes are the cache's)."""

    block_size: int
    policy: str
    ttl: float | None
    events: BlockEventLog | None
    on_drop: Callable[[RadixNode, int], None] | None
    num_cached_blocks: int
    num_evictable_blocks: int
    num_retained_dropped: int
    _now: Callable[[], float]
    _weights: Mapping[str, float]
    _walks: int
    _inflation: float
    _leaves: EvictableLeaves
    _cached_by_group: dict[str, int]
    _evictable_by_group: dict[str, int]
    _pinned: dict[int, tuple[RadixNode, int]]
    _next_expiry_scan: float

    def _touch(self, node: RadixNode, tenant: str) -> None:
        now = self._now()
        floor = self._inflation + self._weights.get(tenant, 1.0)
        self._walks += 1
        tick, push = self._walks * WALK_TICKS, self._leaves.push
        while node.parent is not None:
            node.last_access = now
            node.tick = tick
            if floor > node.priority:
                node.priority = floor
            if node.is_leaf_candidate:
                push(node)
            tick += 1
            node = node.parent

    def _touch_locked(self, node: RadixNode, tenant: str) -> None:
        """`_touch` of a locked path (no eviction candidate on it, so nothing to re-key): kept on
        its deepest node as pending, written to each node of the path when its key is first read
        (`settle`, as it becomes a candidate; a removed node hands its pending touch up)."""
        if node.parent is not None:
            self._walks += 1
            touch = (self._now(), self._walks * WALK_TICKS, self._inflation + self._weights.get(tenant, 1.0))
            node.pending = merge_touches(node.pending, touch)

    # ------------------------------------------------------------------ lock / pin

    def lock(self, handle: PrefixMatch) -> None:
        """Protect the handle's path from eviction until `unlock`."""
        self._lock_up_to(handle.node, None)

    def _lock_up_to(self, node: RadixNode | None, stop: RadixNode | None) -> RadixNode | None:
        """Lock the path from `node` up to `stop` (excluded) or the root; returns where it stopped."""
        while node is not None and node.parent is not None and node is not stop:
            if node.lock_ref == 0:
                self._move_evictable(node, -len(node.block_ids))
                self._leaves.update(node, False)
            node.lock_ref += 1
            node = node.parent
        return node

    def relock(self, old: PrefixMatch, new: PrefixMatch) -> None:
        """Move a lock from `old` to `new`: the same as `lock(new)` then `unlock(old)`, but when
        old's node is on new's path (a request's lock moving down as its blocks are cached) only
        the nodes below it are walked: those above stay locked, as the pair would leave them."""
        self._lock_path(old, new.node)

    def _lock_path(self, old: PrefixMatch | None, node: RadixNode | None) -> None:
        """Lock the path from `node` up (`relock` from `old`'s node, when given)."""
        if old is None:
            self._lock_up_to(node, None)
            return
        stop = old.node if old.node.parent is not None else None
        if stop is None or self._lock_up_to(node, stop) is not stop:
            if stop is None:
                self._lock_up_to(node, None)
            self.unlock(old)

    def evictable_on_path(self, handle: PrefixMatch, groups: Sequence[str] | None = None) -> int:
        """Blocks of the handle's path that eviction (of `groups`) could take now: what
        `lock(handle)` would protect."""
        n = 0
        node: RadixNode | None = handle.node
        while node is not None and node.parent is not None and node.lock_ref == 0:   # locks reach the root
            if groups is None or node.group in groups:
                n += len(node.block_ids)
            node = node.parent
        return n

    def unlock(self, handle: PrefixMatch) -> None:
        node: RadixNode | None = handle.node
        while node is not None and node.parent is not None:
            if node.lock_ref <= 0:
                raise ValueError(f"unlock of unlocked node {node.id}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._move_evictable(node, len(node.block_ids))
                if not node.children:
                    self._leaves.update(node, True)
            node = node.parent

    def pin(self, handle: PrefixMatch) -> bool:
        """Keep the handle's path until `unpin` (a lock with no owner request); False (nothing
        pinned) for the root."""
        if handle.node.parent is None:
            return False
        self.lock(handle)
        node, count = self._pinned.get(handle.node.id, (handle.node, 0))
        self._pinned[node.id] = (node, count + 1)
        return True

    def unpin(self, handle: PrefixMatch) -> None:
        entry = self._pinned.get(handle.node.id)
        if entry is None:
            raise ValueError("unpin of a prefix that is not pinned")
        node, count = entry
        if count == 1:
            del self._pinned[node.id]
        else:
            self._pinned[node.id] = (node, count - 1)
        self.unlock(handle)

    def _move_evictable(self, node: RadixNode, delta: int) -> None:
        self.num_evictable_blocks += delta
        self._evictable_by_group[node.group] = self._evictable_by_group.get(node.group, 0) + delta

    # ------------------------------------------------------------------ eviction

    def evict(self, n: int, groups: Sequence[str] | None = None) -> list[int]:
        """Drop up to n blocks from unlocked, unpinned leaves (tail blocks first) of the
        given eviction groups (all when None), best key first. Returns the dropped block ids;
        the caller releases the cache's reference on each."""
        freed: list[int] = []
        while len(freed) < n:
            best = self._leaves.best(groups)
            if best is None:
                break
            if self.policy == "weighted-lru":
                self._inflation = max(self._inflation, best.priority)
            freed.extend(self._trim(best, n - len(freed)))
        return freed

    def _trim(self, node: RadixNode, most: int) -> list[int]:
        """Remove up to `most` blocks from the tail of an evictable leaf."""
        take = min(most, len(node.block_ids))
        if node.retain_ref:
            self.num_retained_dropped += take
        if self.on_drop is not None and take:
            self.on_drop(node, take)
        dropped = node.block_ids[-take:]
        del node.block_ids[len(node.block_ids) - take:]   # in place: a long leaf loses a block at a time
        del node.tokens[len(node.block_ids) * self.block_size:]
        if self.events is not None:
            self.events.append(BlockRemovedEvent(tuple(node.hashes[-take:])))
            node.hashes = node.hashes[:-take]
        group = node.group
        self.num_cached_blocks -= take
        self._cached_by_group[group] -= take
        self.num_evictable_blocks -= take   # _move_evictable, inline: once per evicted leaf
        self._evictable_by_group[group] = self._evictable_by_group.get(group, 0) - take
        if not node.block_ids:
            leaves = self._leaves
            leaves.update(node, False)
            parent = node.parent
            if parent is not None:
                del parent.children[node.key]
                if node.pending is not None:   # its touches reached its ancestors too, a tick higher per level
                    when, tick, floor = node.pending
                    parent.pending = merge_touches(parent.pending, (when, tick + 1, floor))
                leaves.update(parent, True)
        return dropped

    def expire(self) -> list[int]:
        """Drop every unlocked leaf idle longer than the TTL (repeatedly, so idle parents
        follow). Scans at most ~10 times per TTL period. Returns the dropped block ids."""
        if self.ttl is None:
            return []
        now = self._now()
        if now < self._next_expiry_scan:
            return []
        self._next_expiry_scan = now + self.ttl / 10
        deadline = now - self.ttl
        freed: list[int] = []
        stack = [n for n in self._leaves if n.last_access < deadline and not n.retain_ref]
        while stack:
            node = stack.pop()
            if not node.is_leaf_candidate or node.last_access >= deadline or node.retain_ref:
                continue
            parent = node.parent
            freed.extend(self._trim(node, len(node.block_ids)))
            if parent is not None and parent.is_leaf_candidate:
                stack.append(parent)
        return freed

    def rekey(self, node: RadixNode) -> None:
        """Re-order an eviction candidate whose key changed (its retention tier)."""
        if node.is_leaf_candidate:
            self._leaves.push(node)

    def drop_path(self, node: RadixNode) -> list[int]:
        """Drop `node` and then its ancestors while each is an unlocked, unretained leaf of the
        tree (a released session's own blocks); returns the dropped block ids."""
        freed: list[int] = []
        while node.parent is not None and node.is_leaf_candidate and not node.retain_ref:
            parent = node.parent
            freed.extend(self._trim(node, len(node.block_ids)))
            node = parent
        return freed
