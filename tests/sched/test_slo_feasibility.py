"""The slo policy on a machine that cannot meet its targets (issue 25): when the decodes alone
exceed the step's ITL limit, the budget is fcfs's (the predicted queue drain rate never falls
below fcfs's), and the regime change is reported once, not per step."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pacer.config.slo import Slo
from pacer.request import Request, SamplingParams
from pacer.sched.feasibility import FEASIBLE, ITL_INFEASIBLE, REGIME_HOLD_S, TTFT_DRAIN, FeasibilityTracker
from pacer.sched.policy import WaitingQueue
from pacer.sched.slo_budget import BUDGET_SAFETY, DRAIN_GAP_SHARE, ITL_RATE_SHARE
from pacer.sched.slo_policy import BACKLOG_RATE_SHARE, DRAIN_SAFETY, MIN_PREFILL_TOKENS, SloPolicy
from pacer.sched.step_cost import FixedCostModel, StepShape

PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def _decoding(i: int, context: int, itl_s: float, now: float) -> Request:
    r = Request(f"d{i}", list(range(1, context + 1)), PARAMS, arrival_time=0.0, slo=Slo(ttft=10.0, itl=itl_s))
    r.num_computed_tokens = context
    r.output_token_ids.append(1)
    r.metrics.token_times.append(now)
    return r


def _best_rate(cost: FixedCostModel, shape: StepShape, head_len: int, tokens_left: int) -> float:
    """The best prefill rate a step of `shape` could have, by brute force: the head's prompt (from 0)
    cut anywhere, or the whole budget filled with the head's and then a next prompt's tokens."""
    rest = min(head_len, tokens_left)
    cut = max(m / cost.predict_step_s(shape.with_chunk(m, 0)) for m in range(1, rest + 1))
    whole = shape.with_chunk(rest, 0).with_chunk(tokens_left - rest, 0)
    return max(cut, tokens_left / cost.predict_step_s(whole))


@settings(max_examples=80, deadline=None)
@given(per_step=st.floats(1e-4, 0.2), per_token=st.floats(1e-6, 1e-3), num_decodes=st.integers(1, 48),
       context=st.integers(1, 2000), itl_ms=st.floats(1.0, 2000.0), tokens_left=st.integers(1, 4096),
       head_len=st.integers(1, 8000), need=st.one_of(st.none(), st.floats(0.0, 1e6)),
       per_pair=st.sampled_from([0.0, 0.0, 1e-7, 1e-6]), saved=st.sampled_from([0, 1000]))
def test_the_budget_keeps_the_queue_draining_whether_or_not_the_itl_can_be_met(
        per_step: float, per_token: float, num_decodes: int, context: int, itl_ms: float,
        tokens_left: int, head_len: int, need: float | None, per_pair: float, saved: int) -> None:
    """In either regime the prefill share is never below the floor, nor below the fewest tokens
    whose predicted prefill rate covers the queue's need (DRAIN_SAFETY x; a larger share the ITL
    allows may run past the rate's peak), or, when no chunk covers it, near the best rate one chunk
    has; unless it is a decode's ITL budget that stands because a drain would meet no more TTFTs
    than the streams it breaks (here, `saved` 0). Infeasible ITL: the fewest such tokens; without a
    known need, fcfs's budget."""
    cost = FixedCostModel(per_step, per_token, per_pair)
    policy = SloPolicy(cost, 4096, 512)
    now = 100.0
    decodes = [_decoding(i, context, itl_ms / 1e3, now) for i in range(num_decodes)]
    head = Request("head", [7] * head_len, PARAMS, arrival_time=now, slo=Slo(ttft=10.0))
    budget = policy.prefill_budget(decodes, head, tokens_left, now, None if need is None else lambda share: need,
                                   lambda slow, fast: saved)
    shape = StepShape()
    for r in decodes:
        shape = shape.with_decode(r.num_tokens)
    decode_s = cost.predict_step_s(shape)
    floor = min(tokens_left, MIN_PREFILL_TOKENS)
    assert floor <= budget.tokens <= tokens_left
    n = budget.tokens
    def rate(m: int) -> float:
        return m / cost.predict_step_s(shape.with_chunk(m, 0))

    if need is not None and n < tokens_left:  # either regime: what the queue needs, or near the best rate there is
        stands = saved == 0 and "a drain would meet 0 more TTFTs" in budget.reason
        rates = [rate(m) for m in range(1, tokens_left + 1)]   # the drain's own pricing: one chunk
        covering = next((m for m, r in enumerate(rates, 1) if r >= DRAIN_SAFETY * need * (1 - 1e-9)), None)
        if covering is not None:   # at least the fewest tokens that cover the need (more, within the ITL)
            assert stands or n >= covering, budget
        else:                      # none does: the best-rate chunk, or near it
            assert stands or rate(n) >= ITL_RATE_SHARE * max(rates) * (1 - 1e-9), budget
    if abs(decode_s - 0.9 * itl_ms / 1e3) <= 1e-12:   # on the boundary: either regime, as rounding falls
        return
    if decode_s > 0.9 * itl_ms / 1e3:          # infeasible at any prefill share
        assert budget.reason.startswith(ITL_INFEASIBLE)
        assert policy.feasibility.regime == ITL_INFEASIBLE
        if need is None:
            assert n == tokens_left, budget
        elif floor < n < tokens_left:          # the fewest such tokens: one less would not do
            assert (n - 1) / cost.predict_step_s(shape.with_chunk(n - 1, 0)) < DRAIN_SAFETY * need
    else:
        assert policy.feasibility.regime == FEASIBLE


