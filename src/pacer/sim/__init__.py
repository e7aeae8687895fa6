"""pacer.sim: the real engine and scheduler on simulated hardware: an event loop on a virtual
clock (`simulator`), the executor that prices each step with a `pacer.perf` cost model
(`executor`), N engines behind one router (`cluster`), the offline tools that time this
machine (`calibrate`, `validate`) and the command line (`cli`). Imports no torch (calibration
imports it when run)."""

from __future__ import annotations

from typing import Any

__all__ = ["SimRequest", "SimResult", "build_sim_engine", "simulate"]


def __getattr__(name: str) -> Any:
    # lazy: `import pacer.sim` stays cheap, and the event loop's imports run on first use
    if name in __all__:
        from pacer.sim import simulator

        return getattr(simulator, name)
    raise AttributeError(f"module 'pacer.sim' has no attribute {name!r}")
