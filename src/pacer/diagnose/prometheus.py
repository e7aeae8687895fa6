"""A live Prometheus endpoint of pacer or vLLM (`--metrics-url URL --window 60s`): the histogram
and counter deltas between two scrapes `window` apart, turned into the same class reports.

Series read (pacer's `pacer_<name>` or vLLM's `vllm:<name>`): `time_to_first_token_seconds`,
`inter_token_latency_seconds` (vLLM before 0.10: `time_per_output_token_seconds`),
`request_time_per_output_token_seconds`, `e2e_request_latency_seconds`,
`request_queue_time_seconds`, `request_prefill_time_seconds`, `request_decode_time_seconds`,
`request_prompt_tokens`, `request_generation_tokens`, `num_preemptions_total`. pacer's
histograms carry a `class` label, so its endpoint is reported per class; vLLM's are not.
Percentiles are interpolated inside buckets (as `histogram_quantile` does), length CVs are
estimated from bucket midpoints, and preemption loss, which only exists as a count, is estimated
from the long ITL gaps (each preemption leaves one), all said so in the evidence.
"""

from __future__ import annotations

import math
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from pacer.diagnose.analysis import OVERALL, ClassReport, _evidence, name_bottleneck
from pacer.diagnose.baseline import Baseline
from pacer.diagnose.decompose import Parts
from pacer.diagnose.records import Record, Source
from pacer.workload.report import Slo, SloSet

__all__ = ["scrape", "parse_samples", "Histogram", "window_deltas", "analyze_metrics", "parse_window"]

HISTS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "time_per_output_token_seconds",
         "request_time_per_output_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
         "request_prefill_time_seconds", "request_decode_time_seconds", "request_prompt_tokens",
         "request_generation_tokens")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_window(text: str) -> float:
    from pacer.workload.report import parse_duration

    t = text.strip()
    if t.endswith("m") and not t.endswith("ms"):
        return float(t[:-1]) * 60
    value = parse_duration(t, "--window")
    if value <= 0:
        raise ValueError(f"--window must be > 0, got {text!r}")
    return value


