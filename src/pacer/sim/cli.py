"""`pacer sim [run|calibrate|validate]`: the simulator's command line.

`run` (the default) takes `pacer bench`'s workload and arrival flags and `pacer serve`'s engine
flags, simulates the trace on `--hardware` x `--tp` with `--model`, and prints and saves
(`--out`) the same report as `pacer bench`, so `pacer bench compare` works across the two.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from pacer.cli import COMMANDS
from pacer.engine_args import add_engine_args, engine_kwargs_from_args

__all__ = ["add_args", "run", "add_workload_args", "build_specs"]

MODES = ("run", "calibrate", "validate")


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The workload and arrival flags of `pacer bench`."""
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default="mixed",
                   help="chat | rag | agent | batch | mixed | fixed, or a .yaml/.json workload spec")
    g.add_argument("--input-len", type=int, default=None, help="fixed workload: prompt tokens (default 1024)")
    g.add_argument("--output-len", type=int, default=None, help="fixed workload: output tokens (default 128)")
    g.add_argument("--input-cv", type=float, default=None, help="override every class's prompt-length CV")
    g.add_argument("--output-cv", type=float, default=None, help="override every class's output-length CV")
    g.add_argument("--num-prompts", type=int, default=None, help="requests to send (default 1000; validate: 24)")
    g.add_argument("--duration", type=float, default=None, help="stop sending after this many seconds")
    g.add_argument("--request-rate", type=float, default=None,
                   help="requests/s, Poisson (inf: all at once; the default without --concurrency)")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of gaps (1: Poisson)")
    g.add_argument("--concurrency", type=int, default=None,
                   help="closed loop with this many clients; with --request-rate, a cap on requests in flight")
    g.add_argument("--seed", type=int, default=0, help="workload and arrival seed")
    g.add_argument("--slo", action="append", default=[], help="e.g. ttft=300ms,itl=50ms or rag:ttft=2s (repeatable)")
    g.add_argument("--out", default=None, help="save the run report (pacer bench's run.json schema)")


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Simulate pacer's scheduler on hardware you may not have (run), fit the cost model "
                     "to this machine (calibrate), or check the fit against the real engine (validate).")
    p.add_argument("mode", nargs="?", choices=MODES, default="run", help="run (default) | calibrate | validate")
    g = p.add_argument_group("simulated hardware")
    g.add_argument("--hardware", default="cpu-local",
                   help="a100-80g | h100-sxm | h200-sxm | b200 | cpu-local, or a profile .json")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel devices")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of device memory for weights + KV (GPU profiles)")
    g.add_argument("--chrome-trace", default=None, help="write the simulated steps as a Chrome trace JSON")
    g.add_argument("--calibration-out", default=None,
                   help="calibrate: where to save the fit (default ~/.cache/pacer/sim/cpu-local.json)")
    g.add_argument("--quick", action="store_true", help="calibrate: a smaller grid")
    g.add_argument("--real-out", default=None, help="validate: save the real engine's run.json")
    g.add_argument("--sim-out", default=None, help="validate: save the simulator's run.json")
    g.add_argument("--strict", action="store_true", help="validate: exit 1 when a metric misses its target")
    add_workload_args(p)
    add_engine_args(p, skip=("seed",))


def build_specs(args: argparse.Namespace, max_model_len: int, tokenizer: Any = None,
                default_num: int = 1000) -> tuple[list[Any], Any, Any]:
    """(request specs, workload, arrival process) from the workload flags."""
    from pacer.bench.arrivals import make_arrivals
    from pacer.bench.workloads import builtin_workload, generate_requests, load_workload

    if args.workload == "fixed":
        wl = builtin_workload("fixed", args.input_len, args.output_len)
    elif args.input_len is not None or args.output_len is not None:
        raise ValueError(f"--input-len/--output-len apply to the 'fixed' workload, not {args.workload!r}")
    else:
        wl = load_workload(args.workload)
    if args.input_cv is not None or args.output_cv is not None:
        wl = wl.with_lengths(prompt_cv=args.input_cv, output_cv=args.output_cv)
    rate = args.request_rate
    if rate is None and args.concurrency is None:
        rate = math.inf
    arrivals = make_arrivals(rate, args.burstiness, args.concurrency)
    num = args.num_prompts if args.num_prompts is not None else (None if args.duration else default_num)
    specs = generate_requests(wl, arrivals, seed=args.seed, num_requests=num, duration=args.duration,
                              tokenizer=tokenizer, max_model_len=max_model_len)
    return specs, wl, arrivals


def _meta(args: argparse.Namespace, kwargs: dict[str, Any], wl: Any, arrivals: Any, n: int) -> dict[str, Any]:
    return {"tool": "pacer sim", "workload": wl.name, "arrivals": arrivals.describe(), "seed": args.seed,
            "num_prompts": n, "engine": {k: v for k, v in kwargs.items() if k != "model"},
            "hardware": args.hardware, "tp": args.tp}


def _print_report(report: Any, title: str) -> None:
    from rich.console import Console

    from pacer.bench.tables import report_table

    Console().print(report_table(report, title=title))


