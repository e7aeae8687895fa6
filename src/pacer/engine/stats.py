"""What the outside world may read of an engine: one `StepStats` per step that ran, and one
`EngineSnapshot` of its state on demand (`Engine.snapshot()`).

The server (`/metrics`, `/debug/state`, from the snapshot its engine loop publishes after each
step), `pacer bench` and the simulator's reports read these records, never the scheduler or the KV manager: the
engine stays free to change inside. Both are read-only: the snapshot frozen, the step record by
convention (built every step, where a frozen init cost ~5x a plain one); counters are monotonic totals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pacer.kv.tiers.offload import tier_stats

if TYPE_CHECKING:
    from pacer.kv.manager import KVCacheManager
    from pacer.sched.contract import ModelOutput, SchedulerOutput
    from pacer.sched.scheduler import Scheduler

__all__ = ["StepStats", "EngineSnapshot", "snapshot_of", "step_stats_of"]


@dataclass(slots=True)   # not frozen (read-only by convention): one a step, and a frozen init cost ~4 us
class StepStats:
    step_id: int
    time: float                   # the engine clock when the step ended
    num_running: int
    num_waiting: int
    batch_size: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    kv_usage: float
    schedule_s: float
    prepare_s: float
    forward_s: float              # the executor's (simulated: the cost model's step time)
    sample_s: float
    update_s: float
    num_cached_tokens: int = 0    # prefix-cache hit tokens of the requests admitted this step
    num_swap_out_blocks: int = 0  # KV blocks copied to / from the CPU tier this step
    num_swap_in_blocks: int = 0
    token_budget: int = 0                          # the budget the scheduler chose for this step
    budget_reason: str = "max_num_batched_tokens"  # and why (slo: the ITL target that set it)
    # speculative decoding this step (vLLM's spec_decode counters): rows that drafted, drafted and
    # accepted tokens, and accepted tokens by draft position
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    num_spec_rejections: int = 0   # drafting rows whose drafts did not all hold

    @property
    def total_s(self) -> float:
        return self.schedule_s + self.prepare_s + self.forward_s + self.sample_s + self.update_s

    @property
    def kind(self) -> str:
        """prefill, decode or mixed (both in one step)."""
        if self.num_prefill_tokens and self.num_decode_tokens:
            return "mixed"
        return "prefill" if self.num_prefill_tokens else "decode"


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The engine's state between two steps: requests, KV blocks, prefix-cache and swap counters."""

    num_running: int
    num_waiting: int
    num_steps: int                    # steps that ran (scheduled work)
    num_blocks: int
    num_free_blocks: int
    num_cached_blocks: int            # held by the prefix cache (some also by requests)
    num_evictable_blocks: int         # cached and held by no request
    num_available_blocks: int         # free plus evictable
    kv_usage: float                   # 1 - available / total
    capacity_tokens: int
    max_model_len: int
    prefix_caching: bool
    num_pinned_prefixes: int
    prefix_cache_queried_tokens: int  # tokens looked up in the prefix cache at admission
    prefix_cache_hit_tokens: int      # of those, served from the cache
    evicted_blocks: Mapping[str, int]  # by reason: capacity, ttl, quota
    num_recompute_preemptions: int
    num_swap_preemptions: int
    swap_out_requests: int
    swap_out_blocks: int
    swap_in_requests: int
    swap_in_blocks: int
    swap_fallbacks: int               # swap preemptions that had to recompute (tier full)
    kv_block_bytes: int               # 0: the executor does not say
    num_cpu_blocks: int
    num_cpu_blocks_used: int
    tiers: Mapping[str, Mapping[str, float]]   # per tier (device, host, disk): blocks, usage, hits, promotions,
    #                                            demotions, bytes in / out
    spec_decode: Mapping[str, Any] | None = None   # speculation totals (vLLM's counters); None when off
    num_waiting_for_grammar: int = 0  # of num_waiting, those whose grammar is compiling (no seat, no KV)
    structured: Mapping[str, float] = field(default_factory=dict)   # structured-output counters ({} before any)
    retention: Mapping[str, int] = field(default_factory=dict)   # session retention (pacer.kv.retention.RetentionStats)
    prefill_dedup: Mapping[str, int] = field(default_factory=dict)   # exact dedup (pacer.sched.dedup.DedupStats); {} off
    tenants: Mapping[str, Mapping[str, float]] = field(default_factory=dict)   # service per tenant (Scheduler.tenant_report)
    segments: Mapping[str, int] = field(default_factory=dict)   # the segment store (`segment_stats`); {} off

    @property
    def num_preemptions(self) -> int:
        return self.num_recompute_preemptions + self.num_swap_preemptions

    @property
    def prefix_cache_hit_rate(self) -> float:
        q = self.prefix_cache_queried_tokens
        return self.prefix_cache_hit_tokens / q if q else 0.0

    @property
    def swap_out_bytes(self) -> int:
        return self.swap_out_blocks * self.kv_block_bytes

    @property
    def swap_in_bytes(self) -> int:
        return self.swap_in_blocks * self.kv_block_bytes

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as plain JSON data, under the field names (the one spelling reports,
        `/debug/state` and tests read), with the derived counts beside them."""
        d = asdict(self)
        d["evicted_blocks"] = dict(self.evicted_blocks)
        d["tiers"] = {name: dict(t) for name, t in self.tiers.items()}
        d["structured"] = dict(self.structured)
        d["retention"] = dict(self.retention)
        d["prefill_dedup"] = dict(self.prefill_dedup)
        d["segments"] = dict(self.segments)
        d["tenants"] = {t: dict(row) for t, row in self.tenants.items()}
        for name in ("num_preemptions", "prefix_cache_hit_rate", "swap_out_bytes", "swap_in_bytes"):
            d[name] = getattr(self, name)
        return d


def step_stats_of(out: SchedulerOutput, result: ModelOutput, kv: KVCacheManager, sched: Scheduler, *, now: float,
                  sched_s: float, exec_s: float, update_s: float, cached_tokens: int,
                  spec_counts: Mapping[str, Any]) -> StepStats:
    """The record of one step that ran (`Engine.step`): what it scheduled, the state after it, and
    its wall times; the executor's time not in prepare, forward or sample counts as update.
    `cached_tokens`: prefix-cache hits since the last step; `spec_counts`: the speculation
    counters the step's verification took (empty without speculation)."""
    prepare, sample = result.prepare_s, result.sample_s
    forward = exec_s if result.forward_s is None else result.forward_s
    return StepStats(
        step_id=out.step_id, time=now, num_running=sched.num_running,
        num_waiting=sched.num_waiting, batch_size=len(out.scheduled),
        num_prefill_tokens=out.num_prefill_tokens, num_decode_tokens=out.num_decode_tokens,
        num_preempted=len(out.preempted_ids), kv_usage=kv.usage, schedule_s=sched_s,
        prepare_s=prepare, forward_s=forward, sample_s=sample,
        update_s=update_s + max(0.0, exec_s - prepare - forward - sample),
        num_cached_tokens=cached_tokens,
        num_swap_out_blocks=len(out.swap_out), num_swap_in_blocks=len(out.swap_in),
        token_budget=out.token_budget, budget_reason=out.budget_reason, **spec_counts,
    )


