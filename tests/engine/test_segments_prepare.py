"""Segment spans on the way in (`pacer.engine.segment_spans.check_segments`, `segment_recompute`): bad
input is refused with an error naming the field and the span; truncation keeps the spans it can. A
request's own `segment_reuse` (`check_segment_reuse`): "off" opts it out, "approximate" only where
the engine reuses segments."""

from __future__ import annotations

import pytest

from pacer.config import EngineConfig
from pacer.engine.segment_spans import check_segment_reuse, check_segments
from pacer.errors import FieldError
from pacer.request import SamplingParams
from tests.fakes import make_engine


@pytest.mark.parametrize("spans, message", [
    ("0,4", r"segments must be a list of \[start, length\] token spans"),
    ([(0, 4, 1)], r"segments\[0\] must be a \[start, length\] pair"),
    ([(0, True)], r"segments\[0\] must be a \[start, length\] pair"),
    ([(-1, 4)], r"segments\[0\] = \[-1, 4\] must lie inside the prompt's 10 tokens"),
    ([(8, 3)], r"segments\[0\] = \[8, 3\]"),
    ([(0, 0)], "length >= 1"),
    ([(4, 3), (2, 1)], r"segments\[1\] starts at 2, inside or before segments\[0\]"),
    ([(0, 4), (3, 2)], r"segments\[1\] starts at 3"),
])
def test_bad_spans_name_the_field_and_the_span(spans, message) -> None:
    with pytest.raises(FieldError, match=message) as e:
        check_segments(spans, 10)
    assert e.value.field == "segments"


def test_good_spans_and_truncation() -> None:
    assert check_segments([[0, 4], (4, 6)], 10) == ((0, 4), (4, 6))
    eng, _ = make_engine(num_blocks=32, block_size=4, max_len=64)
    prepared = eng.prepare(list(range(1, 21)), SamplingParams(max_tokens=2, truncate_prompt_tokens=15),
                           segments=[(2, 3), (8, 4)])
    assert prepared.segments == ((3, 4),)   # the first span was cut off with the prompt's first 5 tokens


@pytest.mark.parametrize("value", [1.5, -0.1, "most", True])
def test_segment_recompute_is_a_fraction_or_auto(value) -> None:
    with pytest.raises(ValueError, match="segment_recompute must be a fraction in"):
        EngineConfig.from_kwargs(segment_recompute=value)
    assert EngineConfig.from_kwargs(segment_recompute="0.2").cache.segment_recompute == 0.2
    with pytest.raises(ValueError, match="segment_reuse must be one of off, exact, approximate"):
        EngineConfig.from_kwargs(segment_reuse="fuzzy")
    with pytest.raises(ValueError, match="partitioned"):
        EngineConfig.from_kwargs(segment_reuse="approximate", tenant_isolation="partitioned", tenant_quotas={"a": 4})


@pytest.mark.parametrize("value, engine_mode, message", [
    ("approximate", "off", "segment_reuse 'approximate' needs an engine that reuses segments; this one runs with "
                           "segment_reuse='off'"),
    ("approximate", "exact", "segment_reuse='exact'"),
    ("sometimes", "approximate", "segment_reuse must be one of off, approximate, got 'sometimes'"),
    (1, "approximate", "segment_reuse must be one of off, approximate, got 1"),
])
def test_a_requests_own_segment_reuse_is_checked_against_the_engine(value, engine_mode, message) -> None:
    with pytest.raises(FieldError) as e:
        check_segment_reuse(value, engine_mode)
    assert e.value.field == "segment_reuse" and message in str(e.value)
    assert check_segment_reuse(None, "off") is None and check_segment_reuse("off", "off") == "off"
    assert check_segment_reuse("approximate", "approximate") == "approximate"


def _reused(eng, prompt, spans, **kw) -> int:
    rid = eng.add_request(prompt, SamplingParams(max_tokens=1), segments=spans, **kw)
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished and out.request_id == rid:
                final = out
        eng.kv.check_invariants()
    return final.metrics.segment_reused_tokens


def test_a_request_that_opts_out_neither_stores_nor_reuses() -> None:
    eng, _ = make_engine(num_blocks=64, block_size=4, max_len=128, segment_reuse="approximate", segment_recompute=0.0)
    seg = list(range(500, 532))
    history = [list(range(100 + 10 * i, 108 + 10 * i)) for i in range(4)]
    spans = [(8, 32)]
    assert _reused(eng, history[0] + seg + [7], spans, segment_reuse="off") == 0
    assert eng.prepare(history[0] + seg + [7], segments=spans, segment_reuse="off").segments == ()
    assert _reused(eng, history[1] + seg + [7], spans) == 0                        # nothing stored yet: stores it
    assert _reused(eng, history[2] + seg + [7], spans, segment_reuse="off") == 0   # stored, but not for this one
    assert _reused(eng, history[3] + seg + [7], spans, segment_reuse="approximate") == 32
