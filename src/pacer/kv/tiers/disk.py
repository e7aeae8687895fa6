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

Writes are synchronous, in the engine's thread, one small file per block.

One file per block, named by its chain key (the host tier's stable key, the KV events' block
hash): a magic line, a JSON header and the block's bytes. The header says who wrote it (the
model, the KV dtype and scales, the block's layout: `identity`), where the block sits (its
key, its parent's key, the owner namespace and its tokens) and a sha256 of the bytes. A file
whose identity differs from the engine's, or that is truncated or fails its checksum, is
refused with a message saying which and why; it is never loaded and never crashes the
engine. A file is written whole to a temporary name and then renamed, so a reader never sees
half a block.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pacer.kv.tiers.host import ROOT_KEY
from pacer.kv.tiers.offload import path_keys

if TYPE_CHECKING:
    from pacer.kv.manager import KVCacheManager

__all__ = ["BlockRecord", "BlockStore", "DiskTier", "DiskTierIndex", "DiskTierStats", "PlannedCopies",
           "RefusedFile", "encode_block", "decode_block", "restore_order", "MAGIC"]

MAGIC = b"PACER-KV-BLOCK 1\n"
SUFFIX = ".kvblock"
_HEADER_LEN = struct.Struct(">I")


class RefusedFile(ValueError):
    """A block file this engine will not load; the message names the file and the reason."""


@dataclass(frozen=True, slots=True)
class BlockRecord:
    key: int                  # chain key of this block
    parent: int               # chain key of the block before it (the host tier's ROOT_KEY: first)
    owner: str                # the cache namespace (tenant, salt)
    tokens: tuple[int, ...]


@dataclass(slots=True)
class DiskTierStats:
    """Counters (monotonic) for Engine.snapshot() / metrics."""

    written: int = 0
    bytes_written: int = 0
    loaded: int = 0
    bytes_read: int = 0
    refused: int = 0
    refusals: list[str] = field(default_factory=list)   # the first few reasons, for the start-up line


def encode_block(identity: Mapping[str, Any], rec: BlockRecord, payload: bytes) -> bytes:
    header = json.dumps({"identity": dict(identity), "key": rec.key, "parent": rec.parent, "owner": rec.owner,
                         "tokens": list(rec.tokens), "nbytes": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest()}, sort_keys=True).encode()
    return MAGIC + _HEADER_LEN.pack(len(header)) + header + payload


def decode_block(data: bytes, identity: Mapping[str, Any], name: str = "block file") -> tuple[BlockRecord, bytes]:
    """The record and bytes of one file; RefusedFile when it is not ours to load."""
    if not data.startswith(MAGIC):
        raise RefusedFile(f"{name}: not a pacer KV block file (bad magic)")
    start = len(MAGIC) + _HEADER_LEN.size
    if len(data) < start:
        raise RefusedFile(f"{name}: truncated header")
    (n,) = _HEADER_LEN.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(data[start:start + n])
        written_by = header["identity"]
        rec = BlockRecord(int(header["key"]), int(header["parent"]), str(header["owner"]),
                          tuple(int(t) for t in header["tokens"]))
        nbytes, digest = int(header["nbytes"]), str(header["sha256"])
    except (ValueError, KeyError, TypeError) as e:
        raise RefusedFile(f"{name}: corrupt header ({e})") from None
    if written_by != dict(identity):
        diff = ", ".join(f"{k}={written_by.get(k)!r} (this engine: {identity.get(k)!r})"
                         for k in sorted(set(identity) | set(written_by)) if written_by.get(k) != identity.get(k))
        raise RefusedFile(f"{name}: written by another model or KV format: {diff}")
    payload = data[start + n:]
    if len(payload) != nbytes:
        raise RefusedFile(f"{name}: truncated ({len(payload)} of {nbytes} bytes)")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise RefusedFile(f"{name}: corrupt (checksum mismatch)")
    return rec, payload


def restore_order(records: Iterable[BlockRecord], root: int) -> list[BlockRecord]:
    """The records reachable from `root` through parent links, parents first (breadth-first:
    every prefix's head before any tail); orphans (a parent never written) are left out."""
    children: dict[int, list[BlockRecord]] = {}
    for rec in records:
        children.setdefault(rec.parent, []).append(rec)
    order: list[BlockRecord] = []
    frontier = [root]
    seen = {root}
    while frontier:
        nxt: list[int] = []
        for parent in frontier:
            for rec in sorted(children.get(parent, ()), key=lambda r: r.key):
                if rec.key not in seen:
                    seen.add(rec.key)
                    order.append(rec)
                    nxt.append(rec.key)
        frontier = nxt
    return order


