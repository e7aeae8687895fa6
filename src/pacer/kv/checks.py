"""The KV bookkeeping's integrity check (run after every step in tests, and when idle):
free + cached + held == total, and every block's ref count equals its live holders."""

from __future__ import annotations

from collections.abc import Mapping, Set

from pacer.kv.block_pool import BlockPool
from pacer.kv.prefix_cache import PUBLIC, PrefixCache
from pacer.kv.radix_node import RadixNode

__all__ = ["check_kv_invariants", "check_prefix_cache"]


def check_kv_invariants(pool: BlockPool, block_tables: Mapping[str, list[int]], cache: PrefixCache | None,
                        lock_holders: Set[str]) -> None:
    """Raises AssertionError naming the first broken invariant. `lock_holders`: the requests
    holding a prefix-cache lock (each must hold blocks)."""
    pool.check_invariants()
    holders = [0] * pool.num_blocks
    for table in block_tables.values():
        for b in table:
            holders[b] += 1
    cached: set[int] = set()
    if cache is not None:
        cache.check_invariants()
        for node in cache.iter_nodes():
            for b in node.block_ids:
                if b in cached:
                    raise AssertionError(f"block {b} owned by two cache nodes")
                cached.add(b)
                holders[b] += 1
                if node.lock_ref == 0 and pool.ref_count(b) != 1:
                    raise AssertionError(f"evictable block {b} has ref count {pool.ref_count(b)}")
    for b, n in enumerate(holders):
        if pool.ref_count(b) != n:
            raise AssertionError(f"block {b}: ref count {pool.ref_count(b)} != holders {n}")
    held = {b for t in block_tables.values() for b in t}
    if pool.num_free_blocks + len(cached - held) + len(held) != pool.num_blocks:
        raise AssertionError("free + cached + held != total")
    if lock_holders - set(block_tables):
        raise AssertionError("a lock is held by a request with no blocks")


def check_prefix_cache(cache: PrefixCache) -> None:
    """The prefix cache on its own: counts match the tree; lock refs cover locks below; leaf
    sets exact; owners nest. (Reads the cache's private counts: the one reader outside it.)"""
    cached = evictable = 0
    by_group: dict[str, int] = {}
    _check_children(cache, cache.root)
    for node in cache.iter_nodes():
        n = len(node.block_ids)
        if n == 0 or len(node.tokens) != n * cache.block_size:
            raise AssertionError(f"node {node.id}: {n} blocks, {len(node.tokens)} tokens")
        cached += n
        by_group[node.group] = by_group.get(node.group, 0) + n
        child_locks = sum(c.lock_ref for c in node.children.values())
        if node.lock_ref < child_locks:
            raise AssertionError(f"node {node.id}: lock_ref {node.lock_ref} < children's {child_locks}")
        if node.lock_ref == 0:
            evictable += n
        want_leaf = node.lock_ref == 0 and not node.children
        if node.is_leaf_candidate != want_leaf or (node in cache._leaves) != want_leaf:
            raise AssertionError(f"node {node.id}: leaf-set membership wrong")
        _check_children(cache, node)
    if (cached, evictable) != (cache.num_cached_blocks, cache.num_evictable_blocks):
        raise AssertionError(f"counts ({cache.num_cached_blocks}, {cache.num_evictable_blocks}) != tree "
                             f"({cached}, {evictable})")
    for g, n in cache._cached_by_group.items():
        if by_group.get(g, 0) != n:
            raise AssertionError(f"group {g!r}: cached count {n} != tree {by_group.get(g, 0)}")
    for node_id, (node, count) in cache._pinned.items():
        if node.lock_ref < count:
            raise AssertionError(f"pinned node {node_id} is not locked")


def _check_children(cache: PrefixCache, node: RadixNode) -> None:
    for key, child in node.children.items():
        if child.parent is not node or child.key != key or key != (child.owner, tuple(child.tokens[:cache.block_size])):
            raise AssertionError(f"node {child.id}: bad child key")
        if node.owner != PUBLIC and child.owner != node.owner:
            raise AssertionError(f"node {child.id}: owner {child.owner!r} under {node.owner!r}")
