"""Scanners for JSON that may still be arriving, strings and escapes respected.

- `ValueEnd`: where an object or array that starts at a given index ends, found as the text
  grows: each `feed` resumes where the last stopped, so a value streamed in n pieces costs
  O(its length) in all, not O(n x length). Tool-call readers use it to know when a call's
  object is complete.
- `scan_object`: where each top-level member of an object starts and ends, so a reader can
  cut a finished call's raw `arguments` text out of the model's output (nothing is
  re-serialised: the arguments are what the model wrote).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["ObjectScan", "ValueEnd", "scan_object", "skip_ws", "value_end"]

_STRUCTURE = re.compile(r'["{}\[\]]')   # what changes the depth outside a string
_IN_STRING = re.compile(r'["\\]')        # what ends or escapes inside one


class ValueEnd:
    """The end of the object or array whose opening bracket is `text[start]`, as `text`
    grows. `feed(text)` (the whole text so far, of which earlier calls saw a prefix) returns
    the index after the closing bracket, or None while it is unfinished. Brackets are only
    counted, not matched: the caller validates the value once it has ended."""

    __slots__ = ("pos", "depth", "in_string", "num_scanned")

    def __init__(self, start: int) -> None:
        self.pos = start            # the next character to look at
        self.depth = 0
        self.in_string = False
        self.num_scanned = 0        # characters passed over in all (each once)

    def feed(self, text: str) -> int | None:
        i, n = self.pos, len(text)
        start = i
        end = None
        while i < n:
            m = (_IN_STRING if self.in_string else _STRUCTURE).search(text, i)
            if m is None:
                i = n
                break
            j = m.start()
            c = text[j]
            if self.in_string:
                if c == "\\":
                    if j + 1 >= n:      # the escaped character has not arrived yet
                        i = j
                        break
                    i = j + 2
                    continue
                self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth <= 0:
                    end = i = j + 1
                    break
            i = j + 1
        self.num_scanned += i - start
        self.pos = i
        return end

_WS = " \t\r\n"
_DELIMS = ",}] \t\r\n"


def skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """text[i] == '"': the index after the closing quote, or None if the string is unfinished."""
    j, n = i + 1, len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def value_end(text: str, i: int) -> int | None:
    """The index after the JSON value starting at text[i], or None while it is unfinished
    (a number or literal is unfinished until a delimiter follows it)."""
    n = len(text)
    if i >= n:
        return None
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c in "{[":
        depth, j = 0, i
        while j < n:
            c = text[j]
            if c == '"':
                end = _string_end(text, j)
                if end is None:
                    return None
                j = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    j = i
    while j < n and text[j] not in _DELIMS:
        j += 1
    return j if j < n else None


@dataclass(slots=True)
class ObjectScan:
    """Members seen so far: key -> (value start, value end or None while unfinished)."""

    members: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    end: int | None = None      # index after the closing brace, once seen
    broken: bool = False        # not a JSON object after all


def _key(text: str, i: int) -> tuple[str | None, int | None]:
    import json

    end = _string_end(text, i)
    if end is None:
        return None, None
    try:
        return json.loads(text[i:end]), end
    except ValueError:
        return None, -1


def scan_object(text: str, i: int) -> ObjectScan:
    """Scan the object whose '{' is text[i] as far as the text goes."""
    scan = ObjectScan()
    n = len(text)
    j = skip_ws(text, i + 1)
    while j < n:
        if text[j] == "}":
            scan.end = j + 1
            return scan
        if text[j] != '"':
            scan.broken = True
            return scan
        key, after = _key(text, j)
        if after is None:
            return scan
        if key is None or after < 0:
            scan.broken = True
            return scan
        j = skip_ws(text, after)
        if j >= n:
            return scan
        if text[j] != ":":
            scan.broken = True
            return scan
        start = skip_ws(text, j + 1)
        if start >= n:
            return scan
        end = value_end(text, start)
        scan.members[key] = (start, end)
        if end is None:
            return scan
        j = skip_ws(text, end)
        if j < n and text[j] == ",":
            j = skip_ws(text, j + 1)
        elif j < n and text[j] != "}":
            scan.broken = True
            return scan
    return scan
