"""Interference read from timestamps: time below max_num_seqs, coverage by long prefills, and the
bottleneck they move (KV-held queue wait is KV pressure; waiting behind a long prefill is prefill)."""

from __future__ import annotations

import pytest

from pacer.diagnose.analysis import analyze
from pacer.diagnose.baseline import Baseline
from pacer.diagnose.records import Record, Source
from pacer.diagnose.timeline import RunningTimeline, covered, long_prefills


def rec(arrival, queue, ttft, e2e, prompt=100, out=10, **kw):
    return Record("chat", prompt, out, ttft, e2e, arrival=arrival, queue_wait=queue, **kw)


def test_running_timeline_share_below_a_limit():
    # runs: [0, 4) and [2, 6): two at once during [2, 4)
    t = RunningTimeline([rec(0.0, 0.0, 1.0, 4.0), rec(2.0, 0.0, 1.0, 4.0)])
    assert t.peak == 2
    assert t.share_below(0.0, 8.0, 2) == 0.75          # 2 of 8 s at the limit
    assert t.share_below(2.0, 4.0, 2) == 0.0 and t.share_below(4.0, 6.0, 2) == 1.0


def test_covered_by_the_union_leaving_one_out():
    spans = [(0.0, 2.0, 0), (1.0, 3.0, 1), (5.0, 6.0, 2)]
    assert covered(0.0, 10.0, spans, skip=-1) == 0.4
    assert covered(0.0, 10.0, spans, skip=1) == 0.3


def test_long_prefills_need_four_times_the_median_prompt():
    rs = [rec(0.0, 0.0, 0.5, 1.0), rec(0.0, 0.0, 0.5, 1.0), rec(1.0, 0.25, 3.0, 4.0, prompt=2000)]
    assert long_prefills(rs) == [(1.25, 4.0, 2)]


@pytest.fixture()
def base():
    return Baseline("a100-80g", "llama-3-8b")


def test_queue_wait_while_kv_held_admissions_is_named_preemption(base):
    # one runs at a time, the limit is 8, and the engine preempted: the 10 s waits are KV-held
    rs = [rec(0.0, 0.0, 0.1, 10.0, preemptions=1, preempted_time=0.2, preempted_time_ttft=0.0)]
    rs += [rec(0.0, 10.0 * k, 10.0 * k + 0.1, 10.0 * k + 10.0, preempted_time=0.0, preempted_time_ttft=0.0)
           for k in range(1, 4)]
    src = Source("s", "table", rs)
    assert analyze(src, base, max_num_seqs=8)["overall"].bottleneck == "preemption"
    assert analyze(src, base, max_num_seqs=1)["overall"].bottleneck == "queue"   # at the limit: plain queueing


def test_waiting_behind_a_long_prefill_is_named_prefill(base):
    long = rec(0.0, 0.0, 6.0, 6.5, prompt=4000, out=2)
    chats = [rec(0.5 + k * 0.1, 5.5 - k * 0.1, 5.7 - k * 0.1, 6.0 - k * 0.1) for k in range(5)]
    rep = analyze(Source("s", "table", [long, *chats]), base)["overall"]
    assert rep.bottleneck == "prefill"
    assert any("long prefills" in line for line in rep.evidence)
