"""Segment reuse under random interleavings (hypothesis, the engine over the fake executor): requests
of two isolated tenants carry shared segments after their own histories, arrive and abort at
random steps on a KV cache small enough to evict and preempt (by recompute or swap). After every
step the KV invariants hold (free + cached + stored + held == total, ref counts == holders, the
store's counts), and a consumer of the store's KV events (medium SEGMENT) holds exactly its blocks;
the fake executor checks every position a request reads holds its own token at
that position (a fill shifts a stored segment's positions as RoPE re-rotation does) and was
written by a request of the reader's tenant, so a reused segment is never another tenant's; and
every output equals the fake model's."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pacer.kv.events import MEDIUM_SEGMENT, BlockRemovedEvent, BlockStoredEvent
from pacer.request import SamplingParams
from tests.fakes import Arrival, drive_arrivals, make_engine

SEGMENTS = [list(range(500 + 30 * k, 500 + 30 * k + n)) for k, n in enumerate((7, 13, 22))]

request_strategy = st.tuples(
    st.integers(0, 12),                                     # arrival step
    st.sampled_from(["A", "B"]),                            # tenant
    st.lists(st.integers(1, 40), min_size=1, max_size=12),  # its own history
    st.integers(0, len(SEGMENTS) - 1),                      # which segment it carries
    st.lists(st.integers(1, 40), min_size=1, max_size=4),   # the question after it
    st.integers(1, 5),                                      # max_tokens
    st.one_of(st.none(), st.integers(1, 6)),                # abort after this many steps
)


def _arrivals(requests: list[tuple[Any, ...]]) -> list[Arrival]:
    out = []
    for i, (step, tenant, history, seg, tail, max_tokens, abort) in enumerate(requests):
        prompt = history + SEGMENTS[seg] + tail
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        out.append(Arrival(step, f"r{i}", prompt, params, abort,
                           {"tenant": tenant, "segments": [(len(history), len(SEGMENTS[seg]))]}))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# a segment evicted before its save ran held no KV: demoting it copied nothing into the host tier
@example(requests=[(0, "A", [1] * 9, 2, [1], 2, None), (0, "A", [1], 2, [1], 1, None)], num_blocks=14,
         recompute=0.0, mode="recompute", chunk=8, ttl=None, host=True)
@given(requests=st.lists(request_strategy, min_size=2, max_size=10), num_blocks=st.integers(14, 40),
       recompute=st.sampled_from([0.0, 0.25, 1.0]), mode=st.sampled_from(["recompute", "swap"]),
       chunk=st.sampled_from([8, 64]), ttl=st.sampled_from([None, 0.05]), host=st.booleans())
def test_segment_reuse_keeps_the_kv_invariants_and_tenants_apart(requests: list[tuple[Any, ...]], num_blocks: int,
                                                                 recompute: float, mode: str, chunk: int,
                                                                 ttl: float | None, host: bool) -> None:
    """`ttl` 0.05 s: five steps of the fake loop's clock, so stored segments and cached prefixes
    also expire between the reuses. `host`: a host tier of 40 blocks (shared with swap) takes the
    evicted segments and prefixes, and look-ups promote them back."""
    eng, ex = make_engine(num_blocks=num_blocks, block_size=4, max_len=56, segment_reuse="approximate",
                          segment_recompute=recompute, tenant_isolation="isolated", preemption_mode=mode,
                          num_cpu_blocks=40 if host else 12, max_num_batched_tokens=chunk,
                          long_prefill_token_threshold=chunk, cache_ttl=ttl, kv_offloading_size=1.0 if host else None)
    ex.check_tenants = True
    eng.kv.enable_events()
    mirror: set[int] = set()   # a consumer of the segment store's events (medium SEGMENT)

    def apply_events() -> None:
        for e in eng.kv.take_events():
            if isinstance(e, BlockStoredEvent) and e.medium == MEDIUM_SEGMENT:
                assert not mirror & set(e.block_hashes)   # never stored twice
                mirror.update(e.block_hashes)
            elif isinstance(e, BlockRemovedEvent) and e.medium == MEDIUM_SEGMENT:
                assert set(e.block_hashes) <= mirror      # never removed unless stored
                mirror.difference_update(e.block_hashes)
        assert mirror == {h for entry in eng.kv.segments.iter_entries() for h in entry.hashes}

    finals = drive_arrivals(eng, _arrivals(requests), apply_events, max_steps=3000)
    store = eng.kv.segments
    assert all(e.lock_ref == 0 for e in store.iter_entries())   # no fill outlives its step
    # the store's counters (/metrics) equal the requests' own, fills cancelled by a preemption uncounted
    assert len(finals) == len(requests)
    assert store.stats.reused_tokens == sum(o.metrics.segment_reused_tokens for o in finals.values())
    assert store.stats.recomputed_tokens == sum(o.metrics.segment_recomputed_tokens for o in finals.values())
    if ttl is not None:   # long after the last use: everything stored has expired
        eng.clock.advance(10 * ttl)
        eng.kv.drop_expired()
        assert len(store) == 0 and store.num_cached_blocks == 0
    eng.kv.reset_prefix_cache()
    apply_events()
    assert not mirror
    assert eng.kv.num_available_blocks() == eng.kv.num_blocks   # everything came back
    eng.scheduler.check_invariants()


def test_a_stored_segment_is_reused_by_its_tenant_only() -> None:
    eng, ex = make_engine(num_blocks=64, block_size=4, max_len=64, segment_reuse="approximate",
                          segment_recompute=0.25, tenant_isolation="isolated")
    ex.check_tenants = True
    seg = SEGMENTS[2]   # 22 tokens: k = 6 recomputed, 15 filled (the last prompt token is computed)
    arrivals = [Arrival(0, "a0", [1, 2, 3] + seg + [9], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                        None, {"tenant": "A", "segments": [(3, len(seg))]}),
                Arrival(5, "b0", [4, 5] + seg + [9], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                        None, {"tenant": "B", "segments": [(2, len(seg))]}),
                Arrival(10, "a1", [6, 7, 8, 9, 10] + seg + [11, 12], SamplingParams(max_tokens=2, temperature=0,
                        ignore_eos=True), None, {"tenant": "A", "segments": [(5, len(seg))]})]
    finals = drive_arrivals(eng, arrivals, lambda: None, max_steps=200)
    m = {rid: o.metrics for rid, o in finals.items()}
    assert m["a0"].segment_reused_tokens == 0 and m["b0"].segment_reused_tokens == 0   # B may not read A's
    assert m["a1"].segment_reused_tokens == len(seg) - 6 and m["a1"].segment_recomputed_tokens == 6
    assert m["a1"].prefill_tokens == len(finals["a1"].prompt_token_ids) - (len(seg) - 6)
    assert ex.num_filled == len(seg) - 6
    assert len(eng.kv.segments) == 2   # A's and B's copies, each in its namespace


def test_a_filled_request_caches_only_its_exact_blocks() -> None:
    eng, ex = make_engine(num_blocks=64, block_size=4, max_len=64, segment_reuse="approximate",
                          segment_recompute=0.0)
    seg = SEGMENTS[2]
    p = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    first = [1, 2, 3, 4] + seg + [9]
    second = [5, 6, 7, 8] + seg + [9]
    drive_arrivals(eng, [Arrival(0, "x", first, p, None, {"segments": [(4, len(seg))]}),
                         Arrival(4, "y", second, p, None, {"segments": [(4, len(seg))]})], lambda: None, 100)
    assert ex.num_filled == len(seg)   # k = 0: the whole segment but the prompt's last token... is not in it
    # "y" was filled from position 4: only its first block is in the prefix cache, so a third
    # request with its prompt computes (exactly) from there
    hit = eng.kv.lookup_prefix(_request(second + [10]))
    assert hit is not None and hit.num_tokens == 4


def _request(prompt: list[int]) -> Any:
    from pacer.request import Request

    return Request("probe", prompt, SamplingParams(max_tokens=1), arrival_time=0.0)


def test_an_evicted_segment_comes_back_from_the_host_tier() -> None:
    """A stored segment evicted by a long request is demoted to the host tier (its KV copied out),
    and the next request carrying it promotes it back and fills from it: no token of it recomputed,
    every position it reads checked by the fake executor."""
    eng, ex = make_engine(num_blocks=16, block_size=4, max_len=64, segment_reuse="approximate",
                          segment_recompute=0.0, kv_offloading_size=1.0, num_cpu_blocks=16)
    seg = SEGMENTS[2]   # 22 tokens: 6 blocks in the store
    p = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    arrivals = [Arrival(0, "a", [1, 2, 3, 4] + seg + [9], p, None, {"segments": [(4, len(seg))]}),
                Arrival(4, "big", list(range(100, 156)), p, None, {}),   # 14 blocks: the store must give way
                Arrival(8, "b", [5, 6, 7] + seg + [9], p, None, {"segments": [(3, len(seg))]})]
    finals = drive_arrivals(eng, arrivals, lambda: None, max_steps=100)
    stats = eng.kv.segments.stats
    assert stats.stored == 1 and stats.demoted >= 1 and stats.promoted == 1
    assert finals["b"].metrics.segment_reused_tokens == len(seg) and ex.num_filled == len(seg)
    assert finals["b"].metrics.prefill_tokens == 3 + 1
    eng.kv.reset_prefix_cache()
    eng.scheduler.check_invariants()
    assert eng.kv.num_available_blocks() == eng.kv.num_blocks
