"""KV events from the prefix cache's own store/remove points: a consumer that applies the
stream holds exactly the engine's cached blocks after every operation and every step, the
stream never stores a block twice or removes one it did not store, tenants and salts give
two copies of the same tokens two identities, and a router computes the same hashes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pacer.clock import VirtualClock
from pacer.deploy.kv_index import BlockIndex
from pacer.kv.events import SALT_SEPARATOR, BlockStoredEvent, chain_hashes, namespace
from pacer.kv.manager import KVCacheManager
from pacer.kv.prefix_cache import PrefixCache
from pacer.request import Request, SamplingParams
from tests.fakes import Arrival, drive_arrivals, make_engine

BS = 2


def tree_hashes(kv: KVCacheManager) -> list[int]:
    return [h for node in kv.cache.iter_nodes() for h in node.hashes]


def assert_mirrors(kv: KVCacheManager, index: BlockIndex, replica: str = "r") -> None:
    hashes = tree_hashes(kv)
    assert len(hashes) == len(set(hashes)), "two cached blocks share one identity"
    assert index.blocks(replica) == set(hashes)
    assert len(hashes) == kv.num_cached_blocks


ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.lists(st.integers(0, 2), min_size=1, max_size=12),
                  st.sampled_from("ab"), st.sampled_from([None, "s1", "s2"])),
        st.tuples(st.just("progress"), st.integers(0, 20)),
        st.tuples(st.just("finish"), st.integers(0, 20)),
        st.tuples(st.just("evict"), st.integers(1, 8)),
        st.tuples(st.just("prewarm"), st.lists(st.integers(0, 2), min_size=2, max_size=8)),
        st.tuples(st.just("tick"), st.floats(0, 40)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy, isolation=st.sampled_from(["shared", "isolated", "partitioned"]),
       late=st.booleans())
def test_consumer_of_the_stream_holds_exactly_the_cached_blocks(ops, isolation, late):
    clock = VirtualClock()
    quotas = {"a": 6, "b": 4} if isolation == "partitioned" else None
    group_of = (lambda o: o.partition(SALT_SEPARATOR)[0] if o.partition(SALT_SEPARATOR)[0] in ("", "a", "b")
                else "*") if isolation == "partitioned" else None
    cache = PrefixCache(BS, clock.now, "ttl", ttl=30.0, group_of=group_of)
    kv = KVCacheManager(24, BS, cache, tenant_isolation=isolation, tenant_quotas=quotas)
    index = BlockIndex(strict=True)
    if not late:   # else: enabled half-way, blocks cached already are reported as stores
        kv.enable_events()
    live: list[Request] = []
    for n, op in enumerate(ops):
        if late and n == len(ops) // 2:
            kv.enable_events()
        kind = op[0]
        if kind in ("admit", "prewarm"):
            tokens = [t + 1 for t in op[1]]
            req = Request(f"r{n}", tokens, SamplingParams(max_tokens=4), arrival_time=clock.now(),
                          tenant=op[2] if kind == "admit" else "a", cache_salt=op[3] if kind == "admit" else None)
            if kind == "prewarm":
                kv.mark_prewarm(req.request_id, public=True, pin=False)
            found = kv.lookup_prefix(req)   # committed with the allocation, or nothing changes
            if kv.allocate_slots(req, req.num_tokens - (found.num_tokens if found else 0), found) is None:
                continue
            req.num_computed_tokens = req.num_tokens
            if kind == "prewarm":
                kv.free(req)
            else:
                live.append(req)
        elif kind == "progress" and live:   # a decode step: its full blocks are shared at once
            req = live[op[1] % len(live)]
            req.output_token_ids.append(op[1] % 3 + 1)
            if kv.allocate_slots(req, 1) is not None:
                req.num_computed_tokens += 1
        elif kind == "finish" and live:
            kv.free(live.pop(op[1] % len(live)))
        elif kind == "evict":
            kv._release(cache.evict(op[1]), "capacity")
        elif kind == "tick":
            clock.advance(op[1])
            kv.drop_expired()
        index.apply("r", kv.take_events())
        kv.check_invariants()
        if cache.events is not None:
            assert_mirrors(kv, index)
    for req in live:
        kv.free(req)
    kv._release(cache.evict(10_000), "capacity")
    index.apply("r", kv.take_events())
    assert index.blocks("r") == set() and tree_hashes(kv) == []


def test_tenants_and_salts_make_distinct_blocks_and_routers_compute_the_same_hashes():
    clock = VirtualClock()
    kv = KVCacheManager(64, BS, PrefixCache(BS, clock.now), tenant_isolation="isolated")
    kv.enable_events()
    tokens = [5, 6, 7, 8, 9, 10, 11]
    stored: dict[tuple[str, str | None], list[int]] = {}
    for tenant, salt in [("a", None), ("b", None), ("a", "s"), ("a", None)]:
        req = Request(f"{tenant}{salt}{len(stored)}", tokens, SamplingParams(max_tokens=1), arrival_time=0.0,
                      tenant=tenant, cache_salt=salt)
        found = kv.lookup_prefix(req)
        hit = found.num_tokens if found else 0
        assert hit == (6 if (tenant, salt) in stored else 0)   # a copy is shared only within its namespace
        kv.allocate_slots(req, req.num_tokens - hit, found)
        req.num_computed_tokens = req.num_tokens
        kv.free(req)
        events = [e for e in kv.take_events() if isinstance(e, BlockStoredEvent)]
        if (tenant, salt) not in stored:
            assert len(events) == 1 and events[0].extra_keys == tuple(k for k in (tenant, salt and "salted") if k)   # the salt stays in
            stored[(tenant, salt)] = list(events[0].block_hashes)
        else:
            assert events == []
    ids = [tuple(v) for v in stored.values()]
    assert len(set(ids)) == 3 and all(len(set(a) & set(b)) == 0 for a in ids for b in ids if a is not b)
    for (tenant, salt), hashes in stored.items():   # what a router computes from the request alone
        assert chain_hashes(None, tokens, BS, namespace(tenant, salt)) == hashes


def test_router_index_matches_within_the_tenant_and_public_prefixes():
    clock = VirtualClock()
    kv = KVCacheManager(64, BS, PrefixCache(BS, clock.now), tenant_isolation="isolated")
    kv.enable_events()
    system = [1, 2, 3, 4]
    pre = Request("p", system + [9], SamplingParams(max_tokens=1), arrival_time=0.0, tenant="a")
    kv.mark_prewarm("p", public=True, pin=False)
    for req in [pre, Request("x", system + [5, 6, 7, 8, 0], SamplingParams(max_tokens=1), 0.0, tenant="a")]:
        found = kv.lookup_prefix(req)
        kv.allocate_slots(req, req.num_tokens - (found.num_tokens if found else 0), found)
        req.num_computed_tokens = req.num_tokens
        kv.free(req)
    index = BlockIndex(strict=True)
    index.apply("r0", kv.take_events())
    query = system + [5, 6, 7, 8, 1, 2]
    assert index.match_blocks("r0", query, BS, "a") == 4      # public system prompt + a's own blocks
    assert index.match_blocks("r0", query, BS, "b") == 2      # b sees only the public blocks
    assert index.match_blocks("r0", query, BS, namespace("a", "s")) == 0   # salted: nothing unsalted
    assert index.match_blocks("r1", query, BS, "a") == 0


def test_engine_steps_publish_a_stream_that_mirrors_the_cache_at_every_step():
    eng, ex = make_engine(num_blocks=20, block_size=2, max_len=40, max_num_batched_tokens=12, max_num_seqs=3,
                          tenant_isolation="isolated")
    index = BlockIndex(strict=True)
    batches: list[float] = []

    def sink(now: float, events: list) -> None:
        batches.append(now)
        index.apply("r", events)

    eng.add_kv_event_sink(sink)
    prefix = [11, 12, 13, 14, 15, 16]
    arrivals = [Arrival(i // 2, f"q{i}", prefix + [(i * 7 + j) % 50 + 20 for j in range(4 + i % 5)],
                        SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), None,
                        {"tenant": "ab"[i % 2]}) for i in range(10)]
    drive_arrivals(eng, arrivals, lambda: assert_mirrors(eng.kv, index), max_steps=500)
    assert len(batches) > 3 and eng.kv.stats.hit_tokens > 0
    evicted = sum(eng.kv.stats.evicted_blocks.values())
    assert evicted > 0, "the budget is small enough that eviction (BlockRemoved) is exercised"
    eng.run_until_done()
    assert index.blocks("r")
    eng.reset_prefix_cache()                  # sinks hear of it at once, not at the next step
    assert_mirrors(eng.kv, index)
    assert not index.blocks("r")
