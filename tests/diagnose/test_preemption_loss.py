"""`preempted_time`: the scheduler measures the preemption loss (from each preemption until the
request has its KV back), so the request log and run files can decompose e2e without estimating."""

from __future__ import annotations

import math

import pytest

from pacer.config import EngineConfig
from pacer.diagnose.decompose import decompose
from pacer.diagnose.records import Record
from pacer.perf.profiles import get_hardware, get_model
from pacer.request import RequestMetrics
from pacer.sim.simulator import build_sim_engine, simulate
from pacer.workload.arrivals import Poisson
from pacer.workload.generator import generate_requests
from pacer.workload.spec import builtin_workload


def test_metrics_close_a_preemption_once_the_computed_tokens_are_back():
    m = RequestMetrics(arrival_time=0.0, first_token_time=1.0)
    m.on_preempted(2.0, num_computed_tokens=40)
    m.on_step_end(2.5, num_computed_tokens=16)      # recompute under way: still open
    assert m.preempted_time == 0.0
    m.on_preempted(2.6, num_computed_tokens=16)      # preempted again mid-recompute: the same loss
    m.on_step_end(3.5, num_computed_tokens=41)
    assert m.preempted_time == 1.5 and m.preempted_time_ttft == 0.0 and m.preempted_at is None
    p = RequestMetrics(arrival_time=0.0)
    p.on_preempted(0.5, 100)                         # during prefill: the loss is inside TTFT
    p.on_step_end(1.25, 100)
    assert p.preempted_time == p.preempted_time_ttft == 0.75


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_simulated_preemptions_are_measured_and_decompose_exactly(mode):
    specs = generate_requests(builtin_workload("fixed", 200, 100), Poisson(math.inf), seed=0, num_requests=12,
                              max_model_len=4096)
    cfg = EngineConfig.from_kwargs(num_kv_blocks=60, preemption_mode=mode, swap_space=1.0)
    engine, ex, clock = build_sim_engine(cfg, get_hardware("a100-80g"), get_model("llama-3-8b"))
    res = simulate(engine, ex, clock, specs)
    hit = [r for r in res.records if r.preemptions]
    assert hit, "the KV budget was meant to force preemptions"
    assert all(r.preempted_time > 0 for r in hit)
    assert all(r.preempted_time == 0 for r in res.records if not r.preemptions)
    for r in res.records:
        rec = Record("fixed", r.prompt_tokens, r.output_tokens, r.ttft, r.e2e, queue_wait=r.queue_wait,
                     preempted_time=r.preempted_time, preempted_time_ttft=r.preempted_time_ttft)
        p = decompose(rec)
        assert p.total == pytest.approx(r.e2e, abs=1e-9)
        assert min(p.queue, p.prefill, p.decode, p.preemption) >= -1e-9
