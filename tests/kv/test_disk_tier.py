"""The disk tier's bookkeeping: block files round-trip; a file of another model or KV format,
a truncated or corrupt one, or one renamed, is refused with a message naming why (never
loaded, never overwritten); a restart reads parents before children and drops orphans."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pacer.kv.tiers.disk import (
    BlockRecord,
    DiskTierIndex,
    RefusedFile,
    decode_block,
    encode_block,
    restore_order,
)

ID = {"model": "abc", "kv_cache_dtype": "int8", "block_shape": [2, 2, 4]}


def test_a_block_file_round_trips() -> None:
    rec = BlockRecord(7, 0, "tenant-a", (1, 2, 3, 4))
    assert decode_block(encode_block(ID, rec, b"\x01\x02\x03"), ID) == (rec, b"\x01\x02\x03")


def test_foreign_truncated_and_corrupt_files_are_refused_with_the_reason() -> None:
    data = encode_block(ID, BlockRecord(7, 0, "", (1, 2)), b"payload!")
    with pytest.raises(RefusedFile, match=r"another model or KV format: kv_cache_dtype='int8' \(this engine: 'auto'\)"):
        decode_block(data, {**ID, "kv_cache_dtype": "auto"})
    with pytest.raises(RefusedFile, match="truncated"):
        decode_block(data[:-3], ID)
    with pytest.raises(RefusedFile, match="checksum"):
        decode_block(data[:-1] + b"?", ID)
    with pytest.raises(RefusedFile, match="bad magic"):
        decode_block(b"GGUF" + data, ID)
    with pytest.raises(RefusedFile, match="corrupt header"):
        decode_block(data[:30] + b"{{{" + data[33:], ID)


def test_restore_order_puts_parents_first_and_drops_orphans() -> None:
    a, b, c = BlockRecord(1, 0, "", (1,)), BlockRecord(2, 1, "", (2,)), BlockRecord(3, 2, "", (3,))
    orphan = BlockRecord(9, 8, "", (9,))
    assert restore_order([c, orphan, b, a], 0) == [a, b, c]


def test_the_index_writes_scans_and_never_overwrites_a_refused_file(tmp_path: Path) -> None:
    idx = DiskTierIndex(str(tmp_path), ID)
    rec = BlockRecord(5, 0, "", (1, 2))
    assert idx.write(rec, b"kv")
    Path(idx.path(6)).write_bytes(encode_block({**ID, "model": "other"}, BlockRecord(6, 0, "", (3, 4)), b"x"))
    Path(idx.path(8)).write_bytes(encode_block(ID, BlockRecord(5, 0, "", (1, 2)), b"kv"))   # renamed
    (tmp_path / "notes.txt").write_text("not a block")
    fresh = DiskTierIndex(str(tmp_path), ID)
    assert fresh.scan() == [(rec, b"kv")]
    assert fresh.stats.refused == 2 and any("model='other'" in r for r in fresh.stats.refusals)
    assert any("names block" in r for r in fresh.stats.refusals)
    assert not fresh.write(BlockRecord(6, 0, "", (3, 4)), b"ours")
    assert b"x" == Path(idx.path(6)).read_bytes()[-1:]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