@pytest.mark.parametrize("ttft_s", [8.0, 3.0])
def test_the_arrival_limit_yields_only_to_the_need_over_the_whole_time_left(ttft_s: float) -> None:
    """A lone 1,898-token prompt (as past saturation on the AVX2 stand-in, where the old rule ran it
    as one 2.6 s step that a chat arriving meanwhile waited out) is chunked within the arrival
    limit while that limit's prefill rate covers its need over its whole time left (8 s); a
    tighter deadline (3 s) still takes what it needs."""
    cost = FixedCostModel(0.1, 1 / 716)
    policy = SloPolicy(cost, 4096, 512, arrival_ttft_s=1.0)
    now = 100.0
    batch = Request("b", [1] * 200, PARAMS, arrival_time=0.0, slo=Slo(e2e=120.0))
    batch.num_computed_tokens = 200
    batch.output_token_ids.append(1)
    head = Request("rag", [7] * 1898, PARAMS, arrival_time=now, slo=Slo(ttft=ttft_s))
    budget = policy.prefill_budget([batch], head, 2048, now, lambda share: 1898 / (share * ttft_s))
    shape = StepShape().with_decode(batch.num_tokens)
    n = budget.tokens
    rate = n / cost.predict_step_s(shape.with_chunk(n, 0))
    if ttft_s == 8.0:
        assert budget.reason.startswith("arrival ttft") and cost.predict_step_s(shape.with_chunk(n, 0)) <= 0.5
        assert rate >= DRAIN_SAFETY * 1898 / ttft_s
    else:   # 1.25 x 633 tok/s is more than any step gives: fcfs's budget
        assert budget.reason.startswith(TTFT_DRAIN) and n == 2048


@settings(max_examples=60, deadline=None)
@given(per_step=st.floats(1e-4, 0.2), per_token=st.floats(1e-6, 1e-3), per_pair=st.floats(0.0, 2e-6),
       num_decodes=st.integers(0, 16), start=st.integers(0, 4000), tokens_left=st.integers(1, 2048),
       need=st.floats(0.0, 1e5))
def test_the_drain_takes_the_fewest_tokens_that_cover_the_need_or_the_best_rate_when_none_do(
        per_step: float, per_token: float, per_pair: float, num_decodes: int, start: int,
        tokens_left: int, need: float) -> None:
    """With attention priced (a chunk's cost grows with its length squared), the prefill rate
    rises with the chunk and then falls: the drain is the fewest tokens whose rate covers
    DRAIN_SAFETY x the need, or, when no chunk's does, the chunk with the best rate (checked
    against every size), not the whole budget."""
    cost = FixedCostModel(per_step, per_token, per_pair)
    policy = SloPolicy(cost, 4096, 512)
    shape = StepShape()
    for i in range(num_decodes):
        shape = shape.with_decode(100 + i)
    n = policy._drain_tokens(shape, start, tokens_left, need)
    floor = min(tokens_left, MIN_PREFILL_TOKENS)

    def rate(m: int) -> float:
        return m / cost.predict_step_s(shape.with_chunk(m, start))

    assert floor <= n <= tokens_left
    want = DRAIN_SAFETY * need
    rates = [rate(m) for m in range(floor, tokens_left + 1)]
    if max(rates) >= want:
        assert rate(n) >= want * (1 - 1e-9)
        assert n == floor or rate(n - 1) < want
    else:
        assert rate(n) >= max(rates) * (1 - 1e-9)


