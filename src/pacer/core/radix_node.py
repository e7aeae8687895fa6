"""The prefix cache's tree node and match handle, and the eviction keys it orders leaves by."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RadixNode", "PrefixMatch", "EVICTION_KEYS", "Key"]

Key = tuple[float, int]


class RadixNode:
    """A run of whole cached blocks (token ids + block ids) under one owner, and its place in the tree."""

    __slots__ = ("id", "parent", "owner", "group", "key", "tokens", "block_ids", "children", "lock_ref",
                 "last_access", "tick", "priority", "version", "is_leaf_candidate", "hashes")

    def __init__(self, node_id: int, parent: RadixNode | None, owner: str, group: str,
                 tokens: list[int], block_ids: list[int]) -> None:
        self.id = node_id
        self.parent = parent
        self.owner = owner
        self.group = group
        self.key: tuple[str, tuple[int, ...]] = (owner, ())  # its key in parent.children
        self.tokens = tokens
        self.block_ids = block_ids
        self.children: dict[tuple[str, tuple[int, ...]], RadixNode] = {}
        self.lock_ref = 0
        self.last_access = 0.0
        self.tick = 0
        self.priority = 0.0
        self.version = 0
        self.is_leaf_candidate = False  # in its group's evictable-leaf set
        self.hashes: list[int] = []     # block identities (core.block_events), kept only when events are on


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Handle of a match: the deepest matched node and the blocks along its path."""

    node: RadixNode
    block_ids: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


def _lru_key(node: RadixNode) -> Key:
    return (node.last_access, node.tick)


def _weighted_key(node: RadixNode) -> Key:
    return (node.priority, node.tick)


EVICTION_KEYS: dict[str, Callable[[RadixNode], Key]] = {"lru": _lru_key, "ttl": _lru_key, "weighted-lru": _weighted_key}
