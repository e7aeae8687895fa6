"""How big a step's prefill chunk may be, asked of the step cost model. Pure Python.
`SloBudget` (pacer.sched.slo_budget) mixes it in and decides which of these questions a step
asks; this module only answers them, each by a search over chunk sizes of a prediction that
grows with the chunk:

- **the most that fit a time** (`fit_chunk`, `largest_where`; `smallest_where`, its mirror): the largest chunk that keeps the
  step within a limit, a step's first chunk never below MIN_PREFILL_TOKENS (no starvation by a
  tight limit);
- **the first-token limit** (`chunk_fitter`, `first_token_limit`): once a step answers a prompt,
  other requests' chunks keep it within FIRST_TOKEN_SHARE of that prompt's TTFT;
- **rates** (`_chunk_rate`, `_best_rate_tokens`, `_fewest_at_rate`): prefill tokens per second
  of the step a chunk makes, the chunk with the best rate (it rises while more tokens share the
  step's fixed cost and falls once the chunk's attention grows faster), and the fewest tokens
  that reach a rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pacer.request import Request
from pacer.sched.step_cost import StepCostModel, StepShape
from pacer.sched.step_plan import ChunkFit, StepPlan

__all__ = ["ChunkSizing", "largest_where", "smallest_where", "MIN_PREFILL_TOKENS", "FIRST_TOKEN_SHARE"]

MIN_PREFILL_TOKENS = 16   # prefill tokens a step always allows (no starvation by a tight ITL)
FIRST_TOKEN_SHARE = 0.5   # a step that answers a prompt adds others' chunks only up to this share of its TTFT
_INF = math.inf


class ChunkSizing:
    """The chunk-size searches of `SloBudget` (a mixin: the attributes are the policy's)."""

    cost_model: StepCostModel
    latest_start: Callable[[Request], float]

    def chunk_fitter(self, limit: float | None, now: float) -> ChunkFit:
        """`fit_chunk` bound to a step's time limit (None: no limit) and to its first-token limit:
        once the step answers a prompt (a row ends a prompt not yet answered), a chunk of another
        request that is not in a hurry keeps the step within FIRST_TOKEN_SHARE of the tightest
        TTFT among those rows (or the step so far, if longer), since their first tokens wait for
        the whole step; that request's next step takes the rest. In a hurry: it could not wait
        one more step of that chunk's length and still start by its latest start. Past
        saturation on a slow CPU a 2,048-token step ran 2.5-3 s: five 100-token chats that shared
        it with a rag prompt's whole prompt waited all of it."""

        def fit(step: StepPlan, shape: StepShape, req: Request, n: int, start: int, samples: bool, first: bool) -> int:
            bound = limit
            first_token = self.first_token_limit(step)
            if first_token is not None:
                full = self.cost_model.predict_step_s(shape.with_chunk(n, start, samples))
                slack = self.latest_start(req) - now
                if full > first_token and not 0 <= slack < full:
                    first_token = max(first_token, self.cost_model.predict_step_s(shape))
                    bound = first_token if bound is None else min(bound, first_token)
            return n if bound is None else self.fit_chunk(shape, n, start, samples, first, bound)

        return fit

    @staticmethod
    def first_token_limit(step: StepPlan) -> float | None:
        """FIRST_TOKEN_SHARE x the tightest TTFT target among the step's rows that end a prompt
        not yet answered (their first token comes with the step); None without one."""
        tightest = _INF
        for rid, req in step.requests.items():
            if req.output_token_ids:   # the decode rows, most of a step's: answered already
                continue
            slo = req.slo
            if slo is None or slo.ttft is None or slo.ttft >= tightest:
                continue
            if req.num_computed_tokens + step.num_tokens[rid] >= req.num_tokens:
                tightest = slo.ttft
        return FIRST_TOKEN_SHARE * tightest if math.isfinite(tightest) else None

    def fit_chunk(self, shape: StepShape, n: int, start: int, samples: bool, first: bool, limit: float) -> int:
        """Of a chunk of `n` tokens from `start` (sampling when whole: it ends the prompt), the
        most that keep `shape` plus the chunk within `limit`; the step's first prefill chunk gets
        at least MIN_PREFILL_TOKENS, a later one may get none."""
        if (first and n <= MIN_PREFILL_TOKENS) or self.cost_model.predict_step_s(shape.with_chunk(n, start, samples)) <= limit:
            return n
        return self._largest_within(shape, start, MIN_PREFILL_TOKENS if first else 0, n - 1, False, limit)

    def _largest_within(self, shape: StepShape, start: int, lo: int, hi: int, sample: bool, limit: float) -> int:
        """The largest n in [lo, hi] whose chunk keeps the step within `limit` (lo if none)."""
        return largest_where(lo, hi, lambda m: self.cost_model.predict_step_s(shape.with_chunk(m, start, sample)) <= limit)

    def _chunk_rate(self, shape: StepShape, start: int, n: int) -> float:
        """Predicted prefill tokens per second of the step `shape` plus a chunk of `n` from `start`."""
        return n / self.cost_model.predict_step_s(shape.with_chunk(n, start))

    def _fewest_at_rate(self, shape: StepShape, start: int, lo: int, hi: int, want: float) -> int:
        """The fewest tokens in [lo, hi] whose rate is at least `want`, given that hi's is and that
        the rate rises up to hi (hi at or below the rate's peak, or within the span that covers)."""
        return smallest_where(lo, hi, lambda m: self._chunk_rate(shape, start, m) >= want)

    def _best_rate_tokens(self, shape: StepShape, start: int, lo: int, hi: int) -> int:
        """The chunk size in [lo, hi] whose predicted prefill rate (tokens per second of the step)
        is highest. The rate rises while more tokens share the step's fixed cost (its decodes,
        the weights read) and falls once the chunk's attention, quadratic in its length, grows
        faster: one peak, the first size whose next one is no faster, found by bisection."""
        predict = self.cost_model.predict_step_s
        # rate(m + 1) <= rate(m), cross-multiplied: the rate stopped rising at m
        return smallest_where(lo, hi, lambda m: (m + 1) * predict(shape.with_chunk(m, start))
                              <= m * predict(shape.with_chunk(m + 1, start)))


def largest_where(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """The largest n in [lo, hi] that `fits` (lo if none does), bisected: for a `fits` true up to
    some n and false past it (a step's predicted time grows with its tokens)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def smallest_where(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """The smallest n in [lo, hi] that `fits` (hi if none below it does; hi itself is not asked),
    bisected: for a `fits` false up to some n and true past it."""
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
