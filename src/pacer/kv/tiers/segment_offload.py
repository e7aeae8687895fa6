"""Glue between the segment store and the host tier (`kv_offloading_size`). Pure Python.

When the store drops a segment (capacity, TTL or a reset), its blocks are demoted as the prefix
cache's are: the host tier takes a copy, planned as (device block, host slot) swap-outs of the
current step, which run before the blocks are written again. A look-up that misses the store
finds the segment here and promotes it: fresh device blocks (free, or the prefix cache's
evictable ones), filled by (host slot, device block) copies that run after the step's swap-outs
and before its segment fills and forward; the segment is stored again at its old position, locked
until the step's copies are handed out, so nothing evicts it before they run.

A segment's blocks are a chain of host entries rooted at its fingerprint (owner namespace and
tokens) and stored position, the last one partial; the chain's keys and the stored position are
kept here. They live in host memory only (`transient`): the disk tier neither writes nor publishes
them, since a restart could not place a chain without this index. A segment whose chain lost a
block to the host tier's own eviction is forgotten at its next look-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pacer.kv.events import HASH_MASK, SALT_SEPARATOR
from pacer.kv.interface import SwapPairs
from pacer.kv.segment_store import SegmentEntry, SegmentStore, segment_fingerprint
from pacer.kv.tiers.host import HostKVTier, block_key

__all__ = ["SegmentOffload", "HostSegment"]

_GOLDEN = 0x9E3779B97F4A7C15


@dataclass(frozen=True, slots=True)
class HostSegment:
    owner: str
    token_ids: tuple[int, ...]
    position: int
    keys: tuple[int, ...]   # its blocks' chain keys in the host tier, in order


class SegmentOffload:
    def __init__(self, host: HostKVTier, store: SegmentStore) -> None:
        self.host, self.store = host, store
        store.on_drop = self._on_drop
        self._index: dict[int, HostSegment] = {}   # by fingerprint
        self._out: SwapPairs = []                  # this step's demotions: (device block, host slot)
        self._in: SwapPairs = []                   # this step's promotions: (host slot, device block)
        self._promoted: list[SegmentEntry] = []    # locked until the step's copies are taken

    def __len__(self) -> int:
        return len(self._index)

    def _on_drop(self, entry: SegmentEntry) -> None:
        """The store dropped `entry`: copy the blocks the host tier lacks (a segment promoted
        earlier may still be whole there: no copy) and remember the chain when all of it is kept. A
        segment whose save has not run yet holds no KV: there is nothing to keep."""
        if not entry.written:
            return
        tenant = entry.owner.partition(SALT_SEPARATOR)[0]
        # rooted at the fingerprint and the stored position: a segment computed again elsewhere
        # (after its host copy was made) is another chain, never mistaken for the one kept here
        root = ((entry.fingerprint ^ (entry.position * _GOLDEN)) & HASH_MASK) or 1
        copies = self.host.demote(entry.owner, tenant, root, entry.token_ids, entry.block_ids, transient=True)
        keys = self._chain(entry.owner, entry.token_ids, root)
        self._out.extend(copies)
        if all(self.host.entry(k) is not None for k in keys):
            self._index[entry.fingerprint] = HostSegment(entry.owner, entry.token_ids, entry.position, tuple(keys))
            self.store.stats.demoted += 1

    def _chain(self, owner: str, token_ids: Sequence[int], root: int) -> list[int]:
        bs, keys, parent = self.host.block_size, [], root
        for i in range(0, len(token_ids), bs):
            parent = block_key(parent, owner, token_ids[i:i + bs])
            keys.append(parent)
        return keys

    def find(self, token_ids: Sequence[int], owners: Sequence[str]) -> tuple[int, HostSegment] | None:
        """The demoted segment with exactly these tokens in one of `owners` whose blocks are all
        still in the host tier: (fingerprint, its record); no side effects but forgetting a broken chain."""
        if not self._index:
            return None
        tokens = tuple(token_ids)
        for owner in owners:
            fp = segment_fingerprint(owner, tokens)
            seg = self._index.get(fp)
            if seg is None or seg.owner != owner or seg.token_ids != tokens:
                continue
            if all(self.host.entry(k) is not None for k in seg.keys):
                return fp, seg
            del self._index[fp]   # the host tier evicted part of it
        return None

    def promote(self, fp: int, seg: HostSegment, device_blocks: Sequence[int]) -> SegmentEntry:
        """Store the segment again in `device_blocks` (the caller allocated them, one per chain
        block), filled by this step's copies; locked until `take_ops`."""
        self.host.promote(seg.keys)
        slots = [self.host.entry(k)[0] for k in seg.keys]   # type: ignore[index]
        self._in.extend(zip(slots, device_blocks))
        entry = self.store.adopt(seg.owner, seg.token_ids, list(device_blocks), seg.position, promoted=True)
        self.store.lock(entry)
        self._promoted.append(entry)
        self.store.stats.promoted += 1
        return entry

    def take_ops(self) -> tuple[SwapPairs, SwapPairs]:
        """This step's demotions and promotions; promoted segments may be evicted again."""
        out, ins = self._out, self._in
        self._out, self._in = [], []
        for entry in self._promoted:
            self.store.unlock(entry)
        self._promoted.clear()
        return out, ins
