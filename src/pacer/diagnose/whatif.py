"""`--what-if`: the source replayed through `pacer sim` with today's settings and with each
recommendation that is a setting (or a replica count), and the predicted change."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pacer.diagnose.analysis import ClassReport
from pacer.diagnose.recommend import Recommendation
from pacer.diagnose.records import Source
from pacer.diagnose.replay import Replay, SimTarget, specs_from_source
from pacer.workload.report import SloSet

__all__ = ["WhatIf", "what_if", "WHAT_IF_METRICS"]

WHAT_IF_METRICS = ("ttft_p50", "ttft_p99", "tpot_p99", "itl_p99", "e2e_p50", "e2e_p99", "queue_wait_p99")
MAX_CANDIDATES = 4


@dataclass(slots=True)
class WhatIf:
    arrivals: str
    today: Replay
    rows: list[tuple[Recommendation, Replay]]
    has_slo: bool = False

    def as_dict(self) -> dict[str, Any]:
        def pick(rep: Replay) -> dict[str, Any]:
            s = rep.summary
            return {**{k: s.get(k) for k in WHAT_IF_METRICS}, "preemptions": s.get("preemptions"),
                    "slo_attainment": s.get("slo_attainment")}

        return {"arrivals": self.arrivals, "today": pick(self.today),
                "recommended": [{"flags": rec.flags, "replicas": rec.replicas, **pick(r)} for rec, r in self.rows]}


def candidates(reports: Mapping[str, ClassReport]) -> list[Recommendation]:
    """Distinct simulable recommendations, the overall bottleneck's first."""
    order = ["overall", *[k for k in reports if k != "overall"]]
    seen: dict[str, Recommendation] = {}
    for name in order:
        rep = reports.get(name)
        for rec in rep.recommendations if rep else []:
            if rec.simulable and rec.flags not in seen:
                seen[rec.flags] = rec
    return list(seen.values())[:MAX_CANDIDATES]


def what_if(source: Source, reports: Mapping[str, ClassReport], today: dict[str, Any], target: SimTarget,
            slo: SloSet | None = None, seed: int = 0, extra: Sequence[Recommendation] = ()) -> WhatIf:
    specs, how = specs_from_source(source, seed=seed, max_model_len=target.max_model_len(today))
    base = target.run("today", today, specs, slo)
    rows = []
    for rec in [*candidates(reports), *extra]:
        try:
            r = target.run(rec.flags, {**today, **rec.engine}, specs, slo, replicas=rec.replicas)
        except (ValueError, TypeError):   # e.g. a budget below max_model_len without chunking
            continue
        rows.append((rec, r))
    return WhatIf(how, base, rows, has_slo=slo is not None and not slo.is_empty())
