"""The slo and lpm policies and aging, on the fake executor with a stated cost model."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pacer.engine import Engine
from pacer.request import SamplingParams
from pacer.sched.slo_policy import BUDGET_SAFETY, MIN_PREFILL_TOKENS
from pacer.sched.step_cost import FixedCostModel, StepShape
from tests.fakes import Arrival, FakeExecutor, drive_arrivals, make_engine, reference_output, run

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
LONG = [i % 997 + 1 for i in range(3000)]


def chats_decoding(policy: str, itl: str, cost: FixedCostModel, max_tokens: int = 40) -> tuple[Engine, FakeExecutor]:
    """An engine with four 20-token chats (`chat0`..`chat3`) already decoding under `ttft=10s,itl=<itl>`."""
    eng, ex = make_engine(scheduling_policy=policy, slo=[f"ttft=10s,itl={itl}"], num_blocks=600, block_size=16,
                          max_len=4096, max_num_batched_tokens=2048, cost_model=cost)
    chat = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for i in range(4):
        eng.add_request([i + 1] * 20, chat, request_id=f"chat{i}")
    eng.step()
    eng.step()
    return eng, ex


def _long_prompt_with_chats(policy: str, itl: str, cost: FixedCostModel) -> tuple[list, dict]:
    eng, ex = chats_decoding(policy, itl, cost)
    eng.add_request(LONG, GREEDY, request_id="long")
    finals = run(eng, ex)
    assert finals["long"].token_ids == reference_output(LONG, GREEDY)
    return ex.steps, finals


def test_budget_by_itl_keeps_predicted_steps_within_the_target_and_prefill_progressing() -> None:
    cost = FixedCostModel(5e-3, 1e-4)     # 5 ms + 0.1 ms per token
    steps, _ = _long_prompt_with_chats("slo", "50ms", cost)
    mixed = [s for s in steps if s.num_prefill_tokens and s.num_decode_tokens]
    assert mixed, "the long prompt was meant to run beside decodes"
    for s in mixed:
        # the bound is 50 ms minus the time since the chats' last token (the fake loop's 10 ms)
        m = re.fullmatch(r"itl ([0-9.]+)ms of chat\d", s.budget_reason)
        assert m, s.budget_reason
        bound = float(m.group(1)) / 1000
        assert 0.04 - 1e-9 <= bound <= 0.05
        assert cost.predict_step_s(StepShape.from_output(s)) <= BUDGET_SAFETY * bound + 1e-9
        assert s.num_prefill_tokens >= MIN_PREFILL_TOKENS
        assert s.num_scheduled_tokens <= s.token_budget <= 2048
    fcfs_steps, _ = _long_prompt_with_chats("fcfs", "50ms", cost)
    assert max(s.num_prefill_tokens for s in fcfs_steps if s.num_decode_tokens) > 2 * max(
        s.num_prefill_tokens for s in mixed)


def test_an_impossible_itl_target_never_starves_prefill() -> None:
    steps, finals = _long_prompt_with_chats("slo", "1us", FixedCostModel(5e-3, 1e-4))
    assert finals["long"].finish_reason == "length"
    assert all(s.num_prefill_tokens >= MIN_PREFILL_TOKENS for s in steps if s.num_prefill_tokens)
    # the decodes alone exceed 1us: the policy stops chasing it and takes fcfs's budget (issue 25)
    mixed = [s for s in steps if s.num_prefill_tokens and s.num_decode_tokens]
    assert mixed and all(s.budget_reason.startswith("itl infeasible") for s in mixed)
    assert not any("(floor)" in s.budget_reason for s in steps)


def _slack_case(shed: bool, urgent_ttft_ms: int = 500, hopeless_len: int = 100) -> tuple[list[str], dict]:
    eng, ex = make_engine(scheduling_policy="slo", shed_hopeless=shed, max_num_seqs=1, num_blocks=200,
                          cost_model=FixedCostModel(1e-3, 1e-4))
    p = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    eng.add_request(list(range(1, 101)), p, request_id="relaxed", slo={"ttft_ms": 5000})
    eng.add_request(list(range(1, 101)), p, request_id="none")
    eng.add_request([2 + i % 900 for i in range(hopeless_len)], p, request_id="hopeless", slo={"ttft_ms": 1})
    eng.add_request(list(range(3, 103)), p, request_id="urgent", slo={"ttft_ms": urgent_ttft_ms})
    finals = run(eng, ex)
    order = sorted((o.metrics.first_scheduled_time, o.request_id) for o in finals.values()
                   if o.metrics.first_scheduled_time is not None)
    return [rid for _, rid in order], finals


def test_least_slack_first_and_hopeless_behind_the_feasible_it_would_make_late() -> None:
    # the hopeless prompt (~26 ms of prefill) does not fit twice in urgent's ~29 ms of slack; it
    # does in relaxed's ~5 s, so it goes between them
    order, finals = _slack_case(shed=False, urgent_ttft_ms=40, hopeless_len=250)
    assert order == ["urgent", "hopeless", "relaxed", "none"]
    assert finals["hopeless"].metrics.deprioritized and not finals["urgent"].metrics.deprioritized
    assert finals["urgent"].metrics.slack_at_admission is not None
    assert 0.02 < finals["urgent"].metrics.slack_at_admission < 0.04
    assert finals["urgent"].metrics.ttft_deadline == finals["urgent"].metrics.arrival_time + 0.04


def test_a_hopeless_request_steals_the_slack_the_feasible_ones_spare() -> None:
    # ~11 ms of prefill, twice of it well inside urgent's ~0.49 s: served first, urgent still on time
    order, finals = _slack_case(shed=False)
    assert order == ["hopeless", "urgent", "relaxed", "none"]
    assert finals["hopeless"].metrics.deprioritized
    urgent = finals["urgent"].metrics
    assert urgent.first_token_time is not None and urgent.first_token_time <= urgent.ttft_deadline


def test_earliest_due_first_meets_both_where_least_slack_first_meets_one() -> None:
    # long: ~0.101 s of prefill, due at 0.150 s (slack 0.049 s); short: ~0.011 s, due at 0.070 s
    # (slack 0.059 s). Least slack first ran long first and short missed, or, predicted at
    # 0.112 s > 1.25 x 0.070 s, was refused at admission; earliest due first meets both.
    eng, ex = make_engine(scheduling_policy="slo", max_num_seqs=1, num_blocks=600, max_len=2048,
                          cost_model=FixedCostModel(1e-3, 1e-4))
    p = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    eng.add_request([i % 900 + 2 for i in range(1000)], p, request_id="long", slo={"ttft_ms": 150})
    eng.add_request(list(range(1, 101)), p, request_id="short", slo={"ttft_ms": 70})
    finals = run(eng, ex)
    order = sorted((o.metrics.first_scheduled_time, o.request_id) for o in finals.values())
    assert [rid for _, rid in order] == ["short", "long"]
    for o in finals.values():
        assert not o.metrics.shed and o.metrics.first_token_time is not None
        assert o.metrics.first_token_time <= o.metrics.ttft_deadline


def test_shed_hopeless_refuses_before_any_compute() -> None:
    order, finals = _slack_case(shed=True)
    assert order == ["urgent", "relaxed", "none"]
    shed = finals["hopeless"]
    assert shed.metrics.shed and shed.finish_reason == "abort" and shed.metrics.first_scheduled_time is None
    assert shed.metrics.prefill_tokens == 0


@pytest.mark.parametrize(("classes", "shed"), [(["chat:ttft=1s,itl=200ms", "batch:e2e=120s"], False),
                                               (["chat:ttft=1s", "batch:e2e=120s"], True)])
def test_a_long_batch_job_is_judged_at_the_steps_the_policy_plans(classes: list[str], shed: bool) -> None:
    # a half-budget mixed step is predicted at ~1 s (5 ms + 1 ms per token, 1,024 prompt tokens):
    # 511 of them are far past 120 s, but the chats' 200 ms ITL bounds the steps (~102 s: it can
    # make it); with a TTFT target alone the plan allows 0.5 s steps (~256 s: hopeless, shed)
    eng, ex = make_engine(scheduling_policy="slo", shed_hopeless=True, num_blocks=200, block_size=16, max_len=1024,
                          max_num_batched_tokens=2048, slo=classes, cost_model=FixedCostModel(5e-3, 1e-3))
    eng.add_request(list(range(1, 65)), SamplingParams(max_tokens=512, temperature=0, ignore_eos=True),
                    request_id="job", request_class="batch")
    job = run(eng, ex)["job"]
    assert job.metrics.shed is shed
    assert len(job.token_ids) == (0 if shed else 512)


def _first_victim(policy: str) -> str:
    eng, ex = make_engine(scheduling_policy=policy, num_blocks=12, block_size=4, max_len=48,
                          slo=["chat:ttft=1s,itl=50ms", "batch:e2e=60s"])
    p = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    eng.add_request([i + 1 for i in range(8)], p, request_id="batch-job", request_class="batch")
    eng.add_request([i + 50 for i in range(8)], p, request_id="chat", request_class="chat")
    finals = run(eng, ex)
    assert all(o.finish_reason == "length" for o in finals.values())
    return next(rid for s in ex.steps for rid in s.preempted_ids)


def test_slo_preempts_the_request_with_the_most_slack() -> None:
    assert _first_victim("fcfs") == "chat"        # the latest arrival
    assert _first_victim("slo") == "batch-job"    # 60 s of e2e slack vs a 50 ms ITL target


def _seat_case(policy: str) -> tuple[list, dict]:
    """One seat: a batch job is decoding when a chat with a 300 ms TTFT arrives."""
    eng, ex = make_engine(scheduling_policy=policy, max_num_seqs=1, num_blocks=64, block_size=4,
                          slo=["chat:ttft=300ms,itl=50ms", "batch:e2e=60s"])
    job = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    chat = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    eng.add_request(list(range(1, 9)), job, request_id="batch-job", request_class="batch")
    for _ in range(3):
        eng.step()
        eng.clock.advance(0.01)
    eng.add_request(list(range(50, 58)), chat, request_id="chat", request_class="chat")
    finals = run(eng, ex)
    assert finals["batch-job"].token_ids == reference_output(list(range(1, 9)), job)
    assert finals["chat"].token_ids == reference_output(list(range(50, 58)), chat)
    return ex.steps, finals


def test_slo_frees_a_seat_from_the_request_with_the_most_slack() -> None:
    steps, finals = _seat_case("slo")
    assert [rid for s in steps for rid in s.preempted_ids] == ["batch-job"]   # once: it does not come back early
    chat, job = finals["chat"].metrics, finals["batch-job"].metrics
    assert chat.ttft is not None and chat.ttft < 0.3
    assert job.first_token_time < chat.first_token_time and job.finish_time > chat.finish_time
    fcfs_steps, fcfs = _seat_case("fcfs")
    assert not any(s.preempted_ids for s in fcfs_steps)
    assert fcfs["chat"].metrics.ttft > 0.3      # behind the job's 60 tokens


def _newcomer_during_long_prefill(policy: str) -> tuple[int, int]:
    """A 400-token prompt (relaxed target) prefills 32 tokens a step; a chat with a 100 ms TTFT
    arrives after two steps. Returns (the chat's first step, the long prompt's last prefill step)."""
    eng, ex = make_engine(scheduling_policy=policy, num_blocks=200, block_size=4, max_len=512,
                          max_num_batched_tokens=32, slo=["chat:ttft=100ms", "rag:ttft=60s"])
    long_prompt = [i % 900 + 1 for i in range(400)]
    eng.add_request(long_prompt, GREEDY, request_id="long", request_class="rag")
    for _ in range(2):
        eng.step()
        eng.clock.advance(0.01)
    eng.add_request([7, 8, 9, 10], GREEDY, request_id="chat", request_class="chat")
    finals = run(eng, ex)
    assert finals["long"].token_ids == reference_output(long_prompt, GREEDY)
    assert finals["chat"].token_ids == reference_output([7, 8, 9, 10], GREEDY)
    ids = [{sr.request_id for sr in s.scheduled} for s in ex.steps]
    first_chat = next(i for i, x in enumerate(ids) if "chat" in x)
    last_long = max(i for i, s in enumerate(ex.steps) for sr in s.scheduled if sr.request_id == "long" and sr.is_prefill)
    return first_chat, last_long


def test_a_newcomer_with_less_slack_is_served_before_a_started_long_prefill() -> None:
    first_chat, last_long = _newcomer_during_long_prefill("slo")
    assert first_chat == 2 < last_long               # the step it arrived in, while the long prompt prefills
    first_chat, last_long = _newcomer_during_long_prefill("fcfs")
    assert first_chat >= last_long                  # fcfs finishes the started prefill first


def test_lpm_serves_the_longest_cached_prefix_first() -> None:
    for policy, first in (("fcfs", "cold"), ("lpm", "warm")):
        eng, ex = make_engine(scheduling_policy=policy, max_num_seqs=1, num_blocks=64, block_size=4)
        shared = list(range(1, 33))
        eng.add_request(shared, GREEDY, request_id="seed")
        run(eng, ex)
        eng.add_request(list(range(100, 140)), GREEDY, request_id="cold")
        eng.add_request(shared + [90, 91, 92], GREEDY, request_id="warm")
        finals = run(eng, ex)
        order = sorted(finals, key=lambda rid: finals[rid].metrics.first_scheduled_time)
        assert order[0] == first, policy


@pytest.mark.parametrize("isolation, first", [("shared", "warm"), ("isolated", "cold"), ("partitioned", "cold")])
def test_lpm_orders_by_the_requests_own_tenants_cache(isolation: str, first: str) -> None:
    # tenant A caches a prefix; tenant B then sends a cold prompt and one that starts with A's
    # prefix. Unless tenants share, lpm must not see A's blocks: B's order is arrival order, so
    # B cannot learn (from its own TTFTs) what A has cached
    eng, ex = make_engine(scheduling_policy="lpm", max_num_seqs=1, num_blocks=64, block_size=4,
                          tenant_isolation=isolation)
    shared = list(range(1, 33))
    eng.add_request(shared, GREEDY, request_id="seed", tenant="A")
    run(eng, ex)
    eng.add_request(list(range(100, 140)), GREEDY, request_id="cold", tenant="B")
    eng.add_request(shared + [90, 91, 92], GREEDY, request_id="warm", tenant="B")
    finals = run(eng, ex)
    order = sorted(finals, key=lambda rid: finals[rid].metrics.first_scheduled_time)
    assert order[0] == first, isolation
    assert (finals["warm"].num_cached_tokens > 0) == (isolation == "shared")


POLICIES = ("fcfs", "priority", "sjf", "lpm", "slo")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES),
       reqs=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 40), st.integers(2, 12), st.integers(0, 2)),
                     min_size=2, max_size=14))
def test_aging_serves_overdue_requests_first_in_arrival_order(policy: str, reqs: list[tuple[int, int, int, int]]) -> None:
    delay = 0.05   # five fake steps
    eng, ex = make_engine(scheduling_policy=policy, max_queue_delay=delay, max_num_seqs=2, num_blocks=64,
                          block_size=4, max_num_batched_tokens=32, slo=["ttft=30ms"])
    arrivals = [Arrival(step, f"r{i}", [(i * 7 + j) % 900 + 1 for j in range(n)],
                        SamplingParams(max_tokens=m, temperature=0, ignore_eos=True), add_kwargs={"priority": prio})
                for i, (step, n, m, prio) in enumerate(reqs)]
    seen: dict[str, object] = {}

    def check() -> None:
        now = eng.clock.now()
        sched = eng.scheduler
        for rid, r in sched.requests.items():
            seen[rid] = r
        out = ex.steps[-1] if ex.steps else None
        if out is None:
            return
        admitted = [seen[s.request_id] for s in out.scheduled
                    if seen[s.request_id].metrics.first_scheduled_time == now]   # type: ignore[attr-defined]
        waiting_aged = [r for r in sched.waiting if now - r.arrival_time > delay
                        and r.request_id not in out.preempted_ids]
        if any(now - r.arrival_time <= delay for r in admitted):   # type: ignore[attr-defined]
            assert not waiting_aged, (policy, [r.request_id for r in waiting_aged])
        aged_admitted = [r.arrival_time for r in admitted if now - r.arrival_time > delay]  # type: ignore[attr-defined]
        assert aged_admitted == sorted(aged_admitted)
        if aged_admitted:
            assert all(r.arrival_time >= aged_admitted[-1] for r in waiting_aged)

    drive_arrivals(eng, arrivals, check, max_steps=5000)   # also: outputs equal the greedy reference


def test_aging_bounds_the_wait_sjf_would_impose() -> None:
    def long_job_start(max_queue_delay: float) -> float:
        eng, ex = make_engine(scheduling_policy="sjf", max_queue_delay=max_queue_delay, max_num_seqs=1,
                              num_blocks=128)
        short = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
        arrivals = [Arrival(0, "long", list(range(1, 60)), SamplingParams(max_tokens=3, temperature=0,
                                                                          ignore_eos=True))]
        arrivals += [Arrival(i, f"s{i}", [i + 1, i + 2], short) for i in range(0, 120, 2)]
        finals = drive_arrivals(eng, arrivals, lambda: None, max_steps=5000)
        return finals["long"].metrics.first_scheduled_time - finals["long"].metrics.arrival_time

    assert long_job_start(float("inf")) > 1.0          # behind every short job (sjf starves it)
    assert long_job_start(0.1) <= 0.1 + 0.05           # served within the bound plus the running job
