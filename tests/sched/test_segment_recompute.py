"""How much of a reused segment is recomputed is a scheduling decision above the operator's floor:
under the slo policy a request with TTFT slack to spare recomputes more of it (up to
`MAX_RECOMPUTE`, within the step's chunk for it), one without slack (or under fcfs, or without a
target) exactly the floor; an explicit fraction is a floor too. The engine runs on the fake
executor, which checks every position a request reads."""

from __future__ import annotations

import math
from typing import Any

import pytest

from pacer.config.slo import Slo
from pacer.request import SamplingParams
from pacer.sched.segments import AUTO_RECOMPUTE, MAX_RECOMPUTE
from tests.fakes import Arrival, drive_arrivals, make_engine

SEG = list(range(500, 540))   # 40 tokens: floor 2 (auto), most 12
P = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)


def _recomputed(policy: str, slo: Slo | None, recompute: Any = "auto") -> int:
    eng, _ = make_engine(num_blocks=96, block_size=4, max_len=96, segment_reuse="approximate",
                         segment_recompute=recompute, scheduling_policy=policy, max_num_batched_tokens=256)
    later: dict[str, Any] = {"segments": [(6, len(SEG))]}
    if slo is not None:
        later["slo"] = slo
    finals = drive_arrivals(eng, [
        Arrival(0, "first", [1, 2, 3, 4] + SEG + [9], P, None, {"segments": [(4, len(SEG))]}),   # stores it
        Arrival(3, "later", [5, 6, 7, 8, 10, 11] + SEG + [9, 12], P, None, later)], lambda: None, 200)
    m = finals["later"].metrics
    assert m.segment_reused_tokens + m.segment_recomputed_tokens == len(SEG) and m.segment_reused_tokens > 0
    return m.segment_recomputed_tokens


def test_slack_buys_more_recomputation_up_to_the_cap() -> None:
    floor, top = math.ceil(AUTO_RECOMPUTE * len(SEG)), math.ceil(MAX_RECOMPUTE * len(SEG))
    assert _recomputed("fcfs", None) == floor                   # no targets: the floor, exactly
    assert _recomputed("slo", None) == floor                    # no target for this request
    assert _recomputed("slo", Slo(ttft=30.0)) == top            # seconds of slack: the cap
    assert _recomputed("slo", Slo(ttft=1e-3)) == floor          # already late: nothing to spend


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_an_explicit_fraction_is_a_floor(fraction: float) -> None:
    assert _recomputed("fcfs", None, fraction) == math.ceil(fraction * len(SEG))
    assert _recomputed("slo", Slo(ttft=30.0), fraction) == max(math.ceil(fraction * len(SEG)),
                                                                math.ceil(MAX_RECOMPUTE * len(SEG)))
