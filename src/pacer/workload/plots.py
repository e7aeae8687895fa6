"""PNG plots of `pacer bench` / `pacer sim` reports (matplotlib, Agg backend, imported lazily).

`plot_report`: latency CDFs per class (TTFT, ITL, TPOT, E2E), a timeline of in-flight requests
and output token throughput, and TTFT against prompt length. `plot_sweep`: latency
percentiles and goodput against the offered request rate. Reads only `Report` objects.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pacer.workload.report import OVERALL, Report, RequestRecord

__all__ = ["plot_report", "plot_sweep"]


def _plt() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ValueError("--plots needs matplotlib: pip install 'pacer[bench]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _by_class(records: Sequence[RequestRecord]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.ok:
            out.setdefault(r.request_class, []).append(r)
    return out


def _cdf(ax: Any, values: list[float], label: str) -> None:
    if not values:
        return
    xs = sorted(v * 1000 for v in values)
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})")


def plot_report(report: Report, out_dir: str | Path, prefix: str = "") -> list[Path]:
    """Write latency_cdf.png, timeline.png and ttft_vs_prompt.png; returns their paths."""
    plt = _plt()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    classes = _by_class(report.records)
    paths: list[Path] = []

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, metric in zip(axes.flat, ("ttft", "itl", "tpot", "e2e")):
        for name, recs in classes.items():
            if metric == "itl":
                values = [g for r in recs for g in r.itl]
            else:
                values = [v for v in (getattr(r, metric) for r in recs) if v is not None]
            _cdf(ax, values, name)
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("fraction of requests" if metric != "itl" else "fraction of gaps")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("latency CDFs per class")
    paths.append(_save(plt, fig, out / f"{prefix}latency_cdf.png"))

    paths.append(_timeline(plt, report, out / f"{prefix}timeline.png"))

    fig, ax = plt.subplots(figsize=(7, 5))
    for name, recs in classes.items():
        pts = [(r.prompt_tokens, r.ttft * 1000) for r in recs if r.ttft is not None]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, alpha=0.7, label=name)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFT (ms)")
    ax.grid(alpha=0.3)
    if classes:
        ax.legend(fontsize=8)
    ax.set_title("TTFT against prompt length")
    paths.append(_save(plt, fig, out / f"{prefix}ttft_vs_prompt.png"))
    return paths


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _timeline(plt: Any, report: Report, path: Path) -> Path:
    recs = report.records
    end = max((r.finish_time or r.arrival_time for r in recs), default=0.0)
    step = max(end / 200, 0.05)
    n_bins = max(1, math.ceil(end / step) + 1)
    in_flight = [0] * n_bins
    tokens = [0] * n_bins
    for r in recs:
        a = int(r.arrival_time / step)
        f = int((r.finish_time if r.finish_time is not None else end) / step)
        for i in range(max(0, a), min(n_bins, f + 1)):
            in_flight[i] += 1
        for t in r.token_times:
            tokens[min(n_bins - 1, max(0, int(t / step)))] += 1
    xs = [i * step for i in range(n_bins)]
    fig, ax1 = plt.subplots(figsize=(10, 4.5))
    ax1.plot(xs, in_flight, color="tab:blue", label="in-flight requests")
    ax1.set_xlabel("time since start (s)")
    ax1.set_ylabel("in-flight requests", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(xs, [t / step for t in tokens], color="tab:orange", alpha=0.8, label="output tok/s")
    ax2.set_ylabel("output tokens / s", color="tab:orange")
    ax1.grid(alpha=0.3)
    ax1.set_title("timeline")
    return _save(plt, fig, path)


def plot_sweep(rates: Sequence[float], reports: Sequence[Report], out_dir: str | Path,
               classes: Sequence[str] = (OVERALL,)) -> Path:
    """Latency (TTFT p50/p99, ITL p99, E2E p99) and throughput/goodput against the offered rate."""
    plt = _plt()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in classes:
        sums = [rep.summary.get(name, {}) for rep in reports]
        for key in ("ttft_p50", "ttft_p99", "itl_p99", "e2e_p99"):
            ys = [s.get(key) for s in sums]
            ax1.plot(rates, [float("nan") if y is None else y * 1000 for y in ys], marker="o",
                     label=f"{name} {key}")
        ax2.plot(rates, [s.get("req_s") or 0.0 for s in sums], marker="o", label=f"{name} completed req/s")
        ax2.plot(rates, [s.get("goodput_req_s") or 0.0 for s in sums], marker="s", label=f"{name} goodput req/s")
    ax1.set_yscale("log")
    ax1.set_xlabel("offered request rate (req/s)")
    ax1.set_ylabel("latency (ms)")
    ax1.grid(alpha=0.3, which="both")
    ax1.legend(fontsize=7)
    ax2.set_xlabel("offered request rate (req/s)")
    ax2.set_ylabel("req/s")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    fig.suptitle("load sweep")
    return _save(plt, fig, out / "sweep.png")
