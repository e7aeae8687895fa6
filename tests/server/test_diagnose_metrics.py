"""`pacer diagnose --metrics-url` against a live pacer server (real engine, real HTTP, the official
openai client), and `pacer diagnose` on the same server's request log."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from openai import OpenAI

from pacer.cli.main import main
from pacer.diagnose.analysis import OVERALL
from pacer.diagnose.baseline import Baseline
from pacer.diagnose.prometheus import analyze_metrics, scrape

from .conftest import MODEL, serve, wait_for


@pytest.fixture(scope="module")
def served(llm, tmp_path_factory):
    log = tmp_path_factory.mktemp("diag") / "requests.jsonl"
    with serve(llm.engine, "--request-log", str(log)) as s:
        s.log_path = log
        yield s


@pytest.fixture(scope="module")
def client(served):
    return OpenAI(base_url=served.v1, api_key="unused", max_retries=0)


def _send(served, client, n_chat=3):
    for i in range(n_chat):
        client.chat.completions.create(model=MODEL, max_tokens=6, temperature=0,
                                       messages=[{"role": "user", "content": f"Count to {i + 3}."}])
    r = httpx.post(f"{served.v1}/completions", headers={"X-Pacer-Agent": "1"},
                   json={"model": MODEL, "prompt": "Call a tool", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200


def test_metrics_deltas_per_class_decompose_e2e(served, client):
    url = served.base_url + "/metrics"
    before = scrape(url)
    _send(served, client)
    after = scrape(url)
    reports, description = analyze_metrics(before, after, 1.0, Baseline())
    assert description.startswith("pacer /metrics")
    assert reports[OVERALL].count == 4 and reports["chat"].count == 3 and reports["agent"].count == 1
    for rep in reports.values():
        e2e = rep.latency["e2e"]["mean"]
        assert rep.decomposition.total == pytest.approx(e2e, rel=1e-6)   # queue + prefill + decode = e2e
        assert rep.lengths["prompt_mean"] > 0 and rep.lengths["output_mean"] > 0
        assert rep.bottleneck in ("queue", "prefill", "decode", "preemption", "none")
        assert rep.evidence and rep.latency["ttft"]["p50"] is not None


def test_cli_metrics_url_over_a_window(served, client, capsys):
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            _send(served, client, n_chat=1)

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    try:
        rc = main(["diagnose", "--metrics-url", served.base_url + "/metrics", "--window", "4s", "--json"])
    finally:
        stop.set()
        t.join(60)
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["source"].startswith("pacer /metrics over 4 s")
    assert d["overall"]["count"] >= 1 and set(d["classes"]) <= {"chat", "agent"}


def test_diagnose_reads_the_servers_request_log(served, client, capsys):
    _send(served, client, n_chat=2)
    wait_for(lambda: sum(1 for _ in open(served.log_path)) >= 3, 10, "request-log lines")
    n = sum(1 for _ in open(served.log_path))
    assert main(["diagnose", str(served.log_path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["overall"]["count"] == n
    assert set(d["classes"]) <= {"chat", "agent"}
    assert d["overall"]["preemption_estimated"] is False       # the log carries the measured loss


def test_tune_verifies_against_a_server(served, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("pacer.perf.profiles.calibration_path", lambda: tmp_path / "none.json")
    rows = [{"input_tokens": 40 + i, "output_tokens": 4, "ttft": 0.2, "total_latency": 0.5, "timestamp": i * 0.01,
             "feature": "chat"} for i in range(4)]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    rc = main(["tune", "--from-log", str(trace), "--slo", "e2e=600s", "--max-num-seqs", "2,4",
               "--max-num-batched-tokens", "256", "--verify", "--base-url", served.base_url])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "verify: " + served.base_url in out and "chosen (server)" in out
    assert "the chosen configuration meets the SLA on the real engine" in out
