"""Per class and overall: counts, length mean and CV, latency percentiles, the decomposition,
and the bottleneck named with its evidence.

Naming (the seed's four problems, each with a different fix):

1. `preemption` when preemption loss is >= 5% of the class's mean e2e: KV pressure comes first,
   because it also holds admissions back (queue) and recomputes work.
2. Otherwise the part with the largest *excess* over the request alone on the hardware
   (`Baseline`): queue wait and preemption loss are all excess; prefill beyond an isolated
   prefill of the uncached prompt; decode beyond batch-1 decode steps. Queue wait and decode
   excess spent while another request's long prefill ran (prompt >= 4x the median and >= 256
   tokens, from the source's timestamps) count as `prefill`: the head-of-line block and the
   stall are caused by that prefill, and its fixes (chunk size, long_prefill_token_threshold)
   are prefill fixes.
3. With `--slo`, a class that meets it is `none`; one that misses only TTFT is named among
   queue / prefill / preemption, only ITL/TPOT among decode / prefill / preemption. Without an
   SLO, a top excess under 10% of e2e is `none`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pacer.diagnose.baseline import Baseline
from pacer.diagnose.decompose import PARTS, Parts, decompose_all, mean_parts
from pacer.diagnose.records import Record, Source
from pacer.diagnose.timeline import RunningTimeline, covered, long_prefills
from pacer.workload.report import Slo, SloSet, percentile

__all__ = ["ClassReport", "Context", "analyze", "class_report", "name_bottleneck", "OVERALL", "LATENCY_KEYS"]

OVERALL = "overall"
LATENCY_KEYS = ("queue_wait", "ttft", "itl", "tpot", "e2e")
PREEMPTION_SHARE = 0.05
NONE_SHARE = 0.10


@dataclass(slots=True)
class ClassReport:
    name: str
    count: int
    lengths: dict[str, float]
    latency: dict[str, dict[str, float | None]]
    decomposition: Parts
    excess: dict[str, float]
    bottleneck: str = "none"
    evidence: list[str] = field(default_factory=list)
    recommendations: list[Any] = field(default_factory=list)
    slo_attainment: float | None = None
    preempted_requests: int = 0
    num_preemptions: int = 0
    extra: dict[str, float] = field(default_factory=dict)   # rates and the like, for recommendations

    @property
    def e2e_mean(self) -> float:
        return self.decomposition.total

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "bottleneck": self.bottleneck,
                "decomposition": self.decomposition.as_dict(),
                "decomposition_share": {k: _share(getattr(self.decomposition, k), self.e2e_mean) for k in PARTS},
                "preemption_estimated": self.decomposition.preemption_estimated,
                "excess": self.excess, "evidence": self.evidence,
                "recommendations": [r.as_dict() for r in self.recommendations],
                "lengths": self.lengths, "latency": self.latency, "slo_attainment": self.slo_attainment,
                "preempted_requests": self.preempted_requests, "num_preemptions": self.num_preemptions,
                **({"rates": self.extra} if self.extra else {})}


def _share(part: float, total: float) -> float:
    return part / total if total > 0 else 0.0


def _cv(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = statistics.fmean(xs)
    return statistics.pstdev(xs) / m if m > 0 else 0.0


def _pcts(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"p{q}": percentile(values, q) for q in (50, 90, 95, 99)}
    out["mean"] = statistics.fmean(values) if values else None
    return out


def _latencies(records: Sequence[Record], parts: Sequence[Parts], has_queue: bool) -> dict[str, dict[str, Any]]:
    itl: list[float] = []
    for r in records:
        if r.itl is not None:
            itl.extend(r.itl)
        elif r.itl_mean is not None:
            itl.append(r.itl_mean)   # a request log keeps each request's mean gap (and its max)
    return {
        "queue_wait": _pcts([r.queue_wait for r in records if r.queue_wait is not None]) if has_queue else {},
        "ttft": _pcts([r.ttft for r in records]),
        "itl": _pcts(itl),
        "itl_max": _pcts([r.itl_max for r in records if r.itl_max is not None]),
        "tpot": _pcts([r.tpot for r in records if r.tpot is not None]),
        "e2e": _pcts([r.e2e for r in records]),
        "prefill": _pcts([p.prefill for p in parts]),
        "decode": _pcts([p.decode for p in parts]),
    }


# ---------------------------------------------------------------- excess over the request alone


@dataclass(frozen=True, slots=True)
class Context:
    """What every class report of one source shares."""

    records: Sequence[Record]
    parts: Sequence[Parts]
    base: Baseline
    has_queue: bool
    long: Sequence[tuple[float, float, int]] = ()
    running: RunningTimeline | None = None
    max_num_seqs: int | None = None      # today's limit: queue wait below it, with preemptions, is KV-held


def _excess(ctx: Context, indices: Sequence[int]) -> tuple[dict[str, float], dict[str, float]]:
    """Mean excess per part over the request alone, and the mean seconds re-attributed: queue wait
    and decode excess behind other requests' long prefills (`prefill`), queue wait while fewer
    than max_num_seqs ran in a source that preempts (KV held admissions: `preemption`)."""
    tot = dict.fromkeys(PARTS, 0.0)
    moved = {"queue_behind_prefill": 0.0, "decode_behind_prefill": 0.0, "queue_held_by_kv": 0.0}
    kv_bound = ctx.running is not None and ctx.max_num_seqs is not None and any(
        ctx.records[i].preemptions for i in range(len(ctx.records)))
    for i in indices:
        r, p = ctx.records[i], ctx.parts[i]
        pre = max(0.0, p.prefill - ctx.base.prefill_s(r.uncached_prompt_tokens))
        dec = max(0.0, p.decode - ctx.base.decode_s(r.prompt_tokens, r.output_tokens))
        q_pf = d_pf = q_kv = 0.0
        if r.arrival is not None and r.scheduled_at is not None:
            if ctx.long:
                q_pf = p.queue * covered(r.arrival, r.scheduled_at, ctx.long, i)
            if kv_bound and ctx.running is not None and ctx.max_num_seqs is not None:
                q_kv = (p.queue - q_pf) * ctx.running.share_below(r.arrival, r.scheduled_at, ctx.max_num_seqs)
        if ctx.long and r.first_token_at is not None and r.finished_at is not None:
            d_pf = dec * covered(r.first_token_at, r.finished_at, ctx.long, i)
        moved["queue_behind_prefill"] += q_pf
        moved["decode_behind_prefill"] += d_pf
        moved["queue_held_by_kv"] += q_kv
        tot["queue"] += p.queue - q_pf - q_kv
        tot["prefill"] += pre + q_pf + d_pf
        tot["decode"] += dec - d_pf
        tot["preemption"] += p.preemption + q_kv
    n = max(1, len(indices))
    return {k: v / n for k, v in tot.items()}, {k: v / n for k, v in moved.items()}


# ---------------------------------------------------------------- naming


def _missed(records: Sequence[Record], slo: Slo, target: float) -> list[str]:
    """SLO metrics missed by more than (1 - target) of the requests."""
    checks = {"ttft": lambda r: r.ttft, "tpot": lambda r: r.tpot, "e2e": lambda r: r.e2e,
              "itl": lambda r: (percentile(list(r.itl), 99) if r.itl else r.itl_max)}
    out = []
    for metric, get in checks.items():
        limit = getattr(slo, metric)
        if limit is None:
            continue
        values = [get(r) for r in records]
        over = sum(1 for v in values if v is not None and v > limit)
        if records and over / len(records) > 1 - target:
            out.append(metric)
    return out


def name_bottleneck(rep: ClassReport, missed: list[str] | None) -> tuple[str, str]:
    """(bottleneck, why) from the decomposition and the excess; `missed` None: no SLO given."""
    e2e = rep.e2e_mean
    if missed is not None and not missed:
        return "none", "meets the SLO"
    kv = rep.excess["preemption"]
    if kv >= PREEMPTION_SHARE * e2e and kv > 0:
        return "preemption", (f"KV pressure (preemption loss, and queue wait while KV held admissions) is "
                              f"{_share(kv, e2e):.0%} of e2e (>= {PREEMPTION_SHARE:.0%})")
    allowed: tuple[str, ...] = PARTS
    if missed is not None and set(missed) <= {"ttft"}:
        allowed = ("queue", "prefill", "preemption")
    elif missed is not None and set(missed) <= {"tpot", "itl"}:
        allowed = ("decode", "prefill", "preemption")
    top = max(allowed, key=lambda k: rep.excess[k])
    if missed is None and rep.excess[top] < NONE_SHARE * e2e:
        return "none", f"no part's excess reaches {NONE_SHARE:.0%} of e2e"
    why = f"largest excess over the request alone: {top} {rep.excess[top]:.3f} s ({_share(rep.excess[top], e2e):.0%} of e2e)"
    if missed:
        why += f"; misses {', '.join(missed)}"
    return top, why


def class_report(name: str, indices: Sequence[int], ctx: Context, slo: Slo | None, target: float) -> ClassReport:
    rs = [ctx.records[i] for i in indices]
    ps = [ctx.parts[i] for i in indices]
    mean = mean_parts(ps)
    excess, moved = _excess(ctx, indices)
    prompts = [float(r.prompt_tokens) for r in rs]
    outputs = [float(r.output_tokens) for r in rs]
    rep = ClassReport(
        name=name, count=len(rs),
        lengths={"prompt_mean": statistics.fmean(prompts) if rs else 0.0, "prompt_cv": _cv(prompts),
                 "prompt_p90": percentile(prompts, 90) or 0.0,
                 "output_mean": statistics.fmean(outputs) if rs else 0.0, "output_cv": _cv(outputs),
                 "cached_share": _share(sum(r.cached_tokens for r in rs), sum(prompts))},
        latency=_latencies(rs, ps, ctx.has_queue), decomposition=mean, excess=excess,
        preempted_requests=sum(1 for r in rs if r.preemptions), num_preemptions=sum(r.preemptions or 0 for r in rs))
    missed = None
    if slo is not None and not slo.is_empty():
        missed = _missed(rs, slo, target)
        rep.slo_attainment = sum(1 for r in rs if not _missed([r], slo, 1.0)) / len(rs) if rs else None
    rep.bottleneck, why = name_bottleneck(rep, missed)
    rep.evidence = _evidence(rep, why, moved, ctx.base, len(ctx.long))
    rep.extra = _rates(rs)
    return rep


def _rates(rs: Sequence[Record]) -> dict[str, float]:
    times = sorted(r.arrival for r in rs if r.arrival is not None)
    if len(times) < 2 or times[-1] <= times[0]:
        return {}
    finish = max(r.finished_at or 0.0 for r in rs)
    return {"arrival_req_s": (len(times) - 1) / (times[-1] - times[0]),
            "completion_req_s": len(rs) / max(1e-9, finish - times[0]), "span_s": times[-1] - times[0]}


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _evidence(rep: ClassReport, why: str, moved: dict[str, float], base: Baseline, num_long: int) -> list[str]:
    d, e2e = rep.decomposition, rep.e2e_mean
    lat = rep.latency
    ev = [why,
          f"e2e mean {_fmt(e2e)} = queue {_fmt(d.queue)} ({_share(d.queue, e2e):.0%}) + prefill {_fmt(d.prefill)} "
          f"({_share(d.prefill, e2e):.0%}) + decode {_fmt(d.decode)} ({_share(d.decode, e2e):.0%}) + preemption "
          f"{_fmt(d.preemption)} ({_share(d.preemption, e2e):.0%})",
          "excess over " + base.description + ": " + ", ".join(f"{k} {_fmt(v)}" for k, v in rep.excess.items())]
    b = rep.bottleneck
    if b == "queue":
        ev.append(f"queue wait p50 {_fmt(lat['queue_wait'].get('p50'))}, p99 {_fmt(lat['queue_wait'].get('p99'))}")
    elif b == "prefill":
        ev.append(f"prompt mean {rep.lengths['prompt_mean']:.0f} tokens (CV {rep.lengths['prompt_cv']:.2f}, "
                  f"p90 {rep.lengths['prompt_p90']:.0f}), TTFT p99 {_fmt(lat['ttft'].get('p99'))}, "
                  f"prefill alone {_fmt(base.prefill_s(int(rep.lengths['prompt_mean'])))}")
        if num_long:
            ev.append(f"{num_long} long prefills in the source: {_fmt(moved.get('queue_behind_prefill'))} of queue "
                      f"wait and {_fmt(moved.get('decode_behind_prefill'))} of decode excess per request spent "
                      "behind them (head-of-line block, ITL stalls)")
    elif b == "decode":
        mean_ctx = int(rep.lengths["prompt_mean"] + rep.lengths["output_mean"] / 2)
        ev.append(f"TPOT p50 {_fmt(lat['tpot'].get('p50'))}, p99 {_fmt(lat['tpot'].get('p99'))} vs "
                  f"{_fmt(base.tpot_s(mean_ctx))} alone; ITL max p99 {_fmt(lat['itl_max'].get('p99'))}")
    elif b == "preemption":
        est = " (estimated from the gaps: the source has only counts)" if d.preemption_estimated else " (measured)"
        ev.append(f"{rep.preempted_requests} of {rep.count} requests preempted ({rep.num_preemptions} preemptions); "
                  f"loss {_fmt(d.preemption)} per request{est}")
        if moved.get("queue_held_by_kv"):
            ev.append(f"{_fmt(moved['queue_held_by_kv'])} of queue wait per request passed while fewer than "
                      "max_num_seqs ran in an engine that preempts: KV held admissions back")
    if rep.slo_attainment is not None:
        ev.append(f"SLO met by {rep.slo_attainment:.0%} of requests")
    return ev


def analyze(source: Source, base: Baseline, slo: SloSet | None = None, target: float = 0.9,
            max_num_seqs: int | None = None) -> dict[str, ClassReport]:
    """Class name -> report (per class where the source has classes), plus `overall`.
    `max_num_seqs`: today's limit, to tell queue wait held by KV from queue wait at the limit."""
    records = source.records
    if not records:
        raise ValueError(f"{source.name}: no finished requests to diagnose ({source.num_skipped} skipped)")
    ctx = Context(records, decompose_all(records), base, source.has_queue_wait, long_prefills(records),
                  RunningTimeline(records) if source.has_times and source.has_queue_wait else None, max_num_seqs)
    out: dict[str, ClassReport] = {}
    slo = slo or SloSet()
    for name in source.classes():
        idx = [i for i, r in enumerate(records) if r.request_class == name]
        out[name] = class_report(name, idx, ctx, slo.for_class(name), target)
    overall = class_report(OVERALL, range(len(records)), ctx, slo.default, target)
    if not slo.is_empty():   # overall attainment: each request against its own class's SLO
        met = sum(1 for r in records if not _missed([r], slo.for_class(r.request_class), 1.0))
        overall.slo_attainment = met / len(records)
    out[OVERALL] = overall
    return out
