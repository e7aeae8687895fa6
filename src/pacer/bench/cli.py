"""`pacer bench`: run a workload against an OpenAI-compatible server or an in-process engine,
print the report, keep it as JSON and PNG plots; `pacer bench compare A.json B.json`.

Listed in `pacer.cli.main.SUBCOMMANDS`. Glue only: workloads, drivers and reports live in
their own modules.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import functools
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pacer.config.args import add_engine_args, engine_kwargs_from_args
from pacer.workload.agents import AGENT_LOOP
from pacer.workload.arrivals import ArrivalProcess, ClosedLoop, make_arrivals
from pacer.workload.generator import iter_requests
from pacer.workload.options import DEFAULT_NUM_PROMPTS, add_workload_args, parse_rates, workload_from_args
from pacer.workload.report import OVERALL, Report, RequestRecord, SloSet, build_report, parse_slo
from pacer.workload.spec import RequestSpec, Workload
from pacer.workload.tables import compare_table, report_table
from pacer.workload.text import TokenizerLike
from pacer.workload.tool_reuse import TOOL_REUSE
from pacer.workload.trace import load_trace

__all__ = ["add_args", "run"]



def add_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Load-test an OpenAI-compatible endpoint (--base-url) or an in-process engine "
                     "(--engine inprocess) with a workload; `pacer bench compare A.json B.json` diffs two runs.")
    p.add_argument("action", nargs="*", metavar="compare A.json B.json",
                   help="`compare A.json B.json`: print metric deltas of two --out files side by side")
    t = p.add_argument_group("target")
    t.add_argument("--base-url", default=None, help="server to load, e.g. http://127.0.0.1:8000")
    t.add_argument("--engine", choices=("http", "inprocess"), default=None,
                   help="http (default with --base-url) or inprocess: same workload on an engine in this "
                        "process, no network (takes the engine flags below)")
    t.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="send prompts to /v1/completions (default), or as one user message to "
                        "/v1/chat/completions")
    t.add_argument("--tokenizer", default=None,
                   help="tokenizer (HF dir or .gguf) that cuts prompts to exact lengths; default: --model if "
                        "it is a local path, else pacer's default model")
    t.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="bearer key sent to the server (default $OPENAI_API_KEY)")
    t.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default 600)")
    t.add_argument("--extra-body", default=None, help="JSON merged into every request body")
    r = add_workload_args(p, seed_help="workload, arrivals and engine seed (default 0)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of every request")
    r.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots into DIR")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_args(p, skip=("seed",))


def run(args: argparse.Namespace) -> int:
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 140))   # full tables in logs and pipes
    if args.action:
        if args.action[0] != "compare" or len(args.action) != 3:
            raise ValueError(f"unknown bench action {' '.join(args.action)!r}; usage: pacer bench compare A.json B.json")
        a, b = Report.load(args.action[1]), Report.load(args.action[2])
        console.print(compare_table(a, b, labels=(Path(args.action[1]).stem, Path(args.action[2]).stem)))
        return 0
    engine_mode = args.engine or ("http" if args.base_url else None)
    if engine_mode is None:
        raise ValueError("give --base-url URL (a server) or --engine inprocess")
    if engine_mode == "http" and not args.base_url:
        raise ValueError("--engine http needs --base-url")
    if args.trace and args.request_rate:
        raise ValueError("--trace replays its own timestamps; drop --request-rate (or use --concurrency)")
    if args.workload == AGENT_LOOP:
        return _agent_loop(args, engine_mode, console)
    if args.workload == TOOL_REUSE and engine_mode == "http" and args.endpoint != "chat":
        raise ValueError("--workload tool-reuse over HTTP needs --endpoint chat: the server marks the tool "
                         "messages' contents as segments (a completions prompt carries no segment spans)")
    slo = parse_slo(args.slo)
    rates = parse_rates(args.request_rate)
    bench = _Bench(args, engine_mode, slo, console)
    reports: list[Report] = []
    for rate in rates:
        rep = bench.run_once(rate)
        reports.append(rep)
        title = f"pacer bench: {rep.meta['workload']}, {rep.meta['arrivals']}"
        console.print(report_table(rep, title=title))
        suffix = "" if len(rates) == 1 else f".rate-{_rate_label(rate)}"
        if args.out:
            path = _with_suffix(Path(args.out), suffix)
            rep.save(path)
            console.print(f"[dim]wrote {path}[/dim]")
        if args.plots:
            from pacer.workload.plots import plot_report

            prefix = "" if len(rates) == 1 else f"rate-{_rate_label(rate)}-"
            for path in plot_report(rep, args.plots, prefix=prefix):
                console.print(f"[dim]wrote {path}[/dim]")
    if len(rates) > 1:
        console.print(_sweep_table(rates, reports))
        if args.plots:
            from pacer.workload.plots import plot_sweep

            console.print(f"[dim]wrote {plot_sweep([r or 0.0 for r in rates], reports, args.plots)}[/dim]")
    return 0


def _rate_label(rate: float | None) -> str:
    return "closed" if rate is None else ("inf" if math.isinf(rate) else f"{rate:g}")


def _with_suffix(path: Path, suffix: str) -> Path:
    return path.with_name(path.stem + suffix + (path.suffix or ".json"))


def _sweep_table(rates: list[float | None], reports: list[Report]) -> Table:
    table = Table(title="load sweep (overall)", title_justify="left")
    for col in ("offered req/s", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "ITL p99", "TPOT p99", "goodput"):
        table.add_column(col, justify="right")

    def ms(v: Any) -> str:
        return "-" if v is None else f"{v * 1000:.1f} ms"

    for rate, rep in zip(rates, reports):
        s = rep.summary[OVERALL]
        table.add_row(_rate_label(rate), f"{s['req_s']:.2f}", f"{s['output_tok_s']:.1f}", ms(s["ttft_p50"]),
                      ms(s["ttft_p99"]), ms(s["itl_p99"]), ms(s["tpot_p99"]), f"{s['goodput_req_s']:.2f}")
    return table


class _Bench:
    """One configured benchmark; `run_once(rate)` runs it at one offered rate."""

    def __init__(self, args: argparse.Namespace, mode: str, slo: SloSet, console: Console) -> None:
        self.args = args
        self.mode = mode
        self.slo = slo
        self.console = console
        self.engine: Any = None
        self.engine_kwargs = engine_kwargs_from_args(args)   # includes --seed: the engine's sampler seed too
        self.tokenizer: TokenizerLike | None = None
        self.max_model_len: int | None = args.max_model_len
        self.model_name: str | None = args.model
        if mode == "inprocess":
            from pacer.engine import Engine

            self.engine = Engine.from_kwargs(**self.engine_kwargs)
            self.tokenizer = self.engine.tokenizer
            self.max_model_len = self.engine.max_model_len
        else:
            self.engine_kwargs = {k: v for k, v in self.engine_kwargs.items() if k not in ("model", "seed")}
            self.tokenizer = _load_tokenizer(args.tokenizer or args.model, console)
            self._probe_server()
        self.workload = self._workload()

    def _probe_server(self) -> None:
        from pacer.workload.client import OpenAIClient

        async def probe() -> tuple[str, int | None]:
            async with OpenAIClient(self.args.base_url, model=self.model_name, api_key=self.args.api_key) as c:
                listed = await c.models()
                name = self.model_name or (str(listed[0]["id"]) if listed else None)
                if name is None:
                    raise ValueError(f"{self.args.base_url}/v1/models lists no model; pass --model")
                lens = [m.get("max_model_len") for m in listed if m.get("id") == name]
                return name, int(lens[0]) if lens and isinstance(lens[0], int) else None

        self.model_name, server_len = asyncio.run(probe())
        if self.max_model_len is None:
            self.max_model_len = server_len

    def _workload(self) -> Workload | None:
        return None if self.args.trace else workload_from_args(self.args)

    def _specs(self, arrivals: ArrivalProcess) -> tuple[Iterator[RequestSpec], int | None]:
        args = self.args
        if self.workload is None:
            specs = load_trace(args.trace, tokenizer=self.tokenizer, seed=args.seed)
            if args.num_prompts is not None:
                specs = specs[: args.num_prompts]
            if isinstance(arrivals, ClosedLoop):
                specs = [s.with_arrival(None) for s in specs]
            return iter(specs), len(specs)
        num = args.num_prompts
        if num is None and args.duration is None:
            num = DEFAULT_NUM_PROMPTS
        it = iter_requests(self.workload, arrivals, seed=args.seed, num_requests=num, duration=args.duration,
                           tokenizer=self.tokenizer, max_model_len=self.max_model_len)
        return it, num

    def run_once(self, rate: float | None) -> Report:
        args = self.args
        if self.workload is not None:
            if rate is None and args.concurrency is None:
                rate = math.inf   # neither flag: everything at once, like vLLM's benchmark
            arrivals: ArrivalProcess = make_arrivals(rate, args.burstiness, args.concurrency)
            arrivals_desc = arrivals.describe()
        elif args.concurrency is not None:      # a trace replayed back to back by N clients
            arrivals = ClosedLoop(args.concurrency)
            arrivals_desc = f"trace {Path(args.trace).name}, " + arrivals.describe()
        else:                                   # a trace at its own timestamps
            arrivals = make_arrivals(math.inf)
            arrivals_desc = f"trace {Path(args.trace).name} at its timestamps"
        specs, total = self._specs(arrivals)
        closed = isinstance(arrivals, ClosedLoop)
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        with self._progress(total) as on_done:
            if self.mode == "inprocess":
                from pacer.workload.drive import ARRIVAL_NOTE
                from pacer.workload.runner import run_inprocess

                records, _, stats = run_inprocess(
                    specs, self.engine, endpoint=args.endpoint, temperature=args.temperature,
                    concurrency=args.concurrency, closed_loop=closed, duration=args.duration, on_done=on_done)
                extra: dict[str, Any] = {"engine_steps": stats.as_dict(), "arrival": ARRIVAL_NOTE}
                if stats.spec_decode() is not None:
                    extra["spec_decode"] = stats.spec_decode()
            else:
                records = self._run_http(specs, closed, on_done)
                extra = {}
        meta = {
            "target": args.base_url if self.mode == "http" else "inprocess", "engine": self.mode,
            "endpoint": args.endpoint, "model": self.model_name, "started_at": started,
            "workload": self.workload.name if self.workload else f"trace:{args.trace}",
            "classes": [_class_meta(c) for c in self.workload.classes] if self.workload else [],
            "arrivals": arrivals_desc,
            "request_rate": "inf" if rate is not None and math.isinf(rate) else rate, "burstiness": args.burstiness,
            "concurrency": args.concurrency, "num_prompts": args.num_prompts, "duration": args.duration,
            "seed": args.seed, "temperature": args.temperature, "engine_args": _jsonable(self.engine_kwargs),
            "argv": sys.argv[1:], **extra,
        }
        return build_report(records, slo=self.slo, meta=meta)

    def _run_http(self, specs: Iterator[RequestSpec], closed: bool, on_done: Any) -> list[RequestRecord]:
        from pacer.workload.client import OpenAIClient
        from pacer.workload.runner import run_http

        extra = json.loads(self.args.extra_body) if self.args.extra_body else None

        async def go() -> list[RequestRecord]:
            async with OpenAIClient(self.args.base_url, model=self.model_name, endpoint=self.args.endpoint,
                                    temperature=self.args.temperature, timeout=self.args.request_timeout,
                                    api_key=self.args.api_key, extra_body=extra) as client:
                records, _ = await run_http(specs, client, concurrency=self.args.concurrency, closed_loop=closed,
                                            duration=self.args.duration, on_done=on_done)
                return records

        return asyncio.run(go())

    def _progress(self, total: int | None) -> Any:
        return _ProgressContext(None if self.args.no_progress else self.console, total)


class _ProgressContext:
    """A rich progress bar counting finished requests (errors shown apart); a no-op without a console."""

    def __init__(self, console: Console | None, total: int | None) -> None:
        self.progress = None if console is None else Progress(
            TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[errors]}"),
            TimeElapsedColumn(), console=console, transient=True)
        self.total = total
        self.errors = 0

    def __enter__(self) -> Any:
        if self.progress is None:
            return None
        self.progress.start()
        task = self.progress.add_task("requests", total=self.total, errors="")
        progress = self.progress

        def on_done(rec: RequestRecord) -> None:
            if not rec.ok:
                self.errors += 1
            progress.update(task, advance=1, errors=f"[red]{self.errors} failed" if self.errors else "")

        return on_done

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()


def _class_meta(c: Any) -> dict[str, Any]:
    out: dict[str, Any] = _jsonable(dataclasses.asdict(c))
    return out


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _load_tokenizer(path: str | None, console: Console) -> TokenizerLike | None:
    """The tokenizer prompts are cut with: `path` if it is a local model, else pacer's default model."""
    from pacer.model.loader import default_model_path

    try:
        source = path if path is not None and Path(path).exists() else default_model_path()
        if path is not None and not Path(path).exists():
            console.print(f"[yellow]--model {path!r} is not a local path; cutting prompts with pacer's default "
                          "model tokenizer (pass --tokenizer for exact lengths)[/yellow]")
        return _tokenizer_at(str(Path(source).resolve()))
    except (FileNotFoundError, ValueError, OSError) as e:
        console.print(f"[yellow]no tokenizer ({e}); prompt lengths are approximate (one word per token)[/yellow]")
        return None


