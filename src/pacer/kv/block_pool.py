"""Paged KV blocks: a free list and reference counts. Pure Python, no tensors.

A block's ref count is the number of its live holders (running requests, prefix-cache
nodes). A block with ref count 0 is on the free list, nowhere else. The pool never decides
*who* loses blocks; the KV manager and scheduler do.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

__all__ = ["BlockPool", "OutOfBlocksError", "kept_blocks"]


class OutOfBlocksError(RuntimeError):
    """Raised when more blocks are asked for than are free (callers check first)."""


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an integer >= 1, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def allocate(self, n: int) -> list[int]:
        """Take n free blocks, each with ref count 1."""
        if n > len(self._free):
            raise OutOfBlocksError(f"asked for {n} blocks, {len(self._free)} free")
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self._ref_counts[b] = 1
        return out

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add a holder to blocks that are already held (e.g. a prefix-cache hit)."""
        for b in block_ids:
            if self._ref_counts[b] <= 0:
                raise ValueError(f"incref of free block {b}")
            self._ref_counts[b] += 1

    def free(self, block_ids: Iterable[int]) -> int:
        """Drop one holder from each block; blocks reaching 0 return to the free list.

        Returns how many blocks became free.
        """
        freed = 0
        for b in block_ids:
            rc = self._ref_counts[b]
            if rc <= 0:
                raise ValueError(f"double free of block {b}")
            rc -= 1
            self._ref_counts[b] = rc
            if rc == 0:
                self._free.append(b)
                freed += 1
        return freed

    def check_invariants(self) -> None:
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("a block is on the free list twice")
        for b, rc in enumerate(self._ref_counts):
            if rc < 0:
                raise AssertionError(f"block {b} has negative ref count {rc}")
            if (rc == 0) != (b in free):
                raise AssertionError(f"block {b}: ref count {rc} but on free list = {b in free}")


def kept_blocks(num_verified_tokens: int, block_size: int) -> int:
    """Blocks a request keeps after verification: those holding verified tokens (the rest held
    only rejected drafts). The scheduler and every executor apply this same rule."""
    return -(-num_verified_tokens // block_size)
