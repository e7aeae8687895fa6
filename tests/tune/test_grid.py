"""`pacer tune`: a sweep on the simulator ranks configurations against the SLO."""

from __future__ import annotations

import pytest

from pacer.cli.main import main
from pacer.tune.cli import parse_int_list


def test_tune_sweeps_and_prints_the_best_flags(capsys):
    rc = main(["tune", "--grid", "--hardware", "a100-80g", "--model", "llama-3-8b", "--workload", "chat",
               "--request-rate", "8",
               "--num-prompts", "40", "--slo", "ttft=500ms", "--max-num-seqs", "4,32",
               "--max-num-batched-tokens", "512,2048"])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.count("│") > 0 and "best: --max-num-seqs" in out
    best = out.split("best: --max-num-seqs ")[1].split()[0]
    assert best == "32"   # 4 sequences cannot keep up with 8 req/s of chats


def test_tune_needs_an_slo_and_valid_lists(capsys):
    assert main(["tune", "--hardware", "a100-80g", "--model", "llama-3-8b", "--num-prompts", "4"]) == 2
    assert "needs an SLO" in capsys.readouterr().err
    with pytest.raises(ValueError, match="integers"):
        parse_int_list("8,x", "--max-num-seqs")


def _tuned_attainment(capsys, policy: str) -> float:
    rc = main(["tune", "--grid", "--hardware", "h200-sxm", "--model", "llama-3.1-8b", "--workload", "mixed",
               "--request-rate", "120", "--num-prompts", "200", "--slo", "chat:ttft=300ms,itl=50ms",
               "--slo", "rag:ttft=2s", "--slo", "agent:ttft=500ms", "--slo", "batch:e2e=60s",
               "--max-num-seqs", "256", "--max-num-batched-tokens", "2048", "--scheduling-policy", policy])
    assert rc == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "│" in line and "256" in line)
    return float(next(c for c in row.split("│") if c.strip().endswith("%")).strip()[:-1])


def test_tune_hands_the_slo_spec_to_the_slo_policy(capsys):
    # the same class-scoped spec scores the runs and drives the scheduler: slack order needs the targets
    fcfs, slo = _tuned_attainment(capsys, "fcfs"), _tuned_attainment(capsys, "slo")
    assert slo >= 95.0 and slo > fcfs + 15.0, (fcfs, slo)
