"""`pacer bench` against a live `pacer serve` process on 127.0.0.1 (default model): the report is
complete and its counts match the requests sent; the server's --request-log replays as a trace."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pacer.cli.main import main
from pacer.workload.report import OVERALL, Report


class _Server:
    def __init__(self, log: Path) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pacer.cli.main", "serve", "--port", "0", "--num-threads", "1",
             "--max-model-len", "1024", "--request-log", str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.url: str | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            m = re.search(r"running on (http://[\d.]+:\d+)", line)
            if m and self.url is None:
                self.url = m.group(1)
                self.ready.set()
        self.ready.set()   # exited: wake the waiter, which sees no url


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    log = tmp_path_factory.mktemp("live") / "requests.jsonl"
    srv = _Server(log)
    try:
        srv.ready.wait(180)
        if srv.url is None:
            raise AssertionError("pacer serve did not start:\n" + "".join(srv.lines[-30:]))
        yield srv.url, log
    finally:
        srv.proc.terminate()
        srv.proc.wait(30)


def test_bench_against_live_pacer_server(server: tuple[str, Path], tmp_path: Path) -> None:
    url, log = server
    out = tmp_path / "live.json"
    spec = tmp_path / "small_chat.yaml"   # chat turns with a shared 48-token system prompt, 4-token replies
    spec.write_text("classes:\n  - {base: chat, prompt_len: 16, output_len: 4, shared_prefix_len: 48, turns: 2}\n")
    rc = main(["bench", "--base-url", url, "--endpoint", "chat", "--workload", str(spec), "--num-prompts", "6",
               "--concurrency", "2", "--out", str(out), "--no-progress", "--slo", "ttft=60s"])
    assert rc == 0
    rep = Report.load(out)
    s = rep.summary[OVERALL]
    assert (s["num_requests"], s["num_ok"], s["num_errors"], s["num_rejected"]) == (6, 6, 0, 0)
    assert s["output_tokens"] == sum(r.output_tokens for r in rep.records) > 0
    assert all(r.ttft is not None and r.e2e is not None and r.tpot is not None for r in rep.records)
    assert all(r.prompt_tokens > 0 and r.http_status == 200 for r in rep.records)
    assert s["goodput_req_s"] == s["req_s"]
    # usage reports cached tokens: the shared system prompt and earlier turns hit the prefix cache
    assert s["cached_tokens"] > 0
    deadline = time.monotonic() + 30
    while len(log.read_text().splitlines()) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)   # the log line is written just after the response ends: poll, bounded
    replay = tmp_path / "replay.json"
    assert main(["bench", "--base-url", url, "--trace", str(log), "--out", str(replay), "--no-progress"]) == 0
    rep2 = Report.load(replay)
    assert rep2.summary[OVERALL]["num_ok"] == 6
    assert sorted(r.output_tokens for r in rep2.records) == sorted(r.output_tokens for r in rep.records)


def test_agent_loop_against_live_pacer_server(server: tuple[str, Path], tmp_path: Path) -> None:
    """`--workload agent-loop` over HTTP: each agent's calls grow its history, name its session in
    x-session-id, and the server's retention counters move; without sessions they do not."""
    import json

    url, _ = server
    flags = ["bench", "--base-url", url, "--workload", "agent-loop", "--concurrency", "2", "--agent-turns", "3",
             "--tool-latency", "0.05", "--tool-latency-dist", "fixed", "--output-len", "2", "--agent-system-len", "32",
             "--agent-task-len", "16", "--tool-output-len", "16", "--no-progress"]
    runs = {}
    for name, extra in (("sessions", []), ("none", ["--no-agent-sessions"])):
        out = tmp_path / f"{name}.json"
        assert main([*flags, *extra, "--out", str(out)]) == 0
        runs[name] = json.loads(out.read_text())
    with_sessions, without = runs["sessions"], runs["none"]
    assert with_sessions["result"]["jct_p50"] > 0 and with_sessions["result"]["followup_hit"] > 0.5
    assert with_sessions["retention"]["windows_opened"] == 6 and with_sessions["retention"]["returns"] >= 4
    assert without["retention"]["windows_opened"] == 0
