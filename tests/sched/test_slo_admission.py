"""Overload is an admission question (issue 25): under `slo`, an arrival whose predicted TTFT,
its wait so far plus the predicted prefill ahead of it in slack order and its own, exceeds
`admission_margin` times its target is refused at once; the requests admitted can still
meet theirs, and an admitted request is never refused later."""

from __future__ import annotations

import itertools
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pacer.config import EngineConfig
from pacer.config.slo import Slo, parse_slo
from pacer.perf.profiles import get_hardware, get_model
from pacer.request import Request, SamplingParams
from pacer.sched.feasibility import FEASIBLE, REGIME_HOLD_S, TTFT_INFEASIBLE
from pacer.sched.policy import WaitingQueue
from pacer.sched.slo_policy import SloPolicy
from pacer.sched.step_cost import FixedCostModel
from pacer.sim.simulator import build_sim_engine, simulate
from pacer.workload.arrivals import make_arrivals
from pacer.workload.generator import generate_requests
from pacer.workload.report import OVERALL, STATUS_REJECTED, build_report
from pacer.workload.spec import ClassSpec, LengthDist, Workload

PARAMS = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
COST = FixedCostModel(0.0, 1e-3)   # a prompt token costs 1 ms (a chunk of 512: 0.512 s)


def _req(seq: int, n: int, ttft: float | None, at: float) -> Request:
    return Request(f"r{seq}", [5] * n, PARAMS, arrival_time=at, arrival_seq=seq,
                   slo=None if ttft is None else Slo(ttft=ttft))


arrivals = st.lists(st.tuples(st.integers(1, 3000), st.sampled_from([None, 0.5, 1.0, 4.0, 20.0]),
                              st.floats(0.0, 2.0)), min_size=1, max_size=30)


@settings(max_examples=80, deadline=None)
@given(batches=st.lists(arrivals, min_size=1, max_size=4), margin=st.sampled_from([1.0, 1.25, 2.0]))
def test_a_refused_arrival_was_predicted_late_and_an_admitted_one_is_never_refused_later(
        batches: list, margin: float) -> None:
    policy = SloPolicy(COST, 4096, 512, admission_margin=margin)
    queue, seq, now, admitted = WaitingQueue(policy), itertools.count(), 0.0, set()
    for batch in batches:
        for n, ttft, delay in batch:
            queue.add(_req(next(seq), n, ttft, now - delay))
        queue.refresh(now)
        refused = policy.shed(queue, now)
        assert not {r.request_id for r in refused} & admitted     # once admitted, never refused
        for r in refused:
            queue.remove(r)
        ahead = 0.0
        for r in queue:                                           # the survivors, in slack order
            if policy.is_hopeless(r, now):
                continue
            ahead += policy.prefill_s(r)
            if r.request_id not in admitted and r.slo is not None and r.slo.ttft is not None:
                assert now - r.arrival_time + ahead <= margin * r.slo.ttft + 1e-9, r
            admitted.add(r.request_id)
        for r in refused:
            assert r.slo is not None and r.slo.ttft is not None   # only a TTFT target is judged
        now += 1.0


def test_refusals_leave_the_queue_able_to_meet_its_targets_and_log_the_regime_once(
        caplog: pytest.LogCaptureFixture) -> None:
    policy = SloPolicy(COST, 4096, 512, admission_margin=1.0)
    queue = WaitingQueue(policy)
    for i in range(10):            # ten 700-token prompts with a 2 s TTFT arrive at once: 7 s of prefill
        queue.add(_req(i, 700, 2.0, 0.0))
    queue.refresh(0.0)
    with caplog.at_level(logging.WARNING, logger="pacer.sched.feasibility"):
        refused = policy.shed(queue, 0.0)
        assert policy.shed(queue, 0.0) == []                      # judged once, at arrival
    assert len(refused) == 8                                      # 2 x 0.7 s fit in 2 s, a third does not
    assert policy.admission.regime == TTFT_INFEASIBLE
    assert len(caplog.records) == 1 and "ttft" in caplog.records[0].getMessage()
    queue.add(_req(10, 100, 20.0, 0.5))                           # a loose target still fits
    queue.refresh(0.5)
    assert policy.shed(queue, 0.5) == []
    assert policy.admission.regime == TTFT_INFEASIBLE             # refused 0.5 s ago: not left yet
    later = REGIME_HOLD_S + 0.1
    queue.add(_req(11, 100, 20.0, later))
    queue.refresh(later)
    with caplog.at_level(logging.WARNING, logger="pacer.sched.feasibility"):
        assert policy.shed(queue, later) == []
    assert policy.admission.regime == FEASIBLE and policy.admission.num_flips == 2
    assert len(caplog.records) == 2                               # one line each way


def test_without_a_margin_nothing_is_refused() -> None:
    policy = SloPolicy(COST, 4096, 512)
    queue = WaitingQueue(policy)
    for i in range(10):
        queue.add(_req(i, 700, 0.1, 0.0))
    queue.refresh(0.0)
    assert policy.shed(queue, 0.0) == []


@pytest.mark.parametrize("bad", [-1.0, float("inf"), True, "2"])
def test_a_bad_margin_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match="slo_admission_margin"):
        EngineConfig.from_kwargs(scheduling_policy="slo", slo_admission_margin=bad)


SPIKE = Workload("spike", (
    ClassSpec("chat", LengthDist(64, 0.5), LengthDist(32, 0.4), weight=0.7),
    ClassSpec("rag", LengthDist(1500, 0.3, min=256), LengthDist(16, 0.3), weight=0.3),
))
TARGETS = ("chat:ttft=1s,itl=200ms", "rag:ttft=8s")


def _sim(margin: float) -> tuple[dict, int]:
    config = EngineConfig.from_kwargs(scheduling_policy="slo", slo=TARGETS, slo_admission_margin=margin)
    eng, ex, clock = build_sim_engine(config, get_hardware("cpu-local"), get_model("smollm2-135m"), keep_records=False)
    specs = generate_requests(SPIKE, make_arrivals(12.0, 1.0, None), seed=3, num_requests=60,
                              max_model_len=eng.max_model_len)
    records = simulate(eng, ex, clock, specs).records
    return build_report(records, slo=parse_slo(list(TARGETS))).summary, sum(r.status == STATUS_REJECTED for r in records)


def test_past_saturation_refusing_early_raises_the_goodput_of_those_served() -> None:
    """A spike the cpu-local profile cannot serve: with the margin some arrivals are refused and
    more requests meet their targets than when every arrival waits its turn."""
    served_all, refused_none = _sim(0.0)
    refusing, refused = _sim(1.25)
    assert refused_none == 0 and refused > 0
    assert refusing[OVERALL]["goodput_req_s"] > served_all[OVERALL]["goodput_req_s"]
