"""The request log, defined once: one JSON object per finished request (JSONL), its writer and
reader, and the percentile helpers its readers use.

The request log is shared by `pacer serve --request-log`, `pacer bench` (which replays it
as a trace), `pacer sim` and `pacer diagnose`. One JSON object per finished request, with
these keys (names are stable; new keys may be added, none renamed):

=====================  ==============================================================
``request_id``         engine request id (one per prompt)
``api_id``             id of the HTTP response it belongs to (``cmpl-...``/``chatcmpl-...``)
``index``              choice index inside that response
``endpoint``           ``completions`` or ``chat``
``model``              served model name
``stream``             whether the response was streamed
``tenant``             tenant (the ``tenant`` extension field, else ``user``, else ``default``)
``class``              request class: ``chat``, ``rag`` (alias ``long_context``), ``agent`` or ``batch``
``priority``           int; lower is more important (vLLM's meaning)
``timestamp``          arrival, seconds since the log started (the trace clock)
``arrival_unix``       arrival as Unix time, seconds
``scheduled_at``       first scheduled, seconds since the log started (null if never)
``first_token_at``     first output token, seconds since the log started (null if none)
``finished_at``        finish, seconds since the log started
``queue_wait``         first scheduled - arrival, s (null if never scheduled)
``ttft``               first token - arrival, s (null if no token)
``tpot``               (last token - first token) / (output_tokens - 1), s (null if < 2 tokens)
``itl_mean``/``itl_max``  mean and largest gap between consecutive output tokens, s
``e2e``                finish - arrival, s
``prompt_tokens``      prompt length in tokens
``output_tokens``      tokens generated
``max_tokens``         the output limit the request ran with
``cached_tokens``      prompt tokens served from the prefix cache
``cached_tokens_device``  of ``cached_tokens``, those matched in the device tier (the radix tree)
``cached_tokens_host``    of ``cached_tokens``, those promoted from the host tier (``kv_offloading_size``)
``retention_hit_tokens``  of ``cached_tokens``, those its agent session's retention window kept
                       (0 without a session or an open window; ``pacer.kv.retention``)
``prefill_tokens``     prompt tokens computed (prefill and recompute after preemption)
``segment_reused_tokens``  prompt tokens filled from stored segments (segment reuse), not computed
``segment_recomputed_tokens``  of reused segments, the tokens computed with the real context
``preemptions``        times the request was preempted
``preempted_time``     preemption loss, s: from each preemption until its KV was back (waiting
                       preempted + recompute or swap-in); 0 when never preempted
``preempted_time_ttft``  of ``preempted_time``, the part before the first token (inside ``ttft``)
``finish_reason``      ``stop``, ``length``, ``abort`` or ``error``
``status``             HTTP status of the response (200; 408 streamed too slowly, aborted at
                       ``--max-queued-outputs``; 429 displaced or shed; 499 client gone; 500)
``ttft_deadline``      arrival + the TTFT target, seconds since the log started (null: no target)
``slack_at_admission`` slo policy: seconds of slack (latest start - now) when it was first queued
``slo_met``            whether it met every target it was held to (null: it had none)
``deprioritized``      slo policy: it went behind feasible requests once it could not meet TTFT
``shed``               refused as hopeless (``shed_hopeless``: HTTP 429 ``slo_unattainable``)
``api_key_name``       the ``name`` of the API key that sent it (``--api-keys``), never the key; null
``tenant_service_at_admission``  its tenant's service counter (fair-share cost units / weight,
                       ``pacer.sched.fair_share``) when it was first scheduled (null if never)
=====================  ==============================================================
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from pacer.config.slo import REQUEST_CLASSES, ClassRules

__all__ = [
    "REQUEST_LOG_FIELDS", "REQUEST_CLASSES", "ClassRules", "RequestLogWriter", "read_request_log",
    "percentiles", "summarize", "make_log_record",
]

REQUEST_LOG_FIELDS = (
    "request_id", "api_id", "index", "endpoint", "model", "stream", "tenant", "class", "priority",
    "timestamp", "arrival_unix", "scheduled_at", "first_token_at", "finished_at",
    "queue_wait", "ttft", "tpot", "itl_mean", "itl_max", "e2e",
    "prompt_tokens", "output_tokens", "max_tokens", "cached_tokens", "cached_tokens_device", "cached_tokens_host",
    "prefill_tokens", "preemptions",
    "preempted_time", "preempted_time_ttft", "finish_reason", "status",
    "ttft_deadline", "slack_at_admission", "slo_met", "deprioritized", "shed", "api_key_name",
    "retention_hit_tokens", "tenant_service_at_admission", "segment_reused_tokens", "segment_recomputed_tokens",
)


# ---------------------------------------------------------------- request classes
# One vocabulary and one classifier, defined in pacer.config.slo (shared with the bench and the
# scheduler): REQUEST_CLASSES and ClassRules are re-exported here, beside the log that records them.


# ---------------------------------------------------------------- percentiles


def percentiles(values: Sequence[float], qs: Iterable[float] = (50, 90, 95, 99)) -> dict[str, float]:
    """Linear-interpolated percentiles, keyed 'p50', 'p90', ...; NaN for no values."""
    xs = sorted(values)
    out: dict[str, float] = {}
    for q in qs:
        key = f"p{q:g}"
        if not xs:
            out[key] = math.nan
            continue
        pos = (len(xs) - 1) * q / 100.0
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        out[key] = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return out


def summarize(values: Sequence[float]) -> dict[str, float]:
    """count, mean, p50/p90/p95/p99 and max of a latency list."""
    xs = [v for v in values if v is not None]
    base = {"count": float(len(xs)), "mean": sum(xs) / len(xs) if xs else math.nan,
            "max": max(xs) if xs else math.nan}
    base.update(percentiles(xs))
    return base


# ---------------------------------------------------------------- request log


def make_log_record(*, metrics: Any, start: float, clock_to_unix: float, **fields: Any) -> dict[str, Any]:
    """One request-log line from a `RequestMetrics` (engine clock) and server-side `fields`.

    `start`: engine-clock time the log started; `clock_to_unix`: add to an engine-clock time to
    get Unix time.
    """
    m = metrics
    itl = m.itl

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - start, 6)

    derived = {
        "timestamp": rel(m.arrival_time), "arrival_unix": round(m.arrival_time + clock_to_unix, 6),
        "scheduled_at": rel(m.first_scheduled_time), "first_token_at": rel(m.first_token_time),
        "finished_at": rel(m.finish_time), "queue_wait": m.queue_wait, "ttft": m.ttft, "tpot": m.tpot,
        "itl_mean": sum(itl) / len(itl) if itl else None, "itl_max": max(itl) if itl else None,
        "e2e": m.e2e, "prompt_tokens": m.prompt_tokens, "output_tokens": len(m.token_times),
        "cached_tokens": m.cached_tokens, "cached_tokens_device": m.cached_tokens - getattr(m, "cached_tokens_host", 0),
        "cached_tokens_host": getattr(m, "cached_tokens_host", 0), "prefill_tokens": m.prefill_tokens, "preemptions": m.preemptions,
        "preempted_time": round(m.preempted_time, 6), "preempted_time_ttft": round(m.preempted_time_ttft, 6),
        "ttft_deadline": rel(getattr(m, "ttft_deadline", None)), "slack_at_admission": getattr(m, "slack_at_admission", None),
        "deprioritized": getattr(m, "deprioritized", False), "shed": getattr(m, "shed", False),
        "retention_hit_tokens": getattr(m, "retention_hit_tokens", 0),
        "tenant_service_at_admission": getattr(m, "tenant_service_at_admission", None),
        "segment_reused_tokens": getattr(m, "segment_reused_tokens", 0),
        "segment_recomputed_tokens": getattr(m, "segment_recomputed_tokens", 0),
    }
    derived.update(fields)
    unknown = set(derived) - set(REQUEST_LOG_FIELDS)
    if unknown:
        raise ValueError(f"request log: unknown fields {sorted(unknown)}")
    return {k: derived.get(k) for k in REQUEST_LOG_FIELDS}


class RequestLogWriter:
    """Appends one JSON line per finished request; line-buffered, safe from any thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()
        self.started_unix = time.time()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_request_log(path: str | Path) -> list[dict[str, Any]]:
    """All records of a request log (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------- Prometheus

# upper bounds in seconds; wide enough for CPU serving (slow) and GPU serving (fast)
