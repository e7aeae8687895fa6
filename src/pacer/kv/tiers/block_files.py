"""The disk KV tier's directory (`kv_offloading_dir`): the block file format and the index of
what the directory holds. Standard library only.

One file per block, named by its chain key (the host tier's stable key, the KV events' block
hash): a magic line, a JSON header and the block's bytes, and with a key
(`kv_offloading_dir_key_file`) an HMAC-SHA256 trailer over all of that. The header says who
wrote it (the model, the KV dtype and scales, the block's layout: `identity`), where the
block sits (its key, its parent's key, the owner namespace and its tokens) and a sha256 of
the bytes. A file whose identity differs from the engine's, that is truncated, fails its
checksum or (with a key) its HMAC, is refused with a message saying which and why; it is never
loaded and never crashes the engine.

Safe on a shared machine: the directory is made 0700 and files are written 0600 under a
unique temporary name (two servers on one directory never clash) and then renamed, so a
reader never sees half a block. Start-up reads only the headers (`scan`); a block's bytes are
read, and checked, when it is loaded. `max_bytes` caps the directory: past it the least
recently written or loaded files are deleted. An I/O error (a full disk, a permission) is the
caller's to contain: `write` raises `OSError` after removing its temporary file.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import struct
import tempfile
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BlockRecord", "DiskTierIndex", "DiskTierStats", "RefusedFile", "encode_block", "decode_block",
           "restore_order", "MAGIC", "SUFFIX"]

MAGIC = b"PACER-KV-BLOCK 1\n"
SUFFIX = ".kvblock"
_HEADER_LEN = struct.Struct(">I")
_MAC_LEN = 32


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
    deleted: int = 0          # files deleted to stay under max_bytes
    io_errors: int = 0        # writes that failed (ENOSPC, EACCES, ...): the tier paused itself
    refusals: list[str] = field(default_factory=list)   # the first few reasons, for the start-up line


def encode_block(identity: Mapping[str, Any], rec: BlockRecord, payload: bytes, key: bytes | None = None) -> bytes:
    header = json.dumps({"identity": dict(identity), "key": rec.key, "parent": rec.parent, "owner": rec.owner,
                         "tokens": list(rec.tokens), "nbytes": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest()}, sort_keys=True).encode()
    data = MAGIC + _HEADER_LEN.pack(len(header)) + header + payload
    return data + hmac.new(key, data, "sha256").digest() if key is not None else data


def _decode_header(data: bytes, identity: Mapping[str, Any], name: str) -> tuple[BlockRecord, int, str, int]:
    """The record, the payload's size and digest, and where the payload starts."""
    if not data.startswith(MAGIC):
        raise RefusedFile(f"{name}: not a pacer KV block file (bad magic)")
    start = len(MAGIC) + _HEADER_LEN.size
    if len(data) < start:
        raise RefusedFile(f"{name}: truncated header")
    (n,) = _HEADER_LEN.unpack_from(data, len(MAGIC))
    if len(data) < start + n:
        raise RefusedFile(f"{name}: truncated header")
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
    return rec, nbytes, digest, start + n


