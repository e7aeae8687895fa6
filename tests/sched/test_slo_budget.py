"""The slo policy's step budget beyond ITL: a step stays within a share of the tightest
configured TTFT (for requests yet to arrive), and the plan keeps the cost model's measured
margin for prediction noise."""

from __future__ import annotations

import random

from pacer.perf.cost_model import make_cost_model
from pacer.perf.profiles import get_hardware, get_model
from pacer.perf.step_model import SchedulerCostModel
from pacer.request import SamplingParams
from pacer.sched.slo_budget import ARRIVAL_WAIT_FLOOR
from pacer.sched.slo_policy import ARRIVAL_SHARE, BUDGET_SAFETY, FIRST_TOKEN_SHARE
from pacer.sched.step_cost import FixedCostModel, StepShape
from tests.fakes import make_engine, reference_output, run
from tests.sched.test_slo_policy import chats_decoding

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
LONG = [i % 997 + 1 for i in range(3000)]
COST = FixedCostModel(5e-3, 1e-4)    # 2,048 tokens: 210 ms
CHAT_200MS = ["ttft=10s", "chat:ttft=200ms"]


class _Noisy(FixedCostModel):
    """A stated model that says its steps run up to 1.5x over its predictions."""

    def upper_ratio(self) -> float:
        return 1.5


def _long_prompt_alone(policy: str, slo: list[str], cost: FixedCostModel = COST, chat_first: int = 0) -> list:
    """The steps that prefill LONG, alone; with `chat_first`, a chat of that many tokens is served first."""
    eng, ex = make_engine(scheduling_policy=policy, slo=slo, num_blocks=600, block_size=16, max_len=4096,
                          max_num_batched_tokens=2048, cost_model=cost)
    if chat_first:
        chat = [i % 991 + 3 for i in range(chat_first)]
        eng.add_request(chat, GREEDY, request_id="chat", request_class="chat")
        assert run(eng, ex)["chat"].token_ids == reference_output(chat, GREEDY)
        ex.steps.clear()
    eng.add_request(LONG, GREEDY, request_id="long")
    assert run(eng, ex)["long"].token_ids == reference_output(LONG, GREEDY)
    return [s for s in ex.steps if s.num_prefill_tokens]


def test_a_prefill_step_stays_within_a_share_of_the_tightest_ttft() -> None:
    steps = _long_prompt_alone("slo", CHAT_200MS)
    cap = ARRIVAL_SHARE * 0.2
    assert len(steps) > 2
    for s in steps:
        assert s.budget_reason.startswith(f"arrival ttft {cap * 1e3:.1f}ms"), s.budget_reason
        assert COST.predict_step_s(StepShape.from_output(s)) <= BUDGET_SAFETY * cap + 1e-9
    # the cap is what splits the prompt: with only loose targets, and under fcfs, steps take the full budget
    for policy, slo in (("slo", ["ttft=10s"]), ("fcfs", CHAT_200MS)):
        loose = _long_prompt_alone(policy, slo)
        assert max(s.num_prefill_tokens for s in loose) == 2048
        assert len(loose) < len(steps)


def test_the_budget_keeps_the_cost_models_measured_margin() -> None:
    noisy = _Noisy(5e-3, 1e-4)
    steps = _long_prompt_alone("slo", CHAT_200MS, noisy)
    exact = _long_prompt_alone("slo", CHAT_200MS)
    for s in steps:
        assert noisy.predict_step_s(StepShape.from_output(s)) * 1.5 <= ARRIVAL_SHARE * 0.2 + 1e-9
    assert max(s.num_prefill_tokens for s in steps) < max(s.num_prefill_tokens for s in exact)


def test_the_refitted_predictor_learns_how_far_steps_stray_from_its_predictions() -> None:
    cm = SchedulerCostModel(make_cost_model(get_hardware("cpu-local"), get_model(None), "float32", 1, 16))
    shape = StepShape().with_decode(300).with_chunk(128, 0)
    assert cm.upper_ratio() == 1.0          # nothing measured yet
    base = cm.predict_step_s(shape)
    for _ in range(100):                    # steady 2x slower: the scale absorbs it, the spread stays small
        cm.observe(shape, 2.0 * base)
    steady = cm.upper_ratio()
    assert 1.0 <= steady < 1.05
    rng = random.Random(0)
    for _ in range(200):                    # +-30% noise around 2x
        cm.observe(shape, 2.0 * base * rng.uniform(0.7, 1.3))
    assert 1.2 < cm.upper_ratio() <= 2.0
    assert cm.upper_ratio() > steady


class _PerRow(FixedCostModel):
    """A stated model whose every sampled row costs 5 ms more (an LM head per row)."""

    def predict_step_s(self, shape: StepShape) -> float:
        return super().predict_step_s(shape) + 5e-3 * shape.num_sampled if shape.num_seqs else 0.0


def test_every_chunk_added_to_a_step_keeps_the_whole_step_within_the_itl_target() -> None:
    """Several short prompts share one step's budget: each chunk samples and is a row of its
    own, so the step is priced as built, not as one chunk of the budget's size."""
    cm = _PerRow(5e-3, 5e-4)
    eng, ex = chats_decoding("slo", "100ms", cm, max_tokens=30)
    chat = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    for i in range(8):
        eng.add_request([i + 50] * 12, chat, request_id=f"short{i}")
    finals = run(eng, ex)
    assert all(o.finish_reason == "length" for o in finals.values())
    mixed = [s for s in ex.steps if s.num_prefill_tokens and s.num_decode_tokens and s.budget_reason.startswith("itl")]
    assert any(sum(1 for sr in s.scheduled if len(sr.token_ids) > 1) > 1 for s in mixed), "meant to share steps"
    for s in mixed:
        bound = float(s.budget_reason.split("ms")[0].removeprefix("itl "))
        assert cm.predict_step_s(StepShape.from_output(s)) <= BUDGET_SAFETY * bound / 1000 + 1e-9, s.budget_reason


