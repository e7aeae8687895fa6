"""Prefix cache: the radix tree on its own, and through the KV manager and scheduler with
the fake executor (which checks that every cached position holds the right token)."""

from __future__ import annotations

import pytest

from pacer.clock import VirtualClock
from pacer.config import EngineConfig
from pacer.engine.prewarm import prewarm
from pacer.kv.block_pool import BlockPool
from pacer.kv.prefix_cache import PUBLIC, PrefixCache
from pacer.request import SamplingParams
from tests.fakes import make_engine, reference_output, run, run_preempting_workload

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def generate(eng, ex, prompt, params=GREEDY, tenant="default", request_id=None):
    rid = eng.add_request(prompt, params, tenant=tenant, request_id=request_id)
    return run(eng, ex)[rid]


# ---------------------------------------------------------------------- the tree alone


def make_tree(block_size=2, **kw) -> tuple[PrefixCache, BlockPool, VirtualClock]:
    clock = VirtualClock()
    return PrefixCache(block_size, clock.now, **kw), BlockPool(64), clock


def cache_seq(cache: PrefixCache, pool: BlockPool, tokens: list[int], owner=PUBLIC) -> list[int]:
    """What the KV manager does for a finished request: own blocks, insert, drop its refs."""
    blocks = pool.allocate(len(tokens) // cache.block_size)
    adopted, _ = cache.insert(tokens, blocks, owner)
    pool.incref(adopted)
    pool.free(blocks)
    return blocks


def test_branching_prefixes_share_blocks_and_split_nodes():
    cache, pool, _ = make_tree()
    a = cache_seq(cache, pool, [1, 2, 3, 4, 5, 6])
    b = cache_seq(cache, pool, [1, 2, 3, 4, 9, 9])      # diverges inside a's node: split
    assert cache.num_cached_blocks == 4                   # 3 of a + 1 new of b
    assert pool.num_used_blocks == 4 and pool.ref_count(b[0]) == 0   # b's duplicates freed
    m = cache.match_prefix([1, 2, 3, 4, 9, 9, 7], [PUBLIC], max_blocks=10)
    assert m.block_ids == (a[0], a[1], b[2])
    m = cache.match_prefix([1, 2, 3, 0], [PUBLIC], max_blocks=10)   # ends inside a node: split again
    assert m.block_ids == (a[0],)
    cache.check_invariants()
    assert sum(1 for _ in cache.iter_nodes()) == 4        # [1,2] -> [3,4] -> {[5,6], [9,9]}


def test_match_respects_max_blocks_and_whole_blocks_only():
    cache, pool, _ = make_tree()
    cache_seq(cache, pool, [1, 2, 3, 4, 5, 6])
    assert cache.match_prefix([1, 2, 3, 4, 5, 6], [PUBLIC], max_blocks=2).num_blocks == 2
    assert cache.match_prefix([1, 2, 3], [PUBLIC], max_blocks=9).num_blocks == 1
    assert cache.match_prefix([1, 3], [PUBLIC], max_blocks=9).num_blocks == 0


def test_locked_path_is_not_evictable_and_counts_are_incremental():
    cache, pool, _ = make_tree()
    cache_seq(cache, pool, [1, 2, 3, 4])
    other = cache_seq(cache, pool, [5, 6, 7, 8])
    m = cache.match_prefix([1, 2, 3, 4, 0], [PUBLIC], max_blocks=9)
    cache.lock(m)
    assert (cache.num_evictable_blocks, cache.num_protected_blocks) == (2, 2)
    assert sorted(cache.evict(10)) == sorted(other)
    assert cache.num_cached_blocks == 2
    cache.unlock(m)
    assert cache.num_evictable_blocks == 2
    assert sorted(cache.evict(10)) == sorted(m.block_ids)
    cache.check_invariants()


def test_lru_evicts_least_recently_used_tail_first():
    cache, pool, clock = make_tree()
    old = cache_seq(cache, pool, [1, 1, 2, 2])
    clock.advance(1)
    new = cache_seq(cache, pool, [3, 3, 4, 4])
    clock.advance(1)
    cache.match_prefix([1, 1, 2, 2, 0], [PUBLIC], 9)     # touch the old one
    assert cache.evict(1) == [new[1]]                     # tail block of the LRU leaf
    assert cache.evict(1) == [new[0]]
    assert cache.evict(1) == [old[1]]


def test_weighted_lru_keeps_heavy_tenant_through_a_burst():
    cache, pool, clock = make_tree(eviction_policy="weighted-lru", tenant_weights={"hot": 4.0})
    hot = cache_seq_tenant(cache, pool, [9, 9, 9, 9], "hot")
    for i in range(3):                        # a cold burst turns the cache over 3 times
        clock.advance(1)
        cache_seq_tenant(cache, pool, [i, i, i + 1, i + 1], "cold")
        pool.free(cache.evict(2))
    assert cache.match_prefix([9, 9, 9, 9, 0], [PUBLIC], 9).block_ids == tuple(hot)
    lru, pool2, clock2 = make_tree(eviction_policy="lru")
    cache_seq_tenant(lru, pool2, [9, 9, 9, 9], "hot")
    for i in range(3):
        clock2.advance(1)
        cache_seq_tenant(lru, pool2, [i, i, i + 1, i + 1], "cold")
        pool2.free(lru.evict(2))
    assert lru.match_prefix([9, 9, 9, 9, 0], [PUBLIC], 9).num_blocks == 0
    for i in range(3, 4):                     # weight 4 = survives ~3 turnovers, not 4
        cache_seq_tenant(cache, pool, [i, i, i + 1, i + 1], "cold")
        pool.free(cache.evict(2))
    assert cache.match_prefix([9, 9, 9, 9, 0], [PUBLIC], 9).num_blocks == 0


def cache_seq_tenant(cache, pool, tokens, tenant):
    blocks = pool.allocate(len(tokens) // cache.block_size)
    adopted, _ = cache.insert(tokens, blocks, PUBLIC, tenant)
    pool.incref(adopted)
    pool.free(blocks)
    return blocks


def test_ttl_expiry_follows_the_virtual_clock():
    cache, pool, clock = make_tree(eviction_policy="ttl", ttl=10.0)
    cache_seq(cache, pool, [1, 2, 3, 4])
    clock.advance(5)
    cache_seq(cache, pool, [1, 2, 7, 7])                  # touches the shared [1, 2] block
    clock.advance(6)                                       # [3, 4] idle 11 s; the rest 6 s
    freed = cache.expire()
    assert len(freed) == 1 and cache.num_cached_blocks == 2
    clock.advance(11)
    assert len(cache.expire()) == 2 and cache.num_cached_blocks == 0
    cache.check_invariants()


def test_pinned_prefix_survives_eviction_until_unpinned():
    cache, pool, _ = make_tree()
    cache_seq(cache, pool, [1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 3, 4], [PUBLIC], 9)
    cache.pin(m)
    assert cache.evict(10) == [] and cache.num_cached_blocks == 2
    cache.unpin(m)
    assert len(cache.evict(10)) == 2


def test_owners_see_only_their_own_and_public_branches():
    cache, pool, _ = make_tree()
    cache_seq(cache, pool, [1, 2, 3, 4], owner=PUBLIC)
    cache_seq(cache, pool, [1, 2, 3, 4, 5, 6], owner="a")
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 0], ["a", PUBLIC], 9).num_blocks == 3
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 0], ["b", PUBLIC], 9).num_blocks == 2
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 0], ["b"], 9).num_blocks == 0
    cache.check_invariants()


