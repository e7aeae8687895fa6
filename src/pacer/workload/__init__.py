"""What a run sends and how it is scored, shared by `pacer bench`, `pacer sim`, `pacer diagnose`
and `pacer tune`: workloads, arrivals, traces, prompt text, the one driver of an in-process
engine, the backends (HTTP client, in-process runner) and the reports.

The public names:

- `pacer.workload.spec`: `Workload`, `ClassSpec`, `LengthDist`, `RequestSpec`,
  `builtin_workload`, `load_workload` (what a workload is);
- `pacer.workload.generator`: `iter_requests`, `generate_requests` (its requests, deterministically);
- `pacer.workload.arrivals`: `Poisson`, `Gamma`, `ClosedLoop`, `make_arrivals`, `arrival_times`;
- `pacer.workload.trace`: `load_trace` (JSONL replay; pacer's `--request-log` is a valid trace);
- `pacer.workload.report`: `RequestRecord`, `SloSet`, `parse_slo`, `build_report`, `Report`;
- `pacer.workload.tables`: `report_table`, `compare_table` (rich).
"""

from pacer.workload.arrivals import ArrivalProcess, ClosedLoop, Gamma, Poisson, arrival_times, make_arrivals
from pacer.workload.generator import WorkloadGenerator, generate_requests, iter_requests
from pacer.workload.report import (
    OVERALL,
    Report,
    RequestRecord,
    Slo,
    SloSet,
    build_report,
    parse_slo,
    percentile,
    summarize,
)
from pacer.workload.spec import ClassSpec, LengthDist, RequestSpec, Workload, builtin_workload, load_workload

__all__ = [
    "ArrivalProcess", "ClosedLoop", "Gamma", "Poisson", "arrival_times", "make_arrivals",
    "OVERALL", "Report", "RequestRecord", "Slo", "SloSet", "build_report", "parse_slo", "percentile", "summarize",
    "ClassSpec", "LengthDist", "RequestSpec", "Workload", "WorkloadGenerator", "builtin_workload",
    "generate_requests", "iter_requests", "load_workload",
]
