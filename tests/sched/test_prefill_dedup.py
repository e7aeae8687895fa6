"""Exact dedup of in-flight prefill (pacer.sched.dedup): requests sharing a prefix that arrive
together compute it once; outputs are those without dedup; tenants never wait on each other."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pacer.request import SamplingParams
from tests.fakes import make_engine, run

P = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
SHARED = list(range(500, 564))   # 64 tokens: 16 blocks of 4


def _burst(dedup: bool, n: int = 4, tenants: tuple[str, ...] = ("t",), isolation: str = "isolated", **kw):
    eng, ex = make_engine(num_blocks=256, block_size=4, max_num_batched_tokens=256, max_num_seqs=8,
                          prefill_dedup=dedup, tenant_isolation=isolation, **kw)
    for i in range(n):
        eng.add_request(SHARED + [700 + i] * 6, P, request_id=f"r{i}", tenant=tenants[i % len(tenants)])
    finals = run(eng, ex)
    computed = sum(o.metrics.prefill_tokens for o in finals.values())
    return {k: v.token_ids for k, v in finals.items()}, computed, eng.scheduler


def test_a_burst_sharing_a_prefix_computes_it_once_with_the_same_outputs():
    out_off, computed_off, _ = _burst(False)
    out_on, computed_on, sched = _burst(True)
    assert out_on == out_off
    assert computed_off == 4 * 70 and computed_on == 64 + 4 * 6   # the prefix once, each suffix once
    assert sched.dedup.stats.deferred_requests == 3 and sched.dedup.stats.shared_tokens == 3 * 64


def test_isolated_tenants_never_wait_on_each_other():
    _, computed, sched = _burst(True, tenants=("a", "b"))
    assert sched.dedup.stats.deferred_requests == 2      # r2 waits on r0, r3 on r1: never across tenants
    assert computed == 2 * 64 + 4 * 6


def test_off_without_prefix_caching():
    _, computed, sched = _burst(True, enable_prefix_caching=False)
    assert sched.dedup is None and computed == 4 * 70


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12), st.integers(1, 5), st.integers(0, 3)),
                min_size=1, max_size=10),
       st.integers(16, 64))
def test_dedup_changes_no_output_under_random_bursts_and_preemption(reqs, num_blocks):
    """Random prompts over three shared prefixes, arrivals spread over steps, KV tight enough to
    preempt: every output equals the run without dedup and the invariants hold every step."""
    prefixes = [list(range(100 * k + 1, 100 * k + 1 + 8 * (k + 1))) for k in range(3)]
    outs = []
    for dedup in (False, True):
        eng, ex = make_engine(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=24, max_num_seqs=4,
                              prefill_dedup=dedup)
        pending = [(i, prefixes[k] + [900 + i] * tail, delay) for i, (k, tail, _, delay) in enumerate(reqs)]
        params = {i: SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for i, (_, _, n, _) in enumerate(reqs)}
        finals = {}
        step = 0
        while pending or eng.has_unfinished_requests():
            for item in [p for p in pending if p[2] <= step]:
                eng.add_request(item[1], params[item[0]], request_id=f"r{item[0]}")
                pending.remove(item)
            for o in eng.step():
                if o.finished:
                    finals[o.request_id] = o.token_ids
            eng.scheduler.check_invariants()
            step += 1
        outs.append(finals)
    assert outs[0] == outs[1]
