"""Terminal tables for `pacer bench` / `pacer sim` reports and `pacer bench compare` (rich).

Reads only `Report` objects; formats latencies in ms and rates per second.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from pacer.workload.budget import describe_budget
from pacer.workload.fairness import service_jain, tenant_rows
from pacer.workload.report import OVERALL, Report, Summary

__all__ = ["report_table", "tenant_table", "compare_table", "COMPARE_METRICS"]

# (key, label, higher_is_better)
COMPARE_METRICS: tuple[tuple[str, str, bool], ...] = (
    ("num_ok", "completed", True), ("num_errors", "errors", False), ("num_rejected", "rejected (429)", False),
    ("req_s", "req/s", True), ("output_tok_s", "output tok/s", True), ("total_tok_s", "total tok/s", True),
    ("ttft_p50", "TTFT p50", False), ("ttft_p99", "TTFT p99", False), ("itl_p50", "ITL p50", False),
    ("itl_p99", "ITL p99", False), ("tpot_p50", "TPOT p50", False), ("tpot_p99", "TPOT p99", False),
    ("e2e_p50", "E2E p50", False), ("e2e_p99", "E2E p99", False), ("queue_wait_p99", "queue wait p99", False),
    ("cache_hit_rate", "cache hit rate", True), ("goodput_req_s", "goodput req/s", True),
)


def _ms(v: float | int | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _num(v: float | int | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    return str(v) if isinstance(v, int) else f"{v:.{digits}f}"


def _fmt(key: str, v: float | int | None) -> str:
    if key.split("_")[-1].startswith("p") or key.endswith("_mean"):
        return _ms(v) + (" ms" if v is not None else "")
    if key == "cache_hit_rate":
        return "-" if v is None else f"{v:.1%}"
    return _num(v)


def report_table(report: Report, title: str | None = None) -> Group:
    """Throughput table and latency table (ms; p50 / p90 / p99 and mean), one row per class + overall."""
    names = [*report.classes, OVERALL]
    has_slo = not report.slo.is_empty()
    tput = Table(title=title or "pacer bench", title_justify="left")
    for col in ("class", "requests", "ok", "err", "429", "req/s", "in tok/s", "out tok/s", "cache hit"):
        tput.add_column(col, justify="left" if col == "class" else "right")
    if has_slo:
        tput.add_column("goodput req/s", justify="right")
        tput.add_column("SLO met", justify="right")
        tput.add_column("deprio", justify="right")   # the slo policy put them behind feasible requests
    for name in names:
        s = report.summary[name]
        row = [name, _num(s["num_requests"]), _num(s["num_ok"]), _num(s["num_errors"]), _num(s["num_rejected"]),
               _num(s["req_s"]), _num(s["input_tok_s"], 1), _num(s["output_tok_s"], 1),
               _fmt("cache_hit_rate", s["cache_hit_rate"])]
        if has_slo:
            att = s["slo_attainment"]
            row += [_num(s["goodput_req_s"]), "-" if att is None else f"{att:.1%}", _num(s.get("num_deprioritized"))]
        tput.add_row(*row, style="bold" if name == OVERALL else None)
    lat = Table(title="latency (ms)", title_justify="left")
    lat.add_column("class")
    lat.add_column("metric")
    for col in ("p50", "p90", "p95", "p99", "mean"):
        lat.add_column(col, justify="right")
    for name in names:
        s = report.summary[name]
        for metric in ("ttft", "itl", "tpot", "e2e", "queue_wait"):
            if s.get(f"{metric}_p50") is None:
                continue
            lat.add_row(name, metric, *(_ms(s[f"{metric}_{c}"]) for c in ("p50", "p90", "p95", "p99", "mean")))
        lat.add_section()
    budget = describe_budget(report.meta.get("budget") or report.meta.get("engine_steps", {}).get("budget") or {})
    spec = report.meta.get("spec_decode")
    lines = [*([Text(budget)] if budget else []), *([Text(spec_decode_line(spec))] if spec else [])]
    tenants = tenant_table(report)
    return Group(tput, lat, *([tenants] if tenants is not None else []), *lines)


def tenant_table(report: Report) -> Table | None:
    """Per tenant (runs with more than one): requests, tokens, TTFT p50/p99 and share of the
    service (fair-share cost units), with Jain's index over shares / weights; None otherwise."""
    if len({r.tenant for r in report.records}) < 2:
        return None
    weights = report.meta.get("tenant_weights") or None
    rows = tenant_rows(report.records)
    table = Table(title="tenants", title_justify="left",
                  caption=f"Jain fairness index (service / weight): {service_jain(rows, weights):.3f}",
                  caption_justify="left")
    for col in ("tenant", "requests", "in tok", "out tok", "TTFT p50 ms", "TTFT p99 ms", "service share"):
        table.add_column(col, justify="left" if col == "tenant" else "right")
    for row in rows:
        table.add_row(row.tenant, str(row.requests), str(row.prompt_tokens), str(row.output_tokens),
                      _ms(row.ttft_p50), _ms(row.ttft_p99), f"{row.share:.1%}")
    return table


def spec_decode_line(spec: dict[str, Any]) -> str:
    """'speculative decoding: acceptance rate 71.2%, mean accepted length 3.10 (...)'."""
    per_pos = ", ".join(str(n) for n in spec.get("accepted_per_pos", []))
    return (f"speculative decoding: acceptance rate {spec['acceptance_rate']:.1%} (per token "
            f"{spec['per_token_acceptance']:.1%}), mean accepted length "
            f"{spec['mean_accepted_length']:.2f} ({spec['num_drafts']} drafts, {spec['num_draft_tokens']} draft "
            f"tokens, {spec['num_accepted_tokens']} accepted; by position: {per_pos})")


def _delta(a: float | int | None, b: float | int | None, higher_is_better: bool) -> Text:
    if a is None or b is None:
        return Text("-")
    if a == 0:
        return Text("=" if b == 0 else "new", style="dim")
    change = (b - a) / abs(a)
    better = change > 0 if higher_is_better else change < 0
    style = "dim" if abs(change) < 0.02 else ("green" if better else "red")
    return Text(f"{change:+.1%}", style=style)


def compare_table(a: Report, b: Report, labels: Sequence[str] = ("a", "b"),
                  classes: Sequence[str] | None = None) -> Table:
    """Metric by metric, per class both runs have: value in each run and the relative change."""
    shared = classes or [c for c in [*a.classes, OVERALL] if c in b.summary]
    table = Table(title=f"compare: {labels[0]} -> {labels[1]}", title_justify="left")
    for col in ("class", "metric", labels[0], labels[1], "delta"):
        table.add_column(col, justify="left" if col in ("class", "metric") else "right")
    for name in shared:
        sa: Summary = a.summary[name]
        sb: Summary = b.summary[name]
        for key, label, higher in COMPARE_METRICS:
            va, vb = sa.get(key), sb.get(key)
            if va is None and vb is None:
                continue
            table.add_row(name, label, _fmt(key, va), _fmt(key, vb), _delta(va, vb, higher))
        table.add_section()
    return table
