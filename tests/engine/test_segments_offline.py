"""Segment reuse through the offline API on the default model: `LLM.chat` treats a message marked
`"segment": True` as a segment besides tool messages (and `False` unmarks a tool message), and
`segment_reuse="off"` opts a call out; bad input names the field."""

from __future__ import annotations

import random

import pytest

from pacer.errors import FieldError
from pacer.request import SamplingParams
from pacer.workload.text import TextSource
from tests.conftest import llm_over

ONE = SamplingParams(max_tokens=1, temperature=0.0)


def _chat(history: str, document: str, mark: bool | None) -> list[dict]:
    doc = {"role": "user", "content": document}
    if mark is not None:
        doc["segment"] = mark
    return [{"role": "user", "content": history}, doc, {"role": "user", "content": "Summarize it."}]


def test_marked_messages_are_segments_and_a_call_can_opt_out(base) -> None:
    document = TextSource(base.tokenizer).segment(100, random.Random(3)).text
    llm = llm_over(base, segment_reuse="approximate", segment_recompute=0.0)

    def reused(history: str, mark: bool | None, **kw) -> int:
        return llm.chat(_chat(history, document, mark), ONE, **kw)[0].metrics.segment_reused_tokens

    assert reused("Tell me about trains.", True) == 0                      # computes and stores it
    assert reused("Tell me about boats and ferries.", None) == 0           # a user message is no segment
    assert reused("Tell me about planes.", True, segment_reuse="off") == 0
    assert reused("Tell me about buses in the city.", True) > 80
    tool = [{"role": "user", "content": "Search for cars."},
            {"role": "tool", "content": document, "segment": False}, {"role": "user", "content": "Summarize it."}]
    assert llm.chat(tool, ONE)[0].metrics.segment_reused_tokens == 0


def test_bad_segment_input_names_the_field(base) -> None:
    llm = llm_over(base, segment_reuse="approximate")
    with pytest.raises(FieldError) as e:
        llm.chat(_chat("Hello there.", "A document.", "yes"), ONE)   # type: ignore[arg-type]
    assert e.value.field == "messages[1].segment"
    with pytest.raises(FieldError) as e:
        llm.generate("Hello there.", ONE, segment_reuse="always")
    assert e.value.field == "segment_reuse"
    off = llm_over(base)
    with pytest.raises(FieldError, match="needs an engine that reuses segments") as e:
        off.chat(_chat("Hello there.", "A document.", True), ONE, segment_reuse="approximate")
    assert e.value.field == "segment_reuse"
