"""OpenAI tool-call output: the final message, and streamed deltas that reassemble to it.

Both come from one reader of the parser (pacer.server.tools.parsers), fed the whole text for
the message and the text as it arrives for the stream, so the concatenated deltas of a
stream equal the non-streamed message for the same text: content as it is decided, then per
valid call one delta with `index`, `id`, `type` and `function.name` (arguments ""), then one
with its arguments. A call is sent once its JSON object is complete and valid: what was
sent is never taken back, and the reader reads each character once (no re-parse per chunk).
"""

from __future__ import annotations

import uuid
from typing import Any

from pacer.server.tools.parsers import ParsedCall, ToolParser

__all__ = ["ToolDeltaStream", "tool_message", "new_call_id"]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_message(parser: ToolParser, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """The assistant message for a finished output, and its finish_reason ("tool_calls"
    when it made valid calls and stopped by itself, as OpenAI reports it)."""
    result = parser.parse(text)
    if not result.calls:
        return {"role": "assistant", "content": result.content}, finish_reason
    calls = [{"id": new_call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for c in result.calls]
    message = {"role": "assistant", "content": result.content or None, "tool_calls": calls}
    return message, "tool_calls" if finish_reason == "stop" else finish_reason


class ToolDeltaStream:
    """Turns the text deltas of one streamed choice into OpenAI chat deltas."""

    def __init__(self, parser: ToolParser) -> None:
        self.reader = parser.reader()
        self.ids: list[str] = []

    @property
    def made_calls(self) -> bool:
        return bool(self.ids)

    def update(self, new_text: str, final: bool) -> list[dict[str, Any]]:
        """The deltas for `new_text` (`final`: the output ended)."""
        events = self.reader.feed(new_text)
        if final:
            events += self.reader.finish()
        deltas: list[dict[str, Any]] = []
        for event in events:
            if not isinstance(event, ParsedCall):
                deltas.append({"content": event})
                continue
            i = len(self.ids)
            self.ids.append(new_call_id())
            deltas.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "function",
                                           "function": {"name": event.name, "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": i, "function": {"arguments": event.arguments}}]})
        return deltas

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.ids and reason == "stop" else reason