def decode_block(data: bytes, identity: Mapping[str, Any], name: str = "block file",
                 key: bytes | None = None) -> tuple[BlockRecord, bytes]:
    """The record and bytes of one file; RefusedFile when it is not ours to load."""
    if key is not None:
        body, mac = data[:-_MAC_LEN], data[-_MAC_LEN:]
        if len(data) < _MAC_LEN or not hmac.compare_digest(mac, hmac.new(key, body, "sha256").digest()):
            raise RefusedFile(f"{name}: fails its HMAC (planted, or written under another key)")
        data = body
    rec, nbytes, digest, start = _decode_header(data, identity, name)
    payload = data[start:]
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
    """The directory, which keys it holds (`keys`) and their files' sizes in LRU order."""

    def __init__(self, directory: str, identity: Mapping[str, Any], max_refusals_kept: int = 5,
                 max_bytes: int | None = None, hmac_key: bytes | None = None) -> None:
        self.directory = directory
        self.identity = dict(identity)
        self.keys: set[int] = set()
        self.refused_paths: set[str] = set()   # never overwritten: another engine's, or to inspect
        self.stats = DiskTierStats()
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._sizes: OrderedDict[int, int] = OrderedDict()   # key -> file size, least recently used first
        self._hmac_key = hmac_key
        self._max_refusals = max_refusals_kept
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700)
            os.chmod(directory, 0o700)   # whatever the umask: the files hold every tenant's tokens

    def tier_stats(self) -> dict[str, float]:
        """The disk row of EngineSnapshot.tiers."""
        s = self.stats
        usage = (self.num_bytes / self.max_bytes if self.max_bytes else 1.0) if self.keys else 0.0
        return {"blocks": len(self.keys), "usage": usage, "hit_tokens": 0,
                "promotions": s.loaded, "demotions": s.written, "refused_files": s.refused,
                "bytes_in": s.bytes_written, "bytes_out": s.bytes_read, "deleted_files": s.deleted,
                "io_errors": s.io_errors, "bytes_on_disk": self.num_bytes}

    def path(self, key: int) -> str:
        return os.path.join(self.directory, f"{key:016x}{SUFFIX}")

    def write(self, rec: BlockRecord, payload: bytes) -> bool:
        """Write one block's file (0600, through a unique temporary name); False (nothing
        written) where a refused file lies. An OSError propagates, its temporary file removed."""
        if self.path(rec.key) in self.refused_paths:
            return False
        data = encode_block(self.identity, rec, payload, self._hmac_key)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{rec.key:016x}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path(rec.key))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.keys.add(rec.key)
        self._account(rec.key, len(data))
        self.stats.written += 1
        self.stats.bytes_written += len(payload)
        self._trim(keep=rec.key)
        return True

    def _account(self, key: int, size: int) -> None:
        self.num_bytes += size - self._sizes.pop(key, 0)
        self._sizes[key] = size

    def touch(self, key: int) -> None:
        """`key` was used (loaded): the last to be deleted."""
        if key in self._sizes:
            self._sizes.move_to_end(key)

    def _trim(self, keep: int) -> None:
        """Delete least recently used files until the directory is under max_bytes."""
        while self.max_bytes is not None and self.num_bytes > self.max_bytes and len(self._sizes) > 1:
            key, size = next(iter(self._sizes.items()))
            if key == keep:
                self._sizes.move_to_end(key)
                continue
            with contextlib.suppress(OSError):
                os.unlink(self.path(key))
            del self._sizes[key]
            self.keys.discard(key)
            self.num_bytes -= size
            self.stats.deleted += 1

    def _refuse(self, path: str, reason: str) -> None:
        self.refused_paths.add(path)
        self.stats.refused += 1
        if len(self.stats.refusals) < self._max_refusals:
            self.stats.refusals.append(reason)

    def scan(self) -> list[BlockRecord]:
        """The records of every block file this engine may load, from their headers only (the
        bytes are read by `read` when a block is loaded); refused ones are counted and their
        reasons kept in stats; a file's name must match its key."""
        found: list[tuple[float, BlockRecord, int]] = []
        for name in sorted(os.listdir(self.directory)):
            if not name.endswith(SUFFIX):
                continue
            path = os.path.join(self.directory, name)
            try:
                with open(path, "rb") as f:
                    head = f.read(len(MAGIC) + _HEADER_LEN.size)
                    n = _HEADER_LEN.unpack_from(head, len(MAGIC))[0] if len(head) == len(MAGIC) + 4 else 0
                    rec, _, _, _ = _decode_header(head + f.read(n), self.identity, path)
                    st = os.fstat(f.fileno())
                if os.path.basename(self.path(rec.key)) != name:
                    raise RefusedFile(f"{path}: its header names block {rec.key:016x}")
            except (RefusedFile, OSError) as e:
                self._refuse(path, str(e))
                continue
            found.append((st.st_mtime, rec, st.st_size))
        for _, rec, size in sorted(found, key=lambda f: f[0]):   # oldest first: the first to go
            self.keys.add(rec.key)
            self._account(rec.key, size)
        return [rec for _, rec, _ in found]

    def read(self, key: int) -> bytes | None:
        """One block's bytes, checked (checksum, and HMAC with a key); None (and the file
        refused) when it fails."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                rec, payload = decode_block(f.read(), self.identity, path, self._hmac_key)
        except (RefusedFile, OSError) as e:
            self._refuse(path, str(e))
            self.keys.discard(key)
            self.num_bytes -= self._sizes.pop(key, 0)
            return None
        self.touch(rec.key)
        return payload
