"""Step-time noise for the simulator: what a shared machine does to the steps a model predicts.

The real engine's steps scatter around the fitted model, and its refitted predictor learns the
margin (`StepCostModel.upper_ratio`). A simulator whose steps take exactly what the scheduler
predicts never shows what that costs: no chat misses its ITL, no admission check errs.

`StepNoise` slows time itself, not steps: a log-normal slowdown of mean 1 and coefficient of
variation `cv`, the sum (in log space) of two Ornstein-Uhlenbeck processes in virtual time, a
fast one (FAST_SHARE of the variance, correlation time FAST_TAU_S) and a slow one (SLOW_TAU_S: a
neighbour holding a core for a while). A step's factor is its slowdown averaged over the step,
so a 3 s prefill step averages the fast part out where a 15 ms decode step takes it whole. The
shape is the one measured on the 2-core AVX2 machine: its decode steps of one batch size
scattered around their median with CV 0.14 and autocorrelation 0.78 at the next step, 0.5 ten
steps (~150 ms) on, 0.2 fifty steps on, which two such processes at 0.4 / 22 ms and 0.6 / 1 s
match (0.79, 0.52, 0.28). One seeded generator: a run repeats under its seed.
"""

from __future__ import annotations

import math
import random

__all__ = ["StepNoise", "FAST_SHARE", "FAST_TAU_S", "SLOW_TAU_S"]

FAST_SHARE = 0.4      # of the log-slowdown's variance, the fast process's
FAST_TAU_S = 0.022    # its correlation time (0.5 from one 15 ms decode step to the next)
SLOW_TAU_S = 1.0      # the slow process's
MAX_SEGMENTS = 256    # a step is averaged over at most this many pieces (a long one's are longer)


class StepNoise:
    """`factor(start_s, duration_s)`: how many times longer than predicted a step that starts at
    `start_s` (virtual time, never going back) and was predicted to take `duration_s` runs (mean 1);
    `cv` 0 always gives 1."""

    __slots__ = ("cv", "_sigma", "_fast", "_slow", "_rng", "_zf", "_zs", "_t")

    def __init__(self, cv: float, seed: int = 0) -> None:
        if not (cv >= 0 and math.isfinite(cv)):
            raise ValueError(f"step_noise (--step-noise) must be a finite coefficient of variation >= 0, got {cv!r}")
        self.cv = cv
        self._sigma = math.sqrt(math.log1p(cv * cv))   # of the log-slowdown, for a mean-1 log-normal of this CV
        self._fast = self._sigma * math.sqrt(FAST_SHARE)
        self._slow = self._sigma * math.sqrt(1.0 - FAST_SHARE)
        self._rng = random.Random(seed)
        self._zf = self._rng.gauss(0.0, 1.0)   # the two processes' states (standard normal), at time _t
        self._zs = self._rng.gauss(0.0, 1.0)
        self._t: float | None = None

    def _advance(self, dt: float) -> None:
        gauss = self._rng.gauss
        a, b = math.exp(-dt / FAST_TAU_S), math.exp(-dt / SLOW_TAU_S)
        self._zf = a * self._zf + math.sqrt(1.0 - a * a) * gauss(0.0, 1.0)
        self._zs = b * self._zs + math.sqrt(1.0 - b * b) * gauss(0.0, 1.0)

    def factor(self, start_s: float, duration_s: float) -> float:
        if not self.cv or not duration_s > 0:
            return 1.0
        if self._t is not None and start_s > self._t:
            self._advance(start_s - self._t)   # idle time passes too
        n = min(MAX_SEGMENTS, max(1, math.ceil(duration_s / FAST_TAU_S)))
        dt, half_var, total = duration_s / n, 0.5 * self._sigma * self._sigma, 0.0
        for _ in range(n):
            self._advance(dt)
            total += math.exp(self._fast * self._zf + self._slow * self._zs - half_var)
        self._t = start_s + duration_s
        return total / n
