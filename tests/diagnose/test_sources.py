"""Every input format parses into records; malformed ones are refused naming line and column."""

from __future__ import annotations

import json

import pytest

from pacer.diagnose.sources import load_source


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_csv_with_unit_suffixes_and_feature(tmp_path):
    p = write(tmp_path, "t.csv", "input_tokens,output_tokens,ttft_ms,total_latency_ms,feature,queue_wait_ms,"
                                 "timestamp\n120,40,250,1250,chat,50,100\n3000,20,900,2000,rag,100,101.5\n")
    src = load_source(p)
    assert src.kind == "table" and src.has_classes and src.has_queue_wait and src.has_times
    a, b = src.records
    assert (a.prompt_tokens, a.output_tokens, a.ttft, a.e2e, a.queue_wait, a.request_class) == (
        120, 40, 0.25, 1.25, 0.05, "chat")
    assert (b.arrival, b.request_class) == (1.5, "rag")      # timestamps shifted to the first


def test_jsonl_table_without_class_is_classified_by_the_server_rules(tmp_path):
    rows = [{"input_tokens": 5000, "output_tokens": 10, "ttft": "2s", "total_latency": 3.0},
            {"input_tokens": 50, "output_tokens": 10, "ttft": 0.1, "total_latency": "900ms", "max_tokens": 2000},
            {"input_tokens": 50, "output_tokens": 10, "ttft": 0.1, "total_latency": 0.5,
             "timestamp": "2026-07-30T12:00:00Z"}]
    p = write(tmp_path, "t.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    src = load_source(p)
    assert [r.request_class for r in src.records] == ["rag", "batch", "chat"]
    assert src.records[0].ttft == 2.0 and src.records[1].e2e == 0.9
    assert not src.has_classes and any("classified" in n for n in src.notes)


def test_time_unit_flag_states_the_unit_of_bare_columns(tmp_path):
    p = write(tmp_path, "t.csv", "input_tokens,output_tokens,ttft,total_latency,class\n10,2,250,500,chat\n")
    r = load_source(p, time_unit="ms").records[0]
    assert (r.ttft, r.e2e) == (0.25, 0.5)


def test_request_log_keeps_finished_requests_and_measured_loss(tmp_path):
    from pacer.telemetry.request_log import REQUEST_LOG_FIELDS

    def line(**kw):
        d = dict.fromkeys(REQUEST_LOG_FIELDS)
        d.update(request_id="r", timestamp=10.0, finished_at=12.0, prompt_tokens=64, output_tokens=8, ttft=0.5,
                 e2e=2.0, queue_wait=0.25, tpot=0.2, preemptions=1, preempted_time=0.5, preempted_time_ttft=0.0,
                 finish_reason="stop", status=200, cached_tokens=16, **{"class": "agent"})
        d.update(kw)
        return json.dumps(d)

    p = write(tmp_path, "requests.jsonl", "\n".join([line(), line(finish_reason="abort", status=499),
                                                     line(timestamp=11.0)]) + "\n")
    src = load_source(p)
    assert src.kind == "request_log" and src.num_skipped == 1 and len(src.records) == 2
    r = src.records[0]
    assert (r.request_class, r.queue_wait, r.preempted_time, r.cached_tokens, r.arrival) == ("agent", 0.25, 0.5, 16, 0.0)
    assert src.records[1].arrival == 1.0


def test_run_file_from_the_simulator(tmp_path):
    from pacer.config import EngineConfig
    from pacer.perf.profiles import get_hardware, get_model
    from pacer.sim.simulator import build_sim_engine, simulate
    from pacer.workload.arrivals import Poisson
    from pacer.workload.generator import generate_requests
    from pacer.workload.report import build_report
    from pacer.workload.spec import builtin_workload

    specs = generate_requests(builtin_workload("chat"), Poisson(20.0), seed=1, num_requests=12, max_model_len=2048)
    engine, ex, clock = build_sim_engine(EngineConfig.from_kwargs(max_num_seqs=4), get_hardware("a100-80g"),
                                         get_model("llama-3-8b"))
    res = simulate(engine, ex, clock, specs)
    path = tmp_path / "run.json"
    build_report(res.records, meta={"target": "sim", "engine_args": {"max_num_seqs": 4}}).save(path)
    src = load_source(path)
    assert src.kind == "run" and len(src.records) == 12 and src.has_queue_wait
    assert src.engine_args == {"max_num_seqs": 4}
    assert all(r.preempted_time is not None and r.itl for r in src.records)


@pytest.mark.parametrize("name,text,message", [
    ("a.csv", "input_tokens,output_tokens,ttft_ms,total_latency\n1,2,abc,4\n",
     r"a\.csv:2: column 3 \(ttft_ms\): expected a number, got 'abc'"),
    ("b.csv", "input_tokens,output_tokens,ttft,total_latency\n1,2,0.5,4\n1,2,0.5\n",
     r"b\.csv:3: 3 cells, but the header has 4 columns"),
    ("c.csv", "input_tokens,output_tokens,total_latency\n1,2,3\n",
     r"c\.csv: missing required column 'ttft' or 'time_to_first_token'"),
    ("d.jsonl", '{"input_tokens": 1, "output_tokens": 2, "ttft": 1, "total_latency": 2}\n{"input_tokens": 1,,}\n',
     r"d\.jsonl:2:20: not JSON"),
    ("e.jsonl", '{"input_tokens": 1, "output_tokens": 2, "ttft": 1, "total_latency": 2}\n'
                '{"input_tokens": 1.5, "output_tokens": 2, "ttft": 1, "total_latency": 2}\n',
     r"e\.jsonl:2: column 'input_tokens': expected a whole number"),
    ("f.jsonl", '{"input_tokens": 1, "output_tokens": 2, "ttft": -1, "total_latency": 2}\n',
     r"f\.jsonl:1: column 'ttft': expected a number >= 0"),
    ("g.jsonl", '[1, 2]\n', r"g\.jsonl:1:1: expected a JSON object per line"),
    ("h.csv", "input_tokens,output_tokens,ttft,total_latency\n1,2,,4\n", r"h\.csv:2: column 3 \(ttft\): a value is required"),
    ("i.json", '{"not": "a run"}', r"i\.json: not a pacer run file"),
])
def test_malformed_sources_are_refused_naming_line_and_column(tmp_path, name, text, message):
    with pytest.raises(ValueError, match=message):
        load_source(write(tmp_path, name, text))


def test_malformed_request_log_value_names_line_and_column(tmp_path):
    p = write(tmp_path, "r.jsonl", json.dumps({"request_id": "x", "e2e": "slow", "finished_at": 1, "prompt_tokens": 3,
                                                "output_tokens": 1, "ttft": 0.1, "finish_reason": "stop"}) + "\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:1: column 'e2e': expected a number, got 'slow'"):
        load_source(p)
