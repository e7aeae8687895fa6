"""Grammars that force tool calls (`tool_choice` "required" or a named function), in the
format of the active tool-call parser, so even a small model returns calls whose arguments
validate against each function's `parameters` schema. The grammar is Lark with llguidance's
`%json` for the call objects; it reaches the engine as `StructuredOutputsParams(grammar=...)`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = ["forced_call_grammar"]


def _call_schema(tools: Sequence[dict[str, Any]], args_key: str) -> dict[str, Any]:
    variants = [{"type": "object",
                 "properties": {"name": {"const": t["function"]["name"]}, args_key: t["function"]["parameters"]},
                 "required": ["name", args_key], "additionalProperties": False} for t in tools]
    schema: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    return {**schema, "x-guidance": {"whitespace_flexible": False}}


def forced_call_grammar(parser_name: str, tools: Sequence[dict[str, Any]], parallel: bool) -> str:
    """At least one call (exactly one unless `parallel`) to one of `tools`, nothing else."""
    if parser_name == "llama3_json":
        call = "body"
        sep = '"; "'
        body = f"body: %json {json.dumps(_call_schema(tools, 'parameters'))}"
        rules = [body]
    else:
        call = "call"
        sep = '"\\n"'
        rules = ['call: "<tool_call>\\n" body "\\n</tool_call>"',
                 f"body: %json {json.dumps(_call_schema(tools, 'arguments'))}"]
    start = f"start: {call} ({sep} {call})*" if parallel else f"start: {call}"
    return "\n".join([start, *rules]) + "\n"