def test_a_drain_no_chunk_can_cover_runs_the_best_rate_chunk_not_the_whole_budget() -> None:
    """A 2,048-token chunk of a small model on a CPU runs slower per token than a 500-token one
    (its attention); a queue that needs more than any chunk gives is drained at the best rate,
    in steps a quarter as long, instead of one 2.7 s step every arrival waits out."""
    cost = FixedCostModel(0.05, 1 / 1500, 6e-7)   # 2,048 tokens: 2.7 s, as measured
    policy = SloPolicy(cost, 4096, 512)
    n = policy._drain_tokens(StepShape(), 0, 2048, 10_000.0)
    best = max(range(16, 2049), key=lambda m: m / cost.predict_step_s(StepShape().with_chunk(m, 0)))
    assert abs(n - best) <= 1 and n < 2048 // 4
    rate = n / cost.predict_step_s(StepShape().with_chunk(n, 0))
    assert rate > 1.3 * 2048 / cost.predict_step_s(StepShape().with_chunk(2048, 0))


def test_the_drain_need_counts_arrivals_and_the_deadlines_ahead() -> None:
    """Two waiting prompts of 1,000 tokens with 2 s and 10 s left: the first needs 1,000 tok/s to be
    done in half its time, both together 400; 3,000 prompt tokens arrived over the last 10 s add 300."""
    policy = SloPolicy(FixedCostModel(1e-3, 1e-5), 4096, 512)
    a = Request("a", [7] * 1000, PARAMS, arrival_time=90.0, arrival_seq=1, slo=Slo(ttft=12.0))
    b = Request("b", [7] * 1000, PARAMS, arrival_time=95.0, arrival_seq=2, slo=Slo(ttft=15.0))
    late = Request("late", [7] * 1000, PARAMS, arrival_time=91.0, arrival_seq=3, slo=Slo(ttft=1.0))
    queue = WaitingQueue(policy)
    for r in (a, b, late):
        queue.add(r)
    queue.refresh(100.0)
    assert policy.flow.arrival_rate(100.0) == 300.0               # 3,000 tokens since t=90
    assert policy.drain_need([], queue, 100.0) == 1000.0 + 300.0   # `late` is hopeless: not counted
    queue.refresh(125.0)
    assert policy.flow.arrival_rate(125.0) == 1000 / 30           # a and late fell out of the 30 s window


def test_a_feasibility_flip_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    tracker = FeasibilityTracker()
    with caplog.at_level(logging.WARNING, logger="pacer.sched.feasibility"):
        flips = [tracker.observe(regime) for regime in
                 [FEASIBLE] * 3 + [ITL_INFEASIBLE] * 50 + [FEASIBLE] * 5 + [ITL_INFEASIBLE]]
    assert flips.count(True) == 3 == tracker.num_flips
    assert len(caplog.records) == 3
    assert "feasible -> itl infeasible" in caplog.records[0].getMessage()


def test_a_policy_under_an_impossible_itl_logs_its_regime_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    policy = SloPolicy(FixedCostModel(5e-3, 1e-4), 2048, 512)
    head = Request("head", [7] * 3000, PARAMS, arrival_time=0.0, slo=Slo(ttft=10.0))
    with caplog.at_level(logging.WARNING, logger="pacer.sched.feasibility"):
        for step in range(20):
            now = 1.0 + step * 0.01
            itl = 1e-6 if step < 10 else 1.0      # impossible for ten steps, then easy
            policy.prefill_budget([_decoding(i, 20, itl, now) for i in range(4)], head, 2048, now)
        assert policy.feasibility.num_flips == 1   # easy for 0.1 s only: not left yet (the hold)
        now += REGIME_HOLD_S
        policy.prefill_budget([_decoding(i, 20, 1.0, now) for i in range(4)], head, 2048, now)
    assert policy.feasibility.num_flips == 2
    assert len(caplog.records) == 2


