"""The KV bookkeeping's integrity check (run after every step in tests, and when idle):
free + cached + held == total, and every block's ref count equals its live holders."""

from __future__ import annotations

from collections.abc import Mapping, Set

from pacer.core.block_pool import BlockPool
from pacer.core.prefix_cache import PrefixCache

__all__ = ["check_kv_invariants"]


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
