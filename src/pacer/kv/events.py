"""Block identity and the prefix cache's store/remove events. Pure Python (standard library).

A cached block is identified by a chained hash: H(parent block's hash, its tokens, its
namespace keys). The namespace is the cache node's owner: `PUBLIC` ("") has no keys; an
isolated tenant's blocks carry (tenant,); a request's `cache_salt` adds the salt, so two
tenants' (or two salts') copies of the same tokens are two blocks with two hashes. The
hash is stable across processes and machines (sha256, not Python's `hash`), so a router
can compute a request's block hashes itself and look them up in the replicas' events.

The prefix cache records one `BlockStoredEvent` when a node adopts blocks and one
`BlockRemovedEvent` when blocks leave it (eviction, TTL); node splits change no block. The
segment store (segment reuse) reports its segments' whole blocks the same way with medium
`SEGMENT`: their hashes chain from the segment's fingerprint (no parent block: a segment is
reused at any position), so a prefix index, which reads medium `GPU` only, never matches them. A
`BlockEventLog` collects them until the engine takes them once per step and publishes
them (`pacer.telemetry.kv_events` turns them into vLLM's `KVEventBatch` frames).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pacer.kv.radix_node import RadixNode

__all__ = ["EventSinks", "BlockStoredEvent", "BlockRemovedEvent", "AllBlocksClearedEvent", "BlockEvent", "BlockEventLog",
           "block_hash", "chain_hashes", "namespace", "namespace_keys", "SALT_SEPARATOR", "SALTED", "MEDIUM_DEVICE",
           "MEDIUM_HOST", "MEDIUM_SEGMENT", "HASH_MASK"]

MEDIUM_DEVICE = "GPU"   # vLLM's medium names: the device tier (the radix tree), whatever the device
MEDIUM_HOST = "CPU"     # the host tier (kv_offloading_size); its block hashes are the device's
MEDIUM_SEGMENT = "SEGMENT"   # the segment store (segment reuse): not prefix blocks; chained from the segment's fingerprint
SALTED = "salted"   # what events say in place of a cache_salt
SALT_SEPARATOR = "\x1f"   # owner = tenant + SALT_SEPARATOR + cache_salt (tenant is "" in shared mode)
HASH_MASK = (1 << 63) - 1   # non-negative 63-bit ints: every msgpack and Go/Rust consumer reads them


def namespace(tenant: str, cache_salt: str | None) -> str:
    """The cache owner for a tenant namespace ("" = public/shared) and an optional salt."""
    return f"{tenant}{SALT_SEPARATOR}{cache_salt}" if cache_salt else tenant


def namespace_keys(owner: str) -> tuple[str, ...] | None:
    """The extra keys a block of this owner carries in its events (None for public blocks):
    the tenant, and `SALTED` in place of a salt. A salt is a secret shared by the requests
    that may reuse each other's KV; it never leaves the process (the block hash, which does,
    already keeps salted copies apart)."""
    if not owner:
        return None
    tenant, _, salt = owner.partition(SALT_SEPARATOR)
    return tuple(k for k in (tenant, SALTED if salt else "") if k) or None


def block_hash(parent: int | None, token_ids: Sequence[int], owner: str) -> int:
    """The block's identity: chained over its parent, its tokens and its namespace."""
    h = hashlib.sha256()
    h.update(struct.pack(">q", -1 if parent is None else parent))
    h.update(struct.pack(f">{len(token_ids)}q", *token_ids))
    if owner:
        h.update(owner.encode("utf-8"))
    return int.from_bytes(h.digest()[:8], "big") & HASH_MASK


def chain_hashes(parent: int | None, token_ids: Sequence[int], block_size: int, owner: str) -> list[int]:
    """Hashes of the whole blocks of `token_ids` under `parent`, in order."""
    out: list[int] = []
    for i in range(len(token_ids) // block_size):
        parent = block_hash(parent, token_ids[i * block_size:(i + 1) * block_size], owner)
        out.append(parent)
    return out


@dataclass(frozen=True, slots=True)
class BlockStoredEvent:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    extra_keys: tuple[str, ...] | None   # the same namespace keys for every block of the run
    medium: str = MEDIUM_DEVICE          # the tier that stored them (vLLM's "GPU" / "CPU")


@dataclass(frozen=True, slots=True)
class BlockRemovedEvent:
    block_hashes: tuple[int, ...]
    medium: str = MEDIUM_DEVICE


@dataclass(frozen=True, slots=True)
class AllBlocksClearedEvent:
    pass


BlockEvent = BlockStoredEvent | BlockRemovedEvent | AllBlocksClearedEvent


class BlockEventLog:
    """Events in the order they happened, until `take()`; the prefix cache appends to it."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: list[BlockEvent] = []

    def append(self, event: BlockEvent) -> None:
        self._events.append(event)

    def record_stored(self, node: RadixNode, block_size: int) -> None:
        """Give a cache node its blocks' hashes (chained from its parent's) and log them stored."""
        parent = node.parent.hashes[-1] if node.parent is not None and node.parent.hashes else None
        node.hashes = chain_hashes(parent, node.tokens, block_size, node.owner)
        self.append(BlockStoredEvent(tuple(node.hashes), parent, tuple(node.tokens), block_size,
                                     namespace_keys(node.owner)))

    def take(self) -> list[BlockEvent]:
        events, self._events = self._events, []
        return events

    def __len__(self) -> int:
        return len(self._events)


class EventSinks:
    """Who hears a step's block events: each sink gets `sink(now, events)`, in order, after
    every step that changed the cache (the engine's KV event subscribers)."""

    def __init__(self) -> None:
        self.sinks: list[Callable[[float, list[BlockEvent]], None]] = []

    def add(self, sink: Callable[[float, list[BlockEvent]], None]) -> None:
        self.sinks.append(sink)

    def remove(self, sink: Callable[[float, list[BlockEvent]], None]) -> None:
        if sink in self.sinks:
            self.sinks.remove(sink)

    def publish(self, now: Callable[[], float], take_events: Callable[[], list[BlockEvent]]) -> None:
        if self.sinks:
            events = take_events()
            if events:
                t = now()
                for sink in self.sinks:
                    sink(t, events)
