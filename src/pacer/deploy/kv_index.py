"""What a router knows of the replicas' caches: a mirror of each replica's KV event stream.

Pure Python. `BlockIndex.apply(replica, events)` applies one replica's store/remove/clear
events (pacer's own `core.block_events`, or vLLM wire batches through `from_wire`);
`match_blocks` answers "how many leading blocks of these tokens does that replica hold?"
by computing the request's block hashes exactly as the engine does (chained over the
parent, the tokens and the namespace: in isolated mode the tenant, and a cache_salt), so
a tenant's request only ever matches its own and public blocks.

In strict mode a stream that stores a block already held, or removes one not held, is an
error: the two bugs seen in other engines' streams (a removal while another copy stays
resident; a stale hash stored again) both show up as one of those.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pacer.kv.events import (
    AllBlocksClearedEvent,
    BlockEvent,
    BlockRemovedEvent,
    BlockStoredEvent,
    block_hash,
)

__all__ = ["BlockIndex", "StreamError", "from_wire"]


class StreamError(ValueError):
    """A replica's event stream contradicts itself (strict mode)."""


class BlockIndex:
    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self._blocks: dict[str, set[int]] = {}
        self.num_anomalies = 0   # contradictions tolerated in lenient mode

    def replicas(self) -> list[str]:
        return list(self._blocks)

    def blocks(self, replica: str) -> set[int]:
        return self._blocks.get(replica, set())

    def drop_replica(self, replica: str) -> None:
        self._blocks.pop(replica, None)

    def apply(self, replica: str, events: Iterable[BlockEvent]) -> None:
        held = self._blocks.setdefault(replica, set())
        for e in events:
            if isinstance(e, BlockStoredEvent):
                for h in e.block_hashes:
                    if h in held:
                        self._anomaly(f"replica {replica}: block {h:#x} stored while already held")
                    held.add(h)
            elif isinstance(e, BlockRemovedEvent):
                for h in e.block_hashes:
                    if h not in held:
                        self._anomaly(f"replica {replica}: block {h:#x} removed but not held")
                    held.discard(h)
            elif isinstance(e, AllBlocksClearedEvent):
                held.clear()

    def _anomaly(self, message: str) -> None:
        if self.strict:
            raise StreamError(message)
        self.num_anomalies += 1

    def match_blocks(self, replica: str, token_ids: Sequence[int], block_size: int, owner: str,
                     hashes: _HashMemo | None = None) -> int:
        """Leading whole blocks of `token_ids` the replica holds for a request of namespace
        `owner` (public blocks count too unless the owner is salted, as in the engine)."""
        held = self._blocks.get(replica)
        if not held:
            return 0
        memo = hashes or _HashMemo(token_ids, block_size, owner)
        n, prev, public = 0, None, True
        for i in range(len(token_ids) // block_size):
            h = memo.hash(i, prev, owner) if owner else None
            if h is not None and h in held:
                prev, public = h, False
            elif public and memo.public_ok:
                h = memo.hash(i, prev, "")
                if h not in held:
                    break
                prev = h
            else:
                break
            n += 1
        return n

    def memo(self, token_ids: Sequence[int], block_size: int, owner: str) -> _HashMemo:
        """Hashes shared by several `match_blocks` calls for one request (one per replica)."""
        return _HashMemo(token_ids, block_size, owner)


class _HashMemo:
    __slots__ = ("tokens", "block_size", "public_ok", "_memo")

    def __init__(self, token_ids: Sequence[int], block_size: int, owner: str) -> None:
        self.tokens = token_ids
        self.block_size = block_size
        self.public_ok = "\x1f" not in owner   # a salted namespace never reuses public blocks
        self._memo: dict[tuple[int, int | None, str], int] = {}

    def hash(self, i: int, prev: int | None, owner: str) -> int:
        key = (i, prev, owner)
        h = self._memo.get(key)
        if h is None:
            bs = self.block_size
            h = self._memo[key] = block_hash(prev, self.tokens[i * bs:(i + 1) * bs], owner)
        return h


def from_wire(batch: Any) -> list[BlockEvent]:
    """A decoded vLLM `KVEventBatch` (ours or vLLM's structs) as pacer's block events (GPU tier only)."""
    out: list[BlockEvent] = []
    for e in batch.events:
        name = type(e).__name__
        if getattr(e, "medium", "GPU") not in (None, "GPU"):
            continue
        if name == "BlockStored":
            keys = e.extra_keys[0] if e.extra_keys else None
            out.append(BlockStoredEvent(tuple(e.block_hashes), e.parent_block_hash, tuple(e.token_ids),
                                        e.block_size, tuple(keys) if keys else None))
        elif name == "BlockRemoved":
            out.append(BlockRemovedEvent(tuple(e.block_hashes)))
        elif name == "AllBlocksCleared":
            out.append(AllBlocksClearedEvent())
    return out