class DiskTierIndex:
    """The directory and which keys it holds."""

    def __init__(self, directory: str, identity: Mapping[str, Any], max_refusals_kept: int = 5) -> None:
        self.directory = directory
        self.identity = dict(identity)
        self.keys: set[int] = set()
        self.refused_paths: set[str] = set()   # never overwritten: another engine's, or to inspect
        self.stats = DiskTierStats()
        self._max_refusals = max_refusals_kept
        os.makedirs(directory, exist_ok=True)

    def tier_stats(self) -> dict[str, float]:
        """The disk row of EngineSnapshot.tiers."""
        s = self.stats
        return {"blocks": len(self.keys), "usage": 1.0 if self.keys else 0.0, "hit_tokens": 0,
                "promotions": s.loaded, "demotions": s.written, "refused_files": s.refused,
                "bytes_in": s.bytes_written, "bytes_out": s.bytes_read}

    def path(self, key: int) -> str:
        return os.path.join(self.directory, f"{key:016x}{SUFFIX}")

    def write(self, rec: BlockRecord, payload: bytes) -> bool:
        """Write one block's file; False (nothing written) where a refused file lies."""
        if self.path(rec.key) in self.refused_paths:
            return False
        data = encode_block(self.identity, rec, payload)
        tmp = self.path(rec.key) + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self.path(rec.key))
        self.keys.add(rec.key)
        self.stats.written += 1
        self.stats.bytes_written += len(payload)
        return True

    def scan(self) -> list[tuple[BlockRecord, bytes]]:
        """Every block file this engine may load (refused ones are counted and their reasons
        kept in stats); a file's name must match its key."""
        found: list[tuple[BlockRecord, bytes]] = []
        for name in sorted(os.listdir(self.directory)):
            if not name.endswith(SUFFIX):
                continue
            path = os.path.join(self.directory, name)
            try:
                with open(path, "rb") as f:
                    rec, payload = decode_block(f.read(), self.identity, path)
                if os.path.basename(self.path(rec.key)) != name:
                    raise RefusedFile(f"{path}: its header names block {rec.key:016x}")
            except (RefusedFile, OSError) as e:
                self.refused_paths.add(path)
                self.stats.refused += 1
                if len(self.stats.refusals) < self._max_refusals:
                    self.stats.refusals.append(str(e))
                continue
            self.keys.add(rec.key)
            found.append((rec, payload))
        return found


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

    def __init__(self, kv: KVCacheManager, directory: str, store: BlockStore) -> None:
        host = kv.host_tier
        if host is None or not kv.prefix_caching:
            raise ValueError("kv_offloading_dir needs the host tier (kv_offloading_size) and prefix caching")
        self.kv, self.host, self.store = kv, host, store
        self.index = DiskTierIndex(directory, store.identity)
        self._pending: list[int] = []            # demoted keys whose host copy may not have run yet
        self._planned: list[int] = []            # of those, the ones known when this step was planned
        self._copied: set[int] = set()           # host slots the step being run copies into
        host.track_demotions()

    @classmethod
    def open(cls, kv: KVCacheManager, directory: str, store: BlockStore) -> DiskTier:
        """The tier over `directory`, its block files read back into the host tier now (one
        start-up line on stderr says how many, and why any were refused)."""
        tier = cls(kv, directory, store)
        restored = tier.restore()
        s = tier.index.stats
        refused = f"; refused {s.refused} file(s): " + " | ".join(s.refusals) if s.refused else ""
        print(f"[pacer] disk KV tier {directory}: {len(tier.index.keys)} block file(s), {restored} read back "
              f"into the host tier{refused}", file=sys.stderr)
        return tier

    # ------------------------------------------------------------------ start-up

    def restore(self) -> int:
        """Read this engine's block files back into free host slots, parents first; returns how many."""
        found = self.index.scan()
        payloads = {rec.key: payload for rec, payload in found}
        n = 0
        for rec in restore_order([r for r, _ in found], ROOT_KEY):
            slot = self.host.adopt(rec.key, rec.parent, rec.owner, rec.tokens)
            if slot is None:
                if not self.host.pool.num_free_blocks:
                    break
                continue
            payload = payloads[rec.key]
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
        self._pending, self._planned = keep, []
        self._copied = set()

    def _write_host(self, key: int, slot: int, parent: int, owner: str, tokens: tuple[int, ...]) -> None:
        data = self.store.host_block(slot)
        if data is not None:
            self.index.write(BlockRecord(key, parent, owner, tokens), data)

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
                    self.index.write(rec, self.store.device_block(block_id))
                parent = key
        self._pending.extend(self.host.take_demoted())       # demoted since the last plan: not copied yet
        pending = set(self._pending) | set(self._planned)
        for key, slot, parent, owner, tokens in self.host.entries():
            if key not in self.index.keys and key not in pending:
                self._write_host(key, slot, parent, owner, tokens)
        return self.index.stats.written - before

    def stats(self) -> dict[str, float]:
        """The disk row of EngineSnapshot.tiers."""
        return self.index.tier_stats()
