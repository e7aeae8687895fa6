"""The disk KV tier's bookkeeping (`kv_offloading_dir`): block files, their identity, and the
order a restarted engine reads them back in. Standard library only; the tensors' bytes are
pacer.model.kv_io's business.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BlockRecord", "DiskTierIndex", "DiskTierStats", "RefusedFile", "encode_block", "decode_block",
           "restore_order", "MAGIC"]

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
        """The disk row of Engine.cache_stats()["tiers"]."""
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
