"""The `pacer` command: the subcommand table, each command's one-line purpose, and dispatch."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["main", "SUBCOMMANDS"]

AddArgs = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]

# Every subcommand, explicitly: name -> (module, its add-arguments function, its run function,
# what it is for). Modules are imported when the command line is built; a room whose optional
# dependencies are missing is left out of `pacer --help` rather than failing the others.
SUBCOMMANDS: dict[str, tuple[str, str, str, str]] = {
    "generate": ("pacer.cli.generate", "add_args", "run",
                 "generate from one prompt offline (LLM.generate / LLM.chat) and print the text and timings"),
    "serve": ("pacer.cli.serve", "add_args", "run",
              "serve the OpenAI API over HTTP: one engine, or --replicas N behind a router on Ray Serve"),
    "bench": ("pacer.bench.cli", "add_args", "run",
              "send a workload to a server (or an in-process engine) and report TTFT, ITL, throughput, goodput"),
    "sim": ("pacer.sim.cli", "add_args", "run",
            "run the real scheduler on simulated hardware (H100, H200, this CPU); calibrate and validate it"),
    "tune": ("pacer.tune.cli", "add_args", "run",
             "find max_num_seqs / max_num_batched_tokens / chunking that meet an SLO, on the simulator"),
    "diagnose": ("pacer.diagnose.cli", "add_args", "run",
                 "read request logs or /metrics, name each class's bottleneck and recommend the next experiment"),
}


def _load_commands() -> dict[str, tuple[AddArgs, Run]]:
    import importlib

    commands: dict[str, tuple[AddArgs, Run]] = {}
    for name, (mod, add_name, run_name, _) in SUBCOMMANDS.items():
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
    parser = argparse.ArgumentParser(prog="pacer", description="pacer: an LLM serving engine where batching is a "
                                     "scheduler policy. `pacer COMMAND --help` lists a command's flags.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (add_args, _) in commands.items():
        purpose = SUBCOMMANDS[name][3]
        add_args(sub.add_parser(name, help=purpose, description=purpose[0].upper() + purpose[1:] + "."))
    args = parser.parse_args(argv)
    try:
        return commands[args.command][1](args)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"pacer {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
