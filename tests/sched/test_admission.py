"""Per-tenant shares of the waiting queue, and per-key token buckets (pure Python, no model)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pacer.sched.admission import AdmissionController
from pacer.server.access.rate_limit import KeyLimiter, KeyLimits, TokenBucket


def test_flooding_tenant_cannot_keep_another_out():
    ac = AdmissionController(max_waiting=4)
    for i in range(4):
        assert ac.try_admit(f"a{i}", 0, 0.0, tenant="a").admitted
    assert not ac.try_admit("a4", 0, 0.0, tenant="a").admitted        # a holds the whole queue
    d1 = ac.try_admit("b0", 5, 0.0, tenant="b")                          # b is under its share (2)
    d2 = ac.try_admit("b1", 5, 0.0, tenant="b")
    assert d1.admitted and d2.admitted
    assert (d1.displaced_id, d1.displaced_tenant) == ("a3", "a")         # a's latest first
    assert d2.displaced_id == "a2"
    refused = ac.try_admit("b2", 5, 0.0, tenant="b")                     # b now holds its share
    assert not refused.admitted and refused.reason == "queue_full"
    assert ac.num_waiting_of("a") == 2 and ac.num_waiting_of("b") == 2


def test_priority_displaces_only_inside_the_tenants_share():
    ac = AdmissionController(max_waiting=4)
    for i in range(2):
        ac.try_admit(f"a{i}", 9, 0.0, tenant="a")
        ac.try_admit(f"b{i}", 9, 0.0, tenant="b")
    # a high-priority request of b at b's share displaces b's own worst, never a's
    d = ac.try_admit("b-urgent", 0, 0.0, tenant="b")
    assert d.admitted and d.displaced_id == "b1"
    # one of a at its share, no more important than a's worst: refused
    assert not ac.try_admit("a-late", 9, 0.0, tenant="a").admitted


def test_weights_set_the_shares():
    ac = AdmissionController(max_waiting=6, tenant_weights={"gold": 2})
    for i in range(6):
        ac.try_admit(f"f{i}", 0, 0.0, tenant="free")
    admitted = [ac.try_admit(f"g{i}", 0, 0.0, tenant="gold").admitted for i in range(6)]
    assert admitted == [True] * 4 + [False] * 2                         # 6 * 2 / 3 = 4 places
    assert ac.share("gold") == 4 and ac.share("free") == 2
    with pytest.raises(ValueError, match=r"tenant_weights\['x'\]"):
        AdmissionController(4, tenant_weights={"x": 0})


_ops = st.lists(st.tuples(st.sampled_from(["admit", "start", "release"]), st.sampled_from("abc"),
                          st.integers(0, 3)), max_size=80)


@settings(max_examples=150, deadline=None)
@given(max_waiting=st.integers(1, 6), ops=_ops)
def test_share_invariants(max_waiting, ops):
    """Never more than max_waiting wait; a refused arrival's tenant holds at least its share,
    or no tenant is over its own; a displaced request is the arrival's own tenant's (priority)
    or belongs to a tenant over its share."""
    ac = AdmissionController(max_waiting)
    waiting: dict[str, tuple[str, int]] = {}
    for n, (op, tenant, prio) in enumerate(ops):
        if op == "admit":
            before = {t: ac.num_waiting_of(t) for t in "abc"}
            shares = {t: ac.share(t, arriving=tenant) for t in "abc"}
            d = ac.try_admit(f"r{n}", prio, float(n), tenant)
            if d.admitted:
                waiting[f"r{n}"] = (tenant, prio)
                if d.displaced_id is not None:
                    victim_tenant, victim_prio = waiting.pop(d.displaced_id)
                    assert victim_tenant == d.displaced_tenant
                    if victim_tenant == tenant:
                        assert victim_prio > prio
                    else:
                        assert before[victim_tenant] > shares[victim_tenant] and before[tenant] < shares[tenant]
            else:
                full = sum(before.values()) == max_waiting
                assert full and (before[tenant] >= shares[tenant] or
                                 all(before[t] <= shares[t] for t in "abc" if t != tenant))
        elif waiting:
            rid = sorted(waiting)[prio % len(waiting)]
            waiting.pop(rid)
            ac.mark_started(rid, float(n)) if op == "start" else ac.release(rid)
        assert ac.num_waiting == len(waiting) <= max_waiting
        for t in "abc":
            assert ac.num_waiting_of(t) == sum(1 for w in waiting.values() if w[0] == t)


def test_token_bucket_waits_and_refills():
    b = TokenBucket(rate=2.0, capacity=10.0, now=0.0)
    assert b.wait_time(10, 0.0) == 0.0
    b.take(10, 0.0)
    assert b.wait_time(4, 0.0) == pytest.approx(2.0)
    assert b.wait_time(4, 1.0) == pytest.approx(1.0)
    assert b.level(100.0) == 10.0                      # never above capacity
    assert math.isinf(b.wait_time(11, 100.0))


def test_key_limiter_charges_refunds_and_caps():
    lim = KeyLimiter(KeyLimits(requests_per_minute=60, tokens_per_minute=600, max_concurrent=2), now=0.0)
    assert lim.try_acquire(1, 500, 0.0) is None
    r = lim.try_acquire(1, 200, 0.0)                   # 100 tokens left, 200 needed at 10/s: 10 s
    assert r is not None and r.reason == "rate_limited" and r.limit == "tokens_per_minute"
    assert r.retry_after_s == 10
    lim.release(unused_tokens=400, now=0.0)            # the first used 100 of its 500
    assert lim.try_acquire(1, 200, 0.0) is None and lim.try_acquire(1, 10, 0.0) is None
    capped = lim.try_acquire(1, 1, 0.0)
    assert capped is not None and capped.reason == "concurrency_limit" and capped.retry_after_s == 1
    too_big = lim.try_acquire(3, 1, 0.0)
    assert too_big is not None and too_big.reason == "request_too_large" and too_big.retry_after_s is None
    lim.release(0, 0.0)
    lim.release(0, 0.0)
    never = lim.try_acquire(1, 601, 0.0)
    assert never is not None and never.reason == "request_too_large" and never.limit == "tokens_per_minute"
