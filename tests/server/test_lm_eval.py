"""lm-evaluation-harness against `pacer serve` (slow): `lm_eval --model local-completions` on
small local tasks made from pacer's shipped text gives `lm_eval --model hf`'s results on the
same weights in float32: multiple choice, the accuracy (within one item) and per-item
loglikelihoods within 1e-3; `generate_until` (greedy), the exact-match score (within one item)
and the same generated text (at most one item differing, a near-tie). The full comparison, over
every numerics setting, is benchmarks/grading.py."""

from __future__ import annotations

import pytest
from benchmarks.grading import (
    HF_DIR,
    LM_EVAL,
    compare,
    differing_generations,
    grade_hf,
    grade_served,
    write_task,
)

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not LM_EVAL.exists() or not (HF_DIR / "config.json").exists(),
                    reason="lm-eval peer not installed (setup.sh lmeval and hf)")
def test_lm_eval_local_completions_matches_hf_float32(tmp_path):
    task = write_task(tmp_path / "task", 12)
    ref = grade_hf(task, tmp_path)
    got = grade_served(["--dtype", "float32"], task, tmp_path, "float32")
    mean, worst, _ = compare(ref, got)
    print(f"lm-eval: hf acc {ref['acc']:.3f}, pacer acc {got['acc']:.3f}; |dLL| mean {mean:.2e} max {worst:.2e}")
    gen, differ = got["gen"], differing_generations(ref, got)
    print(f"lm-eval generate_until: hf exact match {ref['gen']['em']:.3f}, pacer {gen['em']:.3f}; "
          f"{differ} of {gen['n']} generations differ")
    assert abs(ref["acc"] - got["acc"]) * ref["n"] <= 1
    assert worst < 1e-3
    assert gen["n"] == ref["gen"]["n"] == 12 and abs(ref["gen"]["em"] - gen["em"]) * gen["n"] <= 1
    assert differ <= 1
