"""Request metrics defined once: the JSONL request-log schema, percentiles, request classes,
and the Prometheus collectors of `pacer serve`.

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
``prefill_tokens``     prompt tokens computed (prefill and recompute after preemption)
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
=====================  ==============================================================
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pacer.engine.stats import StepStats

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
)


# ---------------------------------------------------------------- request classes
# One vocabulary and one classifier, defined in pacer.config.slo (shared with the bench and the
# scheduler): REQUEST_CLASSES and ClassRules are re-exported here.


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
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0,
                    3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
                  0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0)
_LENGTH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)

# base name -> (help, buckets); histograms carry `model_name` and `class` labels
_HISTOGRAMS = {
    "time_to_first_token_seconds": ("Time to first token: first token - arrival.", _LATENCY_BUCKETS),
    "inter_token_latency_seconds": ("Gap between consecutive output tokens.", _TOKEN_BUCKETS),
    "request_time_per_output_token_seconds": ("Per request: (last - first token) / (output tokens - 1).",
                                              _TOKEN_BUCKETS),
    "e2e_request_latency_seconds": ("Arrival to finish.", _LATENCY_BUCKETS),
    "request_queue_time_seconds": ("Arrival to first scheduled (time in the waiting queue).",
                                   _LATENCY_BUCKETS),
    "request_prefill_time_seconds": ("First scheduled to first token.", _LATENCY_BUCKETS),
    "request_decode_time_seconds": ("First token to finish.", _LATENCY_BUCKETS),
    "request_inference_time_seconds": ("First scheduled to finish.", _LATENCY_BUCKETS),
    "request_prompt_tokens": ("Prompt tokens per finished request.", _LENGTH_BUCKETS),
    "request_generation_tokens": ("Output tokens per finished request.", _LENGTH_BUCKETS),
}


class ServingMetrics:
    """The Prometheus series of `pacer serve`, in their own registry.

    Names mirror vLLM's `/metrics`: with prefix `pacer` a series is `pacer_<name>`; with prefix
    `vllm` it is `vllm:<name>`, so dashboards and routers built for vLLM work unchanged.
    Gauges are set from engine snapshots; everything else is counted as requests progress.
    Prefix-cache queries/hits count tokens looked up / found: the engine's own totals
    (`Engine.cache_stats()`) when it has them, else the prompt / cached tokens of each
    scheduled request.
    """

    def __init__(self, model_name: str, prefix: str = "pacer") -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        if not prefix.isidentifier():
            raise ValueError(f"metrics prefix must be an identifier such as 'pacer' or 'vllm', got {prefix!r}")
        self.prefix = prefix
        self.model_name = model_name
        self.registry = CollectorRegistry()
        reg, labels = self.registry, ["model_name"]
        self.histograms = {
            base: Histogram(self.name(base), help_, labels + ["class"], buckets=buckets, registry=reg)
            for base, (help_, buckets) in _HISTOGRAMS.items()
        }
        self.num_running = Gauge(self.name("num_requests_running"), "Requests running in the engine.",
                                 labels, registry=reg)
        self.num_waiting = Gauge(self.name("num_requests_waiting"), "Requests waiting to be scheduled.",
                                 labels, registry=reg)
        self.kv_usage = Gauge(self.name("kv_cache_usage_perc"), "KV-cache usage, 0..1 (1 = full).",
                              labels, registry=reg)
        self.iteration_tokens = Histogram(self.name("iteration_tokens_total"), "Tokens scheduled per engine step.",
                                          labels, buckets=_LENGTH_BUCKETS, registry=reg)
        counters = {
            "prefix_cache_queries": "Prompt tokens looked up in the prefix cache.",
            "prefix_cache_hits": "Prompt tokens found in the prefix cache.",
            "num_preemptions": "Preemptions (a running request lost its KV blocks).",
            "prompt_tokens": "Prompt tokens of requests that produced their first token.",
            "generation_tokens": "Output tokens generated.",
        }
        self.counters = {b: Counter(self.name(b), h, labels, registry=reg) for b, h in counters.items()}
        self.request_success = Counter(self.name("request_success"), "Finished requests by finish reason.",
                                       labels + ["finished_reason"], registry=reg)
        self.request_slo = Counter(self.name("request_slo"), "Finished requests held to targets, by class and "
                                   "whether they met every one (result=met|missed): SLO attainment.",
                                   labels + ["class", "result"], registry=reg)
        self.request_refused = Counter(self.name("request_refused"), "Requests refused, by reason "
                                       "(queue_full, displaced, context_length_exceeded, draining).",
                                       labels + ["reason"], registry=reg)
        self.slow_client_aborted = Counter(self.name("request_slow_client_aborted"), "Streamed requests "
                                           "aborted because their client left --max-queued-outputs outputs "
                                           "unread.", labels, registry=reg)
        self.tenant_refused = Counter(self.name("tenant_request_refused"), "Requests refused, by tenant and "
                                      "reason (also rate_limited, concurrency_limit, request_too_large).",
                                      labels + ["tenant", "reason"], registry=reg)
        self._lock = threading.Lock()
        self._last_totals: dict[str, int] = {}
        self._engine_counts_cache = False

    def set_cache_config(self, **info: object) -> None:
        """vLLM's `cache_config_info` gauge (value 1; the config as labels: `block_size`,
        `num_gpu_blocks`, ...), which the llm-d gateway and other routers scrape."""
        from prometheus_client import Gauge

        labels = {k: str(v) for k, v in info.items()}
        gauge = Gauge(self.name("cache_config_info"), "Information of the LLMEngine CacheConfig.",
                      sorted(labels), registry=self.registry)
        gauge.labels(**labels).set(1)

    def name(self, base: str) -> str:
        return f"vllm:{base}" if self.prefix == "vllm" else f"{self.prefix}_{base}"

    def set_engine_state(self, num_running: int, num_waiting: int, kv_usage: float, num_preemptions: int,
                         prefix_cache_queries: int | None = None, prefix_cache_hits: int | None = None) -> None:
        """Gauges, and counters the engine keeps as running totals (pass them as totals).
        When the engine counts prefix-cache tokens itself, per-request counting stops."""
        m = self.model_name
        self.num_running.labels(m).set(num_running)
        self.num_waiting.labels(m).set(num_waiting)
        self.kv_usage.labels(m).set(kv_usage)
        totals = {"num_preemptions": num_preemptions}
        if prefix_cache_queries is not None and prefix_cache_hits is not None:
            self._engine_counts_cache = True
            totals.update(prefix_cache_queries=prefix_cache_queries, prefix_cache_hits=prefix_cache_hits)
        with self._lock:
            deltas = {k: v - self._last_totals.get(k, 0) for k, v in totals.items()}
            self._last_totals.update(totals)
        for name, delta in deltas.items():
            if delta > 0:
                self.counters[name].labels(m).inc(delta)

    def on_step(self, stats: StepStats) -> None:
        """Each engine step's `StepStats` (called on the engine's thread)."""
        self.iteration_tokens.labels(self.model_name).observe(stats.num_prefill_tokens + stats.num_decode_tokens)

    def on_tokens(self, num_tokens: int) -> None:
        if num_tokens:
            self.counters["generation_tokens"].labels(self.model_name).inc(num_tokens)

    def on_first_token(self, prompt_tokens: int) -> None:
        self.counters["prompt_tokens"].labels(self.model_name).inc(prompt_tokens)

    def on_slo(self, request_class: str, met: bool) -> None:
        self.request_slo.labels(self.model_name, request_class, "met" if met else "missed").inc()

    def on_refused(self, reason: str, tenant: str | None = None) -> None:
        self.request_refused.labels(self.model_name, reason).inc()
        if tenant is not None:
            self.tenant_refused.labels(self.model_name, tenant, reason).inc()

    def on_slow_client(self, num_requests: int) -> None:
        self.slow_client_aborted.labels(self.model_name).inc(num_requests)

    def on_finish(self, metrics: Any, request_class: str, finish_reason: str) -> None:
        """Observe one finished request from its `RequestMetrics`."""
        m, h = metrics, self.histograms
        labels = (self.model_name, request_class)
        self.request_success.labels(self.model_name, finish_reason).inc()
        if m.first_scheduled_time is not None:
            if not self._engine_counts_cache:
                self.counters["prefix_cache_queries"].labels(self.model_name).inc(m.prompt_tokens)
                self.counters["prefix_cache_hits"].labels(self.model_name).inc(m.cached_tokens)
            h["request_queue_time_seconds"].labels(*labels).observe(m.queue_wait)
        if m.first_token_time is not None:
            h["time_to_first_token_seconds"].labels(*labels).observe(m.ttft)
            if m.first_scheduled_time is not None:
                h["request_prefill_time_seconds"].labels(*labels).observe(
                    m.first_token_time - m.first_scheduled_time)
            if m.finish_time is not None:
                h["request_decode_time_seconds"].labels(*labels).observe(m.finish_time - m.first_token_time)
        itl_hist = h["inter_token_latency_seconds"].labels(*labels)
        for gap in m.itl:
            itl_hist.observe(gap)
        if m.tpot is not None:
            h["request_time_per_output_token_seconds"].labels(*labels).observe(m.tpot)
        if m.e2e is not None:
            h["e2e_request_latency_seconds"].labels(*labels).observe(m.e2e)
        if m.first_scheduled_time is not None and m.finish_time is not None:
            h["request_inference_time_seconds"].labels(*labels).observe(m.finish_time - m.first_scheduled_time)
        h["request_prompt_tokens"].labels(*labels).observe(m.prompt_tokens)
        h["request_generation_tokens"].labels(*labels).observe(len(m.token_times))

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
