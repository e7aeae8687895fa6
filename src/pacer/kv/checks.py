"""The KV bookkeeping's integrity checks (run after every step in tests, and when idle). Pure
Python; reads only what it is handed:

- `check_kv_invariants`: the manager's whole view, free + cached + held == total, and every
  block's ref count equals its live holders (request tables + one cache node);
- `check_radix_tree`: a radix tree on its own (the prefix cache hands it its counts), counts
  match the tree, lock refs cover the locks below, leaf sets exact, owners nest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set

from pacer.kv.block_pool import BlockPool
from pacer.kv.interface import PrefixCacheProtocol
from pacer.kv.radix_node import PUBLIC, EvictableLeaves, RadixNode

__all__ = ["check_kv_invariants", "check_radix_tree"]


def check_kv_invariants(pool: BlockPool, block_tables: Mapping[str, list[int]], cache: PrefixCacheProtocol,
                        lock_holders: Set[str], segment_blocks: Sequence[int] = ()) -> None:
    """Raises AssertionError naming the first broken invariant. `lock_holders`: the requests
    holding a prefix-cache handle (each must hold blocks); `segment_blocks`: the segment store's
    blocks (`pacer.kv.segment_store`), each its one holder's and no one else's."""
    pool.check_invariants()
    holders = [0] * pool.num_blocks
    for table in block_tables.values():
        for b in table:
            holders[b] += 1
    cache.check_invariants()
    cached: set[int] = set()
    for node in cache.iter_nodes():
        for b in node.block_ids:
            if b in cached:
                raise AssertionError(f"block {b} owned by two cache nodes")
            cached.add(b)
            holders[b] += 1
            if node.lock_ref == 0 and pool.ref_count(b) != 1:
                raise AssertionError(f"evictable block {b} has ref count {pool.ref_count(b)}")
    stored = set(segment_blocks)
    if len(stored) != len(segment_blocks) or stored & cached:
        raise AssertionError("a segment block is stored twice or also owned by a cache node")
    for b in stored:
        holders[b] += 1
        if pool.ref_count(b) != 1:
            raise AssertionError(f"segment block {b} has ref count {pool.ref_count(b)} (the store is its one holder)")
    for b, n in enumerate(holders):
        if pool.ref_count(b) != n:
            raise AssertionError(f"block {b}: ref count {pool.ref_count(b)} != holders {n}")
    held = {b for t in block_tables.values() for b in t}
    if pool.num_free_blocks + len(cached - held) + len(stored) + len(held) != pool.num_blocks:
        raise AssertionError("free + cached + stored + held != total")
    if lock_holders - set(block_tables):
        raise AssertionError("a lock is held by a request with no blocks")


def check_radix_tree(root: RadixNode, block_size: int, leaves: EvictableLeaves, *, num_cached: int,
                     num_evictable: int, cached_by_group: Mapping[str, int],
                     pinned: Mapping[int, tuple[RadixNode, int]]) -> None:
    """A prefix cache's tree against the counts it keeps incrementally: `num_cached` /
    `num_evictable` blocks, `cached_by_group`, the `pinned` nodes (id -> (node, pin count))
    and its evictable `leaves`."""
    cached = evictable = 0
    by_group: dict[str, int] = {}
    _check_children(root, block_size)
    for node in _nodes_below(root):
        n = len(node.block_ids)
        if n == 0 or len(node.tokens) != n * block_size:
            raise AssertionError(f"node {node.id}: {n} blocks, {len(node.tokens)} tokens")
        cached += n
        by_group[node.group] = by_group.get(node.group, 0) + n
        child_locks = sum(c.lock_ref for c in node.children.values())
        if node.lock_ref < child_locks:
            raise AssertionError(f"node {node.id}: lock_ref {node.lock_ref} < children's {child_locks}")
        if node.lock_ref == 0:
            evictable += n
        want_leaf = node.lock_ref == 0 and not node.children
        if node.is_leaf_candidate != want_leaf or (node in leaves) != want_leaf:
            raise AssertionError(f"node {node.id}: leaf-set membership wrong")
        _check_children(node, block_size)
    if (cached, evictable) != (num_cached, num_evictable):
        raise AssertionError(f"counts ({num_cached}, {num_evictable}) != tree ({cached}, {evictable})")
    for g, n in cached_by_group.items():
        if by_group.get(g, 0) != n:
            raise AssertionError(f"group {g!r}: cached count {n} != tree {by_group.get(g, 0)}")
    for node_id, (node, count) in pinned.items():
        if node.lock_ref < count:
            raise AssertionError(f"pinned node {node_id} is not locked")


def _nodes_below(root: RadixNode) -> Iterator[RadixNode]:
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def _check_children(node: RadixNode, block_size: int) -> None:
    for key, child in node.children.items():
        if child.parent is not node or child.key != key or key != (child.owner, tuple(child.tokens[:block_size])):
            raise AssertionError(f"node {child.id}: bad child key")
        if node.owner != PUBLIC and child.owner != node.owner:
            raise AssertionError(f"node {child.id}: owner {child.owner!r} under {node.owner!r}")
