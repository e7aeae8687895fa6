"""Offline targets on the real default model: `SamplingParams(slo=...)` and `LLM.generate(slo=...)`
reach the scheduler's slo policy, and greedy outputs do not depend on the policy."""

from __future__ import annotations

import pytest

from pacer.config.slo import Slo
from pacer.llm import LLM
from pacer.request import SamplingParams
from tests.conftest import llm_over

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def slo_llm() -> LLM:
    return LLM(scheduling_policy="slo", slo=["chat:ttft=5s,itl=1s"], max_num_seqs=1, num_kv_blocks=64,
               num_threads=1, quantization="none")   # the session base's weights: outputs compare


def test_offline_targets_order_service_by_slack(slo_llm: LLM) -> None:
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    relaxed = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, slo={"ttft_ms": 60_000})
    outs = slo_llm.generate(PROMPTS, [relaxed, greedy, greedy], slo=[None, None, Slo(ttft=2.0)],
                            request_class="chat")
    m = [o.metrics for o in outs]
    # own targets on top of the class's: 60 s and 2 s replace chat's 5 s; the middle one keeps 5 s
    assert [round(x.ttft_deadline - x.arrival_time, 6) for x in m] == [60.0, 5.0, 2.0]
    order = sorted(range(3), key=lambda i: m[i].first_scheduled_time)
    assert order == [2, 1, 0]          # least slack first (one seat)


def test_greedy_outputs_identical_under_fcfs_and_slo(slo_llm: LLM, base) -> None:
    greedy = SamplingParams(max_tokens=10, temperature=0)
    fcfs = llm_over(base, max_num_seqs=1, num_kv_blocks=64)
    want = [o.token_ids for o in fcfs.generate(PROMPTS, greedy)]
    got = slo_llm.generate(PROMPTS, greedy, slo=[{"ttft_ms": 90_000}, {"ttft_ms": 1_000}, None])
    assert [o.token_ids for o in got] == want


def test_bad_offline_targets_name_the_field(slo_llm: LLM) -> None:
    with pytest.raises(ValueError, match="slo: unknown key 'ttft'"):
        slo_llm.generate("hi", SamplingParams(max_tokens=2), slo={"ttft": 3})
    with pytest.raises(ValueError, match=r"slo\.ttft_ms must be a number of milliseconds > 0"):
        SamplingParams(slo={"ttft_ms": -5})
    with pytest.raises(TypeError, match="slo must be a Slo or a dict"):
        SamplingParams(slo="ttft=300ms")   # type: ignore[arg-type]
    with pytest.raises(ValueError, match="slo: got 2 values for 1 prompts"):
        slo_llm.generate("hi", SamplingParams(max_tokens=2), slo=[None, None])
    assert not slo_llm.engine.has_unfinished_requests()