@functools.lru_cache(maxsize=4)
def _tokenizer_at(path: str) -> TokenizerLike | None:
    """Loaded once per process (a sweep, or several runs in one test session)."""
    from pacer.model.tokenizer import Tokenizer

    return Tokenizer.load(path)



def _agent_loop(args: argparse.Namespace, mode: str, console: Console) -> int:
    """`--workload agent-loop`: closed-loop agents (`--concurrency` of them) over growing histories,
    in process or against `--base-url` (its completions endpoint, sessions in `x-session-id`);
    prints job completion time, follow-up TTFT, cached share and the retention counters."""
    from pacer.workload.agents import loop_from_args, result_lines, run_agent_loop

    loop = loop_from_args(args)
    if mode == "inprocess":
        from pacer.engine import Engine

        result = run_agent_loop(Engine.from_kwargs(**engine_kwargs_from_args(args)), loop,
                                sessions=not args.no_agent_sessions)
        target = "inprocess"
    else:
        from pacer.workload.agents_http import run_agent_loop_http
        from pacer.workload.client import OpenAIClient
        from pacer.workload.text import TextSource

        text = TextSource(_load_tokenizer(args.tokenizer or args.model, console))

        async def go() -> Any:
            async with OpenAIClient(args.base_url, model=args.model, endpoint="completions",
                                    temperature=args.temperature, timeout=args.request_timeout,
                                    api_key=args.api_key) as client:
                await client.resolve_model()
                return await run_agent_loop_http(client, loop, text, sessions=not args.no_agent_sessions)

        result = asyncio.run(go())
        target = args.base_url
    lines = result_lines(loop, result)
    console.print(f"pacer bench: agent loop against {target}" + (" (no sessions named)" if args.no_agent_sessions
                                                                   else ""))
    for line in lines:
        console.print(line, highlight=False)
    if args.out:
        Path(args.out).write_text(json.dumps({"workload": AGENT_LOOP, "target": target, "loop": dataclasses.asdict(loop),
                                              "result": result.row(), "retention": result.retention,
                                              "lines": lines}, indent=2, default=str))
        console.print(f"[dim]wrote {args.out}[/dim]")
    return 0
