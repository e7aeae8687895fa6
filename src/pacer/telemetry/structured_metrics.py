"""/metrics series of structured outputs, read from the engine's counters at scrape time:
compilations, cache hits, timeouts, errors, compile seconds, mask compute and mask wait
seconds, and the requests waiting for their grammar."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["StructuredOutputsCollector"]

_COUNTERS = {
    "compilations": "Grammars compiled (cache misses).",
    "cache_hits": "Constrained requests whose grammar came from the cache (or a compile in flight).",
    "timeouts": "Grammar compiles past --structured-outputs-timeout (their requests got a 400).",
    "errors": "Constraints that failed to compile (invalid or unsupported).",
    "compile_seconds": "Wall time of finished grammar compiles.",
    "mask_compute_seconds": "Time the mask thread spent computing token masks.",
    "mask_wait_seconds": "Time steps waited for token masks after their forward.",
}


class StructuredOutputsCollector:
    def __init__(self, engine: Any, name: Callable[[str], str], model_name: str) -> None:
        self.engine = engine
        self.name = name
        self.model_name = model_name

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.engine.structured_stats()
        for key, help_ in _COUNTERS.items():
            family = CounterMetricFamily(self.name(f"structured_outputs_{key}"), help_, labels=["model_name"])
            family.add_metric([self.model_name], float(stats.get(key, 0)))
            yield family
        waiting = GaugeMetricFamily(self.name("num_requests_waiting_for_grammar"),
                                    "Requests whose grammar is compiling (no slot, no KV held).",
                                    labels=["model_name"])
        waiting.add_metric([self.model_name], float(self.engine.num_waiting_for_grammar))
        yield waiting
