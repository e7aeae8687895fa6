"""/metrics series read at scrape time from the engine snapshot the engine loop publishes after each
step (`EngineLoop.state`): the scrape runs on the event loop and never touches the engine, which
its own thread is mutating. Three families, each absent or zero until its feature runs:

- speculative decoding with vLLM's names (`vllm:spec_decode_num_drafts`, ...; `pacer_spec_decode_*`
  with the default prefix), absent while speculation is off;
- the KV tiers (device, host, disk): blocks, usage, hit tokens, promotions, demotions and bytes moved,
  each labelled by tier;
- structured outputs: compilations, cache hits, timeouts, errors, compile seconds, mask compute and
  wait seconds, and the requests waiting for their grammar;
- session retention (agent sessions): retained blocks, retention hit tokens, windows opened,
  returned, expired, released and capped, and retained blocks demoted under pressure;
- fair share: each tenant's service in cost units, its share of all service and its deficit (how
  far its counter runs ahead of the least served waiting tenant), under the capped `tenant` label;
- exact prefill dedup: steps requests sat out for another's prefill, the requests, and the
  prompt tokens they then read from the cache;
- segment reuse: the segment store's segments and blocks, segments stored, evicted, demoted to the
  host tier and promoted back, fills out of
  the store (hits), the tokens they reused and the reused segments' tokens recomputed; absent while
  segment reuse is off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pacer.engine.stats import EngineSnapshot

__all__ = ["SpecDecodeCollector", "KVTierCollector", "StructuredOutputsCollector", "SessionRetentionCollector",
           "TenantServiceCollector", "PrefillDedupCollector", "SegmentReuseCollector", "SnapshotSource"]

SnapshotSource = Callable[[], "EngineSnapshot"]

_SPEC_COUNTERS = {
    "num_drafts": "Verification rows that carried drafts (one per request per drafting step).",
    "num_draft_tokens": "Drafted tokens verified.",
    "num_accepted_tokens": "Drafted tokens accepted.",
}
_TIER_GAUGES = {
    "blocks": "KV blocks the tier holds room for (disk: block files).",
    "usage_perc": "Fraction of the tier's blocks in use, 0..1.",
}
_TIER_COUNTERS = {   # series name -> (help, the tier stat it reads)
    "hit_tokens": ("Prompt tokens served from the tier (the device: matched in place; host: promoted).",
                   "hit_tokens"),
    "promotions": ("Blocks copied from this tier up to the device on a prefix match (disk: read back "
                   "into the host tier at start-up).", "promotions"),
    "demotions": ("Blocks copied into this tier from a faster one (disk: block files written).", "demotions"),
    "io_errors": ("Block file writes that failed (disk tier: ENOSPC, EACCES, ...; the tier paused itself and "
                  "requests carried on without it).", "io_errors"),
}
_STRUCTURED_COUNTERS = {
    "compilations": "Grammars compiled (cache misses).",
    "cache_hits": "Constrained requests whose grammar came from the cache (or a compile in flight).",
    "timeouts": "Grammar compiles past --structured-outputs-timeout (their requests got a 400).",
    "errors": "Constraints that failed to compile (invalid or unsupported).",
    "compile_seconds": "Wall time of finished grammar compiles.",
    "mask_compute_seconds": "Time the mask thread spent computing token masks.",
    "mask_wait_seconds": "Time steps waited for token masks after their forward.",
}


_RETENTION_SERIES = {   # RetentionStats field -> help; retained_blocks is a gauge, the rest counters
    "retained_blocks": "KV blocks under open session retention windows (agent turns whose tool is running).",
    "windows_opened": "Retention windows opened (finished turns of named sessions).",
    "hit_tokens": "Prompt tokens a session's next turn found in its open retention window.",
    "returns": "Retention windows closed by their session's next turn.",
    "expiries": "Retention windows closed by their deadline (the tool did not come back in time).",
    "releases": "Retention windows closed by a kv_retention release hint.",
    "answered": "Retention windows closed because the chat turn answered instead of calling a tool.",
    "capped": "Retention windows closed or refused to respect --session-retention-max-blocks.",
    "demoted_blocks": "Retained blocks eviction took under pressure (demoted to the host tier when there is one).",
}


class _SnapshotCollector:
    def __init__(self, state: SnapshotSource, name: Callable[[str], str], model_name: str) -> None:
        self.state = state
        self.name = name
        self.model_name = model_name


class SpecDecodeCollector(_SnapshotCollector):
    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        stats = self.state().spec_decode
        if stats is None:
            return
        for key, help_ in _SPEC_COUNTERS.items():
            family = CounterMetricFamily(self.name(f"spec_decode_{key}"), help_, labels=["model_name"])
            family.add_metric([self.model_name], float(stats[key]))
            yield family
        per_pos = CounterMetricFamily(self.name("spec_decode_num_accepted_tokens_per_pos"),
                                      "Accepted drafted tokens by position in the draft (0 = first).",
                                      labels=["model_name", "position"])
        for pos, n in enumerate(stats["accepted_per_pos"]):
            per_pos.add_metric([self.model_name, str(pos)], float(n))
        yield per_pos


class KVTierCollector(_SnapshotCollector):
    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        tiers = self.state().tiers
        for key, help_ in _TIER_GAUGES.items():
            gauge = GaugeMetricFamily(self.name(f"kv_tier_{key}"), help_, labels=["model_name", "tier"])
            stat = "usage" if key == "usage_perc" else key
            for tier, stats in tiers.items():
                gauge.add_metric([self.model_name, tier], float(stats.get(stat, 0)))
            yield gauge
        for key, (help_, stat) in _TIER_COUNTERS.items():
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


class StructuredOutputsCollector(_SnapshotCollector):
    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.state()
        for key, help_ in _STRUCTURED_COUNTERS.items():
            family = CounterMetricFamily(self.name(f"structured_outputs_{key}"), help_, labels=["model_name"])
            family.add_metric([self.model_name], float(snap.structured.get(key, 0)))
            yield family
        waiting = GaugeMetricFamily(self.name("num_requests_waiting_for_grammar"),
                                    "Requests whose grammar is compiling (no slot, no KV held).",
                                    labels=["model_name"])
        waiting.add_metric([self.model_name], float(snap.num_waiting_for_grammar))
        yield waiting


class SessionRetentionCollector(_SnapshotCollector):
    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.state().retention
        for key, help_ in _RETENTION_SERIES.items():
            family: Any = (GaugeMetricFamily if key == "retained_blocks" else CounterMetricFamily)(
                self.name(f"session_retention_{key}"), help_, labels=["model_name"])
            family.add_metric([self.model_name], float(stats.get(key, 0)))
            yield family


class TenantServiceCollector(_SnapshotCollector):
    """Per-tenant service (`EngineSnapshot.tenants`), labelled through `tenant_label`
    (`ServingMetrics.tenant_label`: tenants past the label cap are summed under `other`, the
    deficit being the largest of theirs)."""

    def __init__(self, state: SnapshotSource, name: Callable[[str], str], model_name: str,
                 tenant_label: Callable[[str], str]) -> None:
        super().__init__(state, name, model_name)
        self.tenant_label = tenant_label

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        rows: dict[str, dict[str, float]] = {}
        for tenant, row in self.state().tenants.items():
            acc = rows.setdefault(self.tenant_label(tenant), {"service": 0.0, "share": 0.0, "deficit": 0.0})
            acc["service"] += row["service"]
            acc["share"] += row["share"]
            acc["deficit"] = max(acc["deficit"], row["deficit"])
        labels = ["model_name", "tenant"]
        service = CounterMetricFamily(self.name("tenant_service_units"), "Service each tenant received, in fair-share "
                                      "cost units (computed prompt, cached prompt and decoded tokens at their "
                                      "--fair-cost-* prices).", labels=labels)
        share = GaugeMetricFamily(self.name("tenant_service_share"), "Each tenant's fraction of all service, 0..1.",
                                  labels=labels)
        deficit = GaugeMetricFamily(self.name("tenant_service_deficit"), "How far the tenant's service counter "
                                    "(cost units / weight) runs ahead of the least served waiting tenant's (0: "
                                    "nothing waiting, or it is the least served).", labels=labels)
        for label, acc in sorted(rows.items()):
            service.add_metric([self.model_name, label], acc["service"])
            share.add_metric([self.model_name, label], acc["share"])
            deficit.add_metric([self.model_name, label], acc["deficit"])
        yield from (service, share, deficit)


_DEDUP_SERIES = {   # DedupStats field -> help (counters)
    "deferrals": "Steps waiting requests sat out because another request was computing their next prompt block.",
    "deferred_requests": "Requests that waited for another's prefill at least once (exact dedup).",
    "shared_tokens": "Prompt tokens those requests then read from the cache instead of computing them.",
}


class PrefillDedupCollector(_SnapshotCollector):
    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        stats = self.state().prefill_dedup
        for key, help_ in _DEDUP_SERIES.items():
            family = CounterMetricFamily(self.name(f"prefill_dedup_{key}"), help_, labels=["model_name"])
            family.add_metric([self.model_name], float(stats.get(key, 0)))
            yield family


_SEGMENT_SERIES = {   # series -> (help, the snapshot's `segments` key, gauge?)
    "segment_store_segments": ("Segments the segment store holds (segment reuse).", "segments", True),
    "segment_store_blocks": ("KV blocks the segment store holds (evictable unless a fill is reading them).",
                             "blocks", True),
    "segment_store_stored": ("Segments stored (their KV copied into the store after a request computed them).",
                             "stored", False),
    "segment_store_evictions": ("Segments evicted from the store (least recently used first).", "evicted", False),
    "segment_store_demotions": ("Evicted segments the host tier kept whole (--kv-offloading-size).", "demoted", False),
    "segment_store_promotions": ("Segments copied back from the host tier into the store on a look-up.", "promoted",
                                 False),
    "segment_reuse_hits": ("Fills out of the segment store (a request took a stored segment's KV).", "reuses", False),
    "segment_reuse_reused_tokens": ("Prompt tokens filled from stored segments instead of computed.",
                                    "reused_tokens", False),
    "segment_reuse_recomputed_tokens": ("Of the reused segments, the tokens computed with the real context before "
                                        "each fill (--segment-recompute).", "recomputed_tokens", False),
}


class SegmentReuseCollector(_SnapshotCollector):
    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.state().segments
        if not stats:
            return
        for series, (help_, key, gauge) in _SEGMENT_SERIES.items():
            family: Any = (GaugeMetricFamily if gauge else CounterMetricFamily)(self.name(series), help_,
                                                                                labels=["model_name"])
            family.add_metric([self.model_name], float(stats.get(key, 0)))
            yield family
