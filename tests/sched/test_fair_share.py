"""Fair share: the service ledger (VTC) on its own, and the fair / bounded-lpm policies driving
the scheduler over the fake executor (hypothesis properties)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pacer.request import SamplingParams
from pacer.sched.fair_share import ServiceCosts, ServiceLedger, jain_index
from tests.fakes import make_engine, run


def test_costs_price_each_token_kind_and_weights_divide():
    ledger = ServiceLedger(ServiceCosts(prefill=1.0, cached=0.1, decode=2.0), {"gold": 2.0})
    assert ledger.charge("gold", num_prefill=10, num_cached=10, num_decode=3) == pytest.approx(17.0)
    assert ledger.service("gold") == pytest.approx(17.0) and ledger.normalized("gold") == pytest.approx(8.5)
    ledger.charge("free", num_prefill=17)
    assert ledger.shares() == {"free": pytest.approx(0.5), "gold": pytest.approx(0.5)}


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="fair_cost_cached"):
        ServiceCosts(cached=-1.0)
    with pytest.raises(ValueError, match=r"tenant_weights\['a'\]"):
        ServiceLedger(weights={"a": 0.0})
    with pytest.raises(ValueError, match="fair_deficit_bound"):
        make_engine(scheduling_policy="lpm", fair_deficit_bound=-5)


def test_a_tenant_returning_from_idle_is_lifted_to_the_least_backlogged():
    ledger = ServiceLedger()
    ledger.set_backlogged(["a", "b"])
    ledger.charge("a", num_prefill=100)
    ledger.charge("b", num_prefill=40)
    ledger.set_backlogged(["a", "b", "c"])        # c arrives: lifted to b's 40, not 0
    assert ledger.normalized("c") == 40.0 and ledger.deficit("a") == 60.0


def test_jain_index():
    assert jain_index([1, 1, 1]) == pytest.approx(1.0)
    assert jain_index([1, 0]) == pytest.approx(0.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 50), st.integers(0, 50), st.integers(0, 20),
                          st.booleans()), max_size=40))
def test_counters_never_go_negative_and_idlers_bank_nothing(events):
    ledger = ServiceLedger()
    backlog: set[str] = set()
    for tenant, pre, cached, dec, toggle in events:
        if toggle:
            backlog ^= {tenant}
        before = ledger.floor()
        returning = {tenant} - ledger.backlogged if tenant in backlog else set()
        ledger.set_backlogged(backlog)
        for t in returning:   # a returning tenant is never behind the least backlogged one
            assert ledger.normalized(t) >= before - 1e-9 or not (backlog - returning)
        if tenant in backlog:
            ledger.charge(tenant, pre, cached, dec)
        for t in ledger.tenants:
            assert ledger.normalized(t) >= 0 and ledger.service(t) >= 0 and ledger.deficit(t) >= 0


PROMPT, OUT = 24, 4
COSTS = ServiceCosts()
ONE_REQUEST = COSTS.of(PROMPT, 0, OUT)


def _backlog(policy: str, heavy: int, light: int, bound: float | None, weights=None, seqs: int = 4):
    kw = {} if bound is None else {"fair_deficit_bound": bound}
    eng, ex = make_engine(num_blocks=256, block_size=4, max_num_batched_tokens=32, max_num_seqs=seqs,
                          scheduling_policy=policy, fair_tenant_weights=weights, **kw)
    p = SamplingParams(max_tokens=OUT, temperature=0, ignore_eos=True)
    shared = list(range(300, 316))
    for i in range(heavy):   # the heavy tenant shares a prefix; the light one does not
        eng.add_request(shared + [400 + i] * (PROMPT - 16), p, request_id=f"h{i}", tenant="heavy")
    for i in range(light):
        eng.add_request([600 + i] * PROMPT, p, request_id=f"l{i}", tenant="light")
    return eng, ex


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["fair", "lpm"]), heavy=st.integers(4, 20), light=st.integers(1, 6),
       bound=st.sampled_from([10.0, 50.0, 200.0]))
def test_no_backlogged_tenant_runs_ahead_by_more_than_the_bound_and_one_request(policy, heavy, light, bound):
    # lpm: the deficit bound; fair: the slack a seat-poor tenant may run ahead by to get a seat
    eng, ex = _backlog(policy, heavy, light, bound)
    ledger = eng.scheduler.policy.ledger
    limit = bound + ONE_REQUEST
    while eng.has_unfinished_requests():
        eng.step()
        if len(ledger.backlogged) > 1:
            for t in ledger.backlogged:
                assert ledger.deficit(t) <= limit
    assert all(ledger.service(t) >= 0 for t in ledger.tenants)


def test_fair_serves_the_light_tenant_before_the_heavy_backlog_drains():
    eng, ex = _backlog("fair", heavy=30, light=3, bound=None)
    order: list[str] = []
    while eng.has_unfinished_requests():
        order += [o.request_id for o in eng.step() if o.finished]
    assert max(order.index(f"l{i}") for i in range(3)) < 12   # fcfs would finish them last (30+)


def test_weights_split_service_two_to_one():
    eng, ex = _backlog("fair", heavy=80, light=80, bound=None, weights={"heavy": 2.0, "light": 1.0})
    ledger = eng.scheduler.policy.ledger
    while len(ledger.backlogged) != 1:
        eng.step()
        if not ledger.backlogged:
            continue
    ratio = ledger.service("heavy") / ledger.service("light")
    assert 1.8 <= ratio <= 2.2
    run(eng, ex)


def test_aging_keeps_its_bound_under_fair():
    eng, ex = make_engine(num_blocks=256, max_num_batched_tokens=32, max_num_seqs=2, scheduling_policy="fair",
                          max_queue_delay=0.5)
    assert eng.scheduler.waiting.max_queue_delay == 0.5
    finals = {}
    p = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    for i in range(10):
        eng.add_request([7 + i] * 8, p, request_id=f"r{i}", tenant=f"t{i % 3}")
    finals = run(eng, ex)
    assert len(finals) == 10   # every request finished: none starved


def test_a_seat_poor_tenants_arrival_takes_a_seat_at_the_next_step():
    """The heavy tenant holds every seat; the light tenant returns from idle, lifted to the heavy
    one's counter: its arrival is admitted at once (a heavy request gives up its seat) instead of
    waiting behind the heavy backlog until the heavy counter passes it."""
    eng, ex = make_engine(num_blocks=512, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                          scheduling_policy="fair")
    p = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    for i in range(20):
        eng.add_request([400 + i] * 24, p, request_id=f"h{i}", tenant="heavy")
    eng.add_request([600] * 24, p, request_id="l0", tenant="light")
    sched = eng.scheduler
    while not any(o.request_id == "l0" and o.finished for o in eng.step()):
        pass
    for _ in range(3):
        eng.step()
    assert all(r.tenant == "heavy" for r in sched.running) and len(sched.running) == 4
    eng.add_request([700] * 24, p, request_id="l1", tenant="light")
    eng.step()
    assert "l1" in {r.request_id for r in sched.running}
    assert sched.num_preemptions >= 1


def test_a_tenant_above_its_seat_share_prefills_in_small_chunks():
    from pacer.sched.fair_policy import FAIR_CHUNK

    eng, ex = make_engine(num_blocks=2048, block_size=16, max_len=2048, max_num_batched_tokens=2048, max_num_seqs=8,
                          scheduling_policy="fair")
    p = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    for i in range(7):
        eng.add_request([400 + i] * 32, p, request_id=f"h{i}", tenant="heavy")
    eng.add_request([600] * 32, p, request_id="l0", tenant="light")
    for _ in range(3):
        eng.step()
    eng.add_request([500] * 1000, p, request_id="h-long", tenant="heavy")
    eng.add_request([700] * 1000, p, request_id="l-long", tenant="light")
    eng.step()
    computed = {rid: r.num_computed_tokens for rid, r in eng.scheduler.requests.items()}
    assert computed["h-long"] <= FAIR_CHUNK < computed["l-long"] == 1000


def _slo_ties(bound: float | None) -> list[str]:
    from tests.fakes import FixedCostModel

    kw = {} if bound is None else {"fair_deficit_bound": bound}
    eng, ex = make_engine(scheduling_policy="slo", max_num_seqs=1, num_blocks=400, cost_model=FixedCostModel(1e-3, 1e-4),
                          **kw)
    p = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    for i in range(3):   # heavy has been served before the others arrive
        eng.add_request([10 + i] * 40, p, request_id=f"warm{i}", slo={"ttft_ms": 60_000}, tenant="heavy")
    run(eng, ex)
    eng.add_request([50] * 40, p, request_id="heavy-a", slo={"ttft_ms": 20_000}, tenant="heavy")
    eng.add_request([51] * 40, p, request_id="heavy-b", slo={"ttft_ms": 20_000}, tenant="heavy")
    eng.add_request([52] * 40, p, request_id="light", slo={"ttft_ms": 20_300}, tenant="light")
    eng.add_request([53] * 40, p, request_id="urgent", slo={"ttft_ms": 100}, tenant="heavy")
    finals = run(eng, ex)
    return [rid for _, rid in sorted((o.metrics.first_scheduled_time, o.request_id) for o in finals.values())]


def test_slo_with_a_deficit_bound_breaks_ties_by_tenant_service():
    # plain slo: least slack first, heavy's earlier deadlines ahead of light's 300 ms later one
    assert _slo_ties(None) == ["urgent", "heavy-a", "heavy-b", "light"]
    # with the bound: the urgent request (slack under the margin) keeps its place; among the rest,
    # whose deadlines lie within a second of each other, the less-served tenant goes first
    assert _slo_ties(100.0) == ["urgent", "light", "heavy-a", "heavy-b"]
