"""The shared-tool-output workload (`--workload tool-reuse`): N sessions, each with its own
history, receive the same K tool outputs, so a tool output's KV computed for one session can be
reused by the others at another position (segment reuse, docs/features/segment-reuse.md).

Request (session s, tool k) is: a system prompt every session shares, the session's own history
(a user message), an assistant message calling a tool, the tool's output (a `role: tool`
message; its tokens are the request's one segment span), and a short question. The stream goes
tool by tool: every session receives tool k (in a seeded order) before any receives tool k + 1,
so one session meets each tool output first and computes it. After N x K requests a new round
starts with new histories and new tool outputs. Over HTTP (chat) the server marks the tool
message's content as a segment itself; in process and in `pacer sim` the spans travel with the
request (`RequestSpec.segments`).
"""

from __future__ import annotations

import argparse
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pacer.workload.spec import ChatMessage, ClassSpec, LengthDist, RequestSpec, Workload
from pacer.workload.text import Segment, TextSource, TokenizerLike

__all__ = ["TOOL_REUSE", "ToolReuse", "tool_reuse_workload", "add_tool_reuse_args", "tool_reuse_from_args"]

TOOL_REUSE = "tool-reuse"
REQUEST_CLASS = "agent"   # tool-calling traffic: the server's agent class


@dataclass(frozen=True, slots=True)
class ToolReuse:
    """The workload's shape; every length is in tokens."""

    num_sessions: int = 8        # N: sessions, each with its own history
    num_tools: int = 4           # K: tool outputs every session receives
    tool_output_len: int = 1024
    history_len: int = 256       # each session's own history, before the tool call
    system_len: int = 32         # the system prompt all sessions share
    question_len: int = 16       # the question after the tool output
    output_len: int = 16

    def __post_init__(self) -> None:
        for name in ("num_sessions", "num_tools", "tool_output_len", "history_len", "question_len", "output_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"tool-reuse {name} must be an integer >= 1, got {value!r}")
        if isinstance(self.system_len, bool) or not isinstance(self.system_len, int) or self.system_len < 0:
            raise ValueError(f"tool-reuse system_len must be an integer >= 0, got {self.system_len!r}")

    @property
    def prompt_len(self) -> int:
        """Tokens of every request's prompt (the tool call's text counted in)."""
        return self.system_len + self.history_len + CALL_LEN + self.tool_output_len + self.question_len

    def requests(self, seed: int, tokenizer: TokenizerLike | None,
                 max_model_len: int | None) -> Iterator[RequestSpec]:
        """The endless stream of requests (`pacer.workload.generator.RequestSource`)."""
        need = self.prompt_len + self.output_len
        if max_model_len is not None and need > max_model_len:
            raise ValueError(f"tool-reuse requests need {need} tokens (prompt {self.prompt_len} + output "
                             f"{self.output_len}), more than max_model_len={max_model_len}: lower --tool-output-len "
                             f"or --history-len")
        return _stream(self, seed, TextSource(tokenizer))


CALL_LEN = 8   # tokens of the assistant's message that calls the tool


def _stream(wl: ToolReuse, seed: int, text: TextSource) -> Iterator[RequestSpec]:
    rng = random.Random(f"{seed}:{TOOL_REUSE}")
    system = text.segment(wl.system_len, rng)
    n = 0
    for rnd in itertools.count():   # rounds until the caller stops taking requests
        histories = [text.segment(wl.history_len, rng) for _ in range(wl.num_sessions)]
        tools = [text.segment(wl.tool_output_len, rng) for _ in range(wl.num_tools)]
        calls = [text.segment(CALL_LEN, rng) for _ in range(wl.num_tools)]
        for k, (tool, call) in enumerate(zip(tools, calls)):
            order = list(range(wl.num_sessions))
            rng.shuffle(order)
            for s in order:
                question = text.segment(wl.question_len, rng)
                yield _spec(wl, f"req-{n}", f"{TOOL_REUSE}-{rnd}-{s}", k, (system, histories[s], call, tool, question))
                n += 1


def _spec(wl: ToolReuse, request_id: str, session: str, k: int, parts: tuple[Segment, ...]) -> RequestSpec:
    system, history, call, tool, question = parts
    call_id = f"call_{k}"
    messages = [ChatMessage("system", system.text.strip())] if len(system) else []
    messages += [ChatMessage("user", history.text.strip()), ChatMessage("assistant", call.text.strip(), call_id),
                 ChatMessage("tool", tool.text.strip(), call_id), ChatMessage("user", question.text.strip())]
    tool_start = len(system) + len(history) + len(call)
    return RequestSpec(request_id=request_id, request_class=REQUEST_CLASS, prompt="".join(p.text for p in parts),
                       prompt_token_ids=tuple(t for p in parts for t in p.token_ids), output_tokens=wl.output_len,
                       messages=tuple(messages), session=session, turn=k,
                       segments=((tool_start, len(tool)),))


def tool_reuse_workload(spec: ToolReuse | None = None) -> Workload:
    """The `tool-reuse` workload (default shape without `spec`); its one class describes it."""
    spec = spec or ToolReuse()
    cls = ClassSpec(REQUEST_CLASS, LengthDist(spec.prompt_len), LengthDist(spec.output_len),
                    shared_prefix_len=spec.system_len, concurrent_sessions=spec.num_sessions)
    return Workload(TOOL_REUSE, (cls,), source=spec)


# ---------------------------------------------------------------- CLI (`pacer sim` / `pacer bench`)

def add_tool_reuse_args(p: argparse.ArgumentParser) -> None:
    """The `--workload tool-reuse` flags (`--tool-output-len` is shared with the agent loop)."""
    d = ToolReuse()
    g = p.add_argument_group("tool reuse (--workload tool-reuse; --output-len tokens per reply, default "
                             f"{d.output_len})")
    g.add_argument("--tool-sessions", type=int, default=d.num_sessions,
                   help=f"tool reuse: sessions, each with its own history (default {d.num_sessions})")
    g.add_argument("--tool-outputs", type=int, default=d.num_tools,
                   help=f"tool reuse: tool outputs every session receives (default {d.num_tools})")
    g.add_argument("--history-len", type=int, default=d.history_len,
                   help=f"tool reuse: tokens of each session's own history (default {d.history_len})")


def tool_reuse_from_args(args: Any) -> Workload:
    """The workload the flags describe (`--tool-output-len` default 1024 here, `--output-len` 16)."""
    d = ToolReuse()
    values = {"--tool-sessions": args.tool_sessions, "--tool-outputs": args.tool_outputs,
              "--tool-output-len": d.tool_output_len if args.tool_output_len is None else args.tool_output_len,
              "--history-len": args.history_len,
              "--output-len": d.output_len if args.output_len is None else args.output_len}
    for flag, value in values.items():
        if value < 1:
            raise ValueError(f"--workload tool-reuse: {flag} must be >= 1, got {value}")
    sessions, tools, tool_len, history_len, output_len = values.values()
    return tool_reuse_workload(ToolReuse(num_sessions=sessions, num_tools=tools, tool_output_len=tool_len,
                                         history_len=history_len, output_len=output_len))
