"""The one driver: `pacer sim` (`simulate`) and `pacer bench --engine inprocess`
(`run_inprocess`) feed the same simulated engine the same trace and get identical records,
open loop, capped and closed loop; a request arrives when its client hands it over."""

from __future__ import annotations

import pytest

from pacer.clock import VirtualClock, WallClock
from pacer.config import EngineConfig
from pacer.perf.profiles import get_hardware, get_model
from pacer.sim.simulator import build_sim_engine, simulate
from pacer.workload.arrivals import Poisson
from pacer.workload.generator import generate_requests
from pacer.workload.runner import run_inprocess
from pacer.workload.spec import RequestSpec, builtin_workload

A100, L8B = get_hardware("a100-80g"), get_model("llama-3-8b")


def _sim_engine():
    cfg = EngineConfig.from_kwargs(max_num_seqs=8, max_num_batched_tokens=512)
    return build_sim_engine(cfg, A100, L8B)


def _both(specs, concurrency=None, closed_loop=False):
    engine, ex, clock = _sim_engine()
    sim = simulate(engine, ex, clock, specs, concurrency=concurrency).records
    engine2, _, _ = _sim_engine()
    bench, _, _ = run_inprocess(specs, engine2, concurrency=concurrency, closed_loop=closed_loop)
    return sim, bench


def _spec(rid, arrival, prompt, output_tokens):
    return RequestSpec(rid, "default", "", tuple(prompt), output_tokens, arrival_time=arrival)


def _trace(n=16, rate=40.0):
    return generate_requests(builtin_workload("mixed"), Poisson(rate), seed=5, num_requests=n, max_model_len=8192)


@pytest.mark.parametrize("concurrency", [None, 1, 3])
def test_sim_and_inprocess_bench_give_identical_records(concurrency):
    sim, bench = _both(_trace(), concurrency)
    assert len(sim) == 16
    assert sorted((r.as_dict() for r in sim), key=lambda d: d["request_id"]) == sorted(
        (r.as_dict() for r in bench), key=lambda d: d["request_id"])


def test_closed_loop_gives_identical_records():
    specs = [s.with_arrival(None) for s in _trace(12)]
    sim, bench = _both(specs, concurrency=2, closed_loop=True)
    assert [r.as_dict() for r in sim] == [r.as_dict() for r in bench]


def test_a_capped_request_arrives_when_its_slot_frees():
    """The issue's reproduction: 4 requests at t=0 under --concurrency 1. Each is handed over
    when the previous one finishes, so each waits for no one and has the same TTFT."""
    specs = [_spec(f"r{i}", 0.0, list(range(1 + 100 * i, 65 + 100 * i)), 8) for i in range(4)]
    for records in _both(specs, concurrency=1):
        ttfts = [r.ttft for r in records]
        assert ttfts == pytest.approx([ttfts[0]] * 4, rel=1e-9) and ttfts[0] > 0
        for prev, nxt in zip(records, records[1:]):
            assert nxt.arrival_time == pytest.approx(prev.arrival_time + prev.e2e, abs=1e-12)
            assert nxt.queue_wait == pytest.approx(0.0, abs=1e-12)


def test_an_arrival_during_a_step_counts_its_wait_as_queue_wait():
    specs = [_spec("a", 0.0, range(1, 2049), 2), _spec("b", 0.001, list(range(3000, 3016)), 2)]
    for a, b in _both(specs, concurrency=2):
        assert b.arrival_time == pytest.approx(0.001)
        assert b.queue_wait == pytest.approx(a.ttft - 0.001, rel=1e-9)   # the engine saw it after a's step


def test_wait_until_sleeps_on_the_wall_clock_and_jumps_on_a_virtual_one():
    v = VirtualClock(1.0)
    v.wait_until(3.5)
    v.wait_until(2.0)     # already past: no-op, never back
    assert v.now() == 3.5
    w = WallClock()
    target = w.now() + 0.01
    w.wait_until(target)
    assert w.now() >= target


def test_long_chunked_prefills_on_a_clock_that_never_moves_are_not_a_stall():
    """Steps that run work count as progress even when the clock stands still (a fake
    executor): many prefill chunks with no output are not mistaken for a stalled engine."""
    from tests.fakes import make_engine

    engine, _ = make_engine(num_blocks=64, block_size=4, max_len=256, max_num_batched_tokens=8)
    specs = [_spec(f"r{i}", 0.0, range(10 + 100 * i, 110 + 100 * i), 3) for i in range(2)]
    records, _, _ = run_inprocess(specs, engine)
    assert [r.output_tokens for r in records] == [3, 3] and all(r.ok for r in records)
