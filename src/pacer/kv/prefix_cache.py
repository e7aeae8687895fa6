"""Prefix cache: a radix tree over full KV blocks. Pure Python; no requests, no pool. One of
the two `pacer.kv.interface.PrefixCacheProtocol` implementations (the other, with
`enable_prefix_caching=False`, is `pacer.kv.null_cache.NullPrefixCache`).

Contract (handle-based): `match_prefix` -> `lock(handle)` -> ... -> `insert` -> `unlock`.
`evict(n)` / `expire()` return the block ids they dropped; the cache never frees blocks and
never reads or writes request fields — the KV manager owns both. A node holds exactly one
reference on each of its blocks (the KV manager takes it when `insert` reports adoption).

Each node carries a run of whole blocks (token ids + block ids) and an `owner`: the tenant
namespace whose requests may match it (`PUBLIC` = everyone). Children are keyed by
(owner, first block's tokens), so a tenant sees only its own and public branches. A node is
split when a match or insert diverges inside it.

What may leave the tree, and when, is `PrefixEviction` (pacer.kv.prefix_eviction), mixed in.
Lock counts propagate to the root, and evictable / protected block counts are kept
incrementally (per eviction group too), so "how many blocks could I get?" is O(1).
Eviction takes blocks from the tail of the best unlocked leaf under a small key function
(`lru`, `weighted-lru`, `ttl`), using a lazily invalidated heap per group. A key is read only
for a candidate, so the touch of a locked path (a running request caching each block it
completes) is kept pending on its deepest node and written to a node when it becomes one. Session retention
(`pacer.kv.retention`) is a tier above the key: leaves a retention window covers go after every
unretained leaf, and the TTL does not expire them while a window is open.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from pacer.config import EVICTION_POLICIES
from pacer.kv.checks import check_radix_tree
from pacer.kv.events import BlockEvent, BlockEventLog
from pacer.kv.prefix_eviction import PrefixEviction
from pacer.kv.radix_node import (
    EVICTION_KEYS,
    PUBLIC,
    EvictableLeaves,
    PrefixMatch,
    RadixNode,
    retention_tiered,
)

if TYPE_CHECKING:
    from pacer.config import CacheConfig

__all__ = ["PrefixCache", "PrefixMatch", "PUBLIC", "EVICTION_POLICIES"]



class PrefixCache(PrefixEviction):
    """Radix tree of cached blocks. `now` is a clock function (injected; never `time`).

    weighted-lru is GreedyDual: on access a node's priority becomes max(priority, L + weight)
    of the accessing tenant, and L rises to the priority of each evicted node. A weight-w
    node outlives ~(w - 1) turnovers of weight-1 churn without being touched; with equal
    weights it is plain LRU.
    """

    enabled = True   # (the null cache's is False)

    def __init__(self, block_size: int, now: Callable[[], float], eviction_policy: str = "lru",
                 tenant_weights: Mapping[str, float] | None = None, ttl: float | None = None,
                 group_of: Callable[[str], str] | None = None) -> None:
        if eviction_policy not in EVICTION_KEYS:
            raise ValueError(f"eviction_policy must be one of {', '.join(EVICTION_POLICIES)}; got {eviction_policy!r}")
        if ttl is not None and ttl <= 0:
            raise ValueError(f"cache_ttl must be > 0 seconds, got {ttl}")
        self.block_size = block_size
        self.policy = eviction_policy
        self._key = EVICTION_KEYS[eviction_policy]
        self._now = now
        self._weights = dict(tenant_weights or {})
        self.ttl = ttl
        self._group_of = group_of or (lambda owner: PUBLIC)
        self._ids = itertools.count(1)
        self._walks = 0   # touches so far (a touch's ticks: see WALK_TICKS)
        self.root = RadixNode(0, None, PUBLIC, PUBLIC, [], [])
        self.root.lock_ref = 1  # never evicted, never a leaf candidate
        self._inflation = 0.0
        self._leaves = EvictableLeaves(retention_tiered(self._key))
        self.num_cached_blocks = 0
        self.num_evictable_blocks = 0
        self._cached_by_group: dict[str, int] = {}
        self._evictable_by_group: dict[str, int] = {}
        self._pinned: dict[int, tuple[RadixNode, int]] = {}  # node id -> (node, pin count)
        self._next_expiry_scan = float("-inf")
        self.events: BlockEventLog | None = None   # store/remove events, when someone publishes them
        # called with (leaf, n) before the leaf's last n blocks are dropped: the host tier
        # (pacer.kv.tiers.offload) keeps a copy of them
        self.on_drop: Callable[[RadixNode, int], None] | None = None
        self.num_retained_dropped = 0   # blocks eviction took from leaves a retention window covered

    @classmethod
    def from_config(cls, config: CacheConfig, now: Callable[[], float],
                    group_of: Callable[[str], str] | None = None) -> PrefixCache:
        """The cache a CacheConfig describes (the ttl policy's TTL defaults to 30 minutes)."""
        ttl = config.resolved_ttl()
        return cls(config.block_size, now, config.eviction_policy, tenant_weights=config.tenant_weights, ttl=ttl,
                   group_of=group_of)

    def enable_events(self) -> BlockEventLog:
        """Record a BlockStoredEvent per adopted run of blocks and a BlockRemovedEvent per
        dropped one from now on (blocks cached already are reported as stored first); returns
        the log (the same one when already recording)."""
        if self.events is None:
            self.events = BlockEventLog()
            for node in self.iter_nodes():   # parents before children, so each event's parent hash is known
                self.events.record_stored(node, self.block_size)
        return self.events

    def take_events(self) -> list[BlockEvent]:
        """The store/remove events since the last call, in order (empty when not recording)."""
        return self.events.take() if self.events is not None else []

    # ------------------------------------------------------------------ queries

    def cached_blocks(self, group: str) -> int:
        return self._cached_by_group.get(group, 0)

    def evictable_blocks(self, groups: Sequence[str] | None = None) -> int:
        if groups is None:
            return self.num_evictable_blocks
        return sum(self._evictable_by_group.get(g, 0) for g in groups)

    @property
    def num_protected_blocks(self) -> int:
        return self.num_cached_blocks - self.num_evictable_blocks

    def iter_nodes(self) -> Iterator[RadixNode]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # ------------------------------------------------------------------ match / insert

    def match_prefix(self, token_ids: Sequence[int], owners: Sequence[str], max_blocks: int,
                     tenant: str = PUBLIC) -> PrefixMatch:
        """Longest cached run of whole blocks (at most `max_blocks`) visible to `owners`.
        Splits a node when the match ends inside it; touches the matched path."""
        bs = self.block_size
        limit = min(len(token_ids) // bs, max_blocks)
        node = self.root
        blocks: list[int] = []
        while len(blocks) < limit:
            pos = len(blocks) * bs
            child = self._child(node, owners, token_ids[pos:pos + bs])
            if child is None:
                break
            k = self._common_blocks(child, token_ids, pos, limit - len(blocks))
            if k < len(child.block_ids):
                child = self._split(child, k)
            blocks.extend(child.block_ids)
            node = child
        self._touch(node, tenant)
        return PrefixMatch(node, tuple(blocks))

    def lookup_blocks(self, token_ids: Sequence[int], owners: Sequence[str], max_blocks: int,
                      tenant: str | None = None) -> int:
        """How many whole blocks `match_prefix` would match, looked up only: no split. With a
        `tenant`, the wholly matched path is touched for it (a waiting request's demand keeps
        its prefix recent); without, nothing is."""
        bs = self.block_size
        limit = min(len(token_ids) // bs, max_blocks)
        node, num = self.root, 0
        while num < limit:
            child = self._child(node, owners, token_ids[num * bs:(num + 1) * bs])
            if child is None:
                break
            k = self._common_blocks(child, token_ids, num * bs, limit - num)
            num += k
            if k < len(child.block_ids):
                break
            node = child
        if tenant is not None and node.parent is not None:
            self._touch(node, tenant)
        return num

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int], owner: str,
               tenant: str = PUBLIC, start: PrefixMatch | None = None,
               owners: Sequence[str] | None = None, lock: bool = False) -> tuple[list[int], PrefixMatch]:
        """Cache the whole blocks of `token_ids` (block i of `block_ids` holds tokens
        [i*bs, (i+1)*bs)). Returns the block ids newly adopted (the caller adds one ref to
        each) and a handle to the deepest node of the path. Blocks already cached for the
        same tokens are kept; the caller's duplicates are not adopted. `start`, a locked
        handle on a prefix of `token_ids`, skips the walk down to it. `owners` are the
        namespaces the walk may reuse (default: `owner`, then public). `lock`: the handle comes
        back locked, `start`'s lock moved to it (`relock`; `lock` without a start), before the
        path is touched (a node locked at once is no eviction candidate to key)."""
        bs = self.block_size
        n = min(len(token_ids) // bs, len(block_ids))
        if owners is None:
            owners = (owner,) if owner == PUBLIC else (owner, PUBLIC)
        node, done, adopted, created = self.root, 0, [], None
        path: tuple[int, ...] = ()   # the blocks of the path walked (a locked start's path is its blocks)
        walked: list[int] = []       # and below the start
        if start is not None and start.num_blocks <= n:
            node, done, path = start.node, start.num_blocks, start.block_ids
        while done < n:
            pos = done * bs
            first = token_ids[pos:pos + bs]
            key_tokens = tuple(first)
            child = self._child_by_key(node, owners, key_tokens)
            if child is None:   # a new leaf of the rest (locked at once when the handle is to be)
                tokens = first if n - done == 1 else list(token_ids[pos:n * bs])
                created = self._add_child(node, owner, list(tokens), list(block_ids[done:n]), key_tokens, lock)
                adopted = list(block_ids[done:n])
                walked.extend(adopted)
                node = created
                break
            k = self._common_blocks(child, token_ids, pos, n - done)
            if k < len(child.block_ids):
                child = self._split(child, k)
            walked.extend(child.block_ids)
            done += k
            node = child
        handle = PrefixMatch(node, path + tuple(walked) if walked else path)
        if lock:   # a leaf created here is locked already: lock (or move start's lock to) the path above it
            self._lock_path(start, node if created is None else node.parent)
            self._touch_locked(node, tenant)
        else:
            self._touch(node, tenant)
        return adopted, handle

    def _child(self, node: RadixNode, owners: Sequence[str], first: Sequence[int]) -> RadixNode | None:
        return self._child_by_key(node, owners, tuple(first))

    def _child_by_key(self, node: RadixNode, owners: Sequence[str], key_tokens: tuple[int, ...]) -> RadixNode | None:
        children = node.children
        for owner in owners:
            child = children.get((owner, key_tokens))
            if child is not None:
                return child
        return None

    def _common_blocks(self, node: RadixNode, token_ids: Sequence[int], pos: int, most: int) -> int:
        bs = self.block_size
        k, n = 1, min(len(node.block_ids), most)  # the first block matched by key
        if n > 1 and node.tokens[bs:n * bs] == list(token_ids[pos + bs:pos + n * bs]):
            return n   # all of them (one comparison; a long shared prompt is the common case)
        while k < n and node.tokens[k * bs:(k + 1) * bs] == list(token_ids[pos + k * bs:pos + (k + 1) * bs]):
            k += 1
        return k

    def _path_blocks(self, node: RadixNode) -> list[int]:
        parts: list[list[int]] = []
        while node.parent is not None:
            parts.append(node.block_ids)
            node = node.parent
        return [b for part in reversed(parts) for b in part]

    def _add_child(self, parent: RadixNode, owner: str, tokens: list[int], block_ids: list[int],
                   key_tokens: tuple[int, ...] | None = None, locked: bool = False) -> RadixNode:
        """A new leaf under `parent` (`key_tokens`: its first block's tokens, when the caller has them);
        the caller (insert) touches it next, which keys it for eviction. `locked`: it comes with one
        lock, as `lock` on it would leave it (held, never an eviction candidate); the caller locks
        the path above it."""
        group = self._group_of(owner)
        child = RadixNode(next(self._ids), parent, owner, group, tokens, block_ids)
        child.key = (owner, tuple(tokens[:self.block_size]) if key_tokens is None else key_tokens)
        parent.children[child.key] = child
        self._leaves.update(parent, False)
        n = len(block_ids)
        self.num_cached_blocks += n
        self._cached_by_group[group] = self._cached_by_group.get(group, 0) + n
        if locked:
            child.lock_ref = 1
            self._evictable_by_group.setdefault(group, 0)
        else:
            self.num_evictable_blocks += n
            self._evictable_by_group[group] = self._evictable_by_group.get(group, 0) + n
            self._leaves.update(child, True, push=False)   # insert's _touch keys it next
        if self.events is not None:
            self.events.record_stored(child, self.block_size)
        return child

    def _split(self, node: RadixNode, k: int) -> RadixNode:
        """Cut `node` after k blocks; returns the new upper part (the matched prefix).
        Handles to `node` stay valid: it keeps the tail, and the new parent copies its lock."""
        bs = self.block_size
        parent = node.parent
        if parent is None:
            raise ValueError("cannot split the root")
        upper = RadixNode(next(self._ids), parent, node.owner, node.group, node.tokens[:k * bs], node.block_ids[:k])
        upper.lock_ref = node.lock_ref
        upper.retain_ref, upper.next_use = node.retain_ref, node.next_use
        upper.last_access, upper.tick, upper.priority = node.last_access, node.tick, node.priority
        upper.key = node.key
        parent.children[upper.key] = upper
        node.tokens = node.tokens[k * bs:]
        node.block_ids = node.block_ids[k:]
        upper.hashes, node.hashes = node.hashes[:k], node.hashes[k:]
        node.parent = upper
        node.key = (node.owner, tuple(node.tokens[:bs]))
        upper.children[node.key] = node
        return upper

    # ------------------------------------------------------------------ checks

    def check_invariants(self) -> None:
        """Counts match the tree; lock refs cover locks below; leaf sets exact; owners nest
        (`pacer.kv.checks.check_radix_tree`, handed the counts kept here)."""
        check_radix_tree(self.root, self.block_size, self._leaves, num_cached=self.num_cached_blocks,
                         num_evictable=self.num_evictable_blocks, cached_by_group=self._cached_by_group,
                         pinned=self._pinned)
