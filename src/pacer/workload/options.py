"""The workload, arrival and report flags shared by `pacer bench`, `pacer sim` and `pacer tune`
(one definition, so the same names mean the same thing everywhere), and their parsing."""

from __future__ import annotations

import argparse

from pacer.workload.spec import Workload, builtin_workload, load_workload
from pacer.workload.tool_reuse import TOOL_REUSE, tool_reuse_from_args

__all__ = ["DEFAULT_NUM_PROMPTS", "add_workload_args", "parse_rates", "workload_from_args"]

DEFAULT_NUM_PROMPTS = 100


def add_workload_args(p: argparse.ArgumentParser, *, num_prompts_help: str = "",
                      seed_help: str = "workload and arrival seed (default 0)") -> argparse._ArgumentGroup:
    """Adds the workload, arrivals and report groups; returns the report group for extras."""
    w = p.add_argument_group("workload")
    w.add_argument("--workload", default=None,
                   help="chat | rag | agent | batch | mixed | fixed | agent-loop (closed-loop agents over growing "
                        "histories, job completion time) | tool-reuse (sessions with their own histories receive "
                        "the same tool outputs: segment reuse), or a .yaml/.json spec (default chat; fixed when "
                        "--input-len is given)")
    w.add_argument("--input-len", type=int, default=None, help="fixed workload: prompt tokens per request")
    w.add_argument("--output-len", type=int, default=None,
                   help="fixed and tool-reuse workloads: output tokens per request")
    w.add_argument("--prompt-cv", type=float, default=None, help="override every class's prompt length CV")
    w.add_argument("--output-cv", type=float, default=None, help="override every class's output length CV")
    w.add_argument("--trace", default=None, help="replay a JSONL trace (timestamp, prompt|prompt_tokens, ...)")
    w.add_argument("--seed", type=int, default=0, help=seed_help)
    a = p.add_argument_group("arrivals")
    a.add_argument("--request-rate", default=None,
                   help="req/s, Poisson (or gamma with --burstiness); 'inf' (the default without --concurrency) "
                        "sends all at once; a list 1,2,4,8 sweeps load")
    a.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: 1 Poisson, <1 burstier")
    a.add_argument("--concurrency", type=int, default=None,
                   help="closed loop with N clients; with --request-rate: cap on requests in flight")
    a.add_argument("--num-prompts", type=int, default=None,
                   help=num_prompts_help or f"requests to send (default {DEFAULT_NUM_PROMPTS})")
    a.add_argument("--duration", type=float, default=None, help="send for this many seconds instead")
    from pacer.workload.agents import add_agent_loop_args
    from pacer.workload.tool_reuse import add_tool_reuse_args

    add_agent_loop_args(p)
    add_tool_reuse_args(p)
    r = p.add_argument_group("report")
    r.add_argument("--slo", action="append", default=[],
                   help="goodput targets, e.g. ttft=300ms,itl=50ms or per class rag:ttft=2s (repeatable)")
    r.add_argument("--out", default=None, help="write the run as JSON (a sweep writes one file per rate)")
    return r


def parse_rates(text: str | None) -> list[float | None]:
    """`--request-rate` as a list of rates; [None] when it is not given."""
    if text is None:
        return [None]
    rates: list[float | None] = []
    for part in str(text).split(","):
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"--request-rate: expected numbers such as 2 or 1,2,4,8 or inf, got {part!r}") from None
        if not value > 0:
            raise ValueError(f"--request-rate must be > 0, got {part!r}")
        rates.append(value)
    return rates


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload named by --workload / --input-len / --output-len, with CV overrides applied."""
    name = args.workload or ("fixed" if args.input_len is not None else "chat")
    if name == "agent-loop":
        raise ValueError("--workload agent-loop is a closed loop of agents, not a request stream: `pacer sim` and "
                         "`pacer bench` run it themselves (pacer.workload.agents)")
    if name == TOOL_REUSE:
        if args.input_len is not None or args.prompt_cv is not None or args.output_cv is not None:
            raise ValueError("--input-len/--prompt-cv/--output-cv do not apply to --workload tool-reuse (its lengths: "
                             "--tool-output-len, --history-len, --output-len)")
        return tool_reuse_from_args(args)
    if name == "fixed":
        wl = builtin_workload("fixed", args.input_len, args.output_len)
    elif args.input_len is not None or args.output_len is not None:
        raise ValueError("--input-len/--output-len apply to the fixed workload (drop --workload or use fixed)")
    else:
        wl = load_workload(name)
    return wl.with_lengths(prompt_cv=args.prompt_cv, output_cv=args.output_cv)
