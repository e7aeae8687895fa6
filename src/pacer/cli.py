"""`pacer` command line: generate (and, as they land, serve | bench | sim | tune | diagnose)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pacer.engine_args import add_engine_args, engine_kwargs_from_args

__all__ = ["main", "SUBCOMMANDS"]

AddArgs = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]

# Every subcommand, explicitly: name -> (module, its add-arguments function, its run function).
# Modules are imported when the command line is built; a room whose optional dependencies are
# missing is left out of `pacer --help` rather than failing the others.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "generate": ("pacer.cli", "_add_generate", "_run_generate"),
    "serve": ("pacer.server.cli", "add_serve_args", "run_serve"),
    "bench": ("pacer.bench.cli", "add_args", "run"),
    "sim": ("pacer.sim.cli", "add_args", "run"),
    "tune": ("pacer.tune", "add_args", "run"),
    "diagnose": ("pacer.diagnose.cli", "add_args", "run"),
}


def _add_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="prompt text")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", dest="sample_seed", type=int, default=None, help="per-request sampling seed")
    p.add_argument("--n", type=int, default=1, help="samples of the prompt (each printed under its index)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="generate max_tokens even past end-of-sequence")
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help="print each output token's logprob and the K most likely alternatives")
    add_engine_args(p, skip=("seed",))


def _run_generate(args: argparse.Namespace) -> int:
    from pacer.llm import LLM
    from pacer.request import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.sample_seed, n=args.n, stop=tuple(args.stop),
                            ignore_eos=args.ignore_eos, presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty,
                            repetition_penalty=args.repetition_penalty, logprobs=args.logprobs)
    llm = LLM(**engine_kwargs_from_args(args))
    if args.chat:
        out = llm.chat([{"role": "user", "content": args.prompt}], params)[0]
    else:
        out = llm.generate(args.prompt, params)[0]
    for sample in out.outputs:
        if args.n > 1:
            print(f"--- sample {sample.index}")
        print(sample.text)
        if sample.logprobs is not None:
            _print_logprobs(llm.tokenizer, sample.token_ids, sample.logprobs)
        m = sample.metrics
        tpot = f"{m.tpot * 1000:.1f} ms" if m.tpot is not None else "n/a"
        ttft = m.ttft if m.ttft is not None else float("nan")
        print(f"[pacer] ttft {ttft * 1000:.1f} ms, tpot {tpot}, prompt {m.prompt_tokens} tokens, "
              f"output {len(sample.token_ids)} tokens, finish {sample.finish_reason}", file=sys.stderr)
    return 0


def _print_logprobs(tokenizer: Any, token_ids: list[int], logprobs: list[dict[int, float]]) -> None:
    """One line per output token: the token, its logprob, then the top alternatives."""
    def show(t: int) -> str:
        return repr(tokenizer.decode([t])) if tokenizer is not None else str(t)

    for t, lp in zip(token_ids, logprobs):
        top = ", ".join(f"{show(a)} {v:.3f}" for a, v in list(lp.items())[1:])
        print(f"  {show(t):>16} {lp.get(t, float('nan')):8.3f}" + (f"   top: {top}" if top else ""))


def _load_commands() -> dict[str, tuple[AddArgs, Run]]:
    import importlib

    commands: dict[str, tuple[AddArgs, Run]] = {}
    for name, (mod, add_name, run_name) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod or (e.name and mod.startswith(e.name + ".")):
                continue   # that room is not installed here
            raise
        commands[name] = (getattr(module, add_name), getattr(module, run_name))
    return commands


def main(argv: Sequence[str] | None = None) -> int:
    commands = _load_commands()
    parser = argparse.ArgumentParser(prog="pacer", description="pacer: batching is a scheduler policy.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (add_args, _) in commands.items():
        add_args(sub.add_parser(name))
    args = parser.parse_args(argv)
    try:
        return commands[args.command][1](args)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"pacer {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
