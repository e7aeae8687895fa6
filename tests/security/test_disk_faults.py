"""The disk KV tier contains its faults: an OSError at the write is counted and pauses the
tier (nothing raised to the engine); files are 0600 in a 0700 directory under unique
temporary names; the byte cap deletes the least recently used files; a planted file fails
the HMAC."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pacer.kv.tiers.block_files import BlockRecord, DiskTierIndex
from pacer.kv.tiers.disk import BACKOFF_STEPS, DiskTier
from tests.kv.test_disk_tier import BytesStore, _kv

ID = {"model": "m"}


def test_a_write_error_pauses_the_tier_and_raises_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = DiskTier(_kv(), str(tmp_path / "d"), BytesStore())

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    disk._write(BlockRecord(1, 0, "", (1, 2)), b"kv")
    assert disk.index.stats.io_errors == 1 and disk.paused_steps == BACKOFF_STEPS
    assert not [n for n in os.listdir(tmp_path / "d") if n.endswith(".tmp")]   # its temp file removed
    monkeypatch.undo()
    disk._write(BlockRecord(2, 0, "", (3, 4)), b"kv")     # paused: skipped, no error
    assert disk.index.keys == set()


def test_modes_cap_and_hmac(tmp_path: Path) -> None:
    d = tmp_path / "d"
    idx = DiskTierIndex(str(d), ID, max_bytes=1, hmac_key=b"secret")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    idx.write(BlockRecord(1, 0, "", (1,)), b"a")
    assert stat.S_IMODE(os.stat(idx.path(1)).st_mode) == 0o600
    idx.write(BlockRecord(2, 0, "", (2,)), b"b")
    assert idx.keys == {2} and idx.stats.deleted == 1 and not os.path.exists(idx.path(1))   # LRU under the cap
    planted = DiskTierIndex(str(d), ID, hmac_key=b"other")
    assert [r.key for r in planted.scan()] == [2] and planted.read(2) is None and planted.stats.refused == 1
