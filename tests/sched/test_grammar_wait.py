"""A request waiting for its grammar (RequestStatus.WAITING_FOR_GRAMMAR) in the scheduler, with
hand-built requests and the fake executor: under every policy, with aging, it never blocks the
requests behind it, never takes a seat or KV blocks, is never a preemption victim, is counted,
can be aborted, and runs once marked ready."""

from __future__ import annotations

import pytest

from pacer.clock import VirtualClock
from pacer.config import SCHEDULING_POLICIES
from pacer.request import FinishReason, Request, RequestStatus, SamplingParams
from pacer.sched.scheduler import Scheduler
from tests.fakes import FakeExecutor, make_engine

P = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def _req(rid: str, t: float, seq: int, prompt: int = 8, priority: int = 0) -> Request:
    first = 1 + 100 * seq   # distinct prompts: no prefix shared (nor computed once for all)
    return Request(rid, list(range(first, first + prompt)), P, arrival_time=t, priority=priority, arrival_seq=seq)


def _step(sched: Scheduler, ex: FakeExecutor) -> list[str]:
    out = sched.schedule()
    sched.update_from_output(out, ex.execute(out))
    sched.check_invariants()
    return [sr.request_id for sr in out.scheduled]


@pytest.mark.parametrize("policy", SCHEDULING_POLICIES)
def test_a_request_waiting_for_its_grammar_blocks_no_one_and_holds_nothing(policy):
    clock = VirtualClock()
    eng, ex = make_engine(num_blocks=8, block_size=4, max_num_seqs=2, scheduling_policy=policy,
                          max_queue_delay=0.5, clock=clock)
    sched = eng.scheduler
    # the grammar request comes first, with the best priority and the shortest job: every policy
    # would serve it first, were it ready
    sched.add_request(_req("g", 0.0, 0, prompt=4, priority=-5), ready=False)
    for i in range(3):
        sched.add_request(_req(f"r{i}", 0.1, i + 1, prompt=12))
    assert sched.num_waiting == 4 and sched.num_waiting_for_grammar == 1
    clock.advance(1.0)   # everyone is past max_queue_delay: aging serves the oldest *ready* one
    seen: set[str] = set()
    preempted: set[str] = set()
    for _ in range(40):
        if not any(r in sched.requests for r in ("r0", "r1", "r2")):
            break
        seen.update(_step(sched, ex))
        preempted.update(ex.steps[-1].preempted_ids)
        assert sched.requests["g"].status is RequestStatus.WAITING_FOR_GRAMMAR
        assert "g" not in sched.kv.block_tables and sched.requests["g"] not in sched.running
        assert sched.num_running <= 2
        clock.advance(0.01)
    assert seen == {"r0", "r1", "r2"}, "the three ready requests ran and finished past the waiting head"
    assert not any(r in sched.requests for r in ("r0", "r1", "r2"))
    assert preempted and "g" not in preempted   # KV ran out (8 blocks): victims were running ones
    assert sched.kv.num_available_blocks() == 8
    assert _step(sched, ex) == [] and sched.has_unfinished_requests()   # only g left: nothing to run
    assert sched.mark_ready("g") is sched.requests["g"] and sched.num_waiting_for_grammar == 0
    assert _step(sched, ex) == ["g"]
    assert sched.requests["g"].status is RequestStatus.RUNNING


def test_waiting_for_grammar_is_aborted_and_counted_out():
    eng, ex = make_engine(num_blocks=16, block_size=4)
    sched = eng.scheduler
    sched.add_request(_req("g", 0.0, 0), ready=False)
    sched.add_request(_req("a", 0.0, 1))
    assert _step(sched, ex) == ["a"]
    assert eng.snapshot().num_waiting_for_grammar == 1 and eng.snapshot().num_waiting == 1
    req = sched.abort_request("g")
    assert req is not None and req.finish_reason is FinishReason.ABORT
    assert sched.num_waiting_for_grammar == 0 and sched.num_waiting == 0 and "g" not in sched.requests
    assert sched.mark_ready("g") is None and sched.mark_ready("a") is None   # finished / not waiting for one
