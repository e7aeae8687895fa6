"""Whether the slo policy's step targets can be met at today's load, and the regime it is in.
Pure Python (the standard library's logging only).

The slo policy budgets each step's prefill so the step stays within the tightest inter-token
target among its decodes (or a share of the tightest TTFT, for arrivals). When the decodes
alone are predicted to take longer than that limit, no prefill budget can meet it: chasing
it only starves prefill (the queue grows and every request misses its TTFT, issue 25). In
that regime the policy stops chasing: the step takes the budget fcfs would give
(`max_num_batched_tokens`), so the predicted queue drain rate is never below fcfs's.

`FeasibilityTracker` keeps the regime and reports a change once (a log line and a count),
not once per step, and leaves a regime only after REGIME_HOLD_S without it; the step's `budget_reason` names the regime on every step. A second tracker
judges arrivals' TTFT against the queue (`SloPolicy.refuse_late_arrivals`).
"""

from __future__ import annotations

import logging

from pacer.sched.step_cost import StepCostModel, StepShape

__all__ = ["BACKLOG", "FEASIBLE", "ITL_INFEASIBLE", "TTFT_DRAIN", "TTFT_INFEASIBLE", "REGIME_HOLD_S", "FeasibilityTracker",
           "decodes_exceed"]

FEASIBLE = "feasible"
ITL_INFEASIBLE = "itl infeasible"
BACKLOG = "backlog"   # budget_reason: hopeless requests wait; prefill kept near its best rate (throughput)
TTFT_DRAIN = "ttft drain"   # budget_reason: the queue's TTFTs needed more prefill than the ITL budget gave
TTFT_INFEASIBLE = "ttft infeasible"   # the queue's predicted prefill makes arrivals miss their TTFT
REGIME_HOLD_S = 5.0   # a regime is left for FEASIBLE only after this long without it (no flip per arrival)

logger = logging.getLogger("pacer.sched.feasibility")


def decodes_exceed(cost_model: StepCostModel, decodes: StepShape, limit_s: float) -> float | None:
    """The decodes' predicted step time when it alone exceeds `limit_s` (None: the limit can be met)."""
    if decodes.num_seqs == 0:
        return None
    decode_s = cost_model.predict_step_s(decodes)
    return decode_s if decode_s > limit_s else None


class FeasibilityTracker:
    """The regime the policy is in; each change is logged once and counted (`num_flips`). With
    `hold_s`, a return to FEASIBLE is recorded only once no other regime was observed for that
    long (observations carry `now`): past saturation admission alternates between refusing one
    arrival and admitting the next, and a flip each time would be a log line per arrival."""

    __slots__ = ("target", "regime", "num_flips", "last_detail", "hold_s", "_last_bad")

    def __init__(self, target: str = "itl", hold_s: float = 0.0) -> None:
        self.target = target   # which targets it judges (named in the log line)
        self.regime = FEASIBLE
        self.num_flips = 0
        self.last_detail = ""
        self.hold_s = hold_s
        self._last_bad = -float("inf")   # when a regime other than FEASIBLE was last observed

    def observe(self, regime: str, detail: str = "", now: float | None = None) -> bool:
        """Record this step's regime; True (and one log line) when it differs from the last."""
        if regime != FEASIBLE and now is not None:
            self._last_bad = now
        if regime == self.regime:
            return False
        if regime == FEASIBLE and now is not None and now - self._last_bad < self.hold_s:
            return False   # not long enough without the other regime: still in it
        logger.warning("slo %s targets %s -> %s%s", self.target, self.regime, regime, f": {detail}" if detail else "")
        self.regime = regime
        self.num_flips += 1
        self.last_detail = detail
        return True