def test_infeasible_steps_are_counted_in_the_budget_tally_and_the_metric() -> None:
    from pacer.telemetry.prometheus import ServingMetrics
    from pacer.workload.budget import BudgetTally, describe_budget

    steps, _ = _long_prompt_with_impossible_itl()
    tally = BudgetTally().extend(steps)
    assert tally.num_infeasible > 0
    line = describe_budget(tally.as_dict())
    assert line is not None and "exceeded the ITL target" in line
    metrics = ServingMetrics("m")
    for s in steps:
        metrics.on_step(s)   # the fake executor's steps carry the fields on_step reads
    value = metrics.registry.get_sample_value("pacer_steps_itl_infeasible_total", {"model_name": "m"})
    assert value == tally.num_infeasible


def _long_prompt_with_impossible_itl() -> tuple[list, dict]:
    from tests.sched.test_slo_policy import _long_prompt_with_chats

    return _long_prompt_with_chats("slo", "1us", FixedCostModel(5e-3, 1e-4))


@settings(max_examples=80, deadline=None)
@given(per_step=st.floats(1e-4, 0.2), per_token=st.floats(1e-6, 1e-3), num_decodes=st.integers(0, 48),
       context=st.integers(1, 2000), itl_ms=st.floats(1.0, 2000.0), tokens_left=st.integers(1, 4096),
       backlog=st.integers(1, 20_000))
def test_a_hopeless_backlog_keeps_prefill_near_its_best_rate(
        per_step: float, per_token: float, num_decodes: int, context: int, itl_ms: float,
        tokens_left: int, backlog: int) -> None:
    """Hopeless requests waiting (a backlog fcfs would drain at its full budget): whatever the ITL
    targets, the step's predicted prefill rate is at least BACKLOG_RATE_SHARE of the best the
    step could run (all of the budget, or the whole backlog when smaller)."""
    cost = FixedCostModel(per_step, per_token)
    policy = SloPolicy(cost, 4096, 512)
    now = 100.0
    late = Request("late", [7] * backlog, PARAMS, arrival_time=0.0, slo=Slo(ttft=1.0))
    queue = WaitingQueue(policy)
    queue.add(late)
    queue.refresh(now)
    decodes = [_decoding(i, context, itl_ms / 1e3, now) for i in range(num_decodes)]
    head = Request("head", [7] * 4000, PARAMS, arrival_time=now, slo=Slo(ttft=10.0))
    shape = StepShape()
    for r in decodes:
        shape = shape.with_decode(r.num_tokens)
    n = policy.prefill_budget(decodes, head, tokens_left, now).tokens
    best_n = min(tokens_left, max(backlog, MIN_PREFILL_TOKENS))
    best = best_n / cost.predict_step_s(shape.with_chunk(best_n, 0))
    assert n / cost.predict_step_s(shape.with_chunk(n, 0)) >= BACKLOG_RATE_SHARE * best * (1 - 1e-9)


def test_a_regime_is_left_only_after_the_hold_without_it() -> None:
    """Refusal, admission, refusal, ... within the hold: one flip, not one per arrival; the way back
    is reported once the hold has passed without the other regime."""
    tracker = FeasibilityTracker("ttft", hold_s=5.0)
    flips = [tracker.observe(regime, now=t) for t, regime in
             [(0.0, "ttft infeasible"), (0.5, FEASIBLE), (1.0, "ttft infeasible"), (3.0, FEASIBLE),
              (5.9, FEASIBLE), (6.1, FEASIBLE), (6.2, "ttft infeasible")]]
    assert flips == [True, False, False, False, False, True, True] and tracker.num_flips == 3


