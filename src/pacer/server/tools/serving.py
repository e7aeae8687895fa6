"""How the server serves one chat request's tools: which parser reads the output, and, for
`tool_choice` "required" or a named function, the grammar that forces the calls.

Follows vLLM: `auto` needs `--enable-auto-tool-choice` and `--tool-call-parser`; forced
calls are generated under a grammar (in the parser's format, `hermes` when none is set);
`none` renders the tools but parses nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pacer.request import StructuredOutputsParams
from pacer.server.api.errors import bad_request
from pacer.server.api.protocol import ParsedRequest
from pacer.server.tools.grammar import forced_call_grammar
from pacer.server.tools.parsers import ToolParser, get_parser

__all__ = ["ToolOptions", "plan_tools"]


@dataclass(frozen=True, slots=True)
class ToolOptions:
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None      # a name in pacer.server.tools.parsers.TOOL_PARSERS
    chat_template: str | None = None         # --chat-template's text: overrides the model's
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)   # --default-chat-template-kwargs

    def __post_init__(self) -> None:
        if self.tool_call_parser is not None:
            get_parser(self.tool_call_parser)   # raises naming the choices
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (hermes or llama3_json)")
        from pacer.server.tools.template import RESERVED_TEMPLATE_KWARGS

        reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(self.chat_template_kwargs))
        if reserved:
            raise ValueError(f"--default-chat-template-kwargs may not set {', '.join(reserved)}")


def plan_tools(parsed: ParsedRequest, options: ToolOptions) -> tuple[ParsedRequest, ToolParser | None]:
    """The request to run (with the forcing grammar when the calls are forced) and the
    parser for its output (None: plain content): it accepts only the functions in `tools`, and
    only the first call when `parallel_tool_calls` is false."""
    tools = parsed.tools
    if tools is None or tools.choice == "none":
        return parsed, None
    name = options.tool_call_parser or "hermes"
    parser = get_parser(name, [t["function"]["name"] for t in tools.tools], None if tools.parallel else 1)
    if tools.forced:
        grammar = forced_call_grammar(name, tools.forced_tools(), tools.parallel)
        sampling = {**parsed.sampling, "structured_outputs": StructuredOutputsParams(grammar=grammar)}
        return dataclasses.replace(parsed, sampling=sampling, structured_param="tools"), parser
    if not options.enable_auto_tool_choice:
        raise bad_request("tool_choice", '"auto" tool choice requires --enable-auto-tool-choice and '
                                         "--tool-call-parser to be set")
    return parsed, parser