def snapshot_of(kv: KVCacheManager, sched: Scheduler, *, num_steps: int, max_model_len: int,
                block_bytes: int, io_tiers: Mapping[str, Mapping[str, float]] | None = None) -> EngineSnapshot:
    """The snapshot of an engine's KV manager and scheduler (`Engine.snapshot()`); `io_tiers`:
    the rows of `tiers` the KV tier hooks report, by name (the disk tier's "disk")."""
    st = kv.stats
    return EngineSnapshot(
        num_running=sched.num_running, num_waiting=sched.num_waiting, num_steps=num_steps,
        num_blocks=kv.num_blocks, num_free_blocks=kv.pool.num_free_blocks,
        num_cached_blocks=kv.num_cached_blocks,
        num_evictable_blocks=kv.num_evictable_blocks,
        num_available_blocks=kv.num_available_blocks(), kv_usage=kv.usage,
        capacity_tokens=kv.capacity_tokens, max_model_len=max_model_len,
        prefix_caching=kv.prefix_caching, num_pinned_prefixes=len(kv.pins),
        prefix_cache_queried_tokens=st.queried_tokens, prefix_cache_hit_tokens=st.hit_tokens,
        evicted_blocks=dict(st.evicted_blocks),
        num_recompute_preemptions=sched.num_preemptions - sched.num_swap_preemptions,
        num_swap_preemptions=sched.num_swap_preemptions,
        swap_out_requests=st.swap_out_requests, swap_out_blocks=st.swap_out_blocks,
        swap_in_requests=st.swap_in_requests, swap_in_blocks=st.swap_in_blocks,
        swap_fallbacks=st.swap_fallbacks, kv_block_bytes=block_bytes,
        num_cpu_blocks=kv.swap.num_blocks, num_cpu_blocks_used=kv.swap.num_used_blocks,
        tiers=tier_stats(kv.host_tier, kv.num_blocks, kv.num_cached_blocks, st.hit_tokens, block_bytes, kv.usage)
        | {name: dict(row) for name, row in (io_tiers or {}).items()},
        spec_decode=sched.spec.stats.as_dict() if sched.spec is not None else None,
        num_waiting_for_grammar=sched.num_waiting_for_grammar, structured=sched.structured.stats(),
        retention=asdict(kv.retention.stats),
        prefill_dedup={} if sched.dedup is None else asdict(sched.dedup.stats), tenants=sched.tenant_report(),
        segments=segment_stats(kv),
    )


def segment_stats(kv: KVCacheManager) -> dict[str, int]:
    """The segment store's size (segments, blocks) and its counters (`SegmentStats`); {} when off."""
    store = kv.segments
    if not store.enabled:
        return {}
    return {"segments": len(store), "blocks": store.num_cached_blocks, **asdict(store.stats)}