# ---------------------------------------------------------------------- through the engine


def test_second_turn_hits_first_turns_prompt_and_answer():
    eng, ex = make_engine()
    p = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    first = generate(eng, ex, list(range(1, 14)), p)      # 13 prompt tokens + 6 generated
    assert first.num_cached_tokens == 0
    turn2 = list(range(1, 14)) + first.token_ids + [50, 51, 52]
    second = generate(eng, ex, turn2, p)
    # computed KV of turn 1: 13 + 5 tokens (the last sampled token never ran) -> 4 full blocks
    assert second.num_cached_tokens == 16 and second.metrics.cached_tokens == 16
    assert second.metrics.prefill_tokens == len(turn2) - 16
    assert second.token_ids == reference_output(turn2, p)
    assert eng.snapshot().prefix_cache_hit_tokens == 16


def test_fully_cached_prompt_still_computes_its_last_token():
    eng, ex = make_engine()
    prompt = list(range(1, 17))                           # exactly 4 blocks
    generate(eng, ex, prompt)
    again = generate(eng, ex, prompt)
    assert again.num_cached_tokens == 12 and again.metrics.prefill_tokens == 4
    assert again.token_ids == reference_output(prompt, GREEDY)


def test_cache_off_reuses_nothing_and_frees_everything():
    eng, ex = make_engine(enable_prefix_caching=False)
    generate(eng, ex, list(range(1, 17)))
    assert generate(eng, ex, list(range(1, 17))).num_cached_tokens == 0
    assert eng.kv.pool.num_free_blocks == eng.kv.num_blocks


