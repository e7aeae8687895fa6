"""`pacer sim [run|calibrate|validate]`: the simulator's command line.

`run` (the default) takes `pacer bench`'s workload and arrival flags and `pacer serve`'s engine
flags, simulates the trace on `--hardware` x `--tp` with `--model`, and prints and saves
(`--out`) the same report as `pacer bench`, so `pacer bench compare` works across the two.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from pacer.config.args import add_engine_args, engine_kwargs_from_args
from pacer.workload.options import DEFAULT_NUM_PROMPTS

__all__ = ["add_args", "run", "add_workload_args", "build_specs"]

MODES = ("run", "calibrate", "validate")
DEFAULT_VALIDATE_PROMPTS = 24


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The workload, arrival and report flags of `pacer bench` (the same definition)."""
    from pacer.workload.options import add_workload_args as add_bench_workload_args

    add_bench_workload_args(p, num_prompts_help=(f"requests to send (default {DEFAULT_NUM_PROMPTS}; "
                                                 f"validate: {DEFAULT_VALIDATE_PROMPTS})"))


def parse_rates(text: str | None, concurrency: int | None) -> list[float | None]:
    """`--request-rate` as a list; None means closed loop (only with --concurrency), else inf."""
    from pacer.workload.options import parse_rates as parse_bench_rates

    return [math.inf if r is None and concurrency is None else r for r in parse_bench_rates(text)]


def build_specs(args: argparse.Namespace, rate: float | None, max_model_len: int, tokenizer: Any = None,
                default_num: int = 0) -> tuple[list[Any], str, str]:
    """(request specs, workload name, arrivals description) from the workload and arrival flags."""
    from pacer.workload.arrivals import ClosedLoop, make_arrivals
    from pacer.workload.generator import generate_requests
    from pacer.workload.options import workload_from_args
    from pacer.workload.trace import load_trace

    num = args.num_prompts
    if num is None and args.duration is None:
        num = default_num or DEFAULT_NUM_PROMPTS
    if args.trace:
        specs = load_trace(args.trace, tokenizer=tokenizer, seed=args.seed)
        if num is not None:
            specs = specs[:num]
        if args.concurrency is not None and args.request_rate is None:
            return [s.with_arrival(None) for s in specs], f"trace:{args.trace}", ClosedLoop(args.concurrency).describe()
        return specs, f"trace:{args.trace}", "at the trace's timestamps"
    wl = workload_from_args(args)
    arrivals = make_arrivals(rate, args.burstiness, args.concurrency)
    specs = generate_requests(wl, arrivals, seed=args.seed, num_requests=num, duration=args.duration,
                              tokenizer=tokenizer, max_model_len=max_model_len)
    return specs, wl.name, arrivals.describe()


def _meta(args: argparse.Namespace, kwargs: dict[str, Any], workload: str, arrivals: str, rate: float | None,
          n: int) -> dict[str, Any]:
    """Keys of `pacer bench`'s meta, plus what was simulated."""
    from pacer.workload.drive import ARRIVAL_NOTE

    return {"target": "sim", "engine": "sim", "model": args.model, "workload": workload, "arrivals": arrivals,
            "request_rate": rate if rate is None or math.isfinite(rate) else "inf", "burstiness": args.burstiness, "concurrency": args.concurrency,
            "num_prompts": n, "duration": args.duration, "seed": args.seed,
            "engine_args": json.loads(json.dumps(kwargs, default=str)), "argv": sys.argv[1:],
            "hardware": args.hardware, "tp": args.tp, "arrival": ARRIVAL_NOTE}


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
    g.add_argument("--step-noise", type=float, default=0.0, metavar="CV",
                   help="slow each simulated step by a log-normal factor of mean 1 and this coefficient "
                        "of variation, correlated in time as a shared machine's slowdowns are (0: exact; the AVX2 "
                        "machine's decode steps: ~0.14); the scheduler's predictor then refits online, as the real "
                        "engine's does")
    g.add_argument("--chrome-trace", default=None, help="write the simulated steps as a Chrome trace JSON")
    g.add_argument("--calibration-out", default=None,
                   help="calibrate: where to save the fit (default ~/.cache/pacer/sim/cpu-local.json)")
    g.add_argument("--quick", action="store_true", help="calibrate: a smaller grid")
    g.add_argument("--real-out", default=None, help="validate: save the real engine's run.json")
    g.add_argument("--sim-out", default=None, help="validate: save the simulator's run.json")
    g.add_argument("--steps-out", default=None,
                   help="validate: save every real step (kind, batch features, measured and predicted time, budget "
                        "and reason) as JSON lines")
    g.add_argument("--strict", action="store_true", help="validate: exit 1 when a metric misses its target")
    add_workload_args(p)
    add_engine_args(p, skip=("seed",))
    from pacer.deploy.options import add_router_args

    add_router_args(p)


