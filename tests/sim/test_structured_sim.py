"""The simulator prices structured outputs through the real Engine: a constrained request waits
in the scheduler (WAITING_FOR_GRAMMAR) for its modelled compile, cache hits are free, and a step
with constrained rows takes max(step, masks) plus the apply cost exactly, while steps and rows
without constraints pay nothing."""

from __future__ import annotations

import pytest

from pacer.config import EngineConfig
from pacer.perf.profiles import get_hardware, get_model
from pacer.request import RequestStatus, SamplingParams, StructuredOutputsParams
from pacer.sim.simulator import SimRequest, build_sim_engine, simulate
from pacer.sim.structured import StructuredCost

A100, L8B = get_hardware("a100-80g"), get_model("llama-3-8b")
SCHEMA = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}})


def _engine(cost: StructuredCost, **kw):
    return build_sim_engine(EngineConfig.from_kwargs(**kw), A100, L8B, structured_cost=cost)


def _params(n: int, structured: StructuredOutputsParams | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, structured_outputs=structured)


def _run(cost: StructuredCost, structured: list[bool], lengths: list[int]) -> tuple[list[float], list[int], object]:
    """Per-step times and constrained sampling rows of one batch arriving at once."""
    engine, executor, _ = _engine(cost)
    for i, (s, n) in enumerate(zip(structured, lengths)):
        first = 1 + 1000 * i   # distinct prompts: no shared prefix to compute once (exact dedup)
        engine.add_request(list(range(first, first + 64 + i)), _params(n, SCHEMA if s else None), request_id=f"r{i}")
    rows: list[int] = []
    engine.schedule_listeners.append(lambda out: out.scheduled and rows.append(
        sum(1 for sr in out.scheduled if sr.sample and structured[int(sr.request_id[1:])])))
    engine.run_until_done()
    return [executor.costs[k].time_s for k in sorted(executor.costs)], rows, executor


def test_mask_time_beyond_the_forward_and_the_apply_cost_are_added_exactly():
    # masks of 2 rows (2 x 40 ms) outlast a decode step of the 8B model, 1 row (40 ms) does not
    cost = StructuredCost(compile_s=0.0, mask_row_s=0.040, apply_row_s=0.001)
    lengths = [6, 12, 24, 24]
    plain, _, _ = _run(cost, [False] * 4, lengths)
    mixed, rows, executor = _run(cost, [True, True, False, False], lengths)
    assert len(plain) == len(mixed) and len(rows) == len(mixed)
    waited = 0.0
    for base, got, r in zip(plain, mixed, rows):
        wait, apply = max(0.0, r * 0.040 - base) if r else 0.0, r * 0.001
        assert got == pytest.approx(base + wait + apply, rel=1e-12, abs=1e-15)
        waited += wait
    assert any(r == 2 for r in rows) and any(r == 1 for r in rows) and rows[-1] == 0
    assert waited > 0 and executor.mask_wait_s == pytest.approx(waited)
    # once the constrained requests are done, the steps are the unconstrained run's, to the bit
    tail = [i for i, r in enumerate(rows) if r == 0]
    assert tail and all(mixed[i] == plain[i] for i in tail)
    assert executor.mask_rows == sum(rows)


def test_unconstrained_rows_pay_nothing_beside_constrained_ones():
    cost = StructuredCost(compile_s=0.0, mask_row_s=1e-6, apply_row_s=1e-4)   # masks always hidden
    plain, _, _ = _run(cost, [False] * 3, [8, 8, 8])
    one, rows, _ = _run(cost, [True, False, False], [8, 8, 8])
    assert rows and all(r == 1 for r in rows)
    assert one == pytest.approx([t + 1e-4 for t in plain], rel=1e-12)   # one row's apply, not three


def test_a_constrained_request_waits_for_its_compile_in_the_scheduler_and_the_cache_is_free():
    cost = StructuredCost(compile_s=0.5, num_workers=1)
    engine, executor, clock = _engine(cost)
    engine.add_request(list(range(1, 40)), _params(4, SCHEMA), request_id="s")
    engine.add_request(list(range(1, 30)), _params(200), request_id="p")
    engine.step()
    assert engine.scheduler.requests["s"].status is RequestStatus.WAITING_FOR_GRAMMAR
    assert engine.snapshot().num_waiting_for_grammar == 1 and "s" not in engine.kv.block_tables
    while engine.scheduler.requests["s"].status is RequestStatus.WAITING_FOR_GRAMMAR:
        assert engine.scheduler.requests["p"].status is RequestStatus.RUNNING   # p keeps decoding
        engine.step()
    req = engine.scheduler.requests["s"]
    assert clock.now() >= 0.5 and req.metrics.first_scheduled_time is not None
    assert req.metrics.first_scheduled_time - req.arrival_time >= 0.5   # queue time includes the compile
    other = StructuredOutputsParams(regex="[0-9]+")
    engine.add_request([1, 2, 3], _params(3, SCHEMA), request_id="hit")   # same content: cached, no wait
    engine.add_request([1, 2, 3], _params(3, other), request_id="cold")
    engine.step()
    assert engine.scheduler.requests["hit"].status is RequestStatus.RUNNING
    assert engine.scheduler.requests["cold"].status is RequestStatus.WAITING_FOR_GRAMMAR
    engine.run_until_done()
    stats = engine.snapshot().structured
    assert stats["compilations"] == 2 and stats["cache_hits"] == 1 and stats["compile_seconds"] == 1.0


def test_idle_engine_jumps_to_the_compile_and_a_trace_carries_structured_requests():
    cost = StructuredCost(compile_s=0.25)
    engine, executor, clock = _engine(cost)
    trace = [SimRequest("a", 0.0, list(range(1, 50)), 5, structured_outputs=SCHEMA),
             SimRequest("b", 1.0, list(range(101, 150)), 5, structured_outputs=SCHEMA)]
    result = simulate(engine, executor, clock, trace)
    a, b = result.records
    assert a.ttft is not None and b.ttft is not None
    assert a.ttft - b.ttft == pytest.approx(0.25, rel=1e-9)   # a waited for the compile, b hit the cache
    assert engine.snapshot().structured["compilations"] == 1 and executor.mask_rows == 10
