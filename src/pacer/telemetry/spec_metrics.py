"""/metrics series of speculative decoding with vLLM's names (`vllm:spec_decode_num_drafts`, ...;
`pacer_spec_decode_*` with the default prefix), read from the engine's totals at scrape time.
Absent while speculation is off."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["SpecDecodeCollector"]

_COUNTERS = {
    "num_drafts": "Verification rows that carried drafts (one per request per drafting step).",
    "num_draft_tokens": "Drafted tokens verified.",
    "num_accepted_tokens": "Drafted tokens accepted.",
}


class SpecDecodeCollector:
    def __init__(self, engine: Any, name: Callable[[str], str], model_name: str) -> None:
        self.engine = engine
        self.name = name
        self.model_name = model_name

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        stats = self.engine.snapshot().spec_decode
        if stats is None:
            return
        for key, help_ in _COUNTERS.items():
            family = CounterMetricFamily(self.name(f"spec_decode_{key}"), help_, labels=["model_name"])
            family.add_metric([self.model_name], float(stats[key]))
            yield family
        per_pos = CounterMetricFamily(self.name("spec_decode_num_accepted_tokens_per_pos"),
                                      "Accepted drafted tokens by position in the draft (0 = first).",
                                      labels=["model_name", "position"])
        for pos, n in enumerate(stats["accepted_per_pos"]):
            per_pos.add_metric([self.model_name, str(pos)], float(n))
        yield per_pos
