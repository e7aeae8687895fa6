"""The disk tier's bookkeeping: block files round-trip; a file of another model or KV format,
a truncated or corrupt one, or one renamed, is refused with a message naming why (never
loaded, never overwritten); a restart reads parents before children and drops orphans. Its
decisions over a KV manager, with a block store of plain bytes: a demoted block is written
once the step whose plan copies it has run, never before; a flush writes the device tree's
blocks and no host slot whose copy has not run; a restart reads the files back into the host
tier."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pacer.clock import VirtualClock
from pacer.kv.manager import KVCacheManager
from pacer.kv.prefix_cache import PrefixCache
from pacer.kv.tiers.disk import (
    BlockRecord,
    DiskTier,
    DiskTierIndex,
    RefusedFile,
    decode_block,
    encode_block,
    restore_order,
)
from pacer.kv.tiers.host import HostKVTier
from pacer.request import Request, SamplingParams

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
    assert fresh.scan() == [rec] and fresh.read(rec.key) == b"kv"   # headers at start-up, bytes when loaded
    assert fresh.stats.refused == 2 and any("model='other'" in r for r in fresh.stats.refusals)
    assert any("names block" in r for r in fresh.stats.refusals)
    assert not fresh.write(BlockRecord(6, 0, "", (3, 4)), b"ours")
    assert b"x" == Path(idx.path(6)).read_bytes()[-1:]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


BS = 2


@dataclass
class BytesStore:
    """A block store of plain bytes: what the executor would hold in each device block and host slot."""

    identity: dict[str, str] = field(default_factory=lambda: {"model": "bytes"})
    device: dict[int, bytes] = field(default_factory=dict)
    host: dict[int, bytes] = field(default_factory=dict)

    def device_block(self, block_id: int) -> bytes:
        return self.device[block_id]

    def host_block(self, slot: int) -> bytes | None:
        return self.host.get(slot)

    def put_host_block(self, slot: int, data: bytes) -> None:
        self.host[slot] = data


@dataclass
class Plan:
    swap_out: list[tuple[int, int]]


def _kv() -> KVCacheManager:
    clock = VirtualClock()
    return KVCacheManager(8, BS, PrefixCache(BS, clock.now), host_tier=HostKVTier(16, BS, clock.now))


def _cache(kv: KVCacheManager, store: BytesStore, rid: str, tokens: list[int]) -> None:
    """Compute `tokens` into blocks (their bytes name the block) and cache them."""
    req = Request(rid, tokens, SamplingParams(max_tokens=1), arrival_time=0.0)
    hit = kv.lookup_prefix(req)
    assert kv.allocate_slots(req, req.num_tokens - (hit.num_tokens if hit else 0), hit) is not None
    for b in kv.block_table(rid):
        store.device[b] = f"{rid}:{b}".encode()
    req.num_computed_tokens = req.num_tokens
    kv.free(req)


def test_a_demoted_block_is_written_once_the_step_that_copies_it_has_run(tmp_path: Path) -> None:
    kv, store = _kv(), BytesStore()
    disk = DiskTier(kv, str(tmp_path), store)
    _cache(kv, store, "a", [1, 2, 3, 4, 5, 6, 7])                  # 3 full blocks cached
    kv._release(kv.cache.evict(10), "capacity")                    # demoted: copies planned, not run
    disk.before_step(Plan([]))                                     # a plan without those copies
    disk.after_step()
    assert disk.index.keys == set()                                # nothing copied yet, nothing written
    copies, _ = kv.take_swap_ops()
    disk.before_step(Plan(copies))                                 # the plan that copies them
    assert disk.index.keys == set()
    for dev, slot in copies:                                       # the executor runs the step's copies
        store.host[slot] = store.device[dev]
    disk.after_step()
    host = kv.host_tier
    assert host is not None and len(disk.index.keys) == 3
    for key in disk.index.keys:
        entry = host.entry(key)
        assert entry is not None
        with open(disk.index.path(key), "rb") as f:
            assert decode_block(f.read(), store.identity)[1] == store.host[entry[0]]
    assert disk.stats()["demotions"] == 3 and disk.stats()["blocks"] == 3


def test_flush_writes_the_tree_and_skips_host_slots_whose_copy_has_not_run(tmp_path: Path) -> None:
    kv, store = _kv(), BytesStore(host={slot: b"stale" for slot in range(16)})   # slots of an earlier life
    disk = DiskTier(kv, str(tmp_path), store)
    _cache(kv, store, "a", [1, 2, 3, 4, 5])
    kv._release(kv.cache.evict(10), "capacity")                    # 2 blocks demoted, copies not run
    _cache(kv, store, "b", [9, 8, 7, 6, 5])                        # 2 blocks in the tree
    tree = {store.device[b] for node in kv.cache.iter_nodes() for b in node.block_ids}
    assert disk.flush() == 2                                       # the tree's; the host slots hold nothing yet
    host = kv.host_tier
    assert host is not None and all(host.entry(k) is None for k in disk.index.keys)

    copies, _ = kv.take_swap_ops()                                 # the next step copies them, then writes them
    disk.before_step(Plan(copies))
    for dev, slot in copies:
        store.host[slot] = store.device[dev]
    disk.after_step()
    assert len(disk.index.keys) == 4 and disk.flush() == 0         # everything is on disk once

    kv2, store2 = _kv(), BytesStore()                              # a restart over the same directory
    again = DiskTier.open(kv2, str(tmp_path), store2)
    assert again.index.stats.loaded == 4 and kv2.host_tier is not None and kv2.host_tier.num_offloaded_blocks == 4
    assert sorted(store2.host.values()) == sorted(tree | {store.device[dev] for dev, _ in copies})


def test_the_disk_tier_needs_a_host_tier_and_prefix_caching(tmp_path: Path) -> None:
    clock = VirtualClock()
    with pytest.raises(ValueError, match="kv_offloading_size"):
        DiskTier(KVCacheManager(8, BS, PrefixCache(BS, clock.now)), str(tmp_path), BytesStore())
    with pytest.raises(ValueError, match="prefix caching"):
        DiskTier(KVCacheManager(8, BS, host_tier=HostKVTier(4, BS, clock.now)), str(tmp_path), BytesStore())
