"""BlockPool on its own: allocation order, reference counts, double frees, the free list."""

from __future__ import annotations

import pytest

from pacer.kv.block_pool import BlockPool, OutOfBlocksError


def test_allocate_incref_free_round_trip():
    pool = BlockPool(4)
    a = pool.allocate(3)
    assert len(set(a)) == 3 and pool.num_free_blocks == 1 and all(pool.ref_count(b) == 1 for b in a)
    pool.incref(a[:2])                  # a second holder (a prefix-cache hit)
    assert pool.free(a) == 1            # only the block with one holder returns to the free list
    assert pool.num_free_blocks == 2 and [pool.ref_count(b) for b in a] == [1, 1, 0]
    assert pool.free(a[:2]) == 2 and pool.num_free_blocks == 4 and pool.num_used_blocks == 0
    pool.check_invariants()


def test_freed_blocks_are_reused_last():
    pool = BlockPool(3)
    first = pool.allocate(1)
    pool.free(first)
    assert pool.allocate(2) == [1, 2]    # the free list is FIFO: a just-freed block goes to the back
    assert pool.allocate(1) == first


def test_misuse_is_refused_and_changes_nothing():
    pool = BlockPool(2)
    with pytest.raises(OutOfBlocksError):
        pool.allocate(3)
    assert pool.num_free_blocks == 2
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(ValueError, match="double free"):
        pool.free([b])
    with pytest.raises(ValueError, match="incref of free block"):
        pool.incref([b])
    pool.check_invariants()
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)
