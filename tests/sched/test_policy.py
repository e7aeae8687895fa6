"""Ordering policies and the waiting queue on their own."""

from __future__ import annotations

import pytest

from pacer.config import SCHEDULING_POLICIES
from pacer.request import Request, SamplingParams
from pacer.sched.policy import WaitingQueue
from pacer.sched.policy_factory import make_policy


def _req(rid, t, priority=0, prompt=4, max_tokens=4, seq=0):
    return Request(rid, list(range(1, prompt + 1)), SamplingParams(max_tokens=max_tokens), arrival_time=t,
                   priority=priority, arrival_seq=seq)


def test_each_policy_orders_by_its_key():
    a = _req("a", 0.0, priority=2, prompt=50, seq=0)
    b = _req("b", 1.0, priority=0, prompt=5, seq=1)
    c = _req("c", 1.0, priority=1, prompt=20, seq=2)
    order = {name: [r.request_id for r in sorted([c, b, a], key=make_policy(name).key)]
             for name in SCHEDULING_POLICIES if name != "slo"}   # slo needs a cost model (tests/sched/test_slo*)
    assert order == {"fcfs": ["a", "b", "c"], "priority": ["b", "c", "a"], "sjf": ["b", "c", "a"],
                     "lpm": ["a", "b", "c"], "fair": ["a", "b", "c"]}   # no cache, no service: arrival order


def test_only_priority_preempts_for_a_waiting_request():
    hi, lo = _req("hi", 5.0, priority=0), _req("lo", 0.0, priority=3)
    assert make_policy("priority").outranks(hi, lo) and not make_policy("priority").outranks(lo, hi)
    assert not make_policy("fcfs").outranks(hi, lo) and not make_policy("sjf").outranks(hi, lo)


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="fcfs, priority, sjf"):
        make_policy("lifo")


def test_waiting_queue_keeps_key_order_and_a_preempted_request_returns_to_its_place():
    q = WaitingQueue(make_policy("fcfs"))
    reqs = [_req(f"r{i}", float(i), seq=i) for i in range(4)]
    for r in (reqs[2], reqs[0], reqs[3]):
        q.add(r)
    assert [r.request_id for r in q] == ["r0", "r2", "r3"]
    assert q.pop() is reqs[0]
    q.add(reqs[1])
    q.add(reqs[0])                     # back (e.g. preempted): ahead of everyone again
    assert q.peek() is reqs[0] and len(q) == 4
    assert q.remove(reqs[2]) and not q.remove(reqs[2])
    assert [r.request_id for r in q] == ["r0", "r1", "r3"]
