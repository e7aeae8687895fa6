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

from pacer.perf.cost_model import BatchFeatures, CostModel, StepCost
from pacer.sched.step_cost import StepShape

__all__ = ["SchedulerCostModel", "CorrectedCostModel", "features_of", "REFIT_ALPHA"]

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