def _print_report(report: Any, title: str) -> None:
    from rich.console import Console

    from pacer.workload.tables import report_table

    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 140))   # full tables in logs and pipes
    console.print(report_table(report, title=title))


def _run_sim(args: argparse.Namespace) -> int:
    from pacer.config import EngineConfig
    from pacer.perf.profiles import get_hardware, get_model
    from pacer.sim.noise import StepNoise
    from pacer.sim.simulator import build_sim_engine, simulate, utilisation_summary
    from pacer.workload.budget import BudgetTally
    from pacer.workload.report import OVERALL, build_report, parse_slo

    hw, model = get_hardware(args.hardware), get_model(args.model)
    kwargs = engine_kwargs_from_args(args)
    config = EngineConfig.from_kwargs(**kwargs)
    slo = parse_slo(args.slo)
    noise = StepNoise(args.step_noise, seed=args.seed or 0)   # checked before any run
    if args.workload == "agent-loop":   # closed-loop agents: job completion time is the result
        return _run_agent_loop(args, config, hw, model, noise)
    rates = parse_rates(args.request_rate, args.concurrency)
    if args.replicas != 1 or args.router != "least-loaded":
        if noise.cv:
            raise ValueError("--step-noise: the simulated cluster (--replicas, --router) runs exact steps only")
        from pacer.sim.cluster import run_cluster_cli

        return run_cluster_cli(args, config, hw, model, rates, slo, lambda rate, n: build_specs(args, rate, n),
                               lambda r, t: _print_report(r, t), lambda *a: _meta(args, kwargs, *a))
    for rate in rates:
        engine, executor, clock = build_sim_engine(config, hw, model, tp=args.tp,
                                                   gpu_memory_utilization=args.gpu_memory_utilization,
                                                   step_noise=StepNoise(noise.cv, seed=args.seed or 0))
        specs, workload, arrivals = build_specs(args, rate, engine.max_model_len)
        result = simulate(engine, executor, clock, specs, concurrency=args.concurrency)
        meta = _meta(args, kwargs, workload, arrivals, rate, len(specs))
        meta.update({"model": model.name, "cost_model": result.cost_model, "sim": result.stats(),
                     "step_noise": noise.cv,
                     "budget": BudgetTally().extend(result.steps).as_dict(),
                     "tenant_weights": dict(config.scheduler.fair_tenant_weights or {})})
        snap = engine.snapshot()
        if snap.spec_decode is not None:
            meta["spec_decode"] = dict(snap.spec_decode)
        if snap.segments:
            meta["segments"] = dict(snap.segments)
        report = build_report(result.records, slo=slo, meta=meta)
        _print_report(report, f"pacer sim: {model.name} on {hw.name} x{args.tp}, {workload}, {arrivals}")
        print(f"simulated {result.sim_duration_s:.1f} s in {result.wall_s:.2f} s wall: "
              f"{result.speedup:.1f} simulated s per wall s ({result.num_steps} steps, "
              f"{result.num_steps / max(result.wall_s, 1e-9):.0f} steps/s, {result.num_preemptions} preemptions, "
              f"{result.num_kv_blocks} KV blocks, {result.cost_model})")
        for line in utilisation_summary(result.steps, executor.costs):
            print(line)
        if snap.segments:
            seg = snap.segments
            print(f"segment reuse: {seg['reuses']} fills, {seg['reused_tokens']} prompt tokens reused, "
                  f"{seg['recomputed_tokens']} recomputed; {seg['stored']} segments stored, {seg['evicted']} evicted"
                  + (f" ({seg['demoted']} to the host tier, {seg['promoted']} promoted back)" if seg['demoted'] else ""))
        if len(rates) > 1:
            s = report.summary[OVERALL]
            print(f"rate {rate:g}: {s['output_tok_s']:.1f} out tok/s, ttft p99 {_ms(s['ttft_p99'])}, "
                  f"tpot p99 {_ms(s['tpot_p99'])}, goodput {s['goodput_req_s']:.2f} req/s")
        _save(args, "" if len(rates) == 1 else f".rate-{'closed' if rate is None else format(rate, 'g')}",
              report, result)
    return 0


