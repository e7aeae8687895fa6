"""Segment spans on the way in (segment reuse, `pacer.sched.segments`): a prompt's spans checked
once, a request's own `segment_reuse` checked against the engine's mode, the offline API's
per-prompt argument spread over its prompts, and chat conversations rendered with the spans of
their segment messages' contents (tool messages, and any message marked `"segment": true`).
Errors are FieldErrors naming the field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pacer.errors import FieldTypeError, FieldValueError

__all__ = ["REQUEST_SEGMENT_REUSE", "check_segments", "check_segment_reuse", "segments_per_prompt", "render_chats"]

REQUEST_SEGMENT_REUSE = ("off", "approximate")   # a request's own segment_reuse: opt out, or the engine's default


def check_segment_reuse(value: object, engine_mode: str) -> str | None:
    """A request's own `segment_reuse`: None (the engine's mode), "off" (this request neither reuses
    nor stores segments, as on an engine without segment reuse) or "approximate" (only where the
    engine reuses segments: a request cannot turn it on)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise FieldTypeError("segment_reuse", f"segment_reuse must be one of {', '.join(REQUEST_SEGMENT_REUSE)}, "
                                              f"got {value!r:.80}")
    if value not in REQUEST_SEGMENT_REUSE:
        raise FieldValueError("segment_reuse", f"segment_reuse must be one of {', '.join(REQUEST_SEGMENT_REUSE)}, "
                                               f"got {value!r:.80}")
    if value == "approximate" and engine_mode != "approximate":
        raise FieldValueError("segment_reuse", f"segment_reuse 'approximate' needs an engine that reuses segments; "
                                               f"this one runs with segment_reuse={engine_mode!r} (start it with "
                                               f"--segment-reuse approximate)")
    return value


def check_segments(segments: Sequence[Sequence[int]] | None, num_prompt_tokens: int,
                   field: str = "segments") -> tuple[tuple[int, int], ...]:
    """Prompt spans as (start, length) pairs of integers, each inside the prompt, length >= 1,
    sorted by start and disjoint; raises a FieldError naming `field` and the span at fault."""
    if segments is None:
        return ()
    if isinstance(segments, str | bytes) or not isinstance(segments, Sequence):
        raise FieldTypeError(field, f"{field} must be a list of [start, length] token spans, got {segments!r:.80}")
    out: list[tuple[int, int]] = []
    for i, span in enumerate(segments):
        if (isinstance(span, str | bytes) or not isinstance(span, Sequence) or len(span) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) for v in span)):
            raise FieldTypeError(field, f"{field}[{i}] must be a [start, length] pair of integers, got {span!r:.80}")
        start, length = span
        if start < 0 or length < 1 or start + length > num_prompt_tokens:
            raise FieldValueError(field, f"{field}[{i}] = [{start}, {length}] must lie inside the prompt's "
                                         f"{num_prompt_tokens} tokens with length >= 1")
        if out and start < out[-1][0] + out[-1][1]:
            raise FieldValueError(field, f"{field}[{i}] starts at {start}, inside or before {field}[{i - 1}]: "
                                         f"spans must be sorted and disjoint")
        out.append((start, length))
    return tuple(out)


def segments_per_prompt(segments: Sequence[Any] | None, n: int) -> list[Any]:
    """`segments` of `generate`: None, one prompt's spans [(start, length), ...] (one prompt),
    or one list (or None) per prompt."""
    if segments is None:
        return [None] * n
    if isinstance(segments, str | bytes) or not isinstance(segments, Sequence):
        raise FieldTypeError("segments", f"segments must be a list of (start, length) spans, got {segments!r:.80}")
    one_prompt = all(isinstance(s, list | tuple) and len(s) == 2 and all(isinstance(v, int) for v in s)
                     for s in segments)
    if n == 1 and (one_prompt or not segments):
        return [segments]
    if len(segments) != n:
        raise ValueError(f"segments: got {len(segments)} span lists for {n} prompts")
    return list(segments)


def render_chats(tokenizer: Any, convs: Sequence[Sequence[dict[str, Any]]], roles: tuple[str, ...] | None,
                 chat_template: str | None, kwargs: dict[str, Any]
                 ) -> tuple[list[list[int]], list[list[tuple[int, int]] | None]]:
    """Each conversation's token ids (its chat template render, a generation prompt added) and,
    unless `roles` is None, the token spans of its segment messages' contents (those roles', and
    any message's that says `"segment": True`; None per conversation without)."""
    prompts: list[list[int]] = []
    spans: list[list[tuple[int, int]] | None] = []
    for c in convs:
        _check_marks(c)
        if roles is not None:
            ids, found = tokenizer.chat_segments(list(c), roles, True, chat_template, **kwargs)
            prompts.append(ids)
            spans.append(found)
        else:
            prompts.append(tokenizer.apply_chat_template(list(c), add_generation_prompt=True,
                                                         chat_template=chat_template, **kwargs))
            spans.append(None)
    return prompts, spans


def _check_marks(messages: Sequence[dict[str, Any]]) -> None:
    """A message's `segment` mark is a boolean (or absent)."""
    for i, m in enumerate(messages):
        mark = m.get("segment") if isinstance(m, dict) else None
        if mark is not None and not isinstance(mark, bool):
            raise FieldTypeError(f"messages[{i}].segment", f"messages[{i}].segment must be a boolean, got {mark!r:.80}")
