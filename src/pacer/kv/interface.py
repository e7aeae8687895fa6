"""The KV room's seams, interface first: what the KV manager (`pacer.kv.manager`) uses of a
prefix cache and of the host-tier offload. Pure Python (standard library).

Each has two implementations, so the manager never asks whether one exists:

- `PrefixCacheProtocol`: the radix tree (`pacer.kv.prefix_cache.PrefixCache`) and, with
  `enable_prefix_caching=False`, `pacer.kv.null_cache.NullPrefixCache` (matches nothing,
  keeps nothing, evicts nothing).
- `PrefixOffloadProtocol`: `pacer.kv.tiers.offload.PrefixOffload` (the radix tree glued to a
  host tier of `kv_offloading_size`) and `pacer.kv.tiers.offload.NullOffload` (no host tier
  for prefixes: finds nothing, copies nothing).

The handle contract (mini-sglang's): `match_prefix` -> `lock(handle)` -> ... -> `insert` ->
`unlock`; `evict(n)` / `expire()` return the block ids they dropped. A cache never frees blocks
and never reads or writes request fields; the manager owns both, and the ref counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from pacer.kv.events import BlockEvent, BlockEventLog
from pacer.kv.radix_node import PrefixMatch, RadixNode

__all__ = ["PrefixCacheProtocol", "PrefixOffloadProtocol", "SwapPairs"]

SwapPairs = list[tuple[int, int]]


class PrefixCacheProtocol(Protocol):
    """Cached runs of whole KV blocks, found by their tokens under owner namespaces."""

    @property
    def enabled(self) -> bool:
        """False only for the null cache: it caches nothing, so a look-up queries nothing."""
        ...

    @property
    def num_cached_blocks(self) -> int: ...

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks no lock protects (eviction may take them)."""
        ...

    def cached_blocks(self, group: str) -> int:
        """Cached blocks of one eviction group (a tenant's quota group)."""
        ...

    def evictable_blocks(self, groups: Sequence[str] | None = None) -> int:
        """Evictable blocks of `groups` (all when None), in O(1)."""
        ...

    def evictable_on_path(self, handle: PrefixMatch, groups: Sequence[str] | None = None) -> int:
        """Blocks of the handle's path that `lock(handle)` would protect from eviction (of `groups`)."""
        ...

    def iter_nodes(self) -> Iterator[RadixNode]:
        """Every node holding blocks, parents before children."""
        ...

    def match_prefix(self, token_ids: Sequence[int], owners: Sequence[str], max_blocks: int,
                     tenant: str = ...) -> PrefixMatch:
        """The longest cached run of whole blocks (at most `max_blocks`) visible to `owners`."""
        ...

    def lookup_blocks(self, token_ids: Sequence[int], owners: Sequence[str], max_blocks: int,
                      tenant: str | None = None) -> int:
        """How many blocks `match_prefix` would match, without splitting anything; touches the
        matched path for `tenant` when one is given (a waiting request's demand)."""
        ...

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int], owner: str, tenant: str = ...,
               start: PrefixMatch | None = None, owners: Sequence[str] | None = None, lock: bool = False
               ) -> tuple[list[int], PrefixMatch]:
        """Cache the whole blocks of `token_ids`; returns the block ids adopted (the caller adds
        one ref to each) and a handle whose `num_blocks` are the blocks of the prefix it covers
        (`lock`: locked, `start`'s lock moved to it)."""
        ...

    def lock(self, handle: PrefixMatch) -> None: ...

    def unlock(self, handle: PrefixMatch) -> None: ...

    def relock(self, old: PrefixMatch, new: PrefixMatch) -> None:
        """Move a lock from `old` to `new`: the same as `lock(new)` then `unlock(old)`."""
        ...

    def pin(self, handle: PrefixMatch) -> bool:
        """Keep the handle's path until `unpin` (a lock no request owns); False: nothing to pin."""
        ...

    def unpin(self, handle: PrefixMatch) -> None: ...

    def evict(self, n: int, groups: Sequence[str] | None = None) -> list[int]:
        """Drop up to n unlocked blocks (of `groups`, all when None); returns their ids."""
        ...

    def expire(self) -> list[int]:
        """Drop what has been idle longer than the TTL; returns the dropped block ids."""
        ...

    def enable_events(self) -> BlockEventLog | None:
        """Record store/remove events from now on; None: this cache has none to record."""
        ...

    def take_events(self) -> list[BlockEvent]: ...

    def check_invariants(self) -> None:
        """Raises AssertionError when the cache's own counts disagree with its contents."""
        ...


class PrefixOffloadProtocol(Protocol):
    """The host tier behind the prefix cache: a look-up continues a device match there, a
    committed hit is promoted (copied host -> device), evicted blocks are demoted."""

    def lookup(self, matched: RadixNode | None, matched_blocks: int, token_ids: Sequence[int],
               owners: Sequence[str], max_blocks: int) -> list[tuple[int, int]]:
        """Host blocks continuing a device match: [(chain key, host slot)]; no side effects."""
        ...

    def commit(self, request_id: str, hits: list[tuple[int, int]]) -> None:
        """Promote a looked-up continuation for the request (before its device blocks are allocated)."""
        ...

    def bind(self, request_id: str, device_blocks: Sequence[int]) -> None:
        """The device blocks a committed promotion fills, one per hit, in order."""
        ...

    def is_promoting(self, request_id: str) -> bool: ...

    def cancel(self, request_id: str, still_cached: Callable[[int], bool]) -> None:
        """The request lost its blocks in the step that promoted into them."""
        ...

    def pending_device_blocks(self) -> set[int]:
        """Device blocks whose promotion copy has not run yet."""
        ...

    def take_ops(self) -> tuple[SwapPairs, SwapPairs]:
        """The step's copies: demotions (device, host) and promotions (host, device)."""
        ...

    def record_events(self, log: BlockEventLog | None) -> None:
        """The host tier's store/remove events (medium CPU) go to `log` (None: nowhere)."""
        ...