@pytest.mark.parametrize("bound_by", ["itl", "arrival"])
def test_a_drain_past_a_decodes_itl_finishes_the_heads_prompt_and_one_past_the_arrival_limit_takes_the_fewest(
        bound_by: str) -> None:
    """A queue that needs more prefill than the step's limit allows: past a decode's ITL budget
    (a drain that meets as many TTFTs as the streams it breaks, and prefills much faster: the test
    below) the step misses that target however long it is (a stream's ITL is judged on its p99 gap:
    the count of such steps costs), so it finishes the head's 1,898-token prompt in one step, and
    no more of the budget (the next prompt waits a step, not the stream); held only by the limit for
    arrivals (no decode's target at stake) it takes the fewest tokens that cover the need, a short
    step arrivals wait out."""
    # past the ITL, a step cost the ITL's chunk shares badly: the whole budget prefills twice as fast
    cost = FixedCostModel(0.05, 1 / 1500, 6e-7) if bound_by == "arrival" else FixedCostModel(0.1, 1 / 1500, 6e-8)
    need = 840.0 if bound_by == "arrival" else 1000.0
    now = 100.0
    if bound_by == "itl":
        policy = SloPolicy(cost, 4096, 512)
        decodes = [_decoding(0, 300, 0.2, now)]
    else:
        policy = SloPolicy(cost, 4096, 512, arrival_ttft_s=0.4)
        decodes = []
    head = Request("rag", [7] * 1898, PARAMS, arrival_time=now, slo=Slo(ttft=8.0))
    budget = policy.prefill_budget(decodes, head, 2048, now, lambda share: need, lambda slow, fast: 1)
    assert budget.reason.startswith(TTFT_DRAIN), budget
    shape = StepShape()
    for r in decodes:
        shape = shape.with_decode(r.num_tokens)

    def rate(m: int) -> float:
        return m / cost.predict_step_s(shape.with_chunk(m, 0))

    if bound_by == "itl":
        assert budget.tokens == 1898 and budget.time_limit == pytest.approx(cost.predict_step_s(shape.with_chunk(1898, 0)))
    else:
        n = budget.tokens
        assert n < 1024 and rate(n) >= DRAIN_SAFETY * need > rate(n - 1)


@pytest.mark.parametrize(("per_step", "per_pair", "backlog", "saved", "drained"), [
    (0.02, 2e-7, 0, 0, False),    # near the best rate, nobody's TTFT to meet: the ITL stands
    (0.02, 2e-7, 0, 2, True),     # two TTFTs met for one stream broken
    (0.02, 2e-7, 0, 1, False),    # one for one, and the ITL's chunk is near the best rate
    (0.1, 0.0, 0, 1, True),       # one for one, and the whole budget prefills much faster
    (0.1, 0.0, 0, 0, False),      # much faster, but it would break a stream and meet nobody's TTFT
    (0.1, 0.0, 6000, 0, True),    # much faster with seconds of hopeless prompts waiting: throughput first
    (0.02, 2e-7, 6000, 0, False),  # saturated, but the ITL's chunk is near the best rate
])
def test_a_decodes_itl_budget_stands_against_a_drain_unless_it_meets_more_than_it_breaks(
        per_step: float, per_pair: float, backlog: int, saved: int, drained: bool) -> None:
    """The queue needs more than any chunk gives, and one decode's stream (8 tokens, its p99 gap
    nearly its longest) cannot absorb a whole-budget step. The drain goes ahead where it meets more
    queued TTFTs (`saves`) than the streams it breaks, as many where the whole budget prefills more
    than 1 / ITL_RATE_SHARE times faster, or past saturation (hopeless prompts that take seconds
    at the best rate) where it is that much faster; otherwise the ITL budget stands, within it."""
    now = 100.0
    head = Request("rag", [7] * 4000, PARAMS, arrival_time=now, slo=Slo(ttft=8.0))
    decodes = [_decoding(0, 300, 0.2, now)]
    shape = StepShape().with_decode(decodes[0].num_tokens)
    cost = FixedCostModel(per_step, 1 / 2000, per_pair)
    policy = SloPolicy(cost, 4096, 512)
    if backlog:    # 6,000 hopeless tokens: ~3 s at the best rate, saturation
        late = Request("late", [7] * backlog, PARAMS, arrival_time=0.0, slo=Slo(ttft=1.0))
        queue = WaitingQueue(policy)
        queue.add(late)
        queue.refresh(now)
    budget = policy.prefill_budget(decodes, head, 2048, now, lambda share: 1e5, lambda slow, fast: saved)
    if drained:
        assert budget.reason.startswith(TTFT_DRAIN) and budget.tokens == 2048, budget
    else:
        assert f"a drain would meet {saved} more TTFTs and break 1 streams' ITL" in budget.reason, budget
        assert budget.tokens < 2048 and cost.predict_step_s(shape.with_chunk(budget.tokens, 0)) <= 0.2


