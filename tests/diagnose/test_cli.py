"""`pacer diagnose` end to end on simulated runs of the four provoked conditions (the real scheduler
on this machine's default calibrated profile): each names its cause; --json has the documented
shape; --what-if predicts a change; --plots draws the three figures."""

from __future__ import annotations

import json

import pytest

from pacer.cli.main import main

CONDITIONS = {
    # overload: chats at 6 req/s with 4 sequences
    "queue": (None, ["--workload", "chat", "--request-rate", "6", "--num-prompts", "40", "--max-num-seqs", "4"]),
    # long prompts among chats
    "prefill": ("classes:\n  - {name: chat, weight: 3, prompt_len: {mean: 96, cv: 0.3}, output_len: 64}\n"
                "  - {name: long, weight: 1, prompt_len: {mean: 1800, cv: 0.1}, output_len: 16}\n",
                ["--request-rate", "1", "--num-prompts", "24"]),
    # a large token budget under many decodes
    "decode": ("classes:\n  - {name: chat, weight: 1, prompt_len: {mean: 160, cv: 0.2}, output_len: 192}\n",
               ["--request-rate", "2", "--num-prompts", "30", "--max-num-seqs", "64",
                "--max-num-batched-tokens", "8192"]),
    # a KV budget too small
    "preemption": ("classes:\n  - {name: chat, weight: 1, prompt_len: {mean: 256, cv: 0.2}, output_len: 256}\n",
                   ["--request-rate", "2", "--num-prompts", "16", "--kv-cache-memory", "48MiB"]),
}


@pytest.fixture(autouse=True)
def default_calibration(monkeypatch, tmp_path):
    """cpu-local from the packaged default calibration, whatever ~/.cache holds."""
    monkeypatch.setattr("pacer.perf.profiles.calibration_path", lambda: tmp_path / "none.json")


def _run(tmp_path, name):
    spec, flags = CONDITIONS[name]
    if spec is not None:
        (tmp_path / f"{name}.yaml").write_text(spec)
        flags = ["--workload", str(tmp_path / f"{name}.yaml"), *flags]
    out = tmp_path / f"{name}.json"
    assert main(["sim", *flags, "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("name", list(CONDITIONS))
def test_each_provoked_condition_is_named(tmp_path, capsys, name):
    path = _run(tmp_path, name)
    capsys.readouterr()
    assert main(["diagnose", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["overall"]["bottleneck"] == name
    for cls in d["classes"].values():
        assert set(cls) >= {"count", "bottleneck", "decomposition", "evidence", "recommendations"}
        assert set(cls["decomposition"]) == {"queue", "prefill", "decode", "preemption"}
        assert cls["bottleneck"] == name
        assert cls["recommendations"] and all("text" in r and "flags" in r for r in cls["recommendations"])
    parts = d["overall"]["decomposition"]
    e2e = d["overall"]["latency"]["e2e"]["mean"]
    assert sum(parts.values()) == pytest.approx(e2e, rel=1e-9)


def test_slo_met_names_none_and_what_if_predicts_a_change(tmp_path, capsys):
    path = _run(tmp_path, "preemption")
    capsys.readouterr()
    assert main(["diagnose", str(path), "--json", "--slo", "e2e=1000s"]) == 0
    assert json.loads(capsys.readouterr().out)["overall"]["bottleneck"] == "none"
    assert main(["diagnose", str(path), "--json", "--what-if", "--kv-cache-memory", "48MiB"]) == 0
    w = json.loads(capsys.readouterr().out)["what_if"]
    assert w["today"]["preemptions"] > 0 and w["recommended"]
    flags = {r["flags"]: r for r in w["recommended"]}
    more_kv = flags["--kv-cache-memory 96MiB"]
    assert more_kv["preemptions"] < w["today"]["preemptions"]
    assert more_kv["e2e_p99"] < w["today"]["e2e_p99"]


def test_tables_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = _run(tmp_path, "prefill")
    capsys.readouterr()
    assert main(["diagnose", str(path), "--plots", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "latency decomposition" in out and "bottleneck prefill" in out and "--long-prefill-token-threshold" in out
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"breakdown.png", "ttft_vs_prompt.png",
                                                                "itl_over_time.png"}


def test_bad_invocations_are_clear_errors(tmp_path, capsys):
    assert main(["diagnose"]) == 2
    assert "SOURCE files or --metrics-url" in capsys.readouterr().err
    bad = tmp_path / "t.csv"
    bad.write_text("input_tokens,output_tokens,ttft\n1,2,3\n")
    assert main(["diagnose", str(bad)]) == 2
    assert "missing required column 'total_latency'" in capsys.readouterr().err
