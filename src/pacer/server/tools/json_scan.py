"""A scanner for JSON that may still be arriving: where each top-level member of an object
starts and ends, with strings and escapes respected, so a tool parser can cut a call's
`name` and its raw `arguments` text out of a partial model output.

Nothing is re-serialised: spans point into the text as the model wrote it, so arguments
streamed as the text grows are always a prefix of the arguments of the finished text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ObjectScan", "scan_object", "skip_ws", "value_end"]

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