def test_allocation_evicts_cached_blocks_on_demand():
    eng, ex = make_engine(num_blocks=8, max_len=32)
    generate(eng, ex, list(range(1, 21)))                 # leaves 5 cached blocks
    assert eng.kv.num_cached_blocks == 5 and eng.kv.num_available_blocks() == 8
    out = generate(eng, ex, list(range(100, 126)))        # needs 7 blocks: evicts 4+
    assert out.token_ids == reference_output(list(range(100, 126)), GREEDY)
    assert eng.snapshot().evicted_blocks["capacity"] >= 4


def test_recompute_preemption_resumes_from_the_cache():
    eng, prompts, p, finals = run_preempting_workload()
    resumed = [o for o in finals.values() if o.metrics.preemptions]
    # a resumed request recomputes less than prompt + everything it had generated
    assert any(o.metrics.prefill_tokens < 8 + o.metrics.preemptions * 8 for o in resumed)
    assert eng.kv.stats.hit_tokens > 0
    for rid, pr in prompts.items():
        assert finals[rid].token_ids == reference_output(pr, p)


def test_isolated_tenants_never_share_but_public_prewarm_does():
    eng, ex = make_engine(tenant_isolation="isolated")
    secret = list(range(200, 221))
    generate(eng, ex, secret, tenant="alice")
    assert generate(eng, ex, secret, tenant="bob").num_cached_tokens == 0
    assert generate(eng, ex, secret, tenant="alice").num_cached_tokens == 20
    system = list(range(300, 317))                         # 16 + 1 tokens
    assert prewarm(eng, [system]) == [16]
    out_a = generate(eng, ex, system + [1, 2, 3], tenant="alice")
    out_b = generate(eng, ex, system + [4, 5, 6], tenant="bob")
    assert out_a.num_cached_tokens == 16 and out_b.num_cached_tokens == 16
    # bob's continuation of the public prefix is bob's own
    assert generate(eng, ex, system + [4, 5, 6, 7], tenant="carol").num_cached_tokens == 16


def test_shared_mode_shares_across_tenants():
    eng, ex = make_engine()
    generate(eng, ex, list(range(1, 22)), tenant="alice")
    assert generate(eng, ex, list(range(1, 22)), tenant="bob").num_cached_tokens == 20


def test_prewarmed_prefix_is_pinned_against_pressure():
    eng, ex = make_engine(num_blocks=10, max_len=40)
    system = list(range(300, 309))                         # 2 full blocks
    prewarm(eng, [system])
    for i in range(5):                                     # churn through the whole pool
        generate(eng, ex, [500 + 40 * i + j for j in range(24)])
    assert generate(eng, ex, system + [1]).num_cached_tokens == 8
    assert eng.kv.unpin() == 1
    generate(eng, ex, list(range(600, 636)))               # needs all 10 blocks
    assert generate(eng, ex, system + [1]).num_cached_tokens == 0


def test_partitioned_quota_caps_a_tenant_and_protects_the_other():
    eng, ex = make_engine(num_blocks=24, max_len=32, tenant_isolation="partitioned",
                          tenant_quotas={"a": 8, "b": 8})
    a_prompt = list(range(1, 18))                          # 4 full blocks
    generate(eng, ex, a_prompt, tenant="a")
    for i in range(6):                                     # b churns far past its quota
        generate(eng, ex, [100 + 30 * i + j for j in range(20)], tenant="b")
        assert eng.kv.cache.cached_blocks("b") <= 8
    assert eng.snapshot().evicted_blocks["quota"] > 0
    assert generate(eng, ex, a_prompt, tenant="a").num_cached_tokens == 16
    assert generate(eng, ex, list(range(1, 18)), tenant="stranger").num_cached_tokens == 0
    assert eng.kv.cache.cached_blocks("*") == 0            # unlisted tenants cache nothing


def test_partitioned_quotas_must_leave_room_for_a_request():
    with pytest.raises(ValueError, match="tenant_quotas sum to 20"):
        make_engine(num_blocks=24, max_len=32, tenant_isolation="partitioned", tenant_quotas={"a": 20})


