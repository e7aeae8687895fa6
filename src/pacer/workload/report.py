"""Reports for `pacer bench` and `pacer sim`: per-request records in, summary / JSON / table out.

This room is independent of how records were measured (streamed over HTTP, read from an
in-process engine, or simulated): anything that can fill a `RequestRecord` gets the same
percentiles, goodput, `--out run.json` schema, rich table and `compare`. Record fields keep
the names of the engine's `RequestMetrics`; times are seconds from the run's start.

Definitions (ARCHITECTURE.md "Metrics, defined once"): ttft = first_token - arrival;
itl = gaps between consecutive streamed tokens (pooled over requests for percentiles);
tpot = (last_token - first_token) / (output_tokens - 1); e2e = finish - arrival;
queue_wait = first_scheduled - arrival (when the engine reports it). Percentiles interpolate
linearly between closest ranks (numpy's default). Goodput = requests per second that
completed and met every SLO of their class; a request's ITL SLO is checked on the
99th percentile of its own gaps.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pacer.config.slo import Slo, SloSet, parse_duration, parse_slo, percentile
from pacer.request import Latencies, RequestMetrics

__all__ = [
    "RequestRecord", "Slo", "SloSet", "parse_slo", "parse_duration", "percentile", "summarize",
    "Report", "build_report", "OVERALL", "STATUS_OK", "STATUS_ERROR", "STATUS_REJECTED", "SCHEMA",
    "LATENCY_METRICS", "PERCENTILES",
]

SCHEMA = "pacer.bench.run/1"
OVERALL = "overall"
STATUS_OK, STATUS_ERROR, STATUS_REJECTED = "ok", "error", "rejected"   # rejected: HTTP 429 / admission
PERCENTILES = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft", "itl", "tpot", "e2e", "queue_wait")
Summary = dict[str, float | int | None]


@dataclass(slots=True)
class RequestRecord(Latencies):
    """One request's outcome. Times are seconds from the run's start (None: never happened)."""

    request_id: str
    request_class: str
    arrival_time: float
    status: str = STATUS_OK
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)   # one per streamed token (or chunk)
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0
    preempted_time: float = 0.0       # preemption loss, s (RequestMetrics.preempted_time)
    preempted_time_ttft: float = 0.0  # of it, before the first token
    http_status: int | None = None
    error: str | None = None
    tenant: str = "default"
    priority: int = 0
    session: str | None = None
    deprioritized: bool = False   # the slo policy put it behind feasible requests (it could not meet TTFT)
    ttft_deadline: float | None = None        # arrival + its TTFT target (run seconds; None: no target)
    slack_at_admission: float | None = None   # slo policy: latest start - now when first queued, s

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    def _tpot_tokens(self) -> int:
        return self.output_tokens   # the server's usage count: a stream chunk may carry several tokens

    @classmethod
    def from_metrics(cls, metrics: RequestMetrics, *, request_id: str, request_class: str, t0: float = 0.0,
                     status: str = STATUS_OK, **extra: Any) -> RequestRecord:
        """From the engine's (or simulator's) RequestMetrics; `t0` is the run's start on its clock."""
        def rel(t: float | None) -> float | None:
            return None if t is None else t - t0

        return cls(request_id=request_id, request_class=request_class, status=status,
                   arrival_time=metrics.arrival_time - t0, first_scheduled_time=rel(metrics.first_scheduled_time),
                   first_token_time=rel(metrics.first_token_time), finish_time=rel(metrics.finish_time),
                   token_times=_shifted(metrics.token_times, t0), prompt_tokens=metrics.prompt_tokens,
                   output_tokens=len(metrics.token_times), cached_tokens=metrics.cached_tokens,
                   prefill_tokens=metrics.prefill_tokens, preemptions=metrics.preemptions,
                   preempted_time=metrics.preempted_time, preempted_time_ttft=metrics.preempted_time_ttft,
                   deprioritized=metrics.deprioritized, ttft_deadline=rel(metrics.ttft_deadline),
                   slack_at_admission=metrics.slack_at_admission, **extra)

    def as_dict(self) -> dict[str, Any]:
        """The `requests[]` object of run.json (token_times are implied by first_token_time + itl)."""
        return {
            "request_id": self.request_id, "class": self.request_class, "status": self.status,
            "http_status": self.http_status, "error": self.error,
            "arrival_time": self.arrival_time, "first_scheduled_time": self.first_scheduled_time,
            "first_token_time": self.first_token_time, "finish_time": self.finish_time,
            "queue_wait": self.queue_wait, "ttft": self.ttft, "itl": self.itl, "tpot": self.tpot, "e2e": self.e2e,
            "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens, "prefill_tokens": self.prefill_tokens,
            "preemptions": self.preemptions, "preempted_time": self.preempted_time,
            "preempted_time_ttft": self.preempted_time_ttft, "tenant": self.tenant, "priority": self.priority,
            "session": self.session, "deprioritized": self.deprioritized, "ttft_deadline": self.ttft_deadline,
            "slack_at_admission": self.slack_at_admission,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RequestRecord:
        first = d.get("first_token_time")
        times: list[float] = []
        if first is not None:
            times = [float(first)]
            for gap in d.get("itl") or []:
                times.append(times[-1] + float(gap))
        return cls(
            request_id=str(d["request_id"]), request_class=str(d["class"]), status=str(d.get("status", STATUS_OK)),
            arrival_time=float(d["arrival_time"]), first_scheduled_time=d.get("first_scheduled_time"),
            first_token_time=first, finish_time=d.get("finish_time"), token_times=times,
            prompt_tokens=int(d.get("prompt_tokens", 0)), output_tokens=int(d.get("output_tokens", 0)),
            cached_tokens=int(d.get("cached_tokens", 0)), prefill_tokens=int(d.get("prefill_tokens", 0)),
            preemptions=int(d.get("preemptions", 0)), preempted_time=float(d.get("preempted_time", 0.0)),
            preempted_time_ttft=float(d.get("preempted_time_ttft", 0.0)), http_status=d.get("http_status"), error=d.get("error"),
            tenant=str(d.get("tenant", "default")), priority=int(d.get("priority", 0)), session=d.get("session"),
            deprioritized=bool(d.get("deprioritized", False)), ttft_deadline=d.get("ttft_deadline"),
            slack_at_admission=d.get("slack_at_admission"),
        )


# ---------------------------------------------------------------------------- SLOs
# Slo, SloSet, parse_slo and parse_duration are defined once in pacer.config.slo (shared with
# the engine's slo policy) and re-exported here.
_NO_SLO = Slo()


def _shifted(times: list[float], t0: float) -> list[float]:
    """`[t - t0 for t in times]`; a copy when t0 is 0.0 (t - 0.0 is t, to the bit: a simulation's
    clock starts at 0, and a record's token times are ~1.5 million of its floats)."""
    if t0 == 0.0:
        return list(times)
    return list(map(operator.sub, times, itertools.repeat(t0)))


# ---------------------------------------------------------------------------- statistics

def _latency_values(records: Sequence[RequestRecord], metric: str) -> list[float]:
    if metric == "itl":
        return [g for r in records for g in r.itl]
    values = (getattr(r, metric) for r in records)
    return [v for v in values if v is not None]


def run_duration(records: Sequence[RequestRecord]) -> float:
    """First arrival to last finish (or last token, for requests that never finished)."""
    if not records:
        return 0.0
    start = min(r.arrival_time for r in records)
    ends = [r.finish_time if r.finish_time is not None else
            (r.token_times[-1] if r.token_times else r.arrival_time) for r in records]
    return max(ends) - start


def summarize(records: Sequence[RequestRecord], duration: float, slo: Slo = _NO_SLO) -> Summary:
    """One summary object (a class's or `overall`): counts, rates over `duration`, latency
    percentiles over completed requests, goodput under `slo` (`slo_attainment` is the share of
    all requests, failed ones included, that met it)."""
    ok = [r for r in records if r.ok]
    out: Summary = {
        "num_requests": len(records), "num_ok": len(ok),
        "num_errors": sum(1 for r in records if r.status == STATUS_ERROR),
        "num_rejected": sum(1 for r in records if r.status == STATUS_REJECTED),
        "duration_s": duration,
    }
    prompt = sum(r.prompt_tokens for r in ok)
    output = sum(r.output_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    out.update({
        "prompt_tokens": prompt, "output_tokens": output, "cached_tokens": cached,
        "cache_hit_rate": cached / prompt if prompt else 0.0, "preemptions": sum(r.preemptions for r in ok),
        "req_s": rate(len(ok)), "input_tok_s": rate(prompt), "output_tok_s": rate(output),
        "total_tok_s": rate(prompt + output),
    })
    for metric in LATENCY_METRICS:
        values = _latency_values(ok, metric)
        out[f"{metric}_mean"] = sum(values) / len(values) if values else None
        for q in PERCENTILES:
            out[f"{metric}_p{q}"] = percentile(values, q)
    good = sum(1 for r in ok if slo.met_by(r))
    out["num_good"] = good
    out["goodput_req_s"] = rate(good)
    out["slo_attainment"] = good / len(records) if records else None
    out["num_deprioritized"] = sum(1 for r in records if r.deprioritized)
    return out


# ---------------------------------------------------------------------------- the report

@dataclass(slots=True)
class Report:
    """Everything `--out run.json` keeps: meta (what was run), slo, summary, requests."""

    records: list[RequestRecord]
    summary: dict[str, Summary]
    slo: SloSet = SloSet()
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def classes(self) -> list[str]:
        return [k for k in self.summary if k != OVERALL]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "meta": self.meta, "slo": self.slo.as_dict(), "summary": self.summary,
                "requests": [r.as_dict() for r in self.records]}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Report:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a pacer bench run (schema {d.get('schema')!r}, expected {SCHEMA!r})")
        return cls([RequestRecord.from_dict(r) for r in d.get("requests", [])],
                   {k: dict(v) for k, v in d["summary"].items()}, SloSet.from_dict(d.get("slo", {})),
                   dict(d.get("meta", {})))

    @classmethod
    def load(cls, path: str | Path) -> Report:
        return cls.from_dict(json.loads(Path(path).read_text()))


def build_report(records: Sequence[RequestRecord], *, slo: SloSet | None = None,
                 meta: Mapping[str, Any] | None = None, duration: float | None = None) -> Report:
    """Summaries per class (in first-seen order) and `overall`; `duration` defaults to first
    arrival -> last finish. Every class's rates use the same duration, so they add up."""
    slo = slo or SloSet()
    dur = run_duration(records) if duration is None else duration
    by_class: dict[str, list[RequestRecord]] = {}
    for r in records:
        by_class.setdefault(r.request_class, []).append(r)
    summary = {name: summarize(rs, dur, slo.for_class(name)) for name, rs in by_class.items()}
    overall = summarize(records, dur, slo.default)
    # overall goodput counts each request against its own class's SLO
    good = sum(1 for r in records if slo.for_class(r.request_class).met_by(r))
    overall["num_good"] = good
    overall["goodput_req_s"] = good / dur if dur > 0 else 0.0
    overall["slo_attainment"] = good / len(records) if records else None
    summary[OVERALL] = overall
    return Report(list(records), summary, slo, dict(meta or {}))
