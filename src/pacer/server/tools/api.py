"""OpenAI `tools`, `tool_choice`, `parallel_tool_calls` and tool-related message fields,
parsed and checked; every error is a 400 naming its field (pacer.server.api.errors)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pacer.server.api.errors import bad_request

__all__ = ["ToolRequest", "parse_tools", "parse_tool_calls"]

_CHOICES = ("none", "auto", "required")


@dataclass(frozen=True, slots=True)
class ToolRequest:
    tools: list[dict[str, Any]]         # OpenAI function tools, checked
    choice: str                         # "none" | "auto" | "required" | "function"
    function_name: str | None = None    # choice == "function": the one to call
    parallel: bool = True               # parallel_tool_calls

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")

    def forced_tools(self) -> list[dict[str, Any]]:
        if self.choice == "function":
            return [t for t in self.tools if t["function"]["name"] == self.function_name]
        return self.tools


def _tool(i: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise bad_request(where, 'each tool must be {"type": "function", "function": {...}}')
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise bad_request(f"{where}.function", "function must be an object with name and parameters")
    name = fn.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise bad_request(f"{where}.function.name", "function.name must be a non-empty string of at most 64 chars")
    params = fn.get("parameters")
    if params is None:
        raise bad_request(f"{where}.function.parameters",
                          'function.parameters (a JSON schema object) is required; use {"type": "object", '
                          '"properties": {}} for a function without arguments')
    if not isinstance(params, dict):
        raise bad_request(f"{where}.function.parameters", "function.parameters must be a JSON schema object")
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise bad_request(f"{where}.function.description", "function.description must be a string")
    out = {"name": name, "parameters": params}
    if desc is not None:
        out["description"] = desc
    return {"type": "function", "function": out}


def _choice(value: Any, names: set[str]) -> tuple[str, str | None]:
    if isinstance(value, str):
        if value not in _CHOICES:
            raise bad_request("tool_choice", f"tool_choice must be one of {', '.join(_CHOICES)} or "
                                             f'{{"type": "function", "function": {{"name": ...}}}}; got {value!r}')
        return value, None
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if not isinstance(name, str) or name not in names:
            raise bad_request("tool_choice", f"tool_choice names function {name!r}, which is not in tools "
                                             f"({', '.join(sorted(names))})")
        return "function", name
    raise bad_request("tool_choice", 'tool_choice must be a string or {"type": "function", "function": {"name": ...}}')


def parse_tools(body: dict[str, Any]) -> ToolRequest | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls", "parallel_tool_calls must be a boolean")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise bad_request("tool_choice", "tool_choice needs tools")
        return None
    if not isinstance(tools, list):
        raise bad_request("tools", "tools must be a list")
    checked = [_tool(i, t) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise bad_request("tools", "function names in tools must be unique")
    kind, name = _choice("auto" if choice is None else choice, set(names))
    return ToolRequest(checked, kind, name, True if parallel is None else parallel)


def parse_tool_calls(value: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls`, checked; arguments kept as the JSON text sent."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(value, list) or not value:
        raise bad_request(where, "tool_calls must be a non-empty list")
    calls = []
    for j, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}[{j}]", 'each tool call must be {"id", "type": "function", '
                                               '"function": {"name", "arguments"}}')
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args)
        calls.append({"id": str(call.get("id", "")), "type": "function",
                      "function": {"name": fn["name"], "arguments": args}})
    return calls
