"""`pacer tune`: a sweep on the simulator ranks configurations against the SLO."""

from __future__ import annotations

import pytest

from pacer.cli import main
from pacer.tune import parse_int_list


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