def _run_sim(args: argparse.Namespace) -> int:
    from pacer.bench.report import build_report, parse_slo
    from pacer.config import EngineConfig
    from pacer.sim.profiles import get_hardware, get_model
    from pacer.sim.simulator import build_sim_engine, simulate, utilisation_summary, write_chrome_trace

    hw, model = get_hardware(args.hardware), get_model(args.model)
    kwargs = engine_kwargs_from_args(args)
    config = EngineConfig.from_kwargs(**kwargs)
    engine, executor, clock = build_sim_engine(config, hw, model, tp=args.tp,
                                               gpu_memory_utilization=args.gpu_memory_utilization,
                                               keep_records=True)
    specs, wl, arrivals = build_specs(args, engine.max_model_len)
    result = simulate(engine, executor, clock, specs,
                      concurrency=args.concurrency)
    meta = _meta(args, kwargs, wl, arrivals, len(specs))
    meta.update({"backend": "sim", "model": model.name, "cost_model": result.cost_model,
                 "kv_blocks": result.num_kv_blocks, "sim": result.stats()})
    report = build_report(result.records, slo=parse_slo(args.slo), meta=meta)
    _print_report(report, f"pacer sim: {model.name} on {hw.name} x{args.tp} ({result.cost_model})")
    print(f"simulated {result.sim_duration_s:.1f} s in {result.wall_s:.2f} s wall: "
          f"{result.speedup:.1f} simulated s per wall s ({result.num_steps} steps, "
          f"{result.num_steps / max(result.wall_s, 1e-9):.0f} steps/s, {result.num_preemptions} preemptions, "
          f"{result.num_kv_blocks} KV blocks)")
    for line in utilisation_summary(executor.records):
        print(line)
    if args.out:
        report.save(args.out)
        print(f"report saved to {args.out}")
    if args.chrome_trace:
        write_chrome_trace(result, args.chrome_trace)
        print(f"chrome trace saved to {args.chrome_trace}")
    return 0


def _run_calibrate(args: argparse.Namespace) -> int:
    from pacer.sim.calibrate import calibrate
    from pacer.sim.profiles import calibration_path, get_model

    out = Path(args.calibration_out) if args.calibration_out else calibration_path()
    kwargs = engine_kwargs_from_args(args)
    calib = calibrate(kwargs, get_model(args.model), quick=args.quick, out_path=out)
    fit, eng = calib["fit"], calib["engine_fit"]
    print(f"fit on {fit['samples']} executor samples: median error {fit['median_rel_err'] * 100:.1f}%, "
          f"p90 {fit['p90_rel_err'] * 100:.1f}%; engine steps: median {eng['median_rel_err'] * 100:.1f}%")
    print("coefficients: " + json.dumps({k: float(f"{v:.4g}") for k, v in calib["coefficients"].items()}))
    print(f"calibration saved to {out}")
    return 0


def _run_validate(args: argparse.Namespace) -> int:
    import dataclasses

    from pacer.bench.report import build_report
    from pacer.bench.runner import run_inprocess
    from pacer.config import EngineConfig
    from pacer.engine import Engine
    from pacer.sim.profiles import get_hardware, get_model
    from pacer.sim.simulator import build_sim_engine, simulate
    from pacer.sim.validate import compare_summaries, format_errors

    kwargs = engine_kwargs_from_args(args)
    real_engine = Engine.from_kwargs(**kwargs)
    specs, wl, arrivals = build_specs(args, real_engine.max_model_len, tokenizer=real_engine.tokenizer,
                                      default_num=24)
    closed = arrivals.is_closed_loop
    print(f"validate: {len(specs)} requests of {wl.name!r}, {arrivals.describe()}, through the real engine ...",
          flush=True)
    records, _, _ = run_inprocess(specs, real_engine, concurrency=args.concurrency, closed_loop=closed)
    meta = _meta(args, kwargs, wl, arrivals, len(specs))
    real = build_report(records, meta={**meta, "backend": "inprocess"})
    hw = get_hardware(args.hardware)
    model = dataclasses.replace(get_model(args.model), max_model_len=real_engine.max_model_len)
    engine, executor, clock = build_sim_engine(EngineConfig.from_kwargs(**kwargs), hw, model)
    result = simulate(engine, executor, clock, specs, concurrency=args.concurrency)
    sim = build_report(result.records, meta={**meta, "backend": "sim", "cost_model": result.cost_model})
    errors = compare_summaries(real.summary["overall"], sim.summary["overall"])
    print(f"real engine vs simulator ({result.cost_model}), same {len(specs)}-request trace:")
    for line in format_errors(errors):
        print("  " + line)
    for path, rep in ((args.real_out, real), (args.sim_out, sim)):
        if path:
            rep.save(path)
    if args.out:
        Path(args.out).write_text(json.dumps({"errors": [e.as_dict() for e in errors], "meta": meta}, indent=1))
    return 1 if args.strict and not all(e.ok for e in errors) else 0


def run(args: argparse.Namespace) -> int:
    if args.tp < 1:
        raise ValueError(f"--tp must be >= 1, got {args.tp}")
    handlers = {"run": _run_sim, "calibrate": _run_calibrate, "validate": _run_validate}
    return handlers[args.mode](args)


COMMANDS["sim"] = (add_args, run)
