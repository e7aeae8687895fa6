"""One HTTP request as the server carries it (`Job`): its engine requests (one per prompt and
choice), the queue its outputs feed, and how a finished chat choice reads as a message (its
thinking split off by the reasoning parser, then its tool calls). `Service` makes jobs and
feeds their queues; `responses` and the app read them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pacer.engine import RequestOutput
from pacer.server.api.protocol import ParsedRequest
from pacer.server.reasoning import reasoning_message
from pacer.server.requests import RequestContext
from pacer.server.tools.stream import tool_message

__all__ = ["Job"]


@dataclass(slots=True)
class Job:
    """One HTTP request: one engine request per prompt and choice (choice index
    `prompt * n + j`), all feeding one queue of `(index, RequestOutput)` items or `APIError`s:
    streamed, every output (a delta); otherwise only the finished ones."""

    api_id: str
    parsed: ParsedRequest
    created: int
    request_ids: list[str]
    contexts: list[RequestContext]
    queue: asyncio.Queue[Any]
    finished: set[int] = field(default_factory=set)
    tool_parser: Any = None     # pacer.server.tools.parsers.ToolParser reading the output's tool calls
    return_metrics: bool = False   # the response carries each choice's metrics (api.request_metrics)
    reasoning: Any = None       # pacer.server.reasoning.ReasoningSyntax splitting a chat output's thinking

    @property
    def done(self) -> bool:
        return len(self.finished) == len(self.request_ids)

    def chat_message(self, o: RequestOutput) -> tuple[dict[str, Any], str | None]:
        """A finished chat choice's message: its thinking split off (reasoning parser), then its
        tool calls read from the content after the thinking; and its finish_reason."""
        text, finish = o.text, o.finish_reason
        thinking: dict[str, Any] = {}
        if self.reasoning is not None:
            reasoning, text = reasoning_message(self.reasoning, o.text, o.prompt_token_ids)
            thinking = {"reasoning_content": reasoning, "reasoning": reasoning}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.tool_parser is not None:
            message, finish = tool_message(self.tool_parser, text, finish)
        if thinking and thinking["reasoning"] is not None and not message["content"]:
            message["content"] = None   # vLLM: thinking without an answer has null content
        return {**message, **thinking}, finish

    def called_tool(self, o: RequestOutput) -> bool:
        return self.chat_message(o)[1] == "tool_calls"
