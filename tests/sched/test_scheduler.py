"""Scheduler and block pool: unit cases and hypothesis property tests with a fake executor."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pacer.clock import VirtualClock
from pacer.config import SchedulerConfig
from pacer.kv.manager import KVCacheManager
from pacer.request import Request, SamplingParams
from pacer.sched.preemption import preempt
from pacer.sched.scheduler import Scheduler
from pacer.sched.step_plan import Budget, StepPlan
from tests.fakes import (
    Arrival,
    drive_arrivals,
    make_engine,
    next_token,
    reference_output,
    run,
    run_preempting_workload,
)


def test_chunked_prefill_is_decode_first_and_within_budget():
    eng, ex = make_engine(max_num_batched_tokens=16, num_blocks=128)
    p = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    eng.add_request(list(range(10, 14)), p, request_id="short")
    eng.step()  # prefill short (4 tokens) -> first token
    eng.add_request(list(range(100, 160)), p, request_id="long")  # 60 tokens: 4 chunks
    eng.step()
    last = ex.steps[-1]
    assert last.scheduled[0].request_id == "short" and not last.scheduled[0].is_prefill
    assert last.scheduled[1].request_id == "long" and last.scheduled[1].num_tokens == 15
    finals = run(eng, ex)
    assert finals["long"].token_ids == reference_output(list(range(100, 160)), p)
    for out in ex.steps:
        assert out.num_scheduled_tokens <= 16


def test_classic_mode_prefills_whole_prompts_in_prefill_only_steps():
    eng, ex = make_engine(enable_chunked_prefill=False, num_blocks=128, max_len=128)
    p = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    eng.add_request(list(range(1, 50)), p, request_id="a")
    eng.step()
    eng.add_request(list(range(1, 90)), p, request_id="b")
    eng.step()
    out = ex.steps[-1]
    assert [s.request_id for s in out.scheduled] == ["b"] and out.scheduled[0].num_tokens == 89
    run(eng, ex)
    for out in ex.steps:
        kinds = {s.is_prefill for s in out.scheduled}
        assert len(kinds) == 1, "classic mode never mixes prefill and decode"


def test_max_num_seqs_caps_running():
    eng, ex = make_engine(max_num_seqs=2)
    p = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    for i in range(5):
        eng.add_request([i + 1, i + 2], p)
    run(eng, ex)
    assert max(len(o.scheduled) for o in ex.steps) == 2


def test_preemption_by_recompute_keeps_outputs_and_counts():
    eng, prompts, p, finals = run_preempting_workload()
    assert sum(o.metrics.preemptions for o in finals.values()) == eng.scheduler.num_preemptions
    for rid, pr in prompts.items():
        assert finals[rid].token_ids == reference_output(pr, p)
    # the victim is the latest arrival (fcfs): r0 is never preempted
    assert finals["r0"].metrics.preemptions == 0
    assert eng.kv.num_available_blocks() == eng.kv.num_blocks  # free, or cached and evictable


def test_priority_waiting_request_preempts_lowest_priority_running():
    eng, ex = make_engine(max_num_seqs=2, scheduling_policy="priority")
    p = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    eng.add_request([1, 2, 3], p, request_id="low1", priority=5)
    eng.add_request([4, 5, 6], p, request_id="low2", priority=9)
    for _ in range(3):
        eng.step()
    eng.add_request([7, 8, 9], p, request_id="high", priority=0)
    eng.step()
    out = ex.steps[-1]
    assert "low2" in out.preempted_ids
    assert {s.request_id for s in out.scheduled} == {"low1", "high"}
    finals = run(eng, ex)
    assert finals["low2"].metrics.preemptions == 1
    assert finals["low2"].token_ids == reference_output([4, 5, 6], p)


def test_priority_preemption_when_kv_is_what_blocks():
    eng, ex = make_engine(num_blocks=8, block_size=4, max_len=32, scheduling_policy="priority")
    p = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    eng.add_request(list(range(1, 17)), p, request_id="low", priority=3)  # 16 tokens: 4 blocks + growth
    eng.step()
    eng.add_request(list(range(30, 46)), p, request_id="high", priority=1)
    eng.step()
    assert "low" in ex.steps[-1].preempted_ids
    finals = run(eng, ex)
    assert finals["high"].metrics.finish_time < finals["low"].metrics.finish_time
    assert finals["low"].token_ids == reference_output(list(range(1, 17)), p)


def test_preempted_request_keeps_its_place_by_arrival():
    sched_cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=64)
    clock = VirtualClock()
    kv = KVCacheManager(num_blocks=16, block_size=4)
    s = Scheduler(sched_cfg, kv, clock)
    p = SamplingParams(max_tokens=4)
    reqs = [Request(f"r{i}", [1, 2, 3], p, arrival_time=float(i), arrival_seq=i) for i in range(3)]
    for r in reqs:
        s.add_request(r)
    s.schedule()
    preempt(s, StepPlan(Budget(0, 0)), reqs[1])
    late = Request("late", [1], p, arrival_time=10.0, arrival_seq=9)
    s.add_request(late)
    assert [r.request_id for r in s.waiting] == ["r1", "late"]


def test_refuses_requests_that_can_never_fit():
    eng, _ = make_engine(num_blocks=4, block_size=4, max_len=64)
    with pytest.raises(ValueError, match="max_model_len=64"):
        eng.add_request(list(range(1, 60)), SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="KV cache capacity"):
        eng.add_request(list(range(1, 15)), SamplingParams(max_tokens=5))


def test_abort_frees_blocks_and_others_finish():
    eng, ex = make_engine()
    p = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    eng.add_request([1, 2, 3, 4, 5], p, request_id="keep")
    eng.add_request([6, 7, 8], p, request_id="gone")
    eng.step()
    eng.abort_request("gone")
    outs = eng.step()
    aborted = [o for o in outs if o.request_id == "gone"]
    assert aborted and aborted[0].finish_reason == "abort"
    finals = run(eng, ex)
    assert finals["keep"].token_ids == reference_output([1, 2, 3, 4, 5], p)
    assert eng.kv.num_available_blocks() == eng.kv.num_blocks  # free, or cached and evictable


requests_strategy = st.lists(
    st.tuples(
        st.integers(1, 40),      # prompt length
        st.integers(1, 12),      # max_tokens
        st.integers(0, 6),       # arrival step
        st.integers(0, 3),       # priority
        st.integers(0, 30),      # abort after this many steps (30 = never)
        st.integers(0, 10_000),  # token seed
    ),
    min_size=1, max_size=10,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=requests_strategy,
    chunked=st.booleans(),
    budget=st.integers(1, 48),
    max_num_seqs=st.integers(1, 6),
    block_size=st.sampled_from([1, 2, 4, 16]),
    extra_blocks=st.integers(0, 30),
    policy=st.sampled_from(["fcfs", "priority", "sjf"]),
    long_prefill=st.one_of(st.none(), st.integers(1, 20)),
)
def test_property_invariants_and_exact_outputs(reqs, chunked, budget, max_num_seqs, block_size,
                                                extra_blocks, policy, long_prefill):
    max_len = 64
    num_blocks = -(-max_len // block_size) + extra_blocks
    kwargs = dict(max_num_seqs=max_num_seqs, scheduling_policy=policy, enable_chunked_prefill=chunked,
                  long_prefill_token_threshold=long_prefill)
    kwargs["max_num_batched_tokens"] = budget if chunked else max_len + budget
    eng, ex = make_engine(num_blocks=num_blocks, block_size=block_size, max_len=max_len, **kwargs)
    arrivals = []
    for i, (plen, max_tokens, arrive, prio, abort_after, seed) in enumerate(reqs):
        prompt = [(seed + 13 * j) % 997 + 1 for j in range(plen)]
        # odd seeds use a penalty: the fake checks the token history they carry when new
        p = SamplingParams(max_tokens=max_tokens, temperature=0, frequency_penalty=0.5 * (seed % 2))
        arrivals.append(Arrival(arrive, f"r{i}", prompt, p, abort_after if abort_after < 30 else None,
                                {"priority": prio}))

    def check_step() -> None:
        sched = eng.scheduler
        if ex.steps:
            assert ex.steps[-1].num_scheduled_tokens <= sched.max_num_batched_tokens
        assert sched.num_running <= max_num_seqs

    drive_arrivals(eng, arrivals, check_step, max_steps=5_000)
    assert eng.kv.num_available_blocks() == num_blocks  # free, or cached and evictable
    assert not eng.kv.block_tables


def test_long_prefill_threshold_leaves_room_for_short_newcomers():
    eng, ex = make_engine(max_num_batched_tokens=64, num_blocks=128, long_prefill_token_threshold=32)
    p = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    eng.add_request(list(range(1, 201)), p, request_id="long")
    eng.step()
    eng.add_request([5, 6, 7, 8], p, request_id="short")
    eng.step()
    sizes = {s.request_id: s.num_tokens for s in ex.steps[-1].scheduled}
    assert sizes == {"long": 32, "short": 4}
    finals = run(eng, ex)
    assert finals["long"].token_ids == reference_output(list(range(1, 201)), p)


def test_a_stop_token_that_is_also_the_last_allowed_one_reports_stop():
    # as vLLM: the stop check runs before the length check
    eng, ex = make_engine()
    prompt = [5, 6, 7]
    first = next_token(prompt, 1000)
    eng.add_request(prompt, SamplingParams(max_tokens=1, stop_token_ids=[first], temperature=0), request_id="s")
    eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0), request_id="l")
    finals = run(eng, ex)
    assert finals["s"].finish_reason == "stop" and finals["s"].token_ids == [first]
    assert finals["l"].finish_reason == "length"