def parse_samples(text: str) -> Samples:
    """Exposition text -> {(name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def scrape(url: str, timeout: float = 10.0) -> Samples:
    with urllib.request.urlopen(url, timeout=timeout) as resp:   # noqa: S310 - a user-given metrics URL
        return parse_samples(resp.read().decode("utf-8"))


@dataclass(slots=True)
class Histogram:
    buckets: list[tuple[float, float]] = field(default_factory=list)   # (upper bound, cumulative count)
    count: float = 0.0
    sum: float = 0.0

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank:
                if math.isinf(le):
                    return prev_le
                width = c - prev_c
                return prev_le + (le - prev_le) * ((rank - prev_c) / width if width > 0 else 1.0)
            prev_le, prev_c = le, c
        return prev_le

    def share_above(self, limit: float) -> float:
        """Fraction of observations above `limit` (interpolated inside its bucket)."""
        if self.count <= 0:
            return 0.0
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            if le >= limit:
                frac = 1.0 if math.isinf(le) else (limit - prev_le) / (le - prev_le) if le > prev_le else 1.0
                return max(0.0, 1.0 - (prev_c + (c - prev_c) * frac) / self.count)
            prev_le, prev_c = le, c
        return 0.0

    def cv(self) -> float:
        """From bucket midpoints (an estimate)."""
        if self.count <= 0:
            return 0.0
        pts, prev_le, prev_c = [], 0.0, 0.0
        for le, c in self.buckets:
            mid = prev_le * 1.5 if math.isinf(le) else (prev_le + le) / 2
            pts.append((mid, c - prev_c))
            prev_le, prev_c = le, c
        m = self.mean or 0.0
        var = sum(n * (x - m) ** 2 for x, n in pts) / self.count
        return math.sqrt(var) / m if m > 0 else 0.0

    def mean_above(self, limit: float) -> float:
        """Mean of the observations above `limit` (spread evenly inside each bucket)."""
        tot = n_tot = 0.0
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            n = c - prev_c
            if le > limit and n > 0:
                lo = max(prev_le, limit)
                if math.isinf(le):
                    share, mid = 1.0, lo * 1.5
                else:
                    share, mid = (le - lo) / (le - prev_le), (lo + le) / 2
                tot += n * share * mid
                n_tot += n * share
            prev_le, prev_c = le, c
        return tot / n_tot if n_tot else 0.0


def _prefix(samples: Samples) -> str:
    names = {n for n, _ in samples}
    for p in ("vllm:", "pacer_"):
        if any(n.startswith(p + "e2e_request_latency_seconds") for n in names):
            return p
    raise ValueError("--metrics-url: no pacer_* or vllm:* latency histograms at that endpoint "
                     "(is it a pacer or vLLM /metrics?)")


def window_deltas(before: Samples, after: Samples) -> tuple[str, dict[str, dict[str, Histogram]], float]:
    """(prefix, histogram -> class -> delta histogram, preemptions delta). Classes: pacer's `class`
    label, else everything under `overall`."""
    prefix = _prefix(after)
    hists: dict[str, dict[str, Histogram]] = defaultdict(lambda: defaultdict(Histogram))
    buckets: dict[tuple[str, str], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    preempt = 0.0
    for (name, labels), value in after.items():
        if not name.startswith(prefix):
            continue
        base = name[len(prefix):]
        delta = value - before.get((name, labels), 0.0)
        lab = dict(labels)
        cls = lab.get("class", OVERALL)
        if base == "num_preemptions_total":
            preempt += delta
            continue
        for h in HISTS:
            if base == h + "_bucket":
                buckets[(h, cls)][float(lab["le"])] += delta
            elif base == h + "_count":
                hists[h][cls].count += delta
            elif base == h + "_sum":
                hists[h][cls].sum += delta
    for (h, cls), bs in buckets.items():
        hists[h][cls].buckets = sorted(bs.items())
    return prefix, {k: dict(v) for k, v in hists.items()}, preempt


def _class_report(name: str, get: Callable[[str], Histogram], preempt_share: float, base: Baseline,
                  slo: Slo | None, target: float) -> ClassReport | None:
    e2e = get("e2e_request_latency_seconds")
    if e2e.count <= 0:
        return None
    itl = get("inter_token_latency_seconds")
    if itl.count <= 0:
        itl = get("time_per_output_token_seconds")
    ttft, queue = get("time_to_first_token_seconds"), get("request_queue_time_seconds")
    prefill_h, decode_h = get("request_prefill_time_seconds"), get("request_decode_time_seconds")
    prompt, gen, tpot = get("request_prompt_tokens"), get("request_generation_tokens"), get("request_time_per_output_token_seconds")
    q = queue.mean or 0.0
    pre = prefill_h.mean if prefill_h.mean is not None else max(0.0, (ttft.mean or 0.0) - q)
    dec = decode_h.mean if decode_h.mean is not None else max(0.0, (e2e.mean or 0.0) - (ttft.mean or 0.0))
    med = itl.quantile(0.5) or 0.0
    stall = max(0.0, itl.mean_above(4 * med) - med) if med else 0.0
    loss = min(dec, preempt_share * stall / e2e.count) if e2e.count else 0.0
    parts = Parts(q, pre, dec - loss, loss, preemption_estimated=loss > 0)
    lengths: dict[str, float] = {
               "prompt_mean": prompt.mean or 0.0, "prompt_cv": prompt.cv(), "prompt_p90": prompt.quantile(0.9) or 0.0,
               "output_mean": gen.mean or 0.0, "output_cv": gen.cv(), "cached_share": 0.0}
    excess = {"queue": q, "prefill": max(0.0, pre - base.prefill_s(int(lengths["prompt_mean"]))),
              "decode": max(0.0, dec - loss - base.decode_s(int(lengths["prompt_mean"]), int(lengths["output_mean"]))),
              "preemption": loss}
    latency: dict[str, dict[str, float | None]] = {k: {"p50": h.quantile(0.5), "p90": h.quantile(0.9), "p95": h.quantile(0.95), "p99": h.quantile(0.99),
                   "mean": h.mean} for k, h in (("queue_wait", queue), ("ttft", ttft), ("itl", itl), ("tpot", tpot),
                                                ("e2e", e2e), ("prefill", prefill_h), ("decode", decode_h))}
    latency["itl_max"] = {}
    rep = ClassReport(name, int(round(e2e.count)), lengths, latency, parts, excess,
                      num_preemptions=int(round(preempt_share)))
    missed = None
    if slo is not None and not slo.is_empty():
        missed = [m for m, h in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e), ("itl", itl))
                  if getattr(slo, m) is not None and h.share_above(getattr(slo, m)) > 1 - target]
        shares = [h.share_above(getattr(slo, m)) for m, h in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e))
                  if getattr(slo, m) is not None]
        rep.slo_attainment = 1.0 - max(shares) if shares else None
    rep.bottleneck, why = name_bottleneck(rep, missed)
    rep.evidence = _evidence(rep, why, {}, base, 0)
    rep.evidence.append("from Prometheus histograms: percentiles interpolated in buckets, length CV from bucket "
                        "midpoints" + (f"; preemption loss estimated from {preempt_share:.1f} preemptions x the "
                                       f"long ITL gaps ({stall * 1000:.0f} ms each)" if preempt_share else ""))
    return rep


def analyze_metrics(before: Samples, after: Samples, window_s: float, base: Baseline, slo: SloSet | None = None,
                    target: float = 0.9) -> tuple[dict[str, ClassReport], str]:
    """Class reports from two scrapes; and a description of the source."""
    prefix, hists, preempt = window_deltas(before, after)
    slo = slo or SloSet()
    classes = sorted({c for per in hists.values() for c in per} - {OVERALL})

    def getter(cls: str | None) -> Callable[[str], Histogram]:
        def get(h: str) -> Histogram:
            per = hists.get(h, {})
            if cls is not None:
                return per.get(cls, Histogram())
            merged = Histogram()
            acc: dict[float, float] = defaultdict(float)
            for hh in per.values():
                merged.count += hh.count
                merged.sum += hh.sum
                for le, c in hh.buckets:
                    acc[le] += c
            merged.buckets = sorted(acc.items())
            return merged
        return get

    total_decode = sum(h.sum for h in hists.get("request_decode_time_seconds", {}).values()) or 1.0
    out: dict[str, ClassReport] = {}
    for cls in classes:
        share = preempt * hists.get("request_decode_time_seconds", {}).get(cls, Histogram()).sum / total_decode
        rep = _class_report(cls, getter(cls), share, base, slo.for_class(cls), target)
        if rep is not None:
            out[cls] = rep
    overall = _class_report(OVERALL, getter(None), preempt, base, slo.default, target)
    if overall is None:
        raise ValueError(f"--metrics-url: no requests finished during the {window_s:g} s window")
    out[OVERALL] = overall
    kind = "vLLM" if prefix == "vllm:" else "pacer"
    return out, f"{kind} /metrics over {window_s:g} s"


def collect(url: str, window_s: float) -> tuple[Samples, Samples]:
    """Two scrapes `window_s` apart (the measurement window itself, not a synchronisation wait)."""
    before = scrape(url)
    time.sleep(window_s)
    return before, scrape(url)


def synthetic_source(reports: dict[str, ClassReport], window_s: float, seed: int = 0) -> Source:
    """A trace for `--what-if` from histogram aggregates: per class its count over the window as a
    Poisson rate, lengths drawn with the class's mean and (bucket-estimated) CV."""
    import random

    from pacer.workload.spec import LengthDist

    rng = random.Random(f"{seed}:metrics")
    src = Source("metrics", "prometheus")
    classes = [k for k in reports if k != OVERALL] or [OVERALL]
    for cls in classes:
        rep = reports[cls]
        prompt = LengthDist(max(1.0, rep.lengths["prompt_mean"]), rep.lengths["prompt_cv"])
        output = LengthDist(max(1.0, rep.lengths["output_mean"]), rep.lengths["output_cv"])
        rate = rep.count / window_s
        t = 0.0
        for _ in range(rep.count):
            t += rng.expovariate(rate) if rate > 0 else 0.0
            src.records.append(Record(cls, prompt.sample(rng), output.sample(rng), 0.0, 0.0, arrival=t))
    src.records.sort(key=lambda r: r.arrival or 0.0)
    return src