def _chat_during_long_prefill(policy: str, chat_ttft: str, rag_ttft: str = "6s") -> tuple[list, object]:
    """A 3,000-token rag prompt (1 ms a token: a full 1,024-token step takes about 1 s) starts
    prefilling; a 20-token chat arrives after its first chunk. Returns the steps and the chat's
    first step (the one that answers it: 20 tokens need one)."""
    cost = FixedCostModel(5e-3, 1e-3)
    eng, ex = make_engine(scheduling_policy=policy, num_blocks=600, block_size=16, max_len=4096,
                          max_num_batched_tokens=1024, slo=[f"chat:ttft={chat_ttft}", f"rag:ttft={rag_ttft}"], cost_model=cost)
    eng.add_request(LONG, GREEDY, request_id="rag", request_class="rag")
    eng.step()
    eng.add_request([5] * 20, GREEDY, request_id="chat", request_class="chat")
    finals = run(eng, ex)
    assert finals["rag"].token_ids == reference_output(LONG, GREEDY)
    assert finals["chat"].token_ids == reference_output([5] * 20, GREEDY)
    chat_step = next(s for s in ex.steps if any(sr.request_id == "chat" for sr in s.scheduled))
    return ex.steps, chat_step


def test_a_step_that_answers_a_prompt_keeps_other_chunks_within_a_share_of_its_ttft() -> None:
    """The rag prompt's deadline wants full steps (the queue's drain need), but a step that gives
    the chat its first token adds only as much of the rag prompt as keeps it within
    FIRST_TOKEN_SHARE of the chat's TTFT; fcfs puts a full step's chunk beside it."""
    cost = FixedCostModel(5e-3, 1e-3)
    steps, chat_step = _chat_during_long_prefill("slo", "1s")
    assert steps[0].num_prefill_tokens == 1024 and steps[0].budget_reason.startswith("ttft drain")
    rag_tokens = sum(len(sr.token_ids) for sr in chat_step.scheduled if sr.request_id == "rag")
    predicted = cost.predict_step_s(StepShape.from_output(chat_step))
    assert predicted <= FIRST_TOKEN_SHARE * 1.0 + 1e-9
    assert rag_tokens > 400          # the rest of the share still prefills the rag prompt
    assert steps.index(chat_step) == 1
    _, fcfs_chat = _chat_during_long_prefill("fcfs", "1s")
    assert cost.predict_step_s(StepShape.from_output(fcfs_chat)) > 1.5 * FIRST_TOKEN_SHARE * 1.0


def test_a_short_late_prompt_goes_before_a_long_partial_one_with_slack_to_spare() -> None:
    """A chat that cannot make its 1 ms TTFT any more is served in the next step, ahead of the rag
    prompt's next chunk (which has seconds of slack), not after the rag prompt's prefill."""
    steps, chat_step = _chat_during_long_prefill("slo", "1ms")
    assert steps.index(chat_step) == 1


def test_the_first_token_limit_spares_a_prompt_that_cannot_wait_another_step() -> None:
    """With a 2.5 s TTFT the rag prompt's remaining ~2 s of prefill must start within 0.5 s: one
    more step of its chunk (about 1 s) would make it late, so the chat's step takes its whole chunk."""
    cost = FixedCostModel(5e-3, 1e-3)
    steps, chat_step = _chat_during_long_prefill("slo", "1s", rag_ttft="2.5s")
    rag_tokens = sum(len(sr.token_ids) for sr in chat_step.scheduled if sr.request_id == "rag")
    assert steps.index(chat_step) == 1 and rag_tokens == 1024 - 20
    assert cost.predict_step_s(StepShape.from_output(chat_step)) > 2 * FIRST_TOKEN_SHARE * 1.0


def test_the_arrival_limit_leaves_a_typical_arrival_time_for_its_own_prefill() -> None:
    """The limit is there so a 200 ms chat arriving mid-step waits one step and still prefills in
    time: with 100-token chats (15 ms) that is ARRIVAL_SHARE of the TTFT; with 1,000-token chats
    (105 ms of their own) it is what BUDGET_SAFETY x the TTFT leaves (75 ms); with 1,500-token chats
    (155 ms) too little is left to protect (under ARRIVAL_WAIT_FLOOR), and the long prompt takes
    whole steps, as under targets with no limit."""
    short = _long_prompt_alone("slo", CHAT_200MS, chat_first=100)
    assert all(s.budget_reason.startswith(f"arrival ttft {ARRIVAL_SHARE * 200:.1f}ms") for s in short)
    mid = _long_prompt_alone("slo", CHAT_200MS, chat_first=1000)
    wait = BUDGET_SAFETY * 0.2 - COST.predict_step_s(StepShape().with_chunk(1000, 0))
    assert ARRIVAL_WAIT_FLOOR * 0.2 < wait < ARRIVAL_SHARE * 0.2
    for s in mid:
        assert s.budget_reason.startswith(f"arrival ttft {wait * 1e3:.1f}ms"), s.budget_reason
        assert COST.predict_step_s(StepShape.from_output(s)) <= BUDGET_SAFETY * wait + 1e-9
    assert len(mid) > len(short)
    whole = _long_prompt_alone("slo", CHAT_200MS, chat_first=1500)
    assert [s.num_prefill_tokens for s in whole][:1] == [2048]
    assert all(s.budget_reason == "max_num_batched_tokens" for s in whole)
