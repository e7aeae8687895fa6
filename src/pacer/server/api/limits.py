"""Limits on what one request may ask: body size (413), its JSON (nesting depth and integer
digits: 400, never a RecursionError's or int conversion's 500), and counts and lengths in the
body, engine requests per HTTP request (prompts x n) among them (400 naming the field and the
limit). Each has a `pacer serve` flag; the defaults are generous for real clients and small
enough that one request cannot make the server do unbounded work before the engine sees it.
Checked on the raw JSON, before parsing, so a limit is one fact here and parsing stays about
meaning. Types are left to the parser (a wrong type is its 400).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pacer.request import MAX_LOGPROBS
from pacer.server.api.errors import APIError, bad_request
from pacer.server.api.protocol import MAX_N

__all__ = ["RequestLimits", "read_body", "LIMIT_FLAGS"]

# flag -> (field, default, help); `pacer serve --<flag>` sets RequestLimits.<field>
LIMIT_FLAGS: dict[str, tuple[str, int, str]] = {
    "max-request-body-bytes": ("max_body_bytes", 8 * 1024 * 1024, "largest request body, bytes (413 past it)"),
    "max-messages": ("max_messages", 1024, "most chat messages in one request"),
    "max-stop-strings": ("max_stop_strings", 16, "most stop strings in one request"),
    "max-stop-string-length": ("max_stop_string_length", 256, "longest stop string, characters"),
    "max-n": ("max_n", MAX_N, f"most choices per prompt, `n` (at most {MAX_N})"),
    "max-logprobs": ("max_logprobs", MAX_LOGPROBS,
                     f"most logprobs / top_logprobs per token (vLLM's flag; at most {MAX_LOGPROBS})"),
    "max-tools": ("max_tools", 128, "most tool definitions in one chat request"),
    "max-prompts": ("max_prompts", 256, "most prompts in one completions request"),
    "max-sequences-per-request": ("max_sequences", 256,
                                  "most engine requests one HTTP request makes: prompts x n"),
    "max-json-depth": ("max_json_depth", 64, "deepest nesting of arrays and objects in a request body"),
}


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_body_bytes: int = LIMIT_FLAGS["max-request-body-bytes"][1]
    max_messages: int = LIMIT_FLAGS["max-messages"][1]
    max_stop_strings: int = LIMIT_FLAGS["max-stop-strings"][1]
    max_stop_string_length: int = LIMIT_FLAGS["max-stop-string-length"][1]
    max_n: int = MAX_N
    max_logprobs: int = MAX_LOGPROBS
    max_tools: int = LIMIT_FLAGS["max-tools"][1]
    max_prompts: int = LIMIT_FLAGS["max-prompts"][1]
    max_sequences: int = LIMIT_FLAGS["max-sequences-per-request"][1]
    max_json_depth: int = LIMIT_FLAGS["max-json-depth"][1]

    def __post_init__(self) -> None:
        for flag, (name, _, _) in LIMIT_FLAGS.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"--{flag} must be an integer >= 1, got {v!r}")
        if self.max_n > MAX_N:
            raise ValueError(f"--max-n must be <= {MAX_N} (each choice is its own engine request), got {self.max_n}")
        if self.max_logprobs > MAX_LOGPROBS:
            raise ValueError(f"--max-logprobs must be <= {MAX_LOGPROBS}, got {self.max_logprobs}")

    @classmethod
    def from_args(cls, args: Any) -> RequestLimits:
        return cls(**{name: getattr(args, name) for name, _, _ in LIMIT_FLAGS.values()})

    def parse_json(self, raw: bytes) -> Any:
        """The body's JSON; a 400 for text that is not JSON, nests deeper than `max_json_depth`
        or holds an integer longer than Python converts (4,300 digits). Any thread."""
        try:
            body = json.loads(raw)
        except RecursionError:
            raise _too_deep(self.max_json_depth) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad_request(None, f"the request body is not valid JSON: {e}") from None
        except ValueError:   # an integer past sys.get_int_max_str_digits()
            raise bad_request(None, f"the request body holds an integer of more than {sys.get_int_max_str_digits()} "
                                    "digits") from None
        if _depth_exceeds(body, self.max_json_depth):
            raise _too_deep(self.max_json_depth)
        return body

    def check(self, body: Any) -> None:
        """Raise a 400 naming the first field over its limit; other problems are the parser's."""
        if not isinstance(body, Mapping):
            return
        _count(body.get("messages"), "messages", self.max_messages, "--max-messages")
        _count(body.get("tools"), "tools", self.max_tools, "--max-tools")
        prompt = body.get("prompt")
        num_prompts = 1
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            _count(prompt, "prompt", self.max_prompts, "--max-prompts")
            num_prompts = len(prompt)
        n = body.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n * num_prompts > self.max_sequences:
            raise bad_request("n", f"{num_prompts} prompts x n={n} make {n * num_prompts} engine requests; the limit "
                                   f"is {self.max_sequences} (--max-sequences-per-request)")
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
        _count(stops, "stop", self.max_stop_strings, "--max-stop-strings")
        for s in stops:
            if isinstance(s, str) and len(s) > self.max_stop_string_length:
                raise bad_request("stop", f"a stop string is {len(s)} characters; the limit is "
                                          f"{self.max_stop_string_length} (--max-stop-string-length)")
        _at_most(body, "n", self.max_n, "--max-n")
        for name in ("logprobs", "top_logprobs"):
            _at_most(body, name, self.max_logprobs, "--max-logprobs")


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest deeper than `limit` (iterative: no recursion to overflow)."""
    if not isinstance(value, dict | list):
        return False
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        for child in v.values() if isinstance(v, dict) else v:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _too_deep(limit: int) -> APIError:
    return bad_request(None, f"the request body nests arrays and objects deeper than {limit} levels "
                             "(--max-json-depth)")


def _count(value: Any, name: str, limit: int, flag: str) -> None:
    if isinstance(value, list) and len(value) > limit:
        raise bad_request(name, f"{name} has {len(value)} entries; the limit is {limit} ({flag})")


def _at_most(body: Mapping[str, Any], name: str, limit: int, flag: str) -> None:
    v = body.get(name)
    if isinstance(v, int) and not isinstance(v, bool) and v > limit:
        raise bad_request(name, f"{name} must be <= {limit} ({flag}), got {v}")


async def read_body(request: Any, limit: int) -> bytes:
    """The request body, refusing (413) one larger than `limit` bytes without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> APIError:
    return APIError(413, f"the request body is {'at least ' if size else ''}{size} bytes; the limit is {limit} "
                         f"bytes (--max-request-body-bytes)", "invalid_request_error", None, "request_too_large")
