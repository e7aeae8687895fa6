"""Step-time models shared by the engine and the simulator (pure Python): cost models from a
step's shape to seconds (`cost_model`), hardware and model profiles (`profiles`), the fit
shipped for this kind of CPU (`default_calibration`), the scheduler's predictor refitted online
(`step_model`), the timing grid of synthetic steps (`grid`) and the start-up calibration that
times it (`startup_calibration`)."""

from pacer.perf.cost_model import (
    BatchFeatures,
    CostModel,
    LinearCostModel,
    RooflineCostModel,
    StepCost,
    batch_features,
    make_cost_model,
)
from pacer.perf.profiles import HARDWARE, MODELS, HardwareProfile, ModelProfile, get_hardware, get_model

__all__ = [
    "BatchFeatures", "CostModel", "LinearCostModel", "RooflineCostModel", "StepCost", "batch_features",
    "make_cost_model", "HARDWARE", "MODELS", "HardwareProfile", "ModelProfile", "get_hardware", "get_model",
]
