"""The Prometheus series of `pacer serve` (vLLM's names under the `vllm` prefix), kept as requests
progress; the request log is `pacer.telemetry.request_log`."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pacer.sched.feasibility import ITL_INFEASIBLE

if TYPE_CHECKING:
    from pacer.engine.stats import StepStats

__all__ = ["ServingMetrics", "OTHER_TENANTS_LABEL"]

OTHER_TENANTS_LABEL = "other"   # the `tenant` label of every tenant past the label cap

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
    (`EngineSnapshot.prefix_cache_*`) when it has them, else the prompt / cached tokens of each
    scheduled request.

    Tenants are client-named on an open server, so the `tenant` label is capped: the
    `known_tenants` (the keys file's) always get their own, the first `max_tenant_labels`
    others seen get theirs, and every later one is counted under `other`. A client inventing
    tenant names cannot grow the series without end.
    """

    def __init__(self, model_name: str, prefix: str = "pacer", max_tenant_labels: int = 100,
                 known_tenants: Iterable[str] = ()) -> None:
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
        self.steps_infeasible = Counter(self.name("steps_itl_infeasible"), "Engine steps whose decodes alone "
                                        "were predicted past the tightest ITL target (slo: served at fcfs's "
                                        "budget rather than chasing it).", labels, registry=reg)
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
        if isinstance(max_tenant_labels, bool) or not isinstance(max_tenant_labels, int) or max_tenant_labels < 0:
            raise ValueError(f"max_tenant_labels must be an integer >= 0, got {max_tenant_labels!r}")
        self.max_tenant_labels = max_tenant_labels
        self._known_tenants = frozenset(known_tenants)
        self._labelled_tenants: set[str] = set()
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
        if stats.budget_reason.startswith(ITL_INFEASIBLE):
            self.steps_infeasible.labels(self.model_name).inc()

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
            self.tenant_refused.labels(self.model_name, self.tenant_label(tenant), reason).inc()

    def tenant_label(self, tenant: str) -> str:
        """The `tenant` label value for `tenant`: itself while under the cap, else `other`."""
        if tenant in self._known_tenants or tenant in self._labelled_tenants:
            return tenant
        with self._lock:
            if len(self._labelled_tenants) < self.max_tenant_labels:
                self._labelled_tenants.add(tenant)
                return tenant
        return OTHER_TENANTS_LABEL

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
