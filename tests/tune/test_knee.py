"""The method's knee: the largest max_num_seqs before KV pressure, on simulated sweeps whose knee
is known because the KV budget holds exactly 16 requests."""

from __future__ import annotations

import math

from pacer.diagnose.replay import SimTarget
from pacer.tune.method import find_knee, run_method
from pacer.workload.arrivals import Poisson
from pacer.workload.generator import generate_requests
from pacer.workload.report import parse_slo
from pacer.workload.spec import builtin_workload

PROMPT, OUTPUT = 240, 128                        # 368 tokens = 23 blocks of 16 per request
FITS = 16                                         # the KV budget holds exactly this many requests
KV = {"num_kv_blocks": FITS * math.ceil((PROMPT + OUTPUT) / 16)}


def test_find_knee_on_hand_made_sweeps():
    seqs = [1, 2, 4, 8, 16, 32]
    # preemptions start at 32: knee 16
    assert find_knee(seqs, [0, 0, 0, 0, 0, 0.5], [10, 11, 12, 13, 14, 15]) == 4
    # a bend in TPOT p99 at 16 (x3 after x1.1 steps): knee 8
    assert find_knee(seqs, [0] * 6, [10, 11, 12, 13, 39, 40]) == 3
    # a steady rise of 1.3x per doubling is a bigger batch, not a knee
    assert find_knee(seqs, [0] * 6, [10 * 1.3 ** i for i in range(6)]) == 5
    # a stray preemption under the tolerance does not count; the first point preempting gives 0
    assert find_knee(seqs, [0, 0.01, 0, 0, 0, 0], [10] * 6) == 5
    assert find_knee(seqs, [0.5] * 6, [10] * 6) == 0


def _specs(n=48):
    wl = builtin_workload("fixed", PROMPT, OUTPUT)
    return generate_requests(wl, Poisson(math.inf), seed=0, num_requests=n, max_model_len=4096)


def test_knee_found_on_a_simulated_sweep_with_a_known_knee():
    target = SimTarget("a100-80g", "llama-3-8b")
    specs = _specs()
    seqs = [2, 4, 8, 16, 32, 64]
    runs = [target.run(str(s), {**KV, "max_num_seqs": s}, specs) for s in seqs]
    preempt = [r.summary["preemptions"] / len(specs) for r in runs]
    assert preempt[:4] == [0, 0, 0, 0] and preempt[4] > 0     # the budget is what the sweep says
    k = find_knee(seqs, preempt, [r.summary["tpot_p99"] for r in runs])
    assert seqs[k] == FITS


def test_the_method_picks_the_knee_and_a_budget_under_it():
    target = SimTarget("a100-80g", "llama-3-8b")
    lines: list[str] = []
    result = run_method(target, dict(KV), _specs(), parse_slo(["tpot=40ms"]), 0.9, seqs_list=[4, 8, 16, 32, 64],
                        budgets=[1024, 4096], say=lines.append)
    assert result.knee_seqs == FITS
    assert result.chosen.kwargs["max_num_seqs"] == FITS
    assert result.chosen.kwargs["max_num_batched_tokens"] in (1024, 4096)
    assert result.runner_up is not None and result.runner_up.label != result.chosen.label
    text = "\n".join(lines)
    assert "(3)" in text and "(4)" in text and "(5)" in text and "<- knee" in text
