"""Non-negative least squares for the step-time fit (Lawson-Hanson active set, numpy only).

Step times span three orders of magnitude (a 1 ms decode, a 2 s prefill), so the fit
minimises *relative* error: each row is divided by its measured time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["nnls", "fit_relative", "FitStats"]

Array = npt.NDArray[np.float64]


def nnls(a: Array, b: Array, max_iter: int = 500) -> Array:
    """argmin ||a x - b|| subject to x >= 0."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 1e-10 * max(1.0, float(np.abs(w).max(initial=0.0)))
    for _ in range(max_iter):
        if passive.all() or (w[~passive] <= tol).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / (x[neg] - z[neg])))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


class FitStats:
    """Relative errors of a fit on its own samples."""

    def __init__(self, predicted: Sequence[float], measured: Sequence[float]) -> None:
        rel = [abs(p - y) / y for p, y in zip(predicted, measured) if y > 0]
        rel.sort()
        self.n = len(rel)
        self.median_rel_err = rel[len(rel) // 2] if rel else 0.0
        self.p90_rel_err = rel[min(len(rel) - 1, int(0.9 * len(rel)))] if rel else 0.0
        self.max_rel_err = rel[-1] if rel else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"samples": self.n, "median_rel_err": self.median_rel_err, "p90_rel_err": self.p90_rel_err,
                "max_rel_err": self.max_rel_err}


def fit_relative(rows: Sequence[Sequence[float]], times: Sequence[float]) -> list[float]:
    """Non-negative coefficients c minimising sum(((x . c) - t) / t)^2."""
    x = np.asarray(rows, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != t.shape[0] or x.shape[0] == 0:
        raise ValueError(f"fit needs one time per feature row, got {x.shape} rows and {t.shape} times")
    if (t <= 0).any():
        raise ValueError("measured step times must be > 0")
    a = x / t[:, None]
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    c = nnls(a / scale, np.ones_like(t)) / scale
    return [float(v) for v in c]
