"""`pacer sim` end to end: bench's flags in, bench's report out."""

from __future__ import annotations

import json

from pacer.cli.main import main
from pacer.workload.report import SCHEMA, Report


def test_sim_run_prints_and_saves_the_bench_report(tmp_path, capsys):
    out, trace = tmp_path / "run.json", tmp_path / "trace.json"
    rc = main(["sim", "--hardware", "a100-80g", "--model", "llama-3-8b", "--workload", "fixed", "--input-len", "512",
               "--output-len", "16", "--num-prompts", "24", "--request-rate", "inf", "--max-num-seqs", "8",
               "--no-enable-chunked-prefill", "--out", str(out), "--chrome-trace", str(trace), "--slo", "ttft=1s"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "simulated s per wall s" in text and "memory-bound" in text
    report = Report.load(out)
    assert report.to_dict()["schema"] == SCHEMA
    overall = report.summary["overall"]
    assert overall["num_ok"] == 24 and overall["output_tokens"] == 24 * 16
    assert report.meta["target"] == "sim" and report.meta["engine_args"]["max_num_seqs"] == 8
    events = json.loads(trace.read_text())["traceEvents"]
    steps = [e for e in events if e["pid"] == 0]            # pid 1: the requests' spans
    assert steps and {e["name"] for e in steps} <= {"prefill", "decode", "mixed"}
    assert "prefill" in {e["name"] for e in steps}
    assert len([e for e in events if e["pid"] == 1 and e["ph"] == "X"]) == 24


def test_sim_closed_loop_and_tp(tmp_path):
    out = tmp_path / "run.json"
    rc = main(["sim", "--hardware", "h200-sxm", "--tp", "8", "--model", "llama-3.1-70b", "--workload", "chat",
               "--concurrency", "4", "--num-prompts", "12", "--out", str(out)])
    assert rc == 0
    assert Report.load(out).summary["overall"]["num_ok"] == 12


def test_sim_errors_name_the_bad_flag(capsys):
    assert main(["sim", "--hardware", "tpu-v9", "--num-prompts", "2"]) == 2
    assert "hardware must be one of" in capsys.readouterr().err
    assert main(["sim", "--hardware", "a100-80g", "--model", "llama-3.1-70b", "--num-prompts", "2"]) == 2
    assert "does not fit" in capsys.readouterr().err
