"""The engine's seams with a fake executor: the frozen snapshot and StepStats, and the
per-request error slot of ModelOutput."""

from __future__ import annotations

import dataclasses

import pytest

from pacer.request import SamplingParams
from pacer.sched.contract import ModelOutput, RequestResult
from tests.fakes import make_engine, reference_output, run, run_preempting_workload


def test_snapshot_is_one_frozen_view_of_the_engine():
    eng, prompts, _, finals = run_preempting_workload()
    snap = eng.snapshot()
    assert (snap.num_running, snap.num_waiting) == (0, 0)
    assert snap.num_steps == len(eng.step_stats) > 0
    assert snap.num_preemptions == snap.num_recompute_preemptions == sum(
        o.metrics.preemptions for o in finals.values()) > 0
    assert snap.num_available_blocks == snap.num_blocks == 12 and snap.kv_usage == 0.0
    assert eng.snapshot().as_dict() == snap.as_dict()   # between steps, one state, one spelling
    assert snap.as_dict()["num_preemptions"] == snap.num_preemptions
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.num_running = 1
    assert sum(s.num_preempted for s in eng.step_stats) == snap.num_preemptions


class _FailOne:
    """Wraps the fake executor: reports an error result (no exception) for one request."""

    def __init__(self, inner, bad_id):
        self.inner, self.bad_id, self.kv_block_bytes = inner, bad_id, None

    def execute(self, out):
        res = self.inner.execute(out)
        if not any(sr.request_id == self.bad_id for sr in out.scheduled):
            return res
        results = dict(res.results)
        results[self.bad_id] = RequestResult(error="grammar rejected every token")
        return ModelOutput(results)


def test_an_error_result_finishes_that_request_alone():
    eng, fake = make_engine(num_blocks=32)
    # the engine's executor is fixed at construction: build one over the wrapper
    from pacer.engine import Engine

    wrapped = Engine(eng.config, _FailOne(fake, "bad"), None, num_kv_blocks=32, model_max_len=256,
                     eos_token_ids=(7,), clock=eng.clock, vocab_size=1000)
    fake.scheduler = wrapped.scheduler
    p = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompts = {"good": [1, 2, 3, 4, 5], "bad": [9, 8, 7, 6, 5, 4]}
    for rid, prompt in prompts.items():
        wrapped.add_request(prompt, p, request_id=rid)
    finals = run(wrapped, fake)
    assert finals["bad"].finish_reason == "error" and finals["bad"].token_ids == []
    assert finals["good"].finish_reason == "length"
    assert finals["good"].token_ids == reference_output(prompts["good"], p)
    assert wrapped.snapshot().num_available_blocks == 32   # the failed request's blocks came back
