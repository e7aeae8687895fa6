"""A stream's ITL tail (pacer.sched.itl_tail): the gaps `RequestMetrics.stamp` keeps, the 99th
percentile it predicts against the one `Slo.met_by` computes on every gap, and which streams can
take one long gap."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pacer.config.slo import Slo, percentile
from pacer.request import TOP_GAPS, Request, RequestMetrics, SamplingParams
from pacer.sched.itl_tail import absorbs, final_gaps, missed, p99_rank, p99_with


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0.0, 5.0), st.integers(1, 3)), min_size=1, max_size=300))
def test_stamp_keeps_the_gap_count_and_the_largest_gaps(steps: list[tuple[float, int]]) -> None:
    """Tokens of one step share a stamp and are one emission: the count and the TOP_GAPS largest
    gaps are those of `itl`, whatever the order the gaps came in."""
    m = RequestMetrics(arrival_time=0.0)
    now = 0.0
    for dt, tokens in steps:
        now += dt
        for _ in range(tokens):
            m.stamp(now)
    assert m.num_gaps == len(m.itl)
    assert m.top_gaps == sorted(m.itl, reverse=True)[:TOP_GAPS]


@settings(max_examples=300, deadline=None)
@given(past=st.lists(st.floats(0.001, 3.0), max_size=500), gap=st.floats(0.0, 10.0),
       future=st.floats(0.001, 0.5), to_come=st.integers(0, 500))
def test_the_predicted_p99_is_the_percentile_of_every_gap_or_above_it(
        past: list[float], gap: float, future: float, to_come: int) -> None:
    """From the count and the largest gaps alone, the 99th percentile of the final gaps (past, one
    more, the rest at `future`) equals `percentile` over all of them while the ranks it needs are
    among the kept ones (streams up to ~300 gaps), and never falls below it past that."""
    every = [*past, gap, *[future] * to_come]
    top = sorted(past, reverse=True)[:TOP_GAPS]
    predicted = p99_with(top, len(past), len(every), gap, future)
    actual = percentile(every, 99)
    assert actual is not None
    j, _ = p99_rank(len(every))
    if j <= TOP_GAPS:
        assert predicted == pytest.approx(actual, rel=1e-9, abs=1e-12)
    else:
        assert predicted >= actual * (1 - 1e-9)


@pytest.mark.parametrize(("n", "j", "f"), [(1, 1, 0.0), (2, 2, 0.99), (96, 2, 0.05), (101, 2, 0.0), (150, 3, 0.51)])
def test_the_p99_rank(n: int, j: int, f: float) -> None:
    assert p99_rank(n) == (j, pytest.approx(f))


def _streaming(gaps: list[float], params: SamplingParams, slo: Slo, start: float = 0.0) -> Request:
    r = Request("s", [1, 2, 3], params, arrival_time=start, slo=slo)
    now = start + 0.1
    r.metrics.first_token_time = now
    r.output_token_ids.append(1)
    r.metrics.stamp(now)
    for g in gaps:
        now += g
        r.output_token_ids.append(1)
        r.metrics.stamp(now)
    return r


def test_a_long_forced_stream_absorbs_a_stall_a_short_one_does_not() -> None:
    """96 gaps to end with (ignore_eos to 97 tokens), those to come planned at 180 ms: the largest
    gap weighs 0.05 in the p99, so a 0.5 s stall stays within 200 ms, 0.7 s does not; with 20 gaps
    to end with (weight 0.81) 0.2 s does, 0.5 s not; a stream that may stop at any token is judged
    on the gaps it has and this one."""
    slo = Slo(ttft=1.0, itl=0.2)
    long = _streaming([0.07] * 40, SamplingParams(max_tokens=97, ignore_eos=True), slo)
    assert final_gaps(long) == 96
    assert absorbs(long, 0.5) and not absorbs(long, 0.7)
    short = _streaming([0.07] * 10, SamplingParams(max_tokens=21, ignore_eos=True), slo)
    assert absorbs(short, 0.2) and not absorbs(short, 0.5)
    open_ended = _streaming([0.07] * 40, SamplingParams(max_tokens=97), slo)
    assert final_gaps(open_ended) == 41 and not absorbs(open_ended, 0.5) and absorbs(open_ended, 0.2)


def test_what_a_gap_cannot_move() -> None:
    """No inter-token target: nothing to protect; a TPOT-only target is an average: never."""
    params = SamplingParams(max_tokens=500, ignore_eos=True)
    assert absorbs(_streaming([0.05] * 10, params, Slo(ttft=1.0)), 60.0)
    assert not absorbs(_streaming([0.05] * 10, params, Slo(tpot=0.2)), 0.3)


def test_missed_targets() -> None:
    """A first token past its TTFT, an e2e deadline gone, or two 1 s gaps in a 20-gap stream (its
    p99 weighs its two largest gaps) cannot be made up; one such gap in a 400-token stream can."""
    params = SamplingParams(max_tokens=21, ignore_eos=True)
    assert not missed(_streaming([0.05] * 5, params, Slo(ttft=1.0, itl=0.2)), now=1.0)
    late = _streaming([0.05] * 5, params, Slo(ttft=1.0, itl=0.2), start=-1.0)
    late.metrics.first_token_time = 1.5
    assert missed(late, now=2.0)
    assert missed(_streaming([0.05] * 5, params, Slo(e2e=1.0)), now=2.0)
    assert missed(_streaming([0.05, 1.0, 0.05, 1.0], params, Slo(ttft=1.0, itl=0.2)), now=2.5)
    long = SamplingParams(max_tokens=400, ignore_eos=True)
    assert not missed(_streaming([0.05, 1.0, 0.05], long, Slo(ttft=1.0, itl=0.2)), now=1.5)
