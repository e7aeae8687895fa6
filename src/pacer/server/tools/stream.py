"""OpenAI tool-call output: the final message, and streamed deltas that reassemble to it.

Both come from the same parser (pacer.server.tools.parsers), so the concatenated deltas of a
stream equal the non-streamed message for the same text: content first, then per call
one delta with `index`, `id`, `type` and `function.name` (arguments ""), then argument
fragments as the model writes them.
"""

from __future__ import annotations

import uuid
from typing import Any

from pacer.server.tools.parsers import ParseResult, ToolParser

__all__ = ["ToolDeltaStream", "tool_message", "new_call_id"]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _calls_json(result: ParseResult, ids: list[str]) -> list[dict[str, Any]]:
    return [{"id": ids[i], "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(result.calls)]


def tool_message(parser: ToolParser, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """The assistant message for a finished output, and its finish_reason ("tool_calls"
    when it made calls and stopped by itself, as OpenAI reports it)."""
    result = parser.parse(text, final=True)
    if not result.calls:
        return {"role": "assistant", "content": text}, finish_reason
    ids = [new_call_id() for _ in result.calls]
    message = {"role": "assistant", "content": result.content or None, "tool_calls": _calls_json(result, ids)}
    return message, "tool_calls" if finish_reason == "stop" else finish_reason


class ToolDeltaStream:
    """Turns the text deltas of one streamed choice into OpenAI chat deltas. It keeps the
    choice's text (the parser reads the whole of it), and only what was sent of it beside."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.text = ""
        self.content_sent = 0
        self.ids: list[str] = []
        self.args_sent: list[int] = []

    @property
    def made_calls(self) -> bool:
        return bool(self.ids)

    def update(self, new_text: str, final: bool) -> list[dict[str, Any]]:
        """The deltas that bring what was sent up to the text so far plus `new_text` (`final`:
        the output ended)."""
        self.text += new_text
        result = self.parser.parse(self.text, final)
        deltas: list[dict[str, Any]] = []
        if len(result.content) > self.content_sent and not self.ids:
            deltas.append({"content": result.content[self.content_sent:]})
            self.content_sent = len(result.content)
        for i, call in enumerate(result.calls):
            if i == len(self.ids):
                self.ids.append(new_call_id())
                self.args_sent.append(0)
                deltas.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "function",
                                               "function": {"name": call.name, "arguments": ""}}]})
            fragment = call.arguments[self.args_sent[i]:]
            if fragment:
                self.args_sent[i] = len(call.arguments)
                deltas.append({"tool_calls": [{"index": i, "function": {"arguments": fragment}}]})
        return deltas

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.ids and reason == "stop" else reason
