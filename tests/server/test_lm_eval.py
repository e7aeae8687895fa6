"""lm-evaluation-harness against `pacer serve` (slow): `lm_eval --model local-completions` on a
small local multiple-choice task made from pacer's shipped text gives `lm_eval --model hf`'s
accuracy on the same weights in float32 (within one item) and per-item loglikelihoods within
1e-3. The full comparison, over every numerics setting, is benchmarks/grading.py."""

from __future__ import annotations

import pytest
from benchmarks.grading import HF_DIR, LM_EVAL, compare, grade_hf, grade_served, write_task

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not LM_EVAL.exists() or not (HF_DIR / "config.json").exists(),
                    reason="lm-eval peer not installed (setup.sh lmeval and hf)")
def test_lm_eval_local_completions_matches_hf_float32(tmp_path):
    task = write_task(tmp_path / "task", 12)
    ref = grade_hf(task, tmp_path)
    got = grade_served(["--dtype", "float32"], task, tmp_path, "float32")
    mean, worst, _ = compare(ref, got)
    print(f"lm-eval: hf acc {ref['acc']:.3f}, pacer acc {got['acc']:.3f}; |dLL| mean {mean:.2e} max {worst:.2e}")
    assert abs(ref["acc"] - got["acc"]) * ref["n"] <= 1
    assert worst < 1e-3
