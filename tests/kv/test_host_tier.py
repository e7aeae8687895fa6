"""The host KV tier on its own: one pool for swap and offload, chain-key lookups, eviction
order, locks across a step; hypothesis drives random operations and checks the accounting
and that a lookup only ever returns what was demoted under that exact prefix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pacer.clock import VirtualClock
from pacer.kv.tiers.host import ROOT_KEY, HostKVTier, chain_keys

BS = 2


def tier(n: int = 6, **kw: object) -> tuple[HostKVTier, VirtualClock]:
    clock = VirtualClock()
    return HostKVTier(n, BS, clock.now, **kw), clock   # type: ignore[arg-type]


def test_demote_then_lookup_finds_the_prefix_and_promotion_is_a_copy() -> None:
    t, _ = tier()
    toks = [1, 2, 3, 4, 5, 6]
    copies = t.demote("pub", "a", ROOT_KEY, toks, [10, 11, 12])
    assert [d for d, _ in copies] == [10, 11, 12] and t.num_offloaded_blocks == 3
    t.end_step()
    found = t.lookup(["pub"], ROOT_KEY, toks + [7, 8], 4)
    assert [k for k, _ in found] == chain_keys("pub", toks, BS, 3)
    assert t.lookup(["other"], ROOT_KEY, toks, 3) == []            # another namespace misses
    assert t.lookup(["pub"], ROOT_KEY, [1, 2, 9, 9], 2) == found[:1]  # diverges after block 0
    t.promote([k for k, _ in found[:2]])
    assert t.num_offloaded_blocks == 3 and t.stats.promotions == 2 and t.stats.hit_tokens == 4
    t.end_step()
    assert t.demote("pub", "a", ROOT_KEY, toks, [20, 21, 22]) == []   # already there: nothing to copy
    t.check_invariants()


def test_swap_evicts_offloaded_blocks_tail_first_but_never_locked_ones() -> None:
    t, clock = tier(4)
    t.demote("pub", "a", ROOT_KEY, [1, 2, 3, 4], [0, 1])
    t.end_step()
    clock.advance(1.0)
    t.demote("pub", "a", ROOT_KEY, [9, 9], [2])                  # newer, and locked this step
    assert t.available_for_swap() == 3 and t.allocate_swap(4) is None
    slots = t.allocate_swap(2)                                   # 1 free + evicts the older chain's tail
    assert slots is not None and t.stats.evictions["swap"] == 1
    assert len(t.lookup(["pub"], ROOT_KEY, [1, 2, 3, 4], 2)) == 1   # its head survived
    t.check_invariants()
    t.free_swap(slots)
    t.check_invariants()


def test_ttl_drops_idle_entries_and_a_full_pool_of_swap_skips_demotion() -> None:
    t, clock = tier(2, eviction_policy="ttl", ttl=10.0)
    t.demote("pub", "a", ROOT_KEY, [1, 2], [0])
    t.end_step()
    clock.advance(11.0)
    assert t.lookup(["pub"], ROOT_KEY, [1, 2], 1) == [] and t.stats.evictions["ttl"] == 1
    assert t.allocate_swap(2) is not None
    assert t.demote("pub", "a", ROOT_KEY, [3, 4], [5]) == [] and t.stats.demotions_skipped == 1
    with pytest.raises(ValueError, match="eviction_policy"):
        HostKVTier(2, BS, clock.now, eviction_policy="fifo")


def test_weighted_lru_keeps_the_heavier_tenants_blocks() -> None:
    t, clock = tier(2, eviction_policy="weighted-lru", tenant_weights={"gold": 4.0})
    t.demote("pub", "gold", ROOT_KEY, [1, 2], [0])
    t.demote("pub", "free", ROOT_KEY, [3, 4], [1])
    t.end_step()
    t.demote("pub", "free", ROOT_KEY, [5, 6], [2])      # needs a slot: the free tenant's goes
    t.end_step()
    assert len(t.lookup(["pub"], ROOT_KEY, [1, 2], 1)) == 1 and t.lookup(["pub"], ROOT_KEY, [3, 4], 1) == []


ops = st.lists(st.one_of(
    st.tuples(st.just("demote"), st.integers(0, 3), st.integers(1, 4)),
    st.tuples(st.just("lookup"), st.integers(0, 3), st.integers(1, 4)),
    st.tuples(st.just("swap"), st.integers(1, 4), st.just(0)),
    st.tuples(st.just("unswap"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("step"), st.integers(0, 30), st.just(0)),
), max_size=60)


def test_a_tenant_at_its_quota_evicts_only_its_own_blocks() -> None:
    t, _ = tier(6, group_of=lambda owner: owner, quotas={"a": 2, "b": 3})
    t.demote("a", "a", ROOT_KEY, [1, 2, 3, 4], [0, 1])
    t.demote("b", "b", ROOT_KEY, [5, 6, 7, 8], [2, 3])
    t.end_step()
    assert len(t.demote("a", "a", ROOT_KEY, [9, 9], [4])) == 1      # a at its quota: its own oldest goes
    assert t.group_size("a") == 2 and t.group_size("b") == 2 and t.stats.evictions["quota"] == 1
    assert len(t.lookup(["b"], ROOT_KEY, [5, 6, 7, 8], 2)) == 2        # b untouched
    assert t.demote("c", "c", ROOT_KEY, [1, 1], [5]) == []            # unlisted ("*": 0) keeps nothing
    assert t.demote("", "", ROOT_KEY, [2, 2], [5]) != []               # public prefixes have no quota
    t.end_step()
    t.demote("a", "a", ROOT_KEY, [3, 3, 4, 4, 5, 5], [6, 7, 8])        # more than its quota in one chain
    assert t.group_size("a") == 2
    t.check_invariants()


@settings(max_examples=150, deadline=None)
@given(ops=ops, policy=st.sampled_from(["lru", "ttl", "weighted-lru"]),
       quotas=st.sampled_from([None, {"t0": 2, "t1": 3}, {"t0": 5, "*": 1}]))
def test_random_operations_keep_the_accounting_and_never_return_wrong_blocks(ops, policy, quotas) -> None:
    t, clock = tier(8, eviction_policy=policy, ttl=20.0, tenant_weights={"t1": 3.0},
                    group_of=lambda owner: owner if owner in ("", "t0", "t1") else "*", quotas=quotas)
    seqs = [[s, s + 1, s + 2, s + 3, s + 4, s + 5, s + 6, s + 7] for s in (0, 0, 100, 200)]
    seqs[1] = [0, 1, 2, 3, 50, 51, 52, 53]              # shares two blocks with seqs[0]
    demoted: set[int] = set()                            # chain keys ever demoted
    swapped: list[list[int]] = []
    for op, a, b in ops:
        owner = ("t0", "t1", "", "t2")[a % 4]
        if op == "demote":
            t.demote(owner, owner, ROOT_KEY, seqs[a][:b * BS], list(range(b)))
            demoted.update(chain_keys(owner, seqs[a], BS, b))
        elif op == "lookup":
            found = t.lookup([owner], ROOT_KEY, seqs[a], b)
            keys = [k for k, _ in found]
            assert keys == chain_keys(owner, seqs[a], BS, len(keys)) and set(keys) <= demoted
            t.promote(keys)
        elif op == "swap":
            slots = t.allocate_swap(a)
            if slots is not None:
                swapped.append(slots)
        elif op == "unswap" and swapped:
            t.free_swap(swapped.pop(a % len(swapped)))
        else:
            t.end_step()
            clock.advance(float(a))
        t.check_invariants()


def test_kv_manager_demotes_on_eviction_and_promotes_on_a_later_match() -> None:
    from pacer.kv.manager import KVCacheManager
    from pacer.kv.prefix_cache import PrefixCache
    from pacer.request import Request, SamplingParams

    clock = VirtualClock()
    host = HostKVTier(16, BS, clock.now)
    kv = KVCacheManager(8, BS, PrefixCache(BS, clock.now), host_tier=host)
    tokens = [1, 2, 3, 1, 2, 2, 3]

    def admit(rid: str) -> int:
        req = Request(rid, tokens, SamplingParams(max_tokens=1), arrival_time=0.0)
        found = kv.lookup_prefix(req)
        hit = found.num_tokens if found else 0
        assert kv.allocate_slots(req, req.num_tokens - hit, found) is not None
        req.num_computed_tokens = req.num_tokens
        kv.free(req)
        kv.check_invariants()
        return hit

    assert admit("r0") == 0
    first_blocks = sorted(b for n in kv.cache.iter_nodes() for b in n.block_ids)
    kv._release(kv.cache.evict(10), "capacity")
    out, ins = kv.take_swap_ops()
    assert sorted(d for d, _ in out) == first_blocks and ins == [] and host.num_offloaded_blocks == 3
    assert admit("r1") == 6                                          # 3 blocks back from the host
    out, ins = kv.take_swap_ops()
    assert out == [] and sorted(s for s, _ in ins) == [0, 1, 2] and host.stats.promotions == 3
    assert kv.stats.hit_tokens == 6 and host.stats.hit_tokens == 6
    assert admit("r2") == 6 and kv.take_swap_ops() == ([], [])     # now a device hit: no copy


def test_from_config_gives_each_tenant_the_same_share_of_the_host_tier() -> None:
    from pacer.config import CacheConfig
    from pacer.kv.manager import KVCacheManager

    cfg = CacheConfig(block_size=BS, num_kv_blocks=40, num_cpu_blocks=80, kv_offloading_size=1.0,
                      tenant_isolation="partitioned", tenant_quotas={"a": 10, "b": 20})
    kv = KVCacheManager.from_config(cfg, 40, VirtualClock().now)
    host = kv.host_tier
    assert host is not None
    assert (host.quota("a"), host.quota("b"), host.quota("other"), host.quota("")) == (20, 40, 0, None)
    shared = KVCacheManager.from_config(CacheConfig(block_size=BS, num_cpu_blocks=8, kv_offloading_size=1.0), 40,
                                        VirtualClock().now)
    assert shared.host_tier is not None and shared.host_tier.quota("a") is None


def test_the_host_tier_publishes_its_blocks_as_medium_cpu_under_the_device_tiers_hashes() -> None:
    from pacer.kv.events import BlockEventLog, BlockRemovedEvent, BlockStoredEvent, chain_hashes

    t, _ = tier(2)
    t.events = BlockEventLog()
    t.demote("a", "a", ROOT_KEY, [1, 2, 3, 4], [0, 1])
    t.end_step()
    t.demote("a", "a", ROOT_KEY, [7, 7], [2])            # full: the oldest chain's tail goes
    events = t.events.take()
    stored = [e for e in events if isinstance(e, BlockStoredEvent)]
    removed = [e for e in events if isinstance(e, BlockRemovedEvent)]
    device = chain_hashes(None, [1, 2, 3, 4], BS, "a")   # what the radix tree published for them
    assert [e.block_hashes[0] for e in stored[:2]] == device and stored[1].parent_block_hash == device[0]
    assert all(e.medium == "CPU" and e.extra_keys == ("a",) for e in stored)
    assert [e.block_hashes for e in removed] == [(device[1],)] and removed[0].medium == "CPU"


def test_transient_blocks_are_neither_published_nor_tracked_for_the_disk() -> None:
    """A segment's chain (transient) is kept and found like any other, but produces no KV events
    and no keys for the disk tier to write through; evicted, it leaves no trace."""
    from pacer.kv.events import BlockEventLog

    t, _ = tier(3)
    t.events = BlockEventLog()
    t.track_demotions()
    copies = t.demote("a", "a", 77, [1, 2, 3], [0, 1], transient=True)   # a partial last block
    assert len(copies) == 2 and len(t.transient) == 2
    assert t.events.take() == [] and t.take_demoted() == []
    t.end_step()
    t.demote("a", "a", ROOT_KEY, [5, 6, 7, 8], [2, 3])                  # needs a slot: a transient one goes
    assert len(t.transient) == 1 and t.take_demoted() and t.events.take()
    t.check_invariants()


def test_demotions_planned_in_an_idle_step_are_still_copied() -> None:
    """A TTL expiry while nothing runs demotes blocks in a step with nothing scheduled: its
    copies must still reach the executor, or a later promotion reads a slot never filled."""
    from pacer.request import SamplingParams
    from tests.fakes import make_engine, reference_output

    clock = VirtualClock()
    eng, ex = make_engine(clock=clock, eviction_policy="ttl", cache_ttl=10.0, kv_offloading_size=1.0,
                          num_cpu_blocks=16)
    prompt, params = list(range(1, 14)), SamplingParams(max_tokens=3, temperature=0.0)
    eng.add_request(prompt, params)
    eng.run_until_done()
    eng.step()                                            # reports the finished id: the executor's last call
    clock.advance(11.0)
    eng.step()                                            # idle: the tree's nodes expire and are demoted
    assert eng.kv.host_tier is not None and eng.kv.host_tier.stats.demotions == 3
    assert sum(len(s.swap_out) for s in ex.steps) == 3   # their copies ran
    rid = eng.add_request(prompt, params)
    out = [o for o in eng.run_until_done() if o.request_id == rid][0]
    assert out.num_cached_tokens == 12 and list(out.token_ids) == reference_output(prompt, params)
    eng.kv.check_invariants()


def test_a_request_preempted_in_the_step_of_its_promotion_leaves_no_copy_into_a_freed_block() -> None:
    from pacer.kv.manager import KVCacheManager
    from pacer.kv.prefix_cache import PrefixCache
    from pacer.request import Request, SamplingParams

    clock = VirtualClock()
    host = HostKVTier(16, BS, clock.now)
    kv = KVCacheManager(8, BS, PrefixCache(BS, clock.now), host_tier=host)
    tokens = [1, 2, 3, 1, 2, 2, 3]
    first = Request("r0", tokens, SamplingParams(max_tokens=1), arrival_time=0.0)
    assert kv.allocate_slots(first, first.num_tokens) is not None
    first.num_computed_tokens = first.num_tokens
    kv.free(first)
    kv._release(kv.cache.evict(10), "capacity")
    kv.take_swap_ops()                                                               # the demotions ran

    def promote(rid: str) -> Request:
        req = Request(rid, tokens, SamplingParams(max_tokens=1), arrival_time=0.0)
        hit = kv.lookup_prefix(req)
        assert hit is not None and len(hit.promoted) == 3                            # all from the host tier
        assert kv.allocate_slots(req, req.num_tokens - hit.num_tokens, hit) is not None
        req.num_computed_tokens = hit.num_tokens
        return req

    swapped = promote("r1")
    assert not kv.swap_out(swapped)              # its KV arrives only with this step's copies: recompute
    kv.free(swapped)                             # (the scheduler's fallback) the tree keeps the promoted blocks
    out, ins = kv.take_swap_ops()
    kept = {b for n in kv.cache.iter_nodes() for b in n.block_ids}
    assert out == [] and len(ins) == 3 and {d for _, d in ins} == kept             # each still filled
    kv.check_invariants()

    kv._release(kv.cache.evict(10), "capacity")
    kv.take_swap_ops()
    dup = promote("r2")
    dup.num_computed_tokens = 0                  # nothing computed: the tree adopts none of its blocks
    kv.free(dup)
    assert kv.take_swap_ops() == ([], [])        # no copy lands in blocks handed back to the pool
    assert host.stats.promotions == 3            # and the dropped promotions are not counted
    kv.check_invariants()
