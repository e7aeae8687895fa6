"""vLLM's /metrics names: deltas over a window, bucket quantiles, overall only (no classes)."""

from __future__ import annotations

import pytest

from pacer.diagnose.baseline import Baseline
from pacer.diagnose.prometheus import Histogram, analyze_metrics, parse_samples, parse_window


def _hist(name, buckets, count, total):
    lines = [f"# TYPE vllm:{name} histogram"]
    for le, c in buckets:
        lines.append(f'vllm:{name}_bucket{{le="{le}",model_name="m"}} {c}')
    lines += [f'vllm:{name}_count{{model_name="m"}} {count}', f'vllm:{name}_sum{{model_name="m"}} {total}']
    return "\n".join(lines)


def _exposition(scale: int, preemptions: int) -> str:
    """`scale` x 10 requests: queue 1 s, prefill 0.5 s, decode 2 s each (e2e 3.5 s)."""
    n = 10 * scale
    parts = [
        _hist("e2e_request_latency_seconds", [(1.0, 0), (5.0, n), ("+Inf", n)], n, 3.5 * n),
        _hist("request_queue_time_seconds", [(0.5, 0), (2.0, n), ("+Inf", n)], n, 1.0 * n),
        _hist("request_prefill_time_seconds", [(1.0, n), ("+Inf", n)], n, 0.5 * n),
        _hist("request_decode_time_seconds", [(1.0, 0), (5.0, n), ("+Inf", n)], n, 2.0 * n),
        _hist("time_to_first_token_seconds", [(1.0, 0), (2.0, n), ("+Inf", n)], n, 1.5 * n),
        _hist("inter_token_latency_seconds", [(0.01, 0), (0.02, 90 * n), (1.0, 100 * n), ("+Inf", 100 * n)],
              100 * n, 0.02 * 100 * n),
        _hist("request_prompt_tokens", [(100, 0), (200, n), ("+Inf", n)], n, 150 * n),
        _hist("request_generation_tokens", [(50, 0), (200, n), ("+Inf", n)], n, 101 * n),
        "# TYPE vllm:num_preemptions counter", f'vllm:num_preemptions_total{{model_name="m"}} {preemptions}',
    ]
    return "\n".join(parts) + "\n"


def test_histogram_quantiles_interpolate_inside_buckets():
    h = Histogram([(1.0, 2.0), (2.0, 6.0), (float("inf"), 8.0)], count=8.0, sum=10.0)
    assert h.quantile(0.25) == 1.0 and h.quantile(0.5) == 1.5 and h.mean == 1.25
    assert h.share_above(2.0) == 0.25 and h.share_above(1.5) == 0.5


def test_vllm_endpoint_deltas_over_a_window():
    before, after = parse_samples(_exposition(1, 3)), parse_samples(_exposition(3, 5))
    reports, description = analyze_metrics(before, after, 60.0, Baseline())
    assert description == "vLLM /metrics over 60 s"
    assert list(reports) == ["overall"]                          # vLLM's series carry no class
    rep = reports["overall"]
    assert rep.count == 20 and rep.num_preemptions == 2
    d = rep.decomposition
    assert (d.queue, d.prefill) == (1.0, 0.5)
    assert d.decode + d.preemption == pytest.approx(2.0)       # decode time, part of it estimated as loss
    assert d.preemption > 0 and d.preemption_estimated
    assert rep.lengths["prompt_mean"] == 150 and rep.lengths["output_mean"] == 101
    assert rep.latency["queue_wait"]["p50"] == pytest.approx(1.25)


def test_windows_and_a_foreign_endpoint():
    assert parse_window("60s") == 60 and parse_window("2m") == 120 and parse_window("500ms") == 0.5
    with pytest.raises(ValueError, match="no pacer_\\* or vllm:\\*"):
        analyze_metrics({}, parse_samples("# TYPE up gauge\nup 1\n"), 1.0, Baseline())
