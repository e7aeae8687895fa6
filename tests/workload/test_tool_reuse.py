"""The shared-tool-output workload (`--workload tool-reuse`): N sessions with their own histories
receive the same K tool outputs, each request carrying its tool output's span as a segment, and
on the simulator (the real scheduler and KV bookkeeping) approximate segment reuse lowers TTFT."""

from __future__ import annotations

import statistics

import pytest

from pacer.config import EngineConfig
from pacer.perf.profiles import get_hardware, get_model
from pacer.sim.simulator import build_sim_engine, simulate
from pacer.workload.arrivals import Poisson
from pacer.workload.generator import generate_requests
from pacer.workload.tool_reuse import ToolReuse, tool_reuse_workload

SMALL = ToolReuse(num_sessions=4, num_tools=3, tool_output_len=1000, history_len=200, output_len=4)


def _specs(shape=SMALL, n=12, rate=4.0, seed=0):
    return generate_requests(tool_reuse_workload(shape), Poisson(rate), seed=seed, num_requests=n)


def _span(spec):
    (start, length), = spec.segments
    return spec.prompt_token_ids[start:start + length]


def test_sessions_receive_the_same_tool_outputs_after_their_own_histories():
    specs = _specs()
    by_tool = [specs[k * 4:(k + 1) * 4] for k in range(3)]       # tool by tool: every session gets tool k
    for group in by_tool:
        assert {s.session for s in group} == {f"tool-reuse-0-{i}" for i in range(4)}
        assert len({_span(s) for s in group}) == 1                # the same tool output's tokens
        assert len({s.prompt_token_ids[:s.segments[0][0]] for s in group}) == 4   # after different prefixes
        tool_messages = [[m for m in s.messages if m.role == "tool"] for s in group]
        assert all(len(t) == 1 for t in tool_messages) and len({t[0].content for t in tool_messages}) == 1
    assert len({_span(g[0]) for g in by_tool}) == 3               # K different tool outputs
    assert all(len(_span(s)) == 1000 and s.prompt_tokens == SMALL.prompt_len for s in specs)
    chat = specs[0].messages
    assert chat[2].as_dict()["tool_calls"][0]["id"] == chat[3].as_dict()["tool_call_id"]
    nxt = _specs(n=13)[12]                                        # a new round: new sessions, new tools
    assert nxt.session == "tool-reuse-1-" + nxt.session.rsplit("-", 1)[1] and _span(nxt) not in {
        _span(g[0]) for g in by_tool}
    assert _specs(seed=1)[0].prompt_token_ids != specs[0].prompt_token_ids


def test_a_request_that_cannot_fit_names_the_flags():
    with pytest.raises(ValueError, match="max_model_len=512.*--tool-output-len"):
        generate_requests(tool_reuse_workload(SMALL), Poisson(1.0), num_requests=1, max_model_len=512)
    with pytest.raises(ValueError, match="num_tools must be an integer >= 1"):
        ToolReuse(num_tools=0)


def _simulate(mode):
    cfg = EngineConfig.from_kwargs(segment_reuse=mode, max_num_batched_tokens=512, max_num_seqs=8)
    engine, executor, clock = build_sim_engine(cfg, get_hardware("a100-80g"), get_model("llama-3-8b"))
    records = simulate(engine, executor, clock, _specs()).records
    engine.kv.check_invariants()
    return records


def test_approximate_segment_reuse_lowers_ttft_in_the_simulator():
    off, reuse = _simulate("off"), _simulate("approximate")
    assert len(off) == len(reuse) == 12 and all(r.ok for r in off + reuse)
    # 8 of the 12 requests take most of their 1,000 tool tokens from the store instead of computing them
    assert sum(r.prefill_tokens for r in off) - sum(r.prefill_tokens for r in reuse) > 8 * 800
    ttft_off = statistics.median(r.ttft for r in off)
    ttft_reuse = statistics.median(r.ttft for r in reuse)
    assert ttft_reuse < 0.8 * ttft_off, (ttft_reuse, ttft_off)
    # the first session to meet each tool output computes it: those TTFTs barely move
    firsts = [0, 4, 8]
    assert sum(reuse[i].ttft for i in firsts) > 0.7 * sum(off[i].ttft for i in firsts)


def test_pacer_sim_runs_the_workload_from_its_flags(tmp_path, capsys):
    from pacer.cli.main import main
    from pacer.workload.report import Report

    out = tmp_path / "run.json"
    rc = main(["sim", "--hardware", "a100-80g", "--model", "llama-3-8b", "--workload", "tool-reuse",
               "--tool-sessions", "3", "--tool-outputs", "2", "--tool-output-len", "600", "--history-len", "100",
               "--output-len", "4", "--num-prompts", "6", "--request-rate", "4", "--segment-reuse", "approximate",
               "--out", str(out)])
    assert rc == 0
    report = Report.load(out)
    assert report.meta["workload"] == "tool-reuse" and report.summary["overall"]["num_ok"] == 6
    assert report.summary["overall"]["output_tokens"] == 6 * 4
    segments = report.meta["segments"]   # 3 sessions x 2 tools: each tool stored once, reused twice
    assert segments["stored"] == 2 and segments["reuses"] == 4 and segments["reused_tokens"] > 4 * 500
    assert f"segment reuse: 4 fills, {segments['reused_tokens']} prompt tokens reused" in capsys.readouterr().out
    assert main(["sim", "--workload", "tool-reuse", "--tool-outputs", "0", "--num-prompts", "2"]) == 2
    assert "--tool-outputs must be >= 1" in capsys.readouterr().err


def test_pacer_bench_over_http_needs_the_chat_endpoint(capsys):
    from pacer.cli.main import main

    assert main(["bench", "--base-url", "http://127.0.0.1:9", "--workload", "tool-reuse", "--num-prompts", "1"]) == 2
    assert "needs --endpoint chat" in capsys.readouterr().err


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_in_process_bench_reuses_the_tool_outputs_on_the_model(base, endpoint):
    """`pacer bench --engine inprocess`: completions carry the spans; chat renders the messages and
    marks the tool message as a server does. One at a time, each tool output is stored once and
    reused by the other session."""
    from pacer.workload.arrivals import ClosedLoop
    from pacer.workload.runner import run_inprocess
    from tests.conftest import make

    engine = make(base, segment_reuse="approximate")
    shape = ToolReuse(num_sessions=2, num_tools=2, tool_output_len=96, history_len=24, output_len=1)
    specs = generate_requests(tool_reuse_workload(shape), ClosedLoop(1), num_requests=4, tokenizer=base.tokenizer)
    records, _, _ = run_inprocess(specs, engine, endpoint=endpoint, concurrency=1, closed_loop=True)
    assert len(records) == 4 and all(r.ok for r in records)
    segments = engine.snapshot().segments
    assert segments["stored"] == 2 and segments["reuses"] == 2 and segments["reused_tokens"] > 2 * 60
