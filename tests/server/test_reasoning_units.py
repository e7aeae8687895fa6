"""The reasoning reader (pacer.server.reasoning) on its own: a stream's segments, however the
text is cut (tags split across deltas included), concatenate to the non-streamed split; where
an output starts is read from the prompt's tags."""

from __future__ import annotations

import pytest

from pacer.sched.reasoning import ThinkTags
from pacer.server.reasoning import ReasoningSyntax, reasoning_message

START, END = 7, 8   # token ids of <think> and </think> in these tests
TAGS = ThinkTags((START,), (END,))
QWEN3 = ReasoningSyntax.named("qwen3", TAGS)
R1 = ReasoningSyntax.named("deepseek_r1", TAGS)


def _streamed(syntax: ReasoningSyntax, pieces: list[str], prompt: list[int] | None = None) -> tuple[str, str, list]:
    reader = syntax.reader(prompt)
    segments = []
    for i, piece in enumerate(pieces):
        segments += reader.feed(piece, final=i == len(pieces) - 1)
    return ("".join(t for k, t in segments if k == "reasoning"), "".join(t for k, t in segments if k == "content"),
            segments)


@pytest.mark.parametrize("text, reasoning, content", [
    ("<think>\nsky is blue\n</think>\n\nBecause.", "\nsky is blue\n", "\n\nBecause."),
    ("no opening tag</think>answer", "no opening tag", "answer"),        # Qwen3-Thinking / R1 without <think>
    ("<think>cut off by max_tokens", "cut off by max_tokens", ""),        # never closed: all reasoning
    ("a < b </ c </think> d </think> e", "a < b </ c ", " d </think> e"),  # near-misses are text; one split
])
def test_every_cut_of_the_text_gives_the_same_split(text, reasoning, content):
    assert reasoning_message(QWEN3, text) == (reasoning, content)
    for cut in range(len(text) + 1):   # two deltas, every cut (a tag split in two included)
        r, c, _ = _streamed(QWEN3, [text[:cut], text[cut:]])
        assert (r, c) == (reasoning, content), cut
    r, c, segments = _streamed(QWEN3, list(text))   # one character a delta
    assert (r, c) == (reasoning, content)
    kinds = [k for k, _ in segments]
    assert kinds == sorted(kinds, reverse=True)        # all reasoning, then all content


def test_a_partial_tag_is_held_back_until_it_is_decided():
    reader = QWEN3.reader(None)
    assert reader.feed("thinking </thi") == [("reasoning", "thinking ")]
    assert reader.feed("nk>ans") == [("content", "ans")]
    reader = QWEN3.reader(None)
    assert reader.feed("<thi") == []                      # could still be the opening tag
    assert reader.feed("s is not a tag") == [("reasoning", "<this is not a tag")]


def test_the_prompt_decides_where_the_output_starts():
    ended = [1, START, 2, END, 3]                          # enable_thinking false: an empty block
    assert reasoning_message(QWEN3, "plain </think> answer", ended) == (None, "plain </think> answer")
    opened = [1, END, 2, START]                            # a template that opens the thinking
    assert reasoning_message(R1, "thought</think>ans", opened) == ("thought", "ans")
    assert reasoning_message(R1, "all thought", None) == ("all thought", "")
    with pytest.raises(ValueError, match="qwen3, deepseek_r1"):
        ReasoningSyntax.named("granite")
