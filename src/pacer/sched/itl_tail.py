"""How a stream's ITL is judged, and whether it can take one long gap. Pure Python.

A request's ITL target holds on the 99th percentile of its own gaps (`Slo.met_by`: linear
between closest ranks). With n gaps that percentile sits at position 0.99 (n - 1) of the sorted
gaps: between the j-th and the (j - 1)-th largest, j = n - floor(0.99 (n - 1)), with weights 1 - f
and f (f the position's fraction). So one more long gap moves it only by its weight: a stream that
will have 96 gaps, the others at 180 ms, takes a 0.58 s stall within a 200 ms target (the largest
gap weighs 0.05), one of 20 gaps barely its target (0.81), and from 101 gaps on the largest gap
does not count while the next ones stay within. `absorbs` answers whether a running stream can take a gap
of a given length now and still meet its target, from its few largest gaps so far
(`RequestMetrics.top_gaps`) and the fewest gaps it can end with (`final_gaps`): with an unknown
length that is the gaps it has plus this one, whose weight is the largest, so the answer errs
towards protecting the stream. The slo policy counts the streams a long prefill step would cost
this way (pacer.sched.slo_budget, `_itl_stands`).
"""

from __future__ import annotations

import math

from pacer.request import Request

__all__ = ["absorbs", "final_gaps", "missed", "p99_rank", "p99_with"]

PLANNED_GAP_SHARE = 0.9   # a gap still to come is planned within this share of the target (BUDGET_SAFETY)


def p99_rank(n: int) -> tuple[int, float]:
    """Where the 99th percentile of n gaps sits: (j, f), the value (1 - f) x the j-th largest +
    f x the (j - 1)-th largest (j = 1: the largest alone)."""
    if n < 1:
        raise ValueError(f"a stream's gaps must number at least 1, got {n}")
    pos = 0.99 * (n - 1)
    k = math.floor(pos)
    j = n - k
    return j, (pos - k if j > 1 else 0.0)


def p99_with(top: list[float], past: int, n: int, gap: float, future: float) -> float:
    """The 99th percentile of a stream's n final gaps given its `past` gaps so far (the largest
    of them in `top`, descending; the others at most its last), one more of `gap` seconds and, for
    the n - past - 1 still to come, `future` seconds each."""
    j, f = p99_rank(n)
    known = list(top[:j])
    if past > len(known):   # gaps so far that `top` does not keep are at most its smallest
        known += [known[-1] if known else 0.0] * (min(past, j) - len(known))
    values = sorted([*known, gap, *[future] * min(max(n - past - 1, 0), j)], reverse=True)
    return values[0] if j == 1 else (1 - f) * values[j - 1] + f * values[j - 2]


def final_gaps(r: Request) -> int:
    """The fewest gaps `r`'s stream can end with once it has one more: the gaps it has, that
    one, and those its remaining forced tokens (`ignore_eos` to `max_tokens`, or `min_tokens`)
    still need at the tokens per emission it has had (a verified draft is one emission)."""
    m = r.metrics
    tokens = len(m.token_times)
    sp = r.sampling_params
    forced = (sp.max_tokens if sp.ignore_eos else sp.min_tokens) - tokens
    per_emission = max(1.0, tokens / (m.num_gaps + 1)) if tokens else 1.0
    return m.num_gaps + 1 + max(0, math.ceil(forced / per_emission) - 1)


def _over_target(r: Request, gap: float) -> float | None:
    """How far past its ITL target `r`'s final 99th-percentile gap lands (<= 0: within) if its
    next gap takes `gap` seconds and the rest are planned within PLANNED_GAP_SHARE of the target;
    None without an ITL target or a token yet."""
    slo = r.slo
    if slo is None or slo.itl is None or not r.metrics.token_times:
        return None
    m = r.metrics
    return p99_with(m.top_gaps, m.num_gaps, final_gaps(r), gap, PLANNED_GAP_SHARE * slo.itl) - slo.itl


def absorbs(r: Request, gap: float) -> bool:
    """Whether `r`'s stream, decoding, can take its next gap `gap` seconds long and still meet
    its ITL target on its 99th-percentile gap. No inter-token target: nothing to protect (True);
    a TPOT-only target is an average every gap moves, and a stream with no token yet has no
    gaps to spread one over (False)."""
    if r.slo is None or r.slo.itl_target is None:
        return True
    over = _over_target(r, gap)
    return over is not None and over <= 0


def missed(r: Request, now: float) -> bool:
    """Whether `r`, decoding, already missed a target it cannot make up: its first token came
    after its TTFT, its e2e deadline passed, or its gaps so far put its 99th-percentile gap past
    its ITL target however the rest go."""
    slo = r.slo
    if slo is None:
        return False
    ttft = r.metrics.ttft
    if slo.ttft is not None and ttft is not None and ttft > slo.ttft:
        return True
    if slo.e2e is not None and now - r.arrival_time > slo.e2e:
        return True
    over = _over_target(r, 0.0)
    return over is not None and over > 0
