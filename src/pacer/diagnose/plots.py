"""`--plots DIR`: a stacked latency breakdown per class, TTFT against prompt length, ITL over time."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pacer.diagnose.analysis import ClassReport
from pacer.diagnose.decompose import PARTS
from pacer.diagnose.records import Source

__all__ = ["plot_diagnosis"]


def plot_diagnosis(reports: Mapping[str, ClassReport], source: Source | None, out_dir: str | Path) -> list[Path]:
    from pacer.workload.plots import _plt

    plt = _plt()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(reports)
    bottom = [0.0] * len(names)
    for part in PARTS:
        vals = [getattr(reports[n].decomposition, part) for n in names]
        ax.bar(names, vals, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("mean seconds per request")
    ax.set_title("latency breakdown per class")
    ax.legend()
    paths.append(out / "breakdown.png")
    fig.tight_layout()
    fig.savefig(paths[-1])
    plt.close(fig)
    if source is not None and source.records:
        fig, ax = plt.subplots(figsize=(7, 4))
        for cls in source.classes():
            rs = source.of_class(cls)
            ax.scatter([r.prompt_tokens for r in rs], [r.ttft for r in rs], s=10, label=cls)
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("TTFT, s")
        ax.set_title("TTFT against prompt length")
        ax.legend()
        paths.append(out / "ttft_vs_prompt.png")
        fig.tight_layout()
        fig.savefig(paths[-1])
        plt.close(fig)
        if source.has_times:
            fig, ax = plt.subplots(figsize=(7, 4))
            for cls in source.classes():
                xs, ys = [], []
                for r in source.of_class(cls):
                    t = r.first_token_at or 0.0
                    if r.itl:
                        for g in r.itl:
                            t += g
                            xs.append(t)
                            ys.append(g)
                    elif r.itl_mean is not None:
                        xs.append(r.finished_at or t)
                        ys.append(r.itl_mean)
                ax.scatter(xs, ys, s=4, label=cls)
            ax.set_xlabel("time, s")
            ax.set_ylabel("inter-token gap, s")
            ax.set_title("ITL over time")
            ax.legend()
            paths.append(out / "itl_over_time.png")
            fig.tight_layout()
            fig.savefig(paths[-1])
            plt.close(fig)
    return paths
