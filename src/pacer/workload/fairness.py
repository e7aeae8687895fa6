"""Per-tenant scoring of a run (pure): requests, tokens, TTFT p50/p99, each tenant's share of the
service (priced as the fair policy prices it) and Jain's fairness index over the shares divided
by the tenants' weights. Read by `pacer bench` / `pacer sim` reports and benchmarks/fair_share.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pacer.sched.fair_share import ServiceCosts, jain_index
from pacer.workload.report import RequestRecord

__all__ = ["TenantRow", "tenant_rows", "tenant_table", "service_jain", "record_service"]


@dataclass(frozen=True, slots=True)
class TenantRow:
    tenant: str
    requests: int
    prompt_tokens: int
    output_tokens: int
    ttft_p50: float | None
    ttft_p99: float | None
    service: float
    share: float


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def record_service(r: RequestRecord, costs: ServiceCosts) -> float:
    """The cost units a finished request received (computed prompt, cached prompt, decoded)."""
    return costs.of(r.prefill_tokens, r.cached_tokens, r.output_tokens)


def tenant_rows(records: Sequence[RequestRecord], costs: ServiceCosts | None = None,
                until: float | None = None) -> list[TenantRow]:
    """One row per tenant; `until`: count only the service of requests finished by then (run seconds)."""
    costs = costs or ServiceCosts()
    by: dict[str, list[RequestRecord]] = {}
    for r in records:
        by.setdefault(r.tenant, []).append(r)
    service = {t: sum(record_service(r, costs) for r in rs
                      if r.finish_time is not None and (until is None or r.finish_time <= until))
               for t, rs in by.items()}
    total = sum(service.values())
    rows = []
    for t in sorted(by):
        rs = by[t]
        ttfts = [r.first_token_time - r.arrival_time for r in rs if r.first_token_time is not None]
        rows.append(TenantRow(t, len(rs), sum(r.prompt_tokens for r in rs), sum(r.output_tokens for r in rs),
                              _pct(ttfts, 0.5), _pct(ttfts, 0.99), service[t],
                              service[t] / total if total else 0.0))
    return rows


def service_jain(rows: Sequence[TenantRow], weights: Mapping[str, float] | None = None) -> float:
    """Jain's index over each tenant's service divided by its weight (1.0: shares exactly met)."""
    return jain_index(row.service / (weights or {}).get(row.tenant, 1.0) for row in rows)


def tenant_table(rows: Sequence[TenantRow], weights: Mapping[str, float] | None = None) -> str:
    """The per-tenant table of a report, with the Jain index under it."""
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1000:.0f}"

    lines = [f"{'tenant':12s} {'reqs':>6s} {'in tok':>9s} {'out tok':>8s} {'TTFT p50':>9s} {'p99 ms':>8s} "
             f"{'share':>6s}"]
    for r in rows:
        lines.append(f"{r.tenant:12s} {r.requests:6d} {r.prompt_tokens:9d} {r.output_tokens:8d} "
                     f"{ms(r.ttft_p50):>9s} {ms(r.ttft_p99):>8s} {r.share:6.1%}")
    lines.append(f"Jain fairness index (service / weight): {service_jain(rows, weights):.3f}")
    return "\n".join(lines)
