"""Tool-call parsers (vLLM's `--tool-call-parser` names): model text -> content + calls.

A parser makes a `CallReader` per output. The reader reads the text as it arrives
(`feed(new_text)`, then `finish()`), each character once, and says what it has learnt as
events: a piece of content, or a call, emitted once the call's JSON object is complete and
valid. The streamed deltas (pacer.server.tools.stream) are those events as they come; the
non-streamed message is the same reader fed the whole text (`ToolParser.parse`), so the two
always agree.

A call is valid (vLLM's rule, checked once, when its object closes) when the object parses as
JSON, its `name` is a function the request declared in `tools`, and its arguments are a JSON
object (absent: `{}`). The text of anything else (arguments that are not JSON, an undeclared
name, a call cut off by `max_tokens`) comes back as content, so an output without a valid
call is returned exactly as the model wrote it. Text around calls is content too; whitespace
just before a call, after the last one, and between a call and the first content, is dropped. With `max_calls` (`parallel_tool_calls`
false) calls past it are dropped.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number, between
  content (Hermes, Qwen2.5, and pacer's shipped template).
- `llama3_json`: the output is `{"name": ..., "parameters": {...}}` (or "arguments"),
  several joined by `;`, optionally after `<|python_tag|>` (Llama 3.1+ JSON tool calling);
  output that does not start with a call is all content.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from pacer.server.tools.json_scan import ValueEnd, scan_object, skip_ws

__all__ = ["ParsedCall", "ParseResult", "ToolParser", "CallReader", "HermesParser", "Llama3JsonParser",
           "TOOL_PARSERS", "get_parser"]


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str      # the arguments object's JSON text as the model wrote it


@dataclass(frozen=True, slots=True)
class ParseResult:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)


Event = str | ParsedCall   # a piece of content, or a valid call


class CallReader:
    """Reads one output as it arrives; subclasses walk their format's states in `_advance`."""

    arg_keys: tuple[str, ...] = ()

    def __init__(self, names: frozenset[str] | None, max_calls: int | None) -> None:
        self.names = names
        self.max_calls = max_calls
        self.text = ""
        self.pos = 0                   # text before this is decided (emitted, dropped or in a call)
        self.num_calls = 0
        self._events: list[Event] = []
        self._ws = ""                  # whitespace held back: it may turn out to precede a call
        self._after_call = False       # the last thing decided was a call
        self._emitted = False          # some content has been emitted
        self._scanner: ValueEnd | None = None
        self._num_scanned = 0          # by the scanners of earlier calls

    @property
    def num_scanned(self) -> int:
        """Characters of call objects passed over so far (each once, however the text arrives)."""
        return self._num_scanned + (self._scanner.num_scanned if self._scanner is not None else 0)

    def feed(self, new_text: str) -> list[Event]:
        self.text += new_text
        self._advance(final=False)
        return self._take()

    def finish(self) -> list[Event]:
        self._advance(final=True)
        if not self._after_call and self._ws:
            self._events.append(self._ws)
        self._ws = ""
        return self._take()

    def _advance(self, final: bool) -> None:
        raise NotImplementedError

    def _take(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def _content(self, chunk: str) -> None:
        """Text that is content; trailing whitespace is held until what follows it is known."""
        if not chunk:
            return
        held = self._ws + chunk
        if self._after_call and not self._emitted:   # no content yet: none starts with a call's newline
            held = held.lstrip()
        body = held.rstrip()
        self._ws = held[len(body):]
        if body:
            self._events.append(body)
            self._after_call = False
            self._emitted = True

    def _scan(self, start: int) -> None:
        if self._scanner is not None:
            self._num_scanned += self._scanner.num_scanned
        self._scanner = ValueEnd(start)

    def _object_end(self) -> int | None:
        assert self._scanner is not None
        return self._scanner.feed(self.text)

    def _accept(self, obj_text: str) -> bool:
        """Whether `obj_text` is a valid call (then it is emitted, unless past `max_calls`)."""
        call = self._validate(obj_text)
        if call is None:
            return False
        self._ws = ""                  # whitespace before a call is not content
        self._after_call = True
        if self.max_calls is None or self.num_calls < self.max_calls:
            self.num_calls += 1
            self._events.append(call)
        return True

    def _validate(self, obj_text: str) -> ParsedCall | None:
        try:
            obj = json.loads(obj_text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict):
            return None
        name = obj.get("name")
        if not isinstance(name, str) or not name or (self.names is not None and name not in self.names):
            return None
        scan = scan_object(obj_text, 0)
        spans = sorted(scan.members[k] for k in self.arg_keys if k in scan.members)
        if not spans:
            return ParsedCall(name, "{}")
        begin, end = spans[0]          # the first arguments member written wins
        raw = obj_text[begin:end]
        try:
            args = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        return ParsedCall(name, raw) if isinstance(args, dict) else None


def _could_start(text: str, i: int, marker: str) -> bool:
    """Whether the text from `i` to its end is a proper prefix of `marker`."""
    rest = len(text) - i
    return 0 < rest < len(marker) and marker.startswith(text[i:])


def _marker_free_end(text: str, pos: int, marker: str) -> int:
    """The end of the text from `pos` that cannot be the start of `marker`."""
    for k in range(min(len(marker) - 1, len(text) - pos), 0, -1):
        if marker.startswith(text[len(text) - k:]):
            return len(text) - k
    return len(text)


class _HermesReader(CallReader):
    """States: content -> open (a marker seen) -> body (its object) -> close (its end marker)."""

    arg_keys = ("arguments", "parameters")
    start_marker, end_marker = "<tool_call>", "</tool_call>"

    def __init__(self, names: frozenset[str] | None, max_calls: int | None) -> None:
        super().__init__(names, max_calls)
        self.state = "content"
        self.call_start = 0            # where the current call's marker starts
        self.cursor = 0                # where the state's scan resumes

    def _advance(self, final: bool) -> None:
        steps = {"content": self._in_content, "open": self._in_open, "body": self._in_body, "close": self._in_close}
        while steps[self.state](final):
            pass

    def _in_content(self, final: bool) -> bool:
        text = self.text
        i = text.find(self.start_marker, self.pos)
        if i < 0:
            end = len(text) if final else _marker_free_end(text, self.pos, self.start_marker)
            self._content(text[self.pos:end])
            self.pos = end
            return False
        self._content(text[self.pos:i])
        self.pos = self.call_start = i
        self.cursor = i + len(self.start_marker)
        self.state = "open"
        return True

    def _in_open(self, final: bool) -> bool:
        j = self.cursor = skip_ws(self.text, self.cursor)
        if j >= len(self.text):
            if final:
                self._give_up(j)
            return False
        if self.text[j] != "{":      # a marker not followed by a call: content, scanning on after it
            self._content(self.start_marker)
            self.pos = self.call_start + len(self.start_marker)
            self.state = "content"
            return True
        self._scan(j)
        self.state = "body"
        return True

    def _in_body(self, final: bool) -> bool:
        end = self._object_end()
        if end is None:
            if final:
                self._give_up(len(self.text))
            return False
        if not self._accept(self.text[self.cursor:end]):
            self._give_up(end)
            return True
        self.pos = self.cursor = end
        self.state = "close"
        return True

    def _in_close(self, final: bool) -> bool:
        """Whitespace, then the end marker (optional, as vLLM reads it)."""
        text = self.text
        j = self.cursor = skip_ws(text, self.cursor)
        if text.startswith(self.end_marker, j):
            self.pos = j + len(self.end_marker)
            self.state = "content"
            return True
        if j >= len(text) or (_could_start(text, j, self.end_marker) and not final):
            if final:
                self._content(text[self.pos:])   # whitespace is held, then dropped
                self.pos = len(text)
            return False
        self.state = "content"   # no end marker: what follows the object is content
        return True

    def _give_up(self, end: int) -> None:
        """The call region up to `end` is not a valid call: it is content."""
        self._content(self.text[self.call_start:end])
        self.pos = end
        self.state = "content"


class _Llama3JsonReader(CallReader):
    """States: start (a tag, then a call or plain text) -> body (a call's object) -> sep
    (`;` and another call, or the rest) -> plain (the rest is content)."""

    arg_keys = ("parameters", "arguments")
    python_tag = "<|python_tag|>"

    def __init__(self, names: frozenset[str] | None, max_calls: int | None) -> None:
        super().__init__(names, max_calls)
        self.state = "start"
        self.call_start = 0
        self.cursor = 0

    def _advance(self, final: bool) -> None:
        steps = {"start": self._at_start, "body": self._in_body, "sep": self._at_sep, "plain": self._in_plain}
        while steps[self.state](final):
            pass

    def _at_start(self, final: bool) -> bool:
        text = self.text
        p = self.cursor = skip_ws(text, self.cursor)
        if text.startswith(self.python_tag, p):
            p = skip_ws(text, p + len(self.python_tag))
        elif _could_start(text, p, self.python_tag) and not final:
            return False
        if p >= len(text):
            if final:
                self._in_plain(final)
            return False
        if text[p] == "{":
            self._open(0, p)
        else:
            self.state = "plain"
        return True

    def _in_body(self, final: bool) -> bool:
        end = self._object_end()
        if end is None:
            if final:
                self._content(self.text[self.call_start:])
                self.pos = len(self.text)
            return False
        if not self._accept(self.text[self.cursor:end]):
            self._content(self.text[self.call_start:end])
            self.pos, self.state = end, "plain"
            return True
        self.pos = self.cursor = end
        self.state = "sep"
        return True

    def _at_sep(self, final: bool) -> bool:
        text, n = self.text, len(self.text)
        j = skip_ws(text, self.cursor)
        k = skip_ws(text, j + 1) if j < n and text[j] == ";" else j
        if k >= n:
            if final:
                self._in_plain(final)
            return False
        if text[k] == "{":
            self._open(j, k)
        else:
            self.state = "plain"
        return True

    def _in_plain(self, final: bool) -> bool:
        self._content(self.text[self.pos:])
        self.pos = len(self.text)
        return False

    def _open(self, call_start: int, brace: int) -> None:
        self.call_start, self.cursor = call_start, brace
        self._scan(brace)
        self.state = "body"


class ToolParser:
    """A tool-call format, the functions a request declared (`names`; None: any name) and the
    most calls it may make (`max_calls`; None: any number)."""

    name = ""
    _reader: type[CallReader] = CallReader

    def __init__(self, names: Iterable[str] | None = None, max_calls: int | None = None) -> None:
        self.names = None if names is None else frozenset(names)
        self.max_calls = max_calls

    def reader(self) -> CallReader:
        return self._reader(self.names, self.max_calls)

    def parse(self, text: str) -> ParseResult:
        """The final parse of a whole output: one reader fed all of it."""
        reader = self.reader()
        events = reader.feed(text) + reader.finish()
        return ParseResult("".join(e for e in events if isinstance(e, str)),
                           [e for e in events if isinstance(e, ParsedCall)])


class HermesParser(ToolParser):
    name = "hermes"
    _reader = _HermesReader


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    _reader = _Llama3JsonReader


TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}


def get_parser(name: str, names: Iterable[str] | None = None, max_calls: int | None = None) -> ToolParser:
    try:
        return TOOL_PARSERS[name](names, max_calls)
    except KeyError:
        raise ValueError(f"--tool-call-parser must be one of {', '.join(TOOL_PARSERS)}; got {name!r}") from None
