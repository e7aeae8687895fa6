"""/metrics series of the KV tiers (device, host, disk), read from the engine's per-tier stats
(`Engine.cache_stats()["tiers"]`) at scrape time: blocks, usage, hit tokens, promotions,
demotions and bytes moved, each labelled by tier."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["KVTierCollector"]

_GAUGES = {
    "blocks": "KV blocks the tier holds room for (disk: block files).",
    "usage_perc": "Fraction of the tier's blocks in use, 0..1.",
}
_COUNTERS = {   # series name -> (help, the tier stat it reads)
    "hit_tokens": ("Prompt tokens served from the tier (the device: matched in place; host: promoted).",
                   "hit_tokens"),
    "promotions": ("Blocks copied from this tier up to the device on a prefix match (disk: read back "
                   "into the host tier at start-up).", "promotions"),
    "demotions": ("Blocks copied into this tier from a faster one (disk: block files written).", "demotions"),
}


class KVTierCollector:
    def __init__(self, engine: Any, name: Callable[[str], str], model_name: str) -> None:
        self.engine = engine
        self.name = name
        self.model_name = model_name

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        tiers: dict[str, dict[str, float]] = self.engine.cache_stats()["tiers"]
        for key, help_ in _GAUGES.items():
            gauge = GaugeMetricFamily(self.name(f"kv_tier_{key}"), help_, labels=["model_name", "tier"])
            stat = "usage" if key == "usage_perc" else key
            for tier, stats in tiers.items():
                gauge.add_metric([self.model_name, tier], float(stats.get(stat, 0)))
            yield gauge
        for key, (help_, stat) in _COUNTERS.items():
            counter = CounterMetricFamily(self.name(f"kv_tier_{key}"), help_, labels=["model_name", "tier"])
            for tier, stats in tiers.items():
                counter.add_metric([self.model_name, tier], float(stats.get(stat, 0)))
            yield counter
        moved = CounterMetricFamily(self.name("kv_tier_bytes"), "KV bytes copied into (direction=in) and out of "
                                    "(direction=out) each slower tier.", labels=["model_name", "tier", "direction"])
        for tier, stats in tiers.items():
            if "bytes_in" in stats:
                moved.add_metric([self.model_name, tier, "in"], float(stats["bytes_in"]))
                moved.add_metric([self.model_name, tier, "out"], float(stats["bytes_out"]))
        yield moved
