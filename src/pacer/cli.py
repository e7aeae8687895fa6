"""`pacer` command line: generate (and, as they land, serve | bench | sim | tune | diagnose)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from pacer.engine_args import add_engine_args, engine_kwargs_from_args

__all__ = ["main", "COMMANDS"]

# name -> (add_arguments, run); rooms register here so `pacer --help` lists everything.
COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def _add_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="prompt text")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", dest="sample_seed", type=int, default=None, help="per-request sampling seed")
    add_engine_args(p, skip=("seed",))


def _run_generate(args: argparse.Namespace) -> int:
    from pacer.llm import LLM
    from pacer.request import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.sample_seed)
    llm = LLM(**engine_kwargs_from_args(args))
    if args.chat:
        out = llm.chat([{"role": "user", "content": args.prompt}], params)[0]
    else:
        out = llm.generate(args.prompt, params)[0]
    print(out.text)
    m = out.metrics
    tpot = f"{m.tpot * 1000:.1f} ms" if m.tpot is not None else "n/a"
    ttft = m.ttft if m.ttft is not None else float("nan")
    print(f"[pacer] ttft {ttft * 1000:.1f} ms, tpot {tpot}, prompt {m.prompt_tokens} tokens, "
          f"output {len(out.token_ids)} tokens, finish {out.finish_reason}", file=sys.stderr)
    return 0


COMMANDS["generate"] = (_add_generate, _run_generate)


def _load_optional_commands() -> None:
    import importlib

    for mod in ("pacer.server.cli", "pacer.bench.cli", "pacer.sim.cli", "pacer.tune", "pacer.diagnose"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod and not (e.name and mod.startswith(e.name)):
                raise


def main(argv: Sequence[str] | None = None) -> int:
    _load_optional_commands()
    parser = argparse.ArgumentParser(prog="pacer", description="pacer: batching is a scheduler policy.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (add_args, _) in COMMANDS.items():
        add_args(sub.add_parser(name))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][1](args)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"pacer {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # `python -m pacer.cli`: run the imported module's main, whose COMMANDS the rooms register into
    from pacer.cli import main as _main

    sys.exit(_main())
