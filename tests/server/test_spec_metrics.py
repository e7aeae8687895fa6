"""Speculative decoding in /metrics (vLLM's names, prefixed) and in pacer bench's report line."""

from pacer.request import SamplingParams
from pacer.telemetry.collectors import SpecDecodeCollector
from pacer.telemetry.prometheus import ServingMetrics
from pacer.workload.runner import InprocessStats
from pacer.workload.tables import spec_decode_line
from tests.fakes import make_engine, run
from tests.sched.test_spec import NGRAM, add_requests, copy_model


def test_spec_decode_series_and_report_line():
    eng, ex = make_engine(num_blocks=64, model=copy_model, speculative_config=NGRAM, speculative_policy="static")
    steps = InprocessStats()
    eng.stats_listeners.append(steps.add)
    add_requests(eng, 2, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    run(eng, ex)
    totals = eng.snapshot().spec_decode
    assert totals is not None and totals["num_accepted_tokens"] > 0
    assert steps.spec_decode() == totals   # the per-step counts add up to the engine's totals
    for prefix, name in (("pacer", "pacer_spec_decode_"), ("vllm", "vllm:spec_decode_")):
        metrics = ServingMetrics("m", prefix)
        metrics.registry.register(SpecDecodeCollector(eng.snapshot, metrics.name, "m"))
        text = metrics.render().decode()
        assert f'{name}num_drafts_total{{model_name="m"}} {float(totals["num_drafts"])}' in text
        assert f'{name}num_draft_tokens_total{{model_name="m"}} {float(totals["num_draft_tokens"])}' in text
        assert f'{name}num_accepted_tokens_total{{model_name="m"}} {float(totals["num_accepted_tokens"])}' in text
        first = totals["accepted_per_pos"][0]
        assert f'{name}num_accepted_tokens_per_pos_total{{model_name="m",position="0"}} {float(first)}' in text
    line = spec_decode_line(totals)
    assert line.startswith(f"speculative decoding: acceptance rate {totals['acceptance_rate']:.1%}")
    assert f"mean accepted length {totals['mean_accepted_length']:.2f}" in line


def test_no_series_while_speculation_is_off():
    eng, _ = make_engine()
    metrics = ServingMetrics("m")
    metrics.registry.register(SpecDecodeCollector(eng.snapshot, metrics.name, "m"))
    assert "spec_decode" not in metrics.render().decode()
