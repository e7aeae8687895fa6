"""The prefix cache of `enable_prefix_caching=False`: matches nothing, keeps nothing, evicts
nothing (mini-sglang's `naive_cache.py`, SGLang's `chunk_cache.py`). Pure Python.

It implements `pacer.kv.interface.PrefixCacheProtocol`, so the KV manager runs one code path
with or without prefix caching. A request's blocks stay its own: `insert` adopts none, and its
handle covers the blocks the caller offered (held by the caller alone), so the manager offers
each completed block once, as it does to the radix tree.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pacer.kv.events import BlockEvent, BlockEventLog
from pacer.kv.radix_node import PUBLIC, PrefixMatch, RadixNode

__all__ = ["NullPrefixCache"]


class NullPrefixCache:
    enabled = False
    num_cached_blocks = 0
    num_evictable_blocks = 0

    def __init__(self, block_size: int) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.block_size = block_size
        self._root = RadixNode(0, None, PUBLIC, PUBLIC, [], [])   # a tree of only its root
        self._no_match = PrefixMatch(self._root, ())

    def cached_blocks(self, group: str) -> int:
        return 0

    def evictable_blocks(self, groups: Sequence[str] | None = None) -> int:
        return 0

    def evictable_on_path(self, handle: PrefixMatch, groups: Sequence[str] | None = None) -> int:
        return 0

    def iter_nodes(self) -> Iterator[RadixNode]:
        return iter(())

    def match_prefix(self, token_ids: Sequence[int], owners: Sequence[str], max_blocks: int,
                     tenant: str = PUBLIC) -> PrefixMatch:
        return self._no_match

    def lookup_blocks(self, token_ids: Sequence[int], owners: Sequence[str], max_blocks: int,
                      tenant: str | None = None) -> int:
        return 0

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int], owner: str, tenant: str = PUBLIC,
               start: PrefixMatch | None = None, owners: Sequence[str] | None = None, lock: bool = False
               ) -> tuple[list[int], PrefixMatch]:
        """Adopts nothing; the handle covers the whole blocks offered (the caller's own); no locks."""
        n = min(len(token_ids) // self.block_size, len(block_ids))
        return [], PrefixMatch(self._root, tuple(block_ids[:n]))

    def lock(self, handle: PrefixMatch) -> None:
        pass

    def unlock(self, handle: PrefixMatch) -> None:
        pass

    def relock(self, old: PrefixMatch, new: PrefixMatch) -> None:
        pass

    def pin(self, handle: PrefixMatch) -> bool:
        return False

    def unpin(self, handle: PrefixMatch) -> None:
        raise ValueError("unpin of a prefix that is not pinned (prefix caching is off)")

    def evict(self, n: int, groups: Sequence[str] | None = None) -> list[int]:
        return []

    def expire(self) -> list[int]:
        return []

    def enable_events(self) -> BlockEventLog | None:
        return None

    def take_events(self) -> list[BlockEvent]:
        return []

    def check_invariants(self) -> None:
        pass
