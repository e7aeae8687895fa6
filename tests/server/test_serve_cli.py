"""`python -m pacer.cli.main serve` as a real process: vLLM metric names, the request log, and
SIGTERM draining (in-flight requests finish within --drain-timeout, the rest are cut)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from pacer.telemetry.request_log import read_request_log
from tests.server.conftest import MODEL, wait_for


class ServerProcess:
    def __init__(self, *flags: str) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pacer.cli.main", "serve", "--port", "0", "--num-threads", "1", *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def url(self) -> str:
        def running():
            if self.proc.poll() is not None:
                raise AssertionError("server exited:\n" + "".join(self.lines))
            return next((m.group(1) for line in self.lines
                         if (m := re.search(r"running on (http://[\d.]+:\d+)", line))), None)
        return wait_for(running, 120, "the server to listen")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("cli") / "requests.jsonl"
    srv = ServerProcess("--metrics-prefix", "vllm", "--request-log", str(log), "--drain-timeout", "6",
                        "--max-num-seqs", "8")
    srv.log = log
    try:
        srv.base = srv.url()
        yield srv
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(30)


def test_vllm_metric_names(server):
    r = httpx.post(server.base + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
                   timeout=60)
    assert r.status_code == 200
    text = httpx.get(server.base + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:request_success_total",
                 "vllm:e2e_request_latency_seconds_count", "vllm:prefix_cache_queries_total"):
        assert name in text, name
    assert "pacer_" not in text


def _stream(base: str, body: dict, out: dict) -> None:
    chunks: list[dict] = []
    try:
        with httpx.stream("POST", base + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: "):
                    chunks.append(json.loads(line[6:]))
                    out["first"] = True
    except httpx.HTTPError as e:
        out["error"] = repr(e)
    out["chunks"] = chunks


def test_sigterm_drains_then_cuts(server):
    short, long_ = {}, {}
    threads = [
        threading.Thread(target=_stream, args=(server.base, {"model": MODEL, "prompt": "Count: 1, 2,",
                                                             "max_tokens": 6, "ignore_eos": True}, short)),
        threading.Thread(target=_stream, args=(server.base, {"model": MODEL, "prompt": "A very long story:",
                                                             "max_tokens": 4000, "ignore_eos": True}, long_)),
    ]
    for t in threads:
        t.start()
    wait_for(lambda: short.get("first") and long_.get("first"), 60, "both streams to start")
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) in (0, -signal.SIGTERM)   # uvicorn re-raises the signal after draining
    for t in threads:
        t.join(30)
    assert short.get("done") and short["chunks"][-1]["choices"][0]["finish_reason"] == "length"
    assert not long_.get("done")   # cut at the drain timeout
    records = read_request_log(Path(server.log))
    reasons = sorted(r["finish_reason"] for r in records)
    assert "length" in reasons   # the drained stream (and the metrics probe, when it ran on this server first)
    assert any(r["finish_reason"] == "abort" and r["output_tokens"] < 4000 for r in records)