def test_ttl_policy_drops_idle_prefixes_proactively():
    clock = VirtualClock()
    eng, ex = make_engine(eviction_policy="ttl", cache_ttl=60.0, clock=clock)
    generate(eng, ex, list(range(1, 22)))                 # 21 + 3 computed tokens: 6 blocks
    assert eng.kv.num_cached_blocks == 6
    clock.advance(30)
    generate(eng, ex, list(range(1, 10)) + [99])          # keeps the first 2 blocks warm
    clock.advance(45)                                      # the other 4 are now 75 s idle
    eng.step()                                             # an idle step drops them
    assert eng.snapshot().evicted_blocks["ttl"] == 4
    assert generate(eng, ex, list(range(1, 22))).num_cached_tokens == 8


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="eviction_policy"):
        EngineConfig.from_kwargs(eviction_policy="mru")
    with pytest.raises(ValueError, match="tenant_weights"):
        EngineConfig.from_kwargs(tenant_weights={"a": 2.0})           # needs weighted-lru
    with pytest.raises(ValueError, match="tenant_quotas"):
        EngineConfig.from_kwargs(tenant_quotas={"a": 2})              # needs partitioned
    with pytest.raises(ValueError, match="cache_ttl"):
        EngineConfig.from_kwargs(cache_ttl=0)


def _preempting_workload(eng):
    p = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    prompts = {f"r{i}": [i * 10 + j for j in range(1, 9)] for i in range(4)}
    for rid, pr in prompts.items():
        eng.add_request(pr, p, request_id=rid)
    return prompts, p


def test_swap_preemption_restores_kv_instead_of_recomputing():
    eng, ex = make_engine(num_blocks=12, block_size=4, max_len=48, preemption_mode="swap", num_cpu_blocks=64,
                          enable_prefix_caching=False)
    prompts, p = _preempting_workload(eng)
    finals = run(eng, ex)
    stats = eng.snapshot()
    assert stats.num_swap_preemptions > 0 and stats.num_recompute_preemptions == 0
    assert stats.swap_in_requests == stats.swap_out_requests == stats.num_swap_preemptions
    assert any(s.swap_out for s in ex.steps) and any(s.swap_in for s in ex.steps)
    for rid, pr in prompts.items():
        assert finals[rid].token_ids == reference_output(pr, p)
        # nothing recomputed: the prompt once, plus the one token of each resume step
        m = finals[rid].metrics
        assert m.prefill_tokens == len(pr) + m.preemptions
    assert stats.num_cpu_blocks_used == 0   # (the host keeps stale copies until a slot is reused)


def test_swap_falls_back_to_recompute_when_the_cpu_tier_is_full():
    eng, ex = make_engine(num_blocks=12, block_size=4, max_len=48, preemption_mode="swap", num_cpu_blocks=1)
    prompts, p = _preempting_workload(eng)
    finals = run(eng, ex)
    stats = eng.snapshot()
    assert stats.num_recompute_preemptions > 0 and stats.swap_fallbacks > 0
    for rid, pr in prompts.items():
        assert finals[rid].token_ids == reference_output(pr, p)


def test_cli_flags_for_cache_options_parse_tenant_maps():
    import argparse

    from pacer.config.args import add_engine_args, engine_kwargs_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--eviction-policy", "weighted-lru", "--tenant-weights", "gold=4,free=1",
                              "--tenant-isolation", "partitioned", "--tenant-quotas", '{"a": 3, "*": 2}',
                              "--cache-ttl", "900"])
    kw = engine_kwargs_from_args(args)
    assert kw["tenant_weights"] == {"gold": 4.0, "free": 1.0} and kw["tenant_quotas"] == {"a": 3, "*": 2}
    assert EngineConfig.from_kwargs(**kw).cache.cache_ttl == 900.0
    with pytest.raises(SystemExit):
        parser.parse_args(["--tenant-quotas", "a=lots"])


def test_running_requests_share_their_computed_blocks_before_finishing():
    eng, ex = make_engine()
    long_run = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    prompt = list(range(1, 22))
    eng.add_request(prompt, long_run, request_id="first")
    for _ in range(3):
        eng.step()                                         # prefilled, decoding
    assert eng.kv.num_cached_blocks == 5 and eng.kv.cache.num_evictable_blocks == 0   # cached, locked
    eng.add_request(prompt[:17] + [99], GREEDY, request_id="second")
    finals = run(eng, ex)
    assert finals["second"].num_cached_tokens == 16
    assert finals["first"].token_ids == reference_output(prompt, long_run)
    assert finals["second"].token_ids == reference_output(prompt[:17] + [99], GREEDY)


def test_step_stats_carry_hits_and_swaps():
    eng, ex = make_engine()
    generate(eng, ex, list(range(1, 22)))
    generate(eng, ex, list(range(1, 22)))
    assert sum(s.num_cached_tokens for s in eng.step_stats) == eng.kv.stats.hit_tokens == 20
    eng, ex = make_engine(num_blocks=12, block_size=4, max_len=48, preemption_mode="swap", num_cpu_blocks=64)
    _preempting_workload(eng)
    run(eng, ex)
    assert sum(s.num_swap_out_blocks for s in eng.step_stats) == eng.kv.stats.swap_out_blocks > 0
