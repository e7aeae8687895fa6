"""KV cache manager: which blocks each request holds. Pure Python.

Owns the `BlockPool` and the per-request block tables. The scheduler asks it for slots
(`allocate_slots`) and returns them (`free`); it answers "can this fit?" in O(1).
The prefix cache, when present, plugs in here (`match_prefix` on admission, `cache` on
finish) so the scheduler stays unaware of it.
"""

from __future__ import annotations

from pacer.core.block_pool import BlockPool
from pacer.request import Request

__all__ = ["KVCacheManager"]


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[str, list[int]] = {}

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.block_size

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (cached-but-evictable blocks count as free)."""
        return self.pool.num_used_blocks / self.pool.num_blocks

    def num_available_blocks(self) -> int:
        """Blocks that can be handed out now (free, plus what the cache could evict)."""
        return self.pool.num_free_blocks

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        held = len(self.block_tables.get(req.request_id, ()))
        total = req.num_computed_tokens + num_new_tokens
        need = -(-total // self.block_size)
        return max(0, need - held)

    def match_prefix(self, req: Request) -> int:
        """On first admission: reuse cached blocks of the prompt; returns tokens reused.

        Without a prefix cache nothing is reused.
        """
        return 0

    def allocate_slots(self, req: Request, num_new_tokens: int) -> list[int] | None:
        """Ensure room for `num_new_tokens` more tokens; returns the blocks added, or None
        (and changes nothing) when the pool cannot supply them."""
        need = self.blocks_needed(req, num_new_tokens)
        if need > self.num_available_blocks():
            return None
        new_blocks = self.pool.allocate(need) if need else []
        table = self.block_tables.setdefault(req.request_id, [])
        table.extend(new_blocks)
        return new_blocks

    def block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    def free(self, req: Request) -> None:
        """Drop the request's hold on all its blocks (finish, abort or preemption)."""
        table = self.block_tables.pop(req.request_id, None)
        if table:
            self.pool.free(table)

    def check_invariants(self) -> None:
        """Every block's ref count equals its number of holders; free list consistent."""
        self.pool.check_invariants()
        holders = [0] * self.pool.num_blocks
        for table in self.block_tables.values():
            for b in table:
                holders[b] += 1
        for b, n in enumerate(holders):
            if self.pool.ref_count(b) != n:
                raise AssertionError(f"block {b}: ref count {self.pool.ref_count(b)} != holders {n}")