@pytest.mark.parametrize("stream", ["long", "missed"])
def test_a_stream_that_absorbs_the_drain_or_already_missed_does_not_hold_it_back(stream: str) -> None:
    """A drain that meets one queued TTFT goes ahead past a decode whose stream takes the long step
    within its p99 target (400 tokens to come: one gap weighs nothing): not a stream it breaks. One
    that already missed its TTFT (its ITL cannot make it count) bounds the step by twice its target
    (MISSED_GAP_SHARE), where the best-rate chunk fits: the step prefills faster than a drain of the
    whole budget would, and the stream still reads gaps within 400 ms."""
    now = 100.0
    head = Request("rag", [7] * 4000, PARAMS, arrival_time=now, slo=Slo(ttft=8.0))
    if stream == "long":
        r = Request("d0", list(range(1, 301)), SamplingParams(max_tokens=400, temperature=0, ignore_eos=True),
                    arrival_time=now - 5.0, slo=Slo(ttft=1.0, itl=0.2))
        times = [now - 4.0 + 0.05 * i for i in range(81)]
    else:
        r = Request("d0", list(range(1, 301)), PARAMS, arrival_time=now - 5.0, slo=Slo(ttft=1.0, itl=0.2))
        times = [now - 3.0 + 0.05 * i for i in range(2)]    # first token 2 s late
    r.num_computed_tokens = 300
    r.metrics.first_token_time = times[0]
    for t in times:
        r.output_token_ids.append(1)
        r.metrics.stamp(t)
    cost = FixedCostModel(0.02, 1 / 2000, 2e-7)    # the ITL's chunk near the best rate: a tie would stand
    policy = SloPolicy(cost, 4096, 512)
    budget = policy.prefill_budget([r], head, 2048, times[-1], lambda share: 1e5, lambda slow, fast: 1)
    if stream == "long":
        assert budget.reason.startswith(TTFT_DRAIN) and budget.tokens == 2048, budget
        return
    assert budget.reason.startswith("itl 400.0ms of d0") and budget.time_limit is not None, budget
    shape = StepShape().with_decode(r.num_tokens)
    step = cost.predict_step_s(shape.with_chunk(budget.tokens, 0))
    assert 0.2 < step <= budget.time_limit <= 0.4
    rate = budget.tokens / step
    assert rate > 2048 / cost.predict_step_s(shape.with_chunk(2048, 0))


def test_a_drain_that_finishes_a_short_rest_takes_at_most_twice_the_itl_target() -> None:
    """A partial prompt with 100 tokens left: a drain past a decode's ITL budget (the queue needs
    more than any chunk gives, two TTFTs met for the one stream it breaks) finishes it and adds
    the next prompts only up to DRAIN_GAP_SHARE x the planned ITL target, not the whole budget: a
    stream that missed still sees the gap (before: one 2,048-token step of several prompts)."""
    now = 100.0
    head = Request("rag", [7] * 1200, PARAMS, arrival_time=now - 1.0, slo=Slo(ttft=8.0))
    head.num_computed_tokens = 1100
    decodes = [_decoding(0, 300, 0.2, now)]
    shape = StepShape().with_decode(decodes[0].num_tokens)
    cost = FixedCostModel(0.1, 1 / 1500, 6e-8)
    policy = SloPolicy(cost, 4096, 512)
    budget = policy.prefill_budget(decodes, head, 2048, now, lambda share: 1e5, lambda slow, fast: 2)
    assert budget.reason.startswith(TTFT_DRAIN), budget
    cap = DRAIN_GAP_SHARE * 0.2 * BUDGET_SAFETY
    assert budget.time_limit == pytest.approx(cap) and 100 < budget.tokens < 2048

    def step_s(m: int) -> float:    # the rest of the head's prompt, then the next prompt's first chunk
        return cost.predict_step_s(shape.with_chunk(100, 1100).with_chunk(m - 100, 0))

    assert step_s(budget.tokens) <= cap < step_s(budget.tokens + 1)
