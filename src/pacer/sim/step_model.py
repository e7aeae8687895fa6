"""The simulator's cost models behind the scheduler's `StepCostModel` protocol, refitted online.

`SchedulerCostModel` wraps a `CostModel` (the calibrated fit of this machine, or a hardware
roofline) so `pacer.core` can ask it for step times from `StepShape` counts; the simulator
advances its clock with the same model, so both predict with the same numbers. On the real
engine it keeps refitting from the engine's own measured steps: one multiplicative
correction per regime (decode-only steps, steps with prefill chunks), an exponentially
weighted mean of measured / predicted, because this machine's speed drifts by 2x between
days while the shape of the fit holds.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

from pacer.core.step_cost import StepShape
from pacer.sim.cost_model import BatchFeatures, CostModel, StepCost, make_cost_model
from pacer.sim.profiles import ModelProfile

__all__ = ["SchedulerCostModel", "CorrectedCostModel", "features_of", "engine_step_cost_model", "REFIT_ALPHA"]

log = logging.getLogger("pacer.sim")

REFIT_ALPHA = 0.1            # weight of the newest measured step in the running correction
_SCALE_RANGE = (0.2, 5.0)   # a correction outside this is a hiccup (GC, a neighbour), not drift
_MAX_UPPER = 2.0            # the most margin upper_ratio asks for


def features_of(shape: StepShape) -> BatchFeatures:
    """The cost models' features of a step given as counts."""
    num_chunk_tokens = sum(n for n, _ in shape.chunks)
    pairs = sum(n * s + n * (n + 1) // 2 for n, s in shape.chunks)
    chunk_kv = sum(s + n for n, s in shape.chunks)
    return BatchFeatures(
        num_tokens=shape.num_tokens, num_seqs=shape.num_seqs, num_single=shape.num_decodes,
        single_kv_tokens=shape.decode_kv_tokens, single_max_ctx=shape.decode_max_ctx, num_chunks=len(shape.chunks),
        chunk_attn_pairs=pairs, chunk_kv_tokens=chunk_kv, num_sampled=shape.num_sampled,
        num_prefill_tokens=num_chunk_tokens, num_decode_tokens=shape.num_decodes,
    )


class SchedulerCostModel:
    """A `StepCostModel` over a simulator `CostModel`, with an online correction per regime."""

    def __init__(self, cost_model: CostModel, refit: bool = True, alpha: float = REFIT_ALPHA) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.base = cost_model
        self.refit = refit
        self.alpha = alpha
        self.scale = {"decode": 1.0, "prefill": 1.0}
        self.rel_var = {"decode": 0.0, "prefill": 0.0}   # EW mean of (measured / predicted - 1)^2
        self.num_observed = 0

    @property
    def name(self) -> str:
        return self.base.name + (" (refit online)" if self.refit else "")

    @staticmethod
    def _regime(shape: StepShape) -> str:
        return "prefill" if shape.chunks else "decode"

    def base_time_s(self, shape: StepShape) -> float:
        """The base model's time for the step, before the correction."""
        return self.base.step_cost(features_of(shape)).time_s if shape.num_seqs else 0.0

    def predict_step_s(self, shape: StepShape) -> float:
        return self.base_time_s(shape) * self.scale[self._regime(shape)]

    def token_cost_s(self, shape: StepShape, context_len: int) -> float:
        return self.predict_step_s(shape.with_decode(context_len)) - self.predict_step_s(shape)

    def observe(self, shape: StepShape, measured_s: float) -> None:
        if not self.refit or shape.num_seqs == 0 or not measured_s > 0 or not math.isfinite(measured_s):
            return
        predicted = self.base_time_s(shape)
        if predicted <= 0:
            return
        regime = self._regime(shape)
        lo, hi = _SCALE_RANGE
        ratio = min(hi, max(lo, measured_s / predicted))
        error = ratio / self.scale[regime] - 1.0         # against the prediction made before this step
        self.rel_var[regime] += self.alpha * (error * error - self.rel_var[regime])
        self.scale[regime] += self.alpha * (ratio - self.scale[regime])
        self.num_observed += 1

    def upper_ratio(self) -> float:
        """1 + 3 standard deviations of the recent relative error of steps with prefill (the
        steps a budget plans), at most 2: a step runs over its prediction by more than this
        about one time in a hundred (an ITL target judged on a short stream's p99 is its
        longest gap, so one overrun in its ~30 steps misses it)."""
        return min(_MAX_UPPER, 1.0 + 3.0 * math.sqrt(self.rel_var["prefill"]))


class CorrectedCostModel:
    """A simulator `CostModel` carrying a `SchedulerCostModel`'s per-regime corrections, so the
    simulator advances its clock with the numbers the real engine's predictor learned."""

    def __init__(self, predictor: SchedulerCostModel) -> None:
        self.base = predictor.base
        self.scale = dict(predictor.scale)
        self.name = (f"{self.base.name} x(decode {self.scale['decode']:.2f}, "
                     f"prefill {self.scale['prefill']:.2f})")

    def step_cost(self, f: BatchFeatures) -> StepCost:
        cost = self.base.step_cost(f)
        k = self.scale["prefill" if f.num_chunks else "decode"]
        return replace(cost, time_s=cost.time_s * k, compute_util=cost.compute_util / k,
                       bandwidth_util=cost.bandwidth_util / k)


def engine_step_cost_model(config: Any, arch: Any, executor: Any = None, num_blocks: int = 0) -> SchedulerCostModel:
    """The real engine's predictor: this machine's `pacer sim calibrate` fit when it was made for
    this model, dtype and thread count; else the fit shipped with pacer (CPU) or the h100-sxm
    roofline, corrected by a start-up calibration on `executor` (seconds, cached: see
    `pacer.sim.startup_calibration`); refitted online from measured steps either way."""
    from pacer.sim.profiles import calibration_path, get_hardware

    model = _model_profile(config, arch)
    on_cpu = config.model.device == "cpu"
    hw = get_hardware("cpu-local" if on_cpu else "h100-sxm")
    dtype = "float32" if config.model.dtype == "auto" and on_cpu else (
        "bfloat16" if config.model.dtype == "auto" else config.model.dtype)
    threads = config.model.num_threads or _torch_threads()
    cm = SchedulerCostModel(make_cost_model(hw, model, dtype, 1, config.cache.block_size), refit=True)
    calib = hw.calibration or {}
    if on_cpu and calibration_path().is_file() and (calib.get("model"), calib.get("dtype"), calib.get("threads")) \
            == (model.name, dtype, threads):
        log.info("scheduling_policy=slo: predicting step times with %s (%s), refitted online", cm.base.name,
                 calibration_path())
        return cm
    how = "`pacer sim calibrate` makes a full fit of this machine"
    if executor is None:
        log.warning("scheduling_policy=slo: no calibration of this machine for %s %s x%d threads; predicting "
                    "with %s, refitted online from measured steps; %s", model.name, dtype, threads, cm.base.name, how)
        return cm
    from pacer.sim.startup_calibration import calibrate_at_startup, calibration_key

    key = calibration_key(device=config.model.device, model=model.name, dtype=dtype, threads=threads,
                          base=cm.base.name)
    entry = calibrate_at_startup(cm, executor, key=key, block_size=config.cache.block_size, num_blocks=num_blocks)
    scales = ", ".join(f"{k} x{v:.2f}" for k, v in cm.scale.items())
    if entry["cached"]:
        log.info("scheduling_policy=slo: start-up calibration read from %s (%s of %s)", entry["path"], scales,
                 cm.base.name)
    else:
        log.warning("scheduling_policy=slo: no calibration of this machine for %s %s x%d threads; timed %d steps "
                    "in %.1fs: %s of %s, cached at %s, refitted online while serving; %s", model.name, dtype,
                    threads, len(entry["samples"]), entry["seconds"], scales, cm.base.name, entry["path"], how)
    return cm


def _model_profile(config: Any, arch: Any) -> ModelProfile:
    from pacer.sim.profiles import get_model, model_from_hf_config

    try:
        return get_model(config.model.model)
    except ValueError:
        return model_from_hf_config({
            "hidden_size": arch.hidden_size, "num_attention_heads": arch.num_heads,
            "num_hidden_layers": arch.num_layers, "intermediate_size": arch.intermediate_size,
            "num_key_value_heads": arch.num_kv_heads, "head_dim": arch.head_dim, "vocab_size": arch.vocab_size,
            "max_position_embeddings": arch.max_position_embeddings,
            "tie_word_embeddings": arch.tie_word_embeddings}, arch.name or "model")


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())
