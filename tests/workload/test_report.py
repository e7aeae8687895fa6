"""Report arithmetic on known data: percentiles, rates, goodput, JSON round trip, tables."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from pacer.request import RequestMetrics
from pacer.workload.report import (
    OVERALL,
    STATUS_ERROR,
    STATUS_REJECTED,
    Report,
    RequestRecord,
    build_report,
    parse_duration,
    parse_slo,
    percentile,
)
from pacer.workload.tables import compare_table, report_table


def _rec(rid: str, cls: str, arrival: float, first: float, gaps: list[float], **kw: object) -> RequestRecord:
    times = [first]
    for g in gaps:
        times.append(times[-1] + g)
    return RequestRecord(request_id=rid, request_class=cls, arrival_time=arrival, first_token_time=first,
                         finish_time=times[-1], token_times=times, prompt_tokens=100, output_tokens=len(times),
                         **kw)  # type: ignore[arg-type]


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_summary_and_goodput_exact() -> None:
    records = [
        _rec("a", "chat", 0.0, 0.1, [0.02, 0.02, 0.02]),            # ttft 100ms, itl 20ms
        _rec("b", "chat", 1.0, 1.5, [0.02, 0.08]),                  # ttft 500ms: misses ttft
        _rec("c", "rag", 2.0, 2.2, [0.01] * 4, cached_tokens=50),   # ttft 200ms (rag allows 300ms)
        RequestRecord("d", "rag", 3.0, status=STATUS_REJECTED, http_status=429, finish_time=3.01),
        RequestRecord("e", "chat", 4.0, status=STATUS_ERROR, http_status=500, error="boom", finish_time=5.0),
    ]
    slo = parse_slo(["ttft=300ms,itl=50ms", "rag:ttft=250ms"])
    rep = build_report(records, slo=slo)
    overall, chat, rag = rep.summary[OVERALL], rep.summary["chat"], rep.summary["rag"]
    assert rep.classes == ["chat", "rag"]
    assert overall["duration_s"] == pytest.approx(5.0)
    assert (overall["num_requests"], overall["num_ok"], overall["num_errors"], overall["num_rejected"]) == (5, 3, 1, 1)
    assert chat["ttft_p50"] == pytest.approx(0.3) and chat["ttft_mean"] == pytest.approx(0.3)
    assert chat["itl_p50"] == pytest.approx(0.02)
    assert chat["itl_p99"] == pytest.approx(0.02 + 0.06 * 0.96)   # gaps [.02,.02,.02,.02,.08]
    assert chat["tpot_p50"] == pytest.approx((0.06 / 3 + 0.1 / 2) / 2)
    assert chat["output_tokens"] == 7 and chat["output_tok_s"] == pytest.approx(7 / 5.0)
    assert rag["cache_hit_rate"] == pytest.approx(0.5)
    # good: a (chat), c (rag: ttft 200ms <= 250ms, itl 10ms); b misses ttft; d, e failed
    assert chat["num_good"] == 1 and rag["num_good"] == 1 and overall["num_good"] == 2
    assert overall["goodput_req_s"] == pytest.approx(2 / 5.0)
    assert overall["slo_attainment"] == pytest.approx(2 / 5)
    assert overall["req_s"] == pytest.approx(3 / 5.0)


def test_itl_slo_uses_the_requests_p99_gap() -> None:
    r = _rec("a", "chat", 0.0, 0.01, [0.01] * 200 + [0.5])   # one stall among 201 gaps
    assert parse_slo(["itl=50ms"]).default.met_by(r)
    r2 = _rec("b", "chat", 0.0, 0.01, [0.01] * 20 + [0.5])
    assert not parse_slo(["itl=50ms"]).default.met_by(r2)


def test_parse_slo_and_duration() -> None:
    assert parse_duration("300ms") == pytest.approx(0.3)
    assert parse_duration("2") == 2.0 and parse_duration("50us") == pytest.approx(5e-5)
    s = parse_slo(["ttft=1s", "chat:itl=40ms,tpot=30ms"])
    assert s.for_class("chat").ttft == 1.0 and s.for_class("chat").itl == pytest.approx(0.04)
    assert s.for_class("rag").itl is None
    with pytest.raises(ValueError, match="ttft"):
        parse_slo(["latency=3s"])
    with pytest.raises(ValueError, match="duration"):
        parse_duration("fast")


def test_json_round_trip_and_tables(tmp_path: Path) -> None:
    rep = build_report([_rec("a", "chat", 0.0, 0.1, [0.02, 0.03]), _rec("b", "rag", 0.5, 0.9, [0.01])],
                       slo=parse_slo(["ttft=300ms"]), meta={"workload": "mixed"})
    path = tmp_path / "run.json"
    rep.save(path)
    back = Report.load(path)
    assert back.summary == rep.summary and back.meta == {"workload": "mixed"}
    assert [g for r in back.records for g in r.itl] == pytest.approx([g for r in rep.records for g in r.itl])
    assert back.records[0].as_dict().keys() >= {"class", "status", "ttft", "itl", "tpot", "e2e", "output_tokens"}
    assert set(back.summary[OVERALL]) >= {"ttft_p50", "ttft_p99", "itl_p99", "tpot_p50", "output_tok_s",
                                          "goodput_req_s"}
    console = Console(file=io.StringIO(), width=160)
    console.print(report_table(back))
    console.print(compare_table(rep, back, labels=("x", "y")))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "overall" in text and "TTFT p99" in text and "goodput" in text


def test_record_from_engine_metrics_keeps_definitions() -> None:
    m = RequestMetrics(arrival_time=10.0, first_scheduled_time=10.1, first_token_time=10.3, finish_time=10.5,
                       token_times=[10.3, 10.4, 10.5], prompt_tokens=12, cached_tokens=4)
    r = RequestRecord.from_metrics(m, request_id="x", request_class="chat", t0=10.0)
    assert r.arrival_time == 0.0 and r.ttft == pytest.approx(m.ttft) and r.tpot == pytest.approx(m.tpot)
    assert r.itl == pytest.approx(m.itl) and r.queue_wait == pytest.approx(m.queue_wait)
    assert r.output_tokens == 3 and r.cached_tokens == 4
    # a stream whose chunks carry several tokens: TPOT counts the server's usage, not the chunks
    chunked = RequestRecord("y", "chat", 0.0, first_token_time=0.2, token_times=[0.2, 0.6], output_tokens=5)
    assert chunked.tpot == pytest.approx(0.4 / 4) and chunked.itl == pytest.approx([0.4])
    assert RequestMetrics(arrival_time=0.0, first_token_time=0.2, token_times=[0.2, 0.6]).tpot == pytest.approx(0.4)
