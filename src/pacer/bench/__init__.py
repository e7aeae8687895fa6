"""`pacer bench`: workloads, arrivals, clients (HTTP and in-process) and reports.

The workload and report APIs are shared with `pacer sim`:

- `pacer.bench.workloads`: `Workload`, `ClassSpec`, `LengthDist`, `RequestSpec`,
  `builtin_workload`, `load_workload`, `iter_requests`, `generate_requests`;
- `pacer.bench.arrivals`: `Poisson`, `Gamma`, `ClosedLoop`, `make_arrivals`, `arrival_times`;
- `pacer.bench.trace`: `load_trace` (JSONL replay; pacer's `--request-log` is a valid trace);
- `pacer.bench.report`: `RequestRecord`, `SloSet`, `parse_slo`, `build_report`, `Report`;
- `pacer.bench.tables`: `report_table`, `compare_table` (rich).
"""

from pacer.bench.arrivals import ArrivalProcess, ClosedLoop, Gamma, Poisson, arrival_times, make_arrivals
from pacer.bench.report import (
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
from pacer.bench.workloads import (
    ClassSpec,
    LengthDist,
    RequestSpec,
    Workload,
    WorkloadGenerator,
    builtin_workload,
    generate_requests,
    iter_requests,
    load_workload,
)

__all__ = [
    "ArrivalProcess", "ClosedLoop", "Gamma", "Poisson", "arrival_times", "make_arrivals",
    "OVERALL", "Report", "RequestRecord", "Slo", "SloSet", "build_report", "parse_slo", "percentile", "summarize",
    "ClassSpec", "LengthDist", "RequestSpec", "Workload", "WorkloadGenerator", "builtin_workload",
    "generate_requests", "iter_requests", "load_workload",
]
