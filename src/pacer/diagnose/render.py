"""The report for people (rich tables) and for machines (`--json`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pacer.diagnose.analysis import OVERALL, ClassReport
from pacer.diagnose.decompose import PARTS
from pacer.diagnose.records import Source
from pacer.diagnose.whatif import WhatIf

__all__ = ["print_report", "to_json"]


def _ms(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v < 1:
        return f"{v * 1000:.0f} ms"
    return f"{v:.2f} s" if v < 100 else f"{v:.0f} s"


def _console() -> Any:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))
    return console


def print_report(description: str, reports: Mapping[str, ClassReport], notes: list[str],
                 baseline: str, today: str, what_if: WhatIf | None) -> None:
    from rich.table import Table

    console = _console()
    console.print(f"[bold]pacer diagnose[/bold]: {description}")
    for n in notes:
        console.print(f"  note: {n}")
    console.print(f"  today's settings: {today}")
    t = Table(title="traffic and latency", title_justify="left")
    for col in ("class", "count", "prompt mean (CV)", "output mean (CV)", "queue p50/p99", "TTFT p50/p99",
                "ITL p50/p99", "TPOT p50/p99", "e2e p50/p99"):
        t.add_column(col, justify="right")
    for name, r in reports.items():
        lat = r.latency

        def pp(k: str, lat: dict[str, Any] = lat) -> str:
            d = lat.get(k) or {}
            return f"{_ms(d.get('p50'))} / {_ms(d.get('p99'))}" if d else "-"

        t.add_row(name, str(r.count), f"{r.lengths['prompt_mean']:.0f} ({r.lengths['prompt_cv']:.2f})",
                  f"{r.lengths['output_mean']:.0f} ({r.lengths['output_cv']:.2f})", pp("queue_wait"), pp("ttft"),
                  pp("itl"), pp("tpot"), pp("e2e"))
    console.print(t)
    d = Table(title="latency decomposition: mean per request (share of e2e)", title_justify="left")
    for col in ("class", *PARTS, "e2e", "bottleneck"):
        d.add_column(col, justify="right")
    for name, r in reports.items():
        e2e = r.e2e_mean
        cells = [f"{_ms(getattr(r.decomposition, k))} ({getattr(r.decomposition, k) / e2e:.0%})" if e2e > 0 else "-"
                 for k in PARTS]
        if r.decomposition.preemption_estimated:
            cells[3] += " est."
        d.add_row(name, *cells, _ms(e2e), f"[bold]{r.bottleneck}[/bold]")
    console.print(d)
    console.print(f"  baseline for the excess: {baseline}")
    for name, r in reports.items():
        console.print(f"[bold]{name}[/bold]: bottleneck [bold]{r.bottleneck}[/bold]")
        for line in r.evidence:
            console.print(f"  - {line}")
        for rec in r.recommendations:
            console.print(f"  next: {rec.text}" + (f"  [cyan]{rec.flags}[/cyan]" if rec.flags else ""))
    if what_if is not None:
        _print_what_if(console, what_if)


def _print_what_if(console: Any, w: WhatIf) -> None:
    from rich.table import Table

    t = Table(title=f"--what-if (pacer sim, arrivals {w.arrivals}): predicted", title_justify="left")
    cols = ("ttft_p50", "ttft_p99", "tpot_p99", "itl_p99", "e2e_p99")
    for col in ("settings", *cols, "preemptions", "SLO met"):
        t.add_column(col, justify="right")

    def row(label: str, s: dict[str, Any], ref: dict[str, Any] | None) -> list[str]:
        cells = [label]
        for k in cols:
            v, r0 = s.get(k), (ref or {}).get(k)
            delta = f" ({(v / r0 - 1) * 100:+.0f}%)" if ref and v is not None and r0 else ""
            cells.append(_ms(v) + delta)
        att = s.get("slo_attainment") if w.has_slo else None
        cells += [str(s.get("preemptions", 0)), "-" if att is None else f"{att:.0%}"]
        return cells

    t.add_row(*row("today", w.today.summary, None))
    for rec, rep in w.rows:
        label = rec.flags if rec.replicas == 1 else f"{rec.replicas} replicas"
        t.add_row(*row(label, rep.summary, w.today.summary))
    console.print(t)


def to_json(source: Source | None, description: str, reports: Mapping[str, ClassReport], notes: list[str],
            baseline: str, today: dict[str, Any], what_if: WhatIf | None) -> dict[str, Any]:
    return {"source": description, "notes": notes, "baseline": baseline, "today": today,
            "classes": {k: v.as_dict() for k, v in reports.items() if k != OVERALL},
            "overall": reports[OVERALL].as_dict(),
            **({"what_if": what_if.as_dict()} if what_if is not None else {})}
