"""The disk KV tier (`kv_offloading_dir`): block files, their identity, the order a restarted
engine reads them back in, and the tier's decisions at three moments. Standard library only
(file I/O included); a block's bytes come from a `BlockStore` (on a real engine
`pacer.model.kv_io.ModelBlockStore`, over the model executor's KV tensors).

`DiskTier` works on the KV manager's host tier and prefix cache, never on the engine; the
engine calls it as one of its KV tier hooks (`pacer.engine.tier_hooks.KVTierHook`):

- start-up (`DiskTier.open`): the directory's block files this model and KV format wrote are
  read back into the host tier (parents first, while it has free slots), so the first request
  after a restart is a host-tier hit: its blocks are promoted, not recomputed. Refused files
  are counted and named in one start-up line; they are never loaded or overwritten.
- each step: blocks demoted to the host tier are written through to their files once the step
  that copied them to the host has run (`before_step` sees the plan's host slots,
  `after_step` writes what that step copied).
- graceful shutdown (`flush`): the cached blocks of the faster tiers, the device's radix tree
  and the host tier, are written too.

Writes are synchronous, in the engine's thread, one small file per block; the file format,
the byte cap (LRU deletion), permissions and the HMAC are `pacer.kv.tiers.block_files`.

The tier contains its faults: a write that fails (ENOSPC, EACCES, any OSError) is counted,
logged once, and pauses the tier (its planned and pending writes dropped) for a number of
steps that doubles with each failure (`BACKOFF_STEPS` up to `MAX_BACKOFF_STEPS`); requests
carry on from the device and host tiers, which hold the same blocks.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pacer.kv.tiers.block_files import (
    MAGIC,
    BlockRecord,
    DiskTierIndex,
    DiskTierStats,
    RefusedFile,
    decode_block,
    encode_block,
    restore_order,
)
from pacer.kv.tiers.host import ROOT_KEY
from pacer.kv.tiers.offload import path_keys

if TYPE_CHECKING:
    from pacer.kv.manager import KVCacheManager

__all__ = ["BlockRecord", "BlockStore", "DiskTier", "DiskTierIndex", "DiskTierStats", "PlannedCopies",
           "RefusedFile", "encode_block", "decode_block", "restore_order", "MAGIC", "BACKOFF_STEPS",
           "MAX_BACKOFF_STEPS"]

log = logging.getLogger("pacer.disk_tier")
BACKOFF_STEPS = 64          # steps the tier pauses after its first I/O error
MAX_BACKOFF_STEPS = 8192    # the longest pause (each further error doubles it)

class BlockStore(Protocol):
    """The bytes of KV blocks as the KV format stores them, and that format's identity."""

    @property
    def identity(self) -> Mapping[str, Any]:
        """What a block file must match to be loaded (the model, the KV dtype and scales, the layout)."""
        ...

    def device_block(self, block_id: int) -> bytes:
        """One device block's bytes (over all layers)."""
        ...

    def host_block(self, slot: int) -> bytes | None:
        """The host tier's copy in `slot`; None: never filled."""
        ...

    def put_host_block(self, slot: int, data: bytes) -> None:
        """Fill a host slot with a block's bytes (a block read back from disk)."""
        ...


class PlannedCopies(Protocol):
    """What the disk tier reads of a step's plan (`pacer.sched.contract.SchedulerOutput`)."""

    @property
    def swap_out(self) -> Sequence[tuple[int, int]]:
        """The (device block, host slot) copies the step runs before its forward."""
        ...


