"""Tool-call parsers (vLLM's `--tool-call-parser` names): model text -> content + calls.

`parse(text, final)` reads the whole output so far. While `final` is False everything it
returns only grows as the text grows: content held back while it could still turn into a
call marker, a call listed once its name is complete, its arguments as the raw text the
model has written of them. So streamed deltas (pacer.server.tools.stream) are differences of
successive parses and reassemble exactly to the final parse, which is the non-streamed
message. With `final` and no named call, the whole text is content.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number, after
  optional content (Hermes, Qwen2.5, and pacer's shipped template).
- `llama3_json`: the output is `{"name": ..., "parameters": {...}}` (or "arguments"),
  several joined by `;`, optionally after `<|python_tag|>` (Llama 3.1+ JSON tool calling).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pacer.server.tools.json_scan import scan_object, skip_ws

__all__ = ["ParsedCall", "ParseResult", "ToolParser", "HermesParser", "Llama3JsonParser", "TOOL_PARSERS",
           "get_parser"]


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str      # raw JSON text as written (a prefix of it while streaming)


@dataclass(frozen=True, slots=True)
class ParseResult:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)


def _read_call(text: str, start: int, arg_keys: tuple[str, ...]) -> tuple[ParsedCall | None, int | None]:
    """The call object at text[start] ('{'): the call (once its name is complete) and the
    index after the object (None while unfinished, or -1 when it is not a call object)."""
    scan = scan_object(text, start)
    call = None
    name_span = scan.members.get("name")
    if name_span is not None and name_span[1] is not None:
        try:
            name = json.loads(text[name_span[0]:name_span[1]])
        except ValueError:
            name = None
        if isinstance(name, str) and name:
            spans = [scan.members[k] for k in arg_keys if k in scan.members]
            args = ""
            if spans:   # the first arguments member written wins (a later one cannot replace it)
                begin, end = min(spans)
                args = text[begin:end if end is not None else len(text)]
            call = ParsedCall(name, args)
    return call, -1 if scan.broken else scan.end


def _hold_marker_prefix(text: str, marker: str) -> str:
    """`text` without a tail that could be the start of `marker`, and without trailing space."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            text = text[:-k]
            break
    return text.rstrip()


class ToolParser:
    name = ""

    def parse(self, text: str, final: bool) -> ParseResult:
        raise NotImplementedError

    @staticmethod
    def _finish(text: str, content: str, calls: list[ParsedCall], final: bool) -> ParseResult:
        if final and not calls:
            return ParseResult(text)
        return ParseResult(content, calls)


class HermesParser(ToolParser):
    name = "hermes"
    start_marker, end_marker = "<tool_call>", "</tool_call>"

    def parse(self, text: str, final: bool) -> ParseResult:
        first = text.find(self.start_marker)
        if first < 0:
            content = text if final else _hold_marker_prefix(text, self.start_marker)
            return ParseResult(content)
        content = text[:first].rstrip()
        calls: list[ParsedCall] = []
        pos = first
        while pos >= 0:
            body = skip_ws(text, pos + len(self.start_marker))
            if body >= len(text) or text[body] != "{":
                break
            call, end = _read_call(text, body, ("arguments", "parameters"))
            if call is not None:
                calls.append(call)
            if end is None or end < 0:
                break
            pos = text.find(self.start_marker, end)
        return self._finish(text, content, calls, final)


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    python_tag = "<|python_tag|>"

    def parse(self, text: str, final: bool) -> ParseResult:
        pos = skip_ws(text, 0)
        if text.startswith(self.python_tag, pos):
            pos = skip_ws(text, pos + len(self.python_tag))
        elif pos < len(text) and self.python_tag.startswith(text[pos:]) and not final:
            return ParseResult("")
        if pos >= len(text):
            return ParseResult(text if final else "")
        if text[pos] != "{":
            return ParseResult(text)
        calls: list[ParsedCall] = []
        while pos < len(text) and text[pos] == "{":
            call, end = _read_call(text, pos, ("parameters", "arguments"))
            if call is not None:
                calls.append(call)
            if end is None or end < 0:
                break
            pos = skip_ws(text, end)
            if pos < len(text) and text[pos] == ";":
                pos = skip_ws(text, pos + 1)
        return self._finish(text, "", calls, final)


TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}


def get_parser(name: str) -> ToolParser:
    try:
        return TOOL_PARSERS[name]()
    except KeyError:
        raise ValueError(f"--tool-call-parser must be one of {', '.join(TOOL_PARSERS)}; got {name!r}") from None
