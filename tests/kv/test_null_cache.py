"""The null prefix cache (`enable_prefix_caching=False`): it matches nothing, keeps nothing and
evicts nothing, and a KV manager over it behaves as a manager without prefix caching always
did: the same fake-executor outputs, nothing cached, nothing queried, usage and availability
counted from the free list alone, every block back on it at the end."""

from __future__ import annotations

import pytest

from pacer.clock import VirtualClock
from pacer.config import CacheConfig
from pacer.engine.prewarm import prewarm
from pacer.kv.manager import KVCacheManager
from pacer.kv.null_cache import NullPrefixCache
from pacer.kv.prefix_cache import PUBLIC
from pacer.kv.tiers.offload import NullOffload
from pacer.request import Request, SamplingParams
from tests.fakes import make_engine, reference_output, run, run_preempting_workload

BS = 4
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), arrival_time=0.0)


def test_the_null_cache_matches_nothing_adopts_nothing_and_evicts_nothing() -> None:
    cache = NullPrefixCache(BS)
    tokens = list(range(1, 14))
    adopted, handle = cache.insert(tokens, [5, 6, 7, 8], PUBLIC)
    assert adopted == [] and handle.block_ids == (5, 6, 7)          # three whole blocks offered, none kept
    assert cache.match_prefix(tokens, [PUBLIC], max_blocks=3).num_blocks == 0
    assert cache.lookup_blocks(tokens, [PUBLIC], max_blocks=3) == 0
    assert not cache.pin(handle) and cache.evict(10) == [] and cache.expire() == []
    assert (cache.num_cached_blocks, cache.num_evictable_blocks, cache.evictable_blocks()) == (0, 0, 0)
    assert list(cache.iter_nodes()) == [] and cache.enable_events() is None and cache.take_events() == []
    with pytest.raises(ValueError, match="not pinned"):
        cache.unpin(handle)
    with pytest.raises(ValueError, match="block_size"):
        NullPrefixCache(0)


def test_a_manager_without_prefix_caching_caches_and_queries_nothing() -> None:
    kv = KVCacheManager(8, BS)                                      # no prefix cache given: the null one
    assert isinstance(kv.cache, NullPrefixCache) and isinstance(kv.offload, NullOffload) and not kv.prefix_caching
    tokens = list(range(1, 14))                                     # 13 tokens: 4 blocks
    a = _req("a", tokens)
    hit = kv.lookup_prefix(a)
    assert hit is not None and (hit.num_tokens, hit.num_queried_tokens, hit.promoted) == (0, 0, ())
    assert kv.allocate_slots(a, a.num_tokens, hit) is not None
    a.num_computed_tokens = a.num_tokens
    assert kv.allocate_slots(a, 1) == []                            # its full blocks are offered (and not kept)
    assert kv.usage == 4 / 8 and kv.num_available_blocks() == 4 == kv.pool.num_free_blocks
    kv.check_invariants()
    kv.free(a)
    b = _req("b", tokens + [99])                                    # the same prefix again: no hit
    assert kv.lookup_prefix(b).num_tokens == 0 and kv.cached_prefix_tokens(b) == 0
    assert (kv.num_cached_blocks, kv.num_evictable_blocks, kv.pool.num_free_blocks, kv.usage) == (0, 0, 8, 0.0)
    assert (kv.stats.queried_tokens, kv.stats.hit_tokens) == (0, 0)
    assert kv.reset_prefix_cache() == 0 and kv.unpin() == 0 and kv.enable_events() is None
    assert kv.take_events() == [] and kv.take_swap_ops() == ([], [])
    kv.check_invariants()


def test_from_config_without_prefix_caching_builds_the_null_cache_even_with_a_host_tier() -> None:
    cfg = CacheConfig(block_size=BS, enable_prefix_caching=False, kv_offloading_size=1.0, num_cpu_blocks=8)
    kv = KVCacheManager.from_config(cfg, 16, VirtualClock().now, block_bytes=1024)
    assert kv.host_tier is not None and kv.swap.num_blocks == 8    # the host pool still serves swap
    assert isinstance(kv.cache, NullPrefixCache) and isinstance(kv.offload, NullOffload)


def test_engine_without_prefix_caching_gives_the_same_outputs_and_keeps_nothing() -> None:
    shared = list(range(1, 17))                                     # every prompt starts with the same 4 blocks
    prompts = {f"r{i}": shared + [100 + i, 200 + i] for i in range(5)}
    results = {}
    for caching in (True, False):
        eng, ex = make_engine(num_blocks=24, block_size=BS, enable_prefix_caching=caching)
        for rid, p in prompts.items():
            eng.add_request(p, GREEDY, request_id=rid)
        results[caching] = (eng, run(eng, ex))
    on, off = results[True], results[False]
    for rid, p in prompts.items():
        assert off[1][rid].token_ids == on[1][rid].token_ids == reference_output(p, GREEDY)
        assert off[1][rid].num_cached_tokens == 0 and off[1][rid].metrics.prefill_tokens == len(p)
    assert on[0].kv.stats.hit_tokens > 0                           # the workload would have hit
    snap = off[0].snapshot()
    assert not snap.prefix_caching and snap.num_cached_blocks == snap.num_evictable_blocks == 0
    assert snap.prefix_cache_queried_tokens == snap.prefix_cache_hit_tokens == 0
    assert snap.num_free_blocks == snap.num_available_blocks == 24 and snap.kv_usage == 0.0
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        prewarm(off[0], [shared])


def test_recompute_preemption_without_prefix_caching_recomputes_everything() -> None:
    eng, prompts, p, finals = run_preempting_workload(enable_prefix_caching=False)
    for rid, pr in prompts.items():
        assert finals[rid].token_ids == reference_output(pr, p)
    resumed = [o for o in finals.values() if o.metrics.preemptions]
    assert resumed and eng.kv.stats.hit_tokens == 0
    assert eng.kv.pool.num_free_blocks == eng.kv.num_blocks and eng.kv.num_cached_blocks == 0