class DiskTier:
    """The disk tier's decisions over a KV manager's host tier and prefix cache; the engine calls
    it as a `pacer.engine.tier_hooks.KVTierHook` (before_step, after_step, flush, stats)."""

    name = "disk"   # its row in EngineSnapshot.tiers

    def __init__(self, kv: KVCacheManager, directory: str, store: BlockStore, max_bytes: int | None = None,
                 hmac_key: bytes | None = None) -> None:
        host = kv.host_tier
        if host is None or not kv.prefix_caching:
            raise ValueError("kv_offloading_dir needs the host tier (kv_offloading_size) and prefix caching")
        self.kv, self.host, self.store = kv, host, store
        self.index = DiskTierIndex(directory, store.identity, max_bytes=max_bytes, hmac_key=hmac_key)
        self.paused_steps = 0                    # steps left before writing again (after an I/O error)
        self._backoff = BACKOFF_STEPS
        self._pending: list[int] = []            # demoted keys whose host copy may not have run yet
        self._planned: list[int] = []            # of those, the ones known when this step was planned
        self._copied: set[int] = set()           # host slots the step being run copies into
        host.track_demotions()

    @classmethod
    def open(cls, kv: KVCacheManager, directory: str, store: BlockStore, max_bytes: int | None = None,
             hmac_key: bytes | None = None) -> DiskTier:
        """The tier over `directory`, its block files read back into the host tier now (one
        start-up line on stderr says how many, and why any were refused)."""
        tier = cls(kv, directory, store, max_bytes, hmac_key)
        restored = tier.restore()
        s = tier.index.stats
        refused = f"; refused {s.refused} file(s): " + " | ".join(s.refusals) if s.refused else ""
        print(f"[pacer] disk KV tier {directory}: {len(tier.index.keys)} block file(s), {restored} read back "
              f"into the host tier{refused}", file=sys.stderr)
        return tier

    # ------------------------------------------------------------------ start-up

    def restore(self) -> int:
        """Read this engine's block files back into free host slots, parents first; returns how many."""
        n = 0
        for rec in restore_order(self.index.scan(), ROOT_KEY):
            if not self.host.pool.num_free_blocks:
                break
            payload = self.index.read(rec.key)   # read (and checked) only now: never the whole directory
            if payload is None:
                continue                          # refused: its children are orphans, never adopted
            slot = self.host.adopt(rec.key, rec.parent, rec.owner, rec.tokens)
            if slot is None:
                continue
            self.store.put_host_block(slot, payload)
            self.index.stats.loaded += 1
            self.index.stats.bytes_read += len(payload)
            n += 1
        return n

    # ------------------------------------------------------------------ each step

    def before_step(self, out: PlannedCopies) -> None:
        """The step is planned: blocks demoted until now have their host copy in this step or a
        later one; blocks demoted after this (while the step runs or updates) wait for the next plan."""
        if self._planned:          # the last step never reached after_step (it raised): its copies ran or not
            self.after_step()
        if self.paused_steps:
            self.paused_steps -= 1
            self.host.take_demoted()   # what is demoted while paused is never written
            return
        self._planned = self._pending + self.host.take_demoted()
        self._copied = {slot for _, slot in out.swap_out}

    def after_step(self) -> None:
        """The step's copies have run: write the planned blocks whose host copy was among them."""
        keep: list[int] = []
        for key in self._planned:
            entry = self.host.entry(key)
            if entry is None or key in self.index.keys:
                continue                          # evicted again already, or on disk
            if entry[0] in self._copied:
                self._write_host(key, *entry)
            else:
                keep.append(key)                  # its copy is in a later step
        self._pending, self._planned = ([] if self.paused_steps else keep), []
        self._copied = set()

    def _write_host(self, key: int, slot: int, parent: int, owner: str, tokens: tuple[int, ...]) -> None:
        data = self.store.host_block(slot)
        if data is not None:
            self._write(BlockRecord(key, parent, owner, tokens), data)

    def _write(self, rec: BlockRecord, data: bytes) -> None:
        """One block file; an OSError pauses the tier (see the module docstring), never the engine."""
        if self.paused_steps:
            return
        try:
            self.index.write(rec, data)
        except OSError as e:
            stats = self.index.stats
            stats.io_errors += 1
            if stats.io_errors == 1:
                log.warning("disk KV tier %s: write failed (%s); the tier pauses for %d steps (doubling on each "
                            "further error, counted in io_errors) and requests carry on without it",
                            self.index.directory, e, self._backoff)
            self.paused_steps = self._backoff
            self._backoff = min(2 * self._backoff, MAX_BACKOFF_STEPS)
            self._pending, self._planned = [], []

    # ------------------------------------------------------------------ shutdown

    def flush(self) -> int:
        """Write the device tree's and the host tier's cached blocks not on disk yet; returns
        how many files were written."""
        before = self.index.stats.written
        bs = self.kv.block_size
        unfilled = self.kv.offload.pending_device_blocks()   # promoted into, copy not run: no KV there yet
        for node in self.kv.cache.iter_nodes():
            keys = path_keys(node, bs)
            own = keys[len(keys) - len(node.block_ids):]
            parent = keys[len(keys) - len(node.block_ids) - 1] if len(keys) > len(node.block_ids) else ROOT_KEY
            for i, (key, block_id) in enumerate(zip(own, node.block_ids)):
                if key not in self.index.keys and block_id not in unfilled:
                    rec = BlockRecord(key, parent, node.owner, tuple(node.tokens[i * bs:(i + 1) * bs]))
                    self._write(rec, self.store.device_block(block_id))
                parent = key
        self._pending.extend(self.host.take_demoted())       # demoted since the last plan: not copied yet
        pending = set(self._pending) | set(self._planned)
        for key, slot, parent, owner, tokens in self.host.entries():
            if key not in self.index.keys and key not in pending and key not in self.host.transient:
                self._write_host(key, slot, parent, owner, tokens)
        return self.index.stats.written - before

    def stats(self) -> dict[str, float]:
        """The disk row of EngineSnapshot.tiers."""
        return self.index.tier_stats()
