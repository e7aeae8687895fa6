"""The segment store on its own: look-up by owner and tokens, adoption, locks, LRU eviction and
its incremental counts (pacer.kv.segment_store)."""

from __future__ import annotations

import pytest

from pacer.clock import VirtualClock
from pacer.kv.events import MEDIUM_SEGMENT, BlockEventLog, BlockRemovedEvent, BlockStoredEvent
from pacer.kv.segment_store import SegmentStore, segment_fingerprint, token_slots


def make() -> tuple[SegmentStore, VirtualClock]:
    clock = VirtualClock()
    return SegmentStore(4, clock.now), clock


def test_find_needs_the_same_owner_and_tokens() -> None:
    store, _ = make()
    store.adopt("a", [1, 2, 3, 4, 5], [10, 11], position=7)
    assert store.find([1, 2, 3, 4, 5], ["a"]).block_ids == [10, 11]
    assert store.find([1, 2, 3, 4, 5], ["b"]) is None          # another tenant's namespace
    assert store.find([1, 2, 3, 4], ["a"]) is None             # a prefix of it is not it
    assert store.find([1, 2, 3, 4, 5], ["b", "a"]).position == 7
    store.check_invariants()


def test_fingerprint_depends_on_owner_and_every_token() -> None:
    fp = segment_fingerprint("a", [1, 2, 3])
    assert fp != segment_fingerprint("b", [1, 2, 3])
    assert fp != segment_fingerprint("a", [1, 2, 4])
    assert fp == segment_fingerprint("a", (1, 2, 3))


def test_adopt_rejects_wrong_block_counts_duplicates_and_a_disabled_store() -> None:
    store, _ = make()
    with pytest.raises(ValueError, match="needs 2 blocks"):
        store.adopt("a", [1] * 5, [1], 0)
    store.adopt("a", [1] * 5, [1, 2], 0)
    with pytest.raises(ValueError, match="stored already"):
        store.adopt("a", [1] * 5, [3, 4], 0)
    off = SegmentStore(4, VirtualClock().now, enabled=False)
    with pytest.raises(ValueError, match="off"):
        off.adopt("a", [1], [0], 0)
    assert off.find([1], ["a"]) is None


def test_eviction_is_lru_and_spares_locked_segments() -> None:
    store, clock = make()
    first = store.adopt("a", [1] * 8, [0, 1], 0)
    clock.advance(1)
    second = store.adopt("a", [2] * 8, [2, 3], 0)
    clock.advance(1)
    third = store.adopt("a", [3] * 4, [4], 0)
    store.lock(first)                  # used again: now the most recent, and not evictable while locked
    assert store.num_evictable_blocks == 3
    assert store.evict(1) == [2, 3]    # the least recently used unlocked one, whole
    store.check_invariants()
    assert store.evict(10) == [4]      # the locked one stays
    assert store.find([1] * 8, ["a"]) is first and third not in list(store.iter_entries())
    store.unlock(first)
    assert store.num_evictable_blocks == 2 and store.evict(2) == [0, 1]
    assert store.num_cached_blocks == 0 and second not in list(store.iter_entries())
    with pytest.raises(ValueError, match="not locked"):
        store.unlock(first)
    store.check_invariants()


def test_token_slots() -> None:
    assert token_slots([5, 9], 2, 4, 4) == (22, 23, 36, 37)


def test_segments_unused_for_longer_than_the_ttl_expire_and_locked_ones_stay() -> None:
    clock = VirtualClock()
    store = SegmentStore(4, clock.now, ttl=10.0)
    old = store.adopt("a", [1] * 8, [0, 1], 0)
    clock.advance(6)
    used = store.adopt("a", [2] * 4, [2], 0)
    held = store.adopt("a", [3] * 4, [3], 0)
    store.lock(held)
    clock.advance(5)                      # `old` 11 s unused, `used` 5 s
    assert store.expire() == [0, 1]
    store.lock(used)
    store.unlock(used)                    # a reuse: fresh again
    clock.advance(9)
    assert store.expire() == []           # `used` 9 s since its reuse; `held` is locked (17 s)
    clock.advance(2)
    assert store.expire() == [2]
    assert store.find([3] * 4, ["a"]) is held and old not in list(store.iter_entries())
    store.unlock(held)                    # its last use is now: it has a full TTL again
    clock.advance(9.5)
    assert store.expire() == []
    store.check_invariants()
    assert SegmentStore(4, clock.now).expire() == []
    with pytest.raises(ValueError, match="ttl"):
        SegmentStore(4, clock.now, ttl=0)


def test_stores_and_removals_are_reported_as_segment_events_of_whole_blocks() -> None:
    clock = VirtualClock()
    store = SegmentStore(4, clock.now, ttl=5.0)
    early = store.adopt("a", [7] * 6, [9, 10], 0)        # stored before anyone listened
    log = BlockEventLog()
    store.record_events(log)
    (first,) = log.take()                                # reported at once, its whole block only
    assert isinstance(first, BlockStoredEvent) and first.medium == MEDIUM_SEGMENT
    assert first.block_hashes == early.hashes and len(early.hashes) == 1 and first.token_ids == (7,) * 4
    a = store.adopt("a", [1] * 8, [0, 1], 3)
    b = store.adopt("b", [1] * 8, [2, 3], 3)             # the same tokens in another namespace
    stored = log.take()
    assert [e.block_hashes for e in stored] == [a.hashes, b.hashes] and len(a.hashes) == 2
    assert not set(a.hashes) & set(b.hashes) and stored[1].extra_keys == ("b",)
    assert all(e.parent_block_hash is None for e in stored)
    assert store.evict(1) == [9, 10]
    clock.advance(6)
    assert sorted(store.expire()) == [0, 1, 2, 3]
    removed = log.take()
    assert all(isinstance(e, BlockRemovedEvent) and e.medium == MEDIUM_SEGMENT for e in removed)
    assert sorted(h for e in removed for h in e.block_hashes) == sorted(early.hashes + a.hashes + b.hashes)
    store.adopt("a", [5, 5], [4], 0)                     # no whole block: nothing to report
    assert log.take() == []
