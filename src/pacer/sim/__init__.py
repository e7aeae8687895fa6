"""pacer.sim: the real scheduler on simulated hardware (cost models, profiles, event loop,
calibration against the real engine). Imports no torch (calibration imports it when run)."""

from __future__ import annotations

from typing import Any

from pacer.sim.cost_model import (
    BatchFeatures,
    CostModel,
    LinearCostModel,
    RooflineCostModel,
    StepCost,
    batch_features,
    make_cost_model,
)
from pacer.sim.profiles import HARDWARE, MODELS, HardwareProfile, ModelProfile, get_hardware, get_model

__all__ = [
    "BatchFeatures", "CostModel", "LinearCostModel", "RooflineCostModel", "StepCost", "batch_features",
    "make_cost_model", "HARDWARE", "MODELS", "HardwareProfile", "ModelProfile", "get_hardware", "get_model",
    "SimRequest", "SimResult", "build_sim_engine", "simulate",
]

_LAZY = {"SimRequest", "SimResult", "build_sim_engine", "simulate"}


def __getattr__(name: str) -> Any:
    # the event loop imports the executor, which imports this package: load it on first use
    if name in _LAZY:
        from pacer.sim import simulator

        return getattr(simulator, name)
    raise AttributeError(f"module 'pacer.sim' has no attribute {name!r}")
