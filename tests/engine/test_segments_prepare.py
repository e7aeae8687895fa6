"""Segment spans on the way in (`pacer.engine.segment_spans.check_segments`, `segment_recompute`): bad
input is refused with an error naming the field and the span; truncation keeps the spans it can."""

from __future__ import annotations

import pytest

from pacer.config import EngineConfig
from pacer.engine.segment_spans import check_segments
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
