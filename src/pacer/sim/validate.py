"""`pacer sim validate`: one trace through the real engine and through the simulator; each
metric's error against the targets (p50 latencies and throughput within 10%, p99 within 20%)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pacer.perf.cost_model import BatchFeatures, CostModel, batch_features

if TYPE_CHECKING:
    from pacer.engine import StepStats
    from pacer.sched.contract import SchedulerOutput

__all__ = ["MetricError", "compare_summaries", "VALIDATION_METRICS", "format_errors", "StepRecorder",
           "refit_on_steps", "STALL_RATIO"]

STALL_RATIO = 4.0   # a real step this much slower than predicted was descheduled, not computing

# (summary key, tolerance)
VALIDATION_METRICS: tuple[tuple[str, float], ...] = (
    ("ttft_p50", 0.10), ("ttft_p99", 0.20), ("tpot_p50", 0.10), ("tpot_p99", 0.20),
    ("itl_p50", 0.10), ("e2e_p50", 0.10), ("output_tok_s", 0.10), ("total_tok_s", 0.10),
)


@dataclass(frozen=True, slots=True)
class MetricError:
    metric: str
    real: float | None
    sim: float | None
    tolerance: float

    @property
    def rel_error(self) -> float | None:
        if self.real is None or self.sim is None or self.real == 0:
            return None
        return (self.sim - self.real) / self.real

    @property
    def ok(self) -> bool:
        e = self.rel_error
        return e is not None and abs(e) <= self.tolerance

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "real": self.real, "sim": self.sim, "rel_error": self.rel_error,
                "tolerance": self.tolerance, "ok": self.ok}


def compare_summaries(real: Mapping[str, Any], sim: Mapping[str, Any]) -> list[MetricError]:
    out = []
    for key, tol in VALIDATION_METRICS:
        r, s = real.get(key), sim.get(key)
        out.append(MetricError(key, None if r is None else float(r), None if s is None else float(s), tol))
    return out


def format_errors(errors: list[MetricError]) -> list[str]:
    lines = [f"{'metric':14s} {'real':>12s} {'sim':>12s} {'error':>8s} {'target':>7s}"]
    for e in errors:
        scale, unit = (1.0, "") if e.metric.endswith("tok_s") else (1000.0, " ms")
        r = "n/a" if e.real is None else f"{e.real * scale:.1f}{unit}"
        s = "n/a" if e.sim is None else f"{e.sim * scale:.1f}{unit}"
        err = "n/a" if e.rel_error is None else f"{e.rel_error * 100:+.1f}%"
        lines.append(f"{e.metric:14s} {r:>12s} {s:>12s} {err:>8s} {'<=' + format(e.tolerance * 100, '.0f') + '%':>7s}"
                     f"  {'ok' if e.ok else 'MISS'}")
    return lines


class StepRecorder:
    """Listens to the real engine during validation: each step's batch features and the
    engine's own StepStats, so measured and predicted step times can be compared step by step
    (`engine.schedule_listeners.append(rec.on_schedule)`, `engine.stats_listeners.append(rec.on_stats)`)."""

    def __init__(self) -> None:
        self.features: dict[int, BatchFeatures] = {}
        self.stats: list[StepStats] = []

    def on_schedule(self, out: SchedulerOutput) -> None:
        if out.scheduled:
            self.features[out.step_id] = batch_features(out)

    def on_stats(self, stats: StepStats) -> None:
        self.stats.append(stats)

    def step_rows(self, cost_model: CostModel) -> list[dict[str, Any]]:
        """Every recorded step as one row: its kind and batch features, the measured and the
        predicted time, and the budget the scheduler chose with its reason (`--steps-out`): where
        the real steps leave the cost model, step by step, not only in the medians."""
        rows = []
        for s in self.stats:
            f = self.features.get(s.step_id)
            if f is not None:
                rows.append({"step_id": s.step_id, "kind": s.kind, "end_time": s.time, "measured_s": s.total_s,
                             "predicted_s": cost_model.step_cost(f).time_s, "token_budget": s.token_budget,
                             "budget_reason": s.budget_reason, **asdict(f)})
        return rows

    def step_errors(self, cost_model: CostModel) -> list[str]:
        """Median measured / predicted step time by step kind, and the time between steps."""
        by_kind: dict[str, list[tuple[float, float]]] = {}
        gaps: list[float] = []
        prev_end: float | None = None
        for s in self.stats:
            f = self.features.get(s.step_id)
            if f is None:
                continue
            by_kind.setdefault(s.kind, []).append((s.total_s, cost_model.step_cost(f).time_s))
            if prev_end is not None:
                gaps.append(s.time - s.total_s - prev_end)
            prev_end = s.time
        lines = []
        for kind, pairs in by_kind.items():
            ratios = sorted(m / p for m, p in pairs if p > 0)
            meas = sorted(m for m, _ in pairs)
            lines.append(f"{kind:8s} steps: {len(pairs):5d}, measured median {meas[len(meas) // 2] * 1000:8.1f} ms, "
                         f"measured/predicted median {ratios[len(ratios) // 2]:.2f} "
                         f"(p10 {ratios[len(ratios) // 10]:.2f}, p90 {ratios[(9 * len(ratios)) // 10]:.2f})")
        small = sorted(g for g in gaps if 0 <= g < 0.05)   # gaps longer than that are idle waits for arrivals
        if small:
            lines.append(f"between steps (driver): median {small[len(small) // 2] * 1000:.2f} ms")
        stalls = [(m, p) for pairs in by_kind.values() for m, p in pairs if p > 0 and m > STALL_RATIO * p]
        if stalls:
            lost = sum(m - p for m, p in stalls)
            lines.append(f"STALLS: {len(stalls)} steps took > {STALL_RATIO:g}x their prediction ({lost:.1f} s lost, "
                         f"longest {max(m for m, _ in stalls):.1f} s): the machine was busy with other work, so "
                         "latency errors above measure the machine's load, not the simulator")
        return lines


def refit_on_steps(recorder: StepRecorder, model: Any, hw: Any, dtype: str) -> tuple[dict[str, float], Any]:
    """The step-time fit redone on the real run's own steps (same machine load as the run)."""
    from pacer.sim.calibrate import Sample, fit_samples

    samples = [Sample(recorder.features[s.step_id], s.total_s) for s in recorder.stats
               if s.step_id in recorder.features and s.total_s > 0]
    return fit_samples(samples, model, hw, dtype)
