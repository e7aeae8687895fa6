"""`pacer bench` end to end through `pacer.cli.main.main`: against the scripted server (report,
--out, plots, sweep, trace replay, compare) and on the in-process engine (default model)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pacer.cli.main import main
from pacer.workload.report import OVERALL, Report


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    script = {"ttft": 0.01, "gaps": [0.002]}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent.parent / "workload" / "scripted_server.py"),
                             json.dumps(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_bench_http_report_out_plots_and_compare(server: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json"
    rc = main(["bench", "--base-url", server, "--workload", "mixed", "--num-prompts", "12", "--request-rate", "100",
               "--max-model-len", "2048", "--slo", "ttft=1s", "--slo", "rag:ttft=2s", "--out", str(out),
               "--plots", str(tmp_path / "plots"), "--no-progress", "--seed", "3"])
    assert rc == 0
    rep = Report.load(out)
    assert rep.summary[OVERALL]["num_requests"] == 12 == len(rep.records)
    assert rep.summary[OVERALL]["num_ok"] == 12
    assert sum(int(rep.summary[c]["num_requests"] or 0) for c in rep.classes) == 12
    assert rep.meta["model"] == "scripted" and rep.meta["workload"] == "mixed"
    assert rep.slo.for_class("rag").ttft == 2.0
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"latency_cdf.png", "timeline.png",
                                                               "ttft_vs_prompt.png"}
    printed = capsys.readouterr().out
    assert "overall" in printed and "goodput" in printed
    assert main(["bench", "compare", str(out), str(out)]) == 0
    assert "TTFT p99" in capsys.readouterr().out


def test_bench_sweep_and_trace_replay(server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--base-url", server, "--input-len", "20", "--output-len", "3", "--num-prompts", "4",
               "--request-rate", "50,100", "--endpoint", "chat", "--out", str(tmp_path / "s.json"), "--no-progress",
               "--plots", str(tmp_path / "plots")])
    assert rc == 0
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["s.rate-100.json", "s.rate-50.json"]
    assert (tmp_path / "plots" / "sweep.png").is_file() and (tmp_path / "plots" / "rate-50-timeline.png").is_file()
    assert "load sweep" in capsys.readouterr().out
    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 0.0, "prompt_tokens": 30, "output_tokens": 2, "class": "a"},
            {"timestamp": 0.05, "prompt": "Tell me a story.", "output_tokens": 3, "class": "b", "tenant": "t1"},
            {"timestamp": 0.1, "prompt_tokens": 50, "output_tokens": 4, "class": "a", "priority": 1}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["bench", "--base-url", server, "--trace", str(trace), "--out", str(tmp_path / "t.json"),
                 "--no-progress"]) == 0
    rep = Report.load(tmp_path / "t.json")
    assert [r.output_tokens for r in rep.records] == [2, 3, 4]
    assert rep.classes == ["a", "b"] and rep.records[1].tenant == "t1"


def test_bench_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--input-len", "8"]) == 2
    assert "--base-url" in capsys.readouterr().err
    assert main(["bench", "frobnicate"]) == 2
    assert main(["bench", "--engine", "inprocess", "--slo", "speed=1"]) == 2


def test_bench_inprocess_with_engine_flags(tmp_path: Path) -> None:
    out = tmp_path / "inproc.json"
    rc = main(["bench", "--engine", "inprocess", "--input-len", "24", "--output-len", "4", "--num-prompts", "4",
               "--request-rate", "inf", "--no-enable-chunked-prefill", "--num-threads", "1", "--max-model-len",
               "512", "--out", str(out), "--no-progress"])
    assert rc == 0
    rep = Report.load(out)
    s = rep.summary[OVERALL]
    assert (s["num_requests"], s["num_ok"], s["output_tokens"], s["prompt_tokens"]) == (4, 4, 16, 96)
    assert rep.meta["engine_args"]["enable_chunked_prefill"] is False
    assert rep.meta["engine_steps"]["num_steps"] >= 4
    for r in rep.records:
        assert r.ttft is not None and r.ttft > 0 and len(r.itl) == 3 and r.queue_wait is not None
        assert r.e2e is not None and r.e2e >= r.ttft