def _run_agent_loop(args: argparse.Namespace, config: Any, hw: Any, model: Any, noise: Any) -> int:
    """`--workload agent-loop`: closed-loop agents on one simulated engine; prints their report."""
    from pacer.sim.simulator import build_sim_engine
    from pacer.workload.agents import loop_from_args, result_lines, run_agent_loop

    engine, _, _ = build_sim_engine(config, hw, model, tp=args.tp, gpu_memory_utilization=args.gpu_memory_utilization,
                                    step_noise=noise)
    loop = loop_from_args(args)
    print(f"pacer sim: {model.name} on {hw.name} x{args.tp}, {engine.snapshot().num_blocks} KV blocks")
    sessions = config.cache.session_retention and not args.no_agent_sessions
    for line in result_lines(loop, run_agent_loop(engine, loop, sessions=sessions)):
        print(line)
    return 0


def _save(args: argparse.Namespace, suffix: str, report: Any, result: Any) -> None:
    """The report (`--out`) and the Chrome trace (`--chrome-trace`) of one rate, named by `suffix`."""
    from pacer.sim.simulator import write_chrome_trace

    if args.out:
        path = Path(args.out)
        path = path.with_name(path.stem + suffix + (path.suffix or ".json"))
        report.save(path)
        print(f"report saved to {path}")
    if args.chrome_trace:
        path = Path(args.chrome_trace)
        path = path.with_name(path.stem + suffix + (path.suffix or ".json"))
        write_chrome_trace(result, path)
        print(f"chrome trace saved to {path}")


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _run_calibrate(args: argparse.Namespace) -> int:
    from pacer.perf.profiles import (
        TRUSTED_FIT_ERROR,
        TRUSTED_FIT_P90_ERROR,
        calibration_path,
        fit_is_trusted,
        get_model,
    )
    from pacer.sim.calibrate import calibrate

    out = Path(args.calibration_out) if args.calibration_out else calibration_path()
    kwargs = engine_kwargs_from_args(args)
    calib = calibrate(kwargs, get_model(args.model), quick=args.quick, out_path=out)
    fit, eng = calib["fit"], calib["engine_fit"]
    print(f"fit on {fit['samples']} executor samples: median error {fit['median_rel_err'] * 100:.1f}%, "
          f"p90 {fit['p90_rel_err'] * 100:.1f}%; engine steps: median {eng['median_rel_err'] * 100:.1f}%")
    print("coefficients: " + json.dumps({k: float(f"{v:.4g}") for k, v in calib["coefficients"].items()}))
    print(f"calibration saved to {out}")
    if not fit_is_trusted(calib):
        a, b, c = os.getloadavg()
        print(f"warning: the fit is noisy (engine steps' median error {eng['median_rel_err'] * 100:.0f}%, limit "
              f"{TRUSTED_FIT_ERROR * 100:.0f}%; executor p90 {fit['p90_rel_err'] * 100:.0f}%, limit "
              f"{TRUSTED_FIT_P90_ERROR * 100:.0f}%; load average {a:.1f}/{b:.1f}/{c:.1f}): the slo policy will not plan "
              f"with it (it scales pacer's shipped fit at start-up instead); calibrate again on a quiet machine")
    return 0


def _run_validate(args: argparse.Namespace) -> int:
    from pacer.engine import Engine
    from pacer.sim.validate import StepRecorder
    from pacer.workload.runner import run_inprocess

    kwargs = engine_kwargs_from_args(args)
    real_engine = Engine.from_kwargs(**kwargs)
    rates = parse_rates(args.request_rate, args.concurrency)
    if len(rates) != 1:
        raise ValueError("validate runs one rate; give a single --request-rate")
    specs, workload, arrivals = build_specs(args, rates[0], real_engine.max_model_len,
                                            tokenizer=real_engine.tokenizer, default_num=DEFAULT_VALIDATE_PROMPTS)
    _warm_up(real_engine)
    recorder = StepRecorder()   # observes only: features and StepStats of every real step
    real_engine.schedule_listeners.append(recorder.on_schedule)
    real_engine.stats_listeners.append(recorder.on_stats)
    print(f"validate: {len(specs)} requests of {workload!r}, {arrivals}, through the real engine ...", flush=True)
    records, _, _ = run_inprocess(specs, real_engine, concurrency=args.concurrency, closed_loop=rates[0] is None)
    meta = _meta(args, kwargs, workload, arrivals, rates[0], len(specs))
    return _compare_with_sim(args, kwargs, specs, records, recorder, real_engine.max_model_len, meta)


