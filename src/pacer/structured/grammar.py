"""From a constraint spec (`StructuredOutputsParams.spec()`) to a checked llguidance grammar.

This is the work the grammar worker process does (pacer.structured.worker), so it imports
only llguidance and the standard library, never torch. `compile_spec` raises `GrammarError`
with a message for the client when the schema, regex or grammar is invalid or uses what
llguidance does not implement.

Why llguidance: it compiles lazily (a JSON schema becomes a grammar in well under a
millisecond; lexer states are built as masks need them), it bounds its own work per mask
(lexer fuel, Earley item caps) so one schema cannot spin a core for hours, it computes a
mask over a 49k vocabulary in tens of microseconds with the GIL released, and it is a ~3 MB
wheel without dependencies. vLLM's `guidance` backend and TensorRT-LLM use it too.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["GrammarError", "compile_spec", "grammar_source", "json_options", "structural_tag_grammar"]


class GrammarError(ValueError):
    """The constraint cannot be compiled; the message says why (for a 400)."""


def json_options(compact: bool) -> Any:
    """llguidance JSON options: compact (no whitespace outside strings) or flexible."""
    return {"whitespace_flexible": not compact}


def grammar_source(spec: dict[str, Any]) -> str:
    """The llguidance grammar (JSON text or Lark) for one spec; not yet checked."""
    import llguidance as llg

    kind, value, compact = spec["kind"], spec["value"], bool(spec.get("compact", True))
    if kind == "json":
        if not isinstance(value, dict | bool):
            raise GrammarError("the JSON schema must be an object")
        try:
            return str(llg.LLMatcher.grammar_from_json_schema(json.dumps(value), defaults=json_options(compact)))
        except ValueError as e:
            raise GrammarError(f"invalid JSON schema: {e}") from None
    if kind == "json_object":
        return str(llg.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=json_options(compact)))
    if kind == "regex":
        return str(llg.LLMatcher.grammar_from_regex(value))
    if kind == "choice":
        alternatives = " | ".join(json.dumps(c) for c in value)
        return str(llg.LLMatcher.grammar_from_lark(f"start: {alternatives}"))
    if kind == "grammar":
        return str(llg.LLMatcher.grammar_from_lark(value))
    if kind == "structural_tag":
        return structural_tag_grammar(value, compact)
    raise GrammarError(f"unknown structured output kind {kind!r}")


def structural_tag_grammar(tag: dict[str, Any], compact: bool) -> str:
    """A structural tag (`{"structures", "triggers"}`, pacer.structural_tag) as llguidance Lark:
    free text, in which each trigger lazily starts its structure (begin, `%json` per schema, end);
    as vLLM's `guidance` backend builds it, through llguidance's StructTag."""
    import llguidance as llg

    tags = []
    for s in tag["structures"]:
        trigger = next(t for t in tag["triggers"] if s["begin"].startswith(t))
        schema = s["schema"]
        if "x-guidance" not in schema:
            schema = {**schema, "x-guidance": json_options(compact)}
        tags.append(llg.StructTag(trigger=trigger, begin=s["begin"], grammar=schema, end=s["end"]))
    return str(llg.StructTag.to_grammar(tags))


def compile_spec(spec: dict[str, Any], tokenizer: Any) -> str:
    """The checked grammar of `spec` for `tokenizer` (an LLTokenizer): builds a matcher and
    its first mask, which is where llguidance does its heavy lifting (regexes to automata,
    the lexer over the vocabulary). Raises GrammarError."""
    import llguidance as llg

    grammar = grammar_source(spec)
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if is_error:
        raise GrammarError(_first_line(messages[0]) if messages else "invalid grammar")
    matcher = llg.LLMatcher(tokenizer, grammar, log_level=0)
    matcher.compute_bitmask()
    if matcher.is_error():
        raise GrammarError(_first_line(matcher.get_error()))
    return grammar


def _first_line(message: str) -> str:
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    return " ".join(lines[:3])[:500] if lines else message
