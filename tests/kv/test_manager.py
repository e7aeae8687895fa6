"""KVCacheManager on its own: slots, look-up-then-commit prefix hits, swap, tenant quotas."""

from __future__ import annotations

from pacer.clock import VirtualClock
from pacer.kv.manager import KVCacheManager
from pacer.kv.prefix_cache import PrefixCache
from pacer.request import Request, SamplingParams

BS = 4


def _kv(num_blocks=8, cache=True, **kw):
    pc = PrefixCache(BS, VirtualClock().now) if cache else None
    return KVCacheManager(num_blocks, BS, pc, **kw)


def _req(rid, tokens, tenant="default"):
    return Request(rid, tokens, SamplingParams(max_tokens=4), arrival_time=0.0, tenant=tenant)


def _run(kv, req):
    """Admit `req` whole (as the scheduler would) and mark its prompt computed."""
    hit = kv.lookup_prefix(req)
    computed = hit.num_tokens if hit else 0
    blocks = kv.allocate_slots(req, req.num_tokens - computed, hit)
    assert blocks is not None
    req.num_computed_tokens = req.num_tokens
    return computed


def test_allocate_grows_the_table_block_by_block():
    kv = _kv(cache=False)
    r = _req("a", list(range(1, 6)))             # 5 tokens: 2 blocks
    assert len(kv.allocate_slots(r, 5)) == 2
    r.num_computed_tokens = 5
    assert kv.allocate_slots(r, 3) == []          # 8 tokens still fit in 2 blocks
    assert len(kv.allocate_slots(r, 4)) == 1
    assert kv.pool.num_free_blocks == 5
    kv.check_invariants()
    kv.free(r)
    assert kv.pool.num_free_blocks == 8 and kv.block_table("a") == []


def test_look_up_takes_no_references_and_commit_counts_once():
    kv = _kv()
    tokens = list(range(1, 14))                   # 13 tokens: 3 full blocks
    a = _req("a", tokens)
    _run(kv, a)
    kv.free(a)                                    # its 3 full blocks stay cached
    b = _req("b", tokens + [99])
    hit = kv.lookup_prefix(b)
    assert hit is not None and hit.num_tokens == 12
    assert kv.stats.queried_tokens == 13 and kv.stats.hit_tokens == 0   # a look-up alone counts nothing
    assert "b" not in kv.block_tables and kv.cache.num_evictable_blocks == 3
    kv.check_invariants()
    assert kv.allocate_slots(b, b.num_tokens - hit.num_tokens, hit) is not None
    assert kv.block_table("b")[:3] == list(hit.match.block_ids)
    assert (kv.stats.queried_tokens, kv.stats.hit_tokens) == (13 + 14, 12)
    assert kv.cache.num_evictable_blocks == 0     # the hit is locked now
    kv.check_invariants()


def test_a_hit_that_cannot_be_admitted_changes_nothing():
    kv = _kv(num_blocks=4)
    tokens = list(range(1, 10))                   # 2 full blocks cached
    a = _req("a", tokens)
    _run(kv, a)
    kv.free(a)
    big = _req("big", tokens + list(range(100, 112)))   # 21 tokens: needs 6 blocks, 2 from the hit
    hit = kv.lookup_prefix(big)
    assert hit.num_tokens == 8
    before = (kv.pool.num_free_blocks, kv.cache.num_evictable_blocks, dict(kv.stats.evicted_blocks))
    # 4 more blocks needed; 2 free + 2 evictable, but the evictable ones are the hit itself
    assert kv.allocate_slots(big, big.num_tokens - hit.num_tokens, hit) is None
    assert (kv.pool.num_free_blocks, kv.cache.num_evictable_blocks, dict(kv.stats.evicted_blocks)) == before
    assert "big" not in kv.block_tables and kv.stats.queried_tokens == 9
    kv.check_invariants()


def test_swap_out_then_in_restores_into_new_blocks():
    kv = _kv(num_blocks=4, cache=False, num_cpu_blocks=4)
    r = _req("r", list(range(1, 8)))             # 7 tokens: 2 blocks
    kv.allocate_slots(r, 7)
    r.num_computed_tokens = 7
    device = kv.block_table("r")
    assert kv.swap_out(r) and kv.block_table("r") == []
    out, ins = kv.take_swap_ops()
    assert [d for d, _ in out] == device and ins == [] and kv.swap.num_used_blocks == 2
    kv.allocate_slots(r, 1)                       # resumed: blocks for its 7 tokens plus one
    out, ins = kv.take_swap_ops()
    assert out == [] and [d for _, d in ins] == kv.block_table("r")[:2] and kv.swap.num_used_blocks == 0
    assert (kv.stats.swap_out_blocks, kv.stats.swap_in_blocks) == (2, 2)
    kv.check_invariants()


def test_swap_out_falls_back_when_the_tier_is_full():
    kv = _kv(num_blocks=4, cache=False, num_cpu_blocks=1)
    r = _req("r", list(range(1, 8)))
    kv.allocate_slots(r, 7)
    r.num_computed_tokens = 7
    assert not kv.swap_out(r) and len(kv.block_table("r")) == 2 and kv.stats.swap_fallbacks == 1


def test_partitioned_quota_evicts_only_the_tenants_own_cache():
    pc = PrefixCache(BS, VirtualClock().now, group_of=lambda o: o if o in ("", "a", "b") else "*")
    kv = KVCacheManager(16, BS, pc, tenant_isolation="partitioned", tenant_quotas={"a": 2, "b": 4})
    for i in range(3):
        _run_free(kv, _req(f"a{i}", list(range(100 * i + 1, 100 * i + 10)), tenant="a"))   # 2 blocks each
    _run_free(kv, _req("b0", list(range(1000, 1009)), tenant="b"))
    assert pc.cached_blocks("a") <= 2 and pc.cached_blocks("b") == 2
    assert kv.stats.evicted_blocks["quota"] >= 4
    kv.check_invariants()


def _run_free(kv, req):
    _run(kv, req)
    kv.free(req)


def test_a_prefix_the_queue_waits_for_is_evicted_last():
    """Queue-aware eviction: the lpm/slo look-up of a waiting request counts as a use of its
    cached prefix, so LRU drops a newer prefix nobody waits for first; off, the older goes."""
    for aware in (True, False):
        kv = _kv(num_blocks=8, queue_aware_eviction=aware)
        older, newer = _req("a", list(range(1, 10))), _req("b", list(range(50, 59)))   # 2 full blocks each
        for r in (older, newer):
            _run(kv, r)
            kv.free(r)
        waiting = _req("w", list(range(1, 9)) + [77, 78])
        assert kv.cached_prefix_tokens(waiting) == 8          # the lpm policy's look-up, each step
        big = _req("big", list(range(200, 220)))              # 5 blocks: 2 cached blocks must go
        _run(kv, big)
        kept_older = kv.cached_prefix_tokens(_req("w2", list(range(1, 9)) + [1])) == 8
        kept_newer = kv.cached_prefix_tokens(_req("w3", list(range(50, 58)) + [1])) == 8
        assert (kept_older, kept_newer) == ((True, False) if aware else (False, True))
        kv.check_invariants()
