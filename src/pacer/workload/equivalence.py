"""Equivalence testing for paired measurements: TOST (two one-sided t-tests), standard library
only (Student's t from the regularized incomplete beta function).

"No significant difference" is not evidence of no difference: with few or noisy samples it
passes by chance. TOST asks the opposite question: is the mean difference confidently inside
a stated margin `(-margin, +margin)`? Equivalence is declared when both one-sided tests reject
at level `alpha`, i.e. when the `1 - 2*alpha` confidence interval of the mean lies inside the
margin. Used by the tenant-isolation timing test and `benchmarks/isolation_timing.py`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["TostResult", "tost_paired", "student_t_cdf", "student_t_ppf"]


@dataclass(frozen=True, slots=True)
class TostResult:
    n: int
    mean: float
    sd: float
    ci_low: float           # the 1 - 2*alpha confidence interval of the mean
    ci_high: float
    margin: float
    p_value: float          # the larger of the two one-sided p-values
    equivalent: bool        # p_value < alpha: the mean lies within (-margin, margin)

    def line(self, unit: str = "") -> str:
        return (f"n={self.n} mean={self.mean:+.4f}{unit} sd={self.sd:.4f} "
                f"CI=[{self.ci_low:+.4f}, {self.ci_high:+.4f}] margin=±{self.margin:.4f} "
                f"p={self.p_value:.3g} equivalent={self.equivalent}")


def tost_paired(diffs: Sequence[float], margin: float, alpha: float = 0.05) -> TostResult:
    """TOST on paired differences against the equivalence margin (-margin, +margin)."""
    if len(diffs) < 3:
        raise ValueError(f"tost_paired needs at least 3 differences, got {len(diffs)}")
    if not margin > 0 or not 0 < alpha < 0.5:
        raise ValueError(f"margin must be > 0 and alpha in (0, 0.5), got {margin!r}, {alpha!r}")
    n = len(diffs)
    mean = statistics.fmean(diffs)
    sd = statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    df = n - 1
    t_crit = student_t_ppf(1 - alpha, df)
    if se == 0:
        p = 0.0 if abs(mean) < margin else 1.0
    else:
        p_low = 1 - student_t_cdf((mean + margin) / se, df)    # H0: mean <= -margin
        p_high = student_t_cdf((mean - margin) / se, df)       # H0: mean >= +margin
        p = max(p_low, p_high)
    return TostResult(n, mean, sd, mean - t_crit * se, mean + t_crit * se, margin, p, p < alpha)


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2, 0.5, x)
    return 1 - tail if t > 0 else tail


def student_t_ppf(p: float, df: float) -> float:
    """The `p` quantile of Student's t (bisection on the CDF; |error| < 1e-10)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    low, high = -1e3, 1e3
    for _ in range(200):
        mid = (low + high) / 2
        if student_t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-10:
            break
    return (low + high) / 2


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1) / (a + b + 2):   # converges faster on the other side
        return 1 - _betainc(b, a, 1 - x)
    return math.exp(log_front) * _beta_fraction(a, b, x) / a


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h
