"""Per-request metrics in a response body (`--enable-per-request-metrics` or the body's
`return_metrics: true`): what the engine measured for each choice (queue wait, TTFT, ITL p50
and max, TPOT, end to end, cached tokens, preemptions) and, which no peer returns, the request's
SLO targets, its slack at admission (the `slo` policy's latest start minus the time it was
queued) and whether each target was met. Times in milliseconds; null where not measured."""

from __future__ import annotations

from typing import Any

from pacer.config.slo import SLO_KEYS, Slo, percentile
from pacer.request import RequestMetrics

__all__ = ["metrics_body"]


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000.0, 3)


def _p50(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[(len(s) - 1) // 2]


def metrics_body(m: RequestMetrics, slo: Slo, ok: bool) -> dict[str, Any]:
    """One choice's metrics; `ok`: it finished normally (a failed request meets no target)."""
    itl = m.itl
    # ITL is held to its target on the 99th percentile of the request's own gaps (Slo.met_by)
    values = {"ttft": m.ttft, "tpot": m.tpot, "e2e": m.e2e, "itl": percentile(itl, 99) if itl else None}
    targets = {f"{k}_ms": _ms(getattr(slo, k)) for k in SLO_KEYS if getattr(slo, k) is not None}
    met = {k: ok and values[k] is not None and values[k] <= getattr(slo, k)
           for k in SLO_KEYS if getattr(slo, k) is not None}
    return {
        "queue_wait_ms": _ms(m.queue_wait), "ttft_ms": _ms(m.ttft), "itl_p50_ms": _ms(_p50(itl)),
        "itl_max_ms": _ms(max(itl) if itl else None), "tpot_ms": _ms(m.tpot), "e2e_ms": _ms(m.e2e),
        "prompt_tokens": m.prompt_tokens, "output_tokens": len(m.token_times), "cached_tokens": m.cached_tokens,
        "preemptions": m.preemptions, "segment_reused_tokens": m.segment_reused_tokens,
        "segment_recomputed_tokens": m.segment_recomputed_tokens,
        "slo": {"targets": targets, "slack_at_admission_ms": _ms(m.slack_at_admission), "met": met,
                "all_met": all(met.values()) if met else None},
    }