def _compare_with_sim(args: argparse.Namespace, kwargs: dict[str, Any], specs: list[Any], records: list[Any],
                      recorder: Any, max_model_len: int, meta: dict[str, Any]) -> int:
    """Simulate the real run's trace with the saved calibration and with step times refitted on
    the run itself; print each metric's error for both."""
    import dataclasses

    from pacer.config import EngineConfig
    from pacer.perf.cost_model import LinearCostModel
    from pacer.perf.profiles import get_hardware, get_model
    from pacer.sim.simulator import build_sim_engine, resolve_dtype, simulate
    from pacer.sim.validate import compare_summaries, format_errors, refit_on_steps
    from pacer.workload.report import build_report

    real = build_report(records, meta={**meta, "target": "inprocess", "engine": "inprocess"})
    hw = get_hardware(args.hardware)
    model = dataclasses.replace(get_model(args.model), max_model_len=max_model_len)
    config = EngineConfig.from_kwargs(**kwargs)
    dtype = resolve_dtype(config.model.dtype, hw)
    engine, executor, clock = build_sim_engine(config, hw, model)
    result = simulate(engine, executor, clock, specs, concurrency=args.concurrency)
    sim = build_report(result.records, meta={**meta, "cost_model": result.cost_model})
    errors = compare_summaries(real.summary["overall"], sim.summary["overall"])
    print(f"real engine vs simulator ({result.cost_model}), same {len(specs)}-request trace:")
    for line in format_errors(errors):
        print("  " + line)
    print("step times, real engine vs cost model on the real engine's own steps:")
    for line in recorder.step_errors(executor.cost_model):
        print("  " + line)
    if args.steps_out:
        rows = recorder.step_rows(executor.cost_model)
        Path(args.steps_out).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"  {len(rows)} steps saved to {args.steps_out}")
    # step times fitted on this run: separates the event loop and scheduler's fidelity from how
    # well the saved calibration matches the machine's load now
    coef, fit = refit_on_steps(recorder, model, hw, dtype)
    engine2, executor2, clock2 = build_sim_engine(config, hw, model, cost_model=LinearCostModel(hw, model, dtype, coef))
    insitu = build_report(simulate(engine2, executor2, clock2, specs, concurrency=args.concurrency).records)
    errors2 = compare_summaries(real.summary["overall"], insitu.summary["overall"])
    print(f"with step times refitted on this run's {fit.n} steps (median fit error {fit.median_rel_err * 100:.1f}%):")
    for line in format_errors(errors2):
        print("  " + line)
    for path, rep in ((args.real_out, real), (args.sim_out, sim)):
        if path:
            rep.save(path)
    if args.out:
        Path(args.out).write_text(json.dumps({"errors": [e.as_dict() for e in errors],
                                              "errors_refit": [e.as_dict() for e in errors2],
                                              "refit_coefficients": coef, "meta": meta}, indent=1))
    return 1 if args.strict and not all(e.ok for e in errors) else 0


def _warm_up(engine: Any) -> None:
    """One short request first, so one-time costs (kernel loads, allocator growth) stay out of the trace."""
    from pacer.request import SamplingParams

    vocab = engine.vocab_size or 1000
    engine.add_request([vocab - 1 - i for i in range(48)], SamplingParams(max_tokens=8, ignore_eos=True,
                                                                          temperature=0.0))
    engine.run_until_done()
    engine.step_stats.clear()


def run(args: argparse.Namespace) -> int:
    if args.tp < 1:
        raise ValueError(f"--tp must be >= 1, got {args.tp}")
    handlers = {"run": _run_sim, "calibrate": _run_calibrate, "validate": _run_validate}
    return handlers[args.mode](args)

