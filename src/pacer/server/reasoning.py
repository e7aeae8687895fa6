"""Reasoning outputs (`--reasoning-parser qwen3 | deepseek_r1`, vLLM's names): a chat output's
thinking, written between `<think>` and `</think>`, goes to `message.reasoning_content` (and
vLLM's newer `reasoning`, the same text); what follows the end tag is the `content`, which the
tool-call parser then reads.

One reader (`ReasoningReader`) serves both shapes, as pacer.server.tools.stream does for tool
calls: fed the whole text for the message and the text as it arrives for the stream, so a
stream's deltas concatenate to the non-streamed message. It reads each character once and
holds back only a tail that could still be the start of a tag (a tag split across deltas).

Where the output starts (vLLM's rules, the same the scheduler's tracker reads from the prompt's
token ids, pacer.sched.reasoning): answering when the prompt's last tag is the end tag
(`enable_thinking: false` writes an empty block), else thinking: text before the output's
`</think>` is reasoning, with or without a leading `<think>` (DeepSeek-R1 may omit it,
Qwen3-Thinking templates open it in the prompt). Thinking that never ends (max_tokens, a stop)
is all reasoning, content null (vLLM's qwen3 returns it as content when the non-streamed
output has no tag at all; pacer keeps one reading for both shapes, so a stream equals its
message).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pacer.config.engine import REASONING_PARSERS

__all__ = ["ReasoningSyntax", "ReasoningReader", "reasoning_message", "Segment"]

Segment = tuple[str, str]   # ("reasoning" | "content", text)

_BEFORE, _THINKING, _ANSWER = "before", "thinking", "answer"


@dataclass(frozen=True, slots=True)
class ReasoningSyntax:
    """A parser's tags, and the state its outputs start in given the prompt's token ids."""

    name: str
    start: str
    end: str
    implicit_start: bool             # text before the end tag is reasoning even without the start tag
    tags: Any = None                 # pacer.sched.reasoning.ThinkTags: the tags' token ids (None: unknown)

    @classmethod
    def named(cls, name: str, tags: Any = None) -> ReasoningSyntax:
        if name not in REASONING_PARSERS:
            raise ValueError(f"reasoning parser must be one of {', '.join(REASONING_PARSERS)}; got {name!r}")
        start, end, implicit = REASONING_PARSERS[name]
        return cls(name, start, end, implicit, tags)

    def initial_state(self, prompt_token_ids: Any) -> str:
        if self.tags is not None and prompt_token_ids:
            if self.tags.ended_in(prompt_token_ids):
                return _ANSWER
            if self.tags.started_in(prompt_token_ids):
                return _THINKING
        return _THINKING if self.implicit_start else _BEFORE

    def reader(self, prompt_token_ids: Any = None) -> ReasoningReader:
        return ReasoningReader(self, self.initial_state(prompt_token_ids))


class ReasoningReader:
    """Splits one output, as it arrives, into reasoning and content segments."""

    def __init__(self, syntax: ReasoningSyntax, state: str) -> None:
        self.syntax = syntax
        self.state = state
        self.pending = ""            # text not yet decided (a possible partial tag)
        self.at_start = True         # nothing of the thinking emitted yet (an opening tag is skipped)
        self.thought = state == _THINKING   # the output had a thinking part (maybe empty)

    def feed(self, text: str, final: bool = False) -> list[Segment]:
        self.pending += text
        out: list[Segment] = []
        while self.pending:
            if not self._step(out, final):
                break
        return [s for s in out if s[1]]

    def _step(self, out: list[Segment], final: bool) -> bool:
        """Decide what it can of `pending`; False when the rest must wait for more text."""
        start, end = self.syntax.start, self.syntax.end
        p = self.pending
        if self.state == _ANSWER:
            out.append(("content", p))
            self.pending = ""
            return True
        if self.state == _BEFORE or (self.state == _THINKING and self.at_start):
            if p.startswith(start):
                self.pending, self.state, self.at_start, self.thought = p[len(start):], _THINKING, False, True
                return True
            if start.startswith(p) and not final:
                return False                       # could still be the start tag
            self.state = _THINKING if self.state == _THINKING else _ANSWER
            self.at_start = False
            return True
        i = p.find(end)
        if i >= 0:
            out.append(("reasoning", p[:i]))
            self.pending, self.state = p[i + len(end):], _ANSWER
            return True
        keep = 0 if final else _partial_suffix(p, end)
        out.append(("reasoning", p[:len(p) - keep]))
        self.pending = p[len(p) - keep:]
        return False


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def reasoning_message(syntax: ReasoningSyntax, text: str, prompt_token_ids: Any = None) -> tuple[str | None, str]:
    """(reasoning or None, content) of a finished output, through the streaming reader."""
    reader = syntax.reader(prompt_token_ids)
    segments = reader.feed(text, final=True)
    reasoning = "".join(t for k, t in segments if k == "reasoning")
    content = "".join(t for k, t in segments if k == "content")
    return (reasoning if reader.thought else None), content
