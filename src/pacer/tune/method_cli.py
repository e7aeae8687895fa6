"""`pacer tune` (the method): flags -> SLA and trace -> `run_method` -> `--verify`."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from pacer.config.args import engine_kwargs_from_args
from pacer.workload.spec import RequestSpec

__all__ = ["run_method_cli"]


def _specs(args: argparse.Namespace, max_model_len: int, tokenizer: Any) -> tuple[list[RequestSpec], str]:
    if args.from_log:
        from pacer.diagnose.cli import load_sources
        from pacer.diagnose.replay import specs_from_source

        source = load_sources(args.from_log)
        specs, how = specs_from_source(source, tokenizer=tokenizer, seed=args.seed, max_model_len=max_model_len)
        if args.num_prompts is not None:
            specs = specs[: args.num_prompts]
        return specs, f"{source.name}, {how}"
    from pacer.sim.cli import build_specs, parse_rates

    rates = parse_rates(args.request_rate, args.concurrency)
    if len(rates) != 1 or args.concurrency is not None:
        raise ValueError("pacer tune runs one open-loop --request-rate")
    specs, workload, arrivals = build_specs(args, rates[0], max_model_len, tokenizer=tokenizer)
    return specs, f"{workload}, {arrivals}"


def _print_traffic(specs: Sequence[RequestSpec], where: str) -> None:
    from pacer.tune.method import length_cv

    pm, pcv = length_cv([s.prompt_tokens for s in specs])
    om, ocv = length_cv([s.output_tokens for s in specs])
    print(f"(2) traffic: {len(specs)} requests ({where}); prompt mean {pm:.0f} tokens, CV {pcv:.2f}; "
          f"output mean {om:.0f}, CV {ocv:.2f}")
    by: dict[str, list[RequestSpec]] = {}
    for s in specs:
        by.setdefault(s.request_class, []).append(s)
    for name, ss in by.items():
        cm, ccv = length_cv([s.prompt_tokens for s in ss])
        print(f"    {name}: {len(ss)} requests, prompt mean {cm:.0f} (CV {ccv:.2f}), output mean "
              f"{length_cv([s.output_tokens for s in ss])[0]:.0f}")
    if max(pcv, ocv) >= 1.0:
        print("    CV >= 1 (mixed traffic): long requests hold KV unevenly, so TPOT p99 turns up at a lower "
              "max_num_seqs than for uniform traffic; expect a lower knee")


def run_method_cli(args: argparse.Namespace, seqs: list[int] | None = None, budgets: list[int] | None = None) -> int:
    """The method from parsed args; `seqs` / `budgets`: the sweep lists given (None: the defaults)."""
    from pacer.diagnose.cli import SIM_SKIP
    from pacer.diagnose.replay import SimTarget
    from pacer.tune.method import DEFAULT_BUDGETS, DEFAULT_SEQS, run_method
    from pacer.workload.report import parse_slo

    slo = parse_slo(args.slo)
    if slo.is_empty():
        raise ValueError("pacer tune needs an SLO (the SLA the method starts from), e.g. --slo ttft=2s,tpot=100ms")
    if not 0 < args.target_attainment <= 1:
        raise ValueError(f"--target-attainment must be in (0, 1], got {args.target_attainment}")
    targets = ", ".join(f"{k}<={v * 1000:g} ms" for k, v in slo.default.as_dict().items() if v is not None)
    per_class = "; ".join(f"{c}: " + ", ".join(f"{k}<={v * 1000:g} ms" for k, v in s.as_dict().items() if v)
                          for c, s in slo.per_class.items())
    print(f"(1) SLA: {targets or '-'}{'; ' + per_class if per_class else ''}; a configuration meets it when "
          f">= {args.target_attainment:.0%} of requests meet every target of their class")
    print(f"    load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    real_kwargs = {k: v for k, v in engine_kwargs_from_args(args).items()
                   if k not in ("max_num_seqs", "max_num_batched_tokens")}   # the swept lists
    sim_kwargs = {k: v for k, v in real_kwargs.items() if k not in SIM_SKIP}
    model = args.model if args.model and not str(args.model).endswith(".gguf") else None
    target = SimTarget(args.hardware, model, args.tp, args.gpu_memory_utilization)
    first_engine = None
    tokenizer = None
    if args.verify and not args.base_url:
        from pacer.tune.verify import _engine

        first_engine = _engine(real_kwargs)   # the defaults' engine: also the trace's tokenizer
        tokenizer = first_engine.tokenizer
    specs, where = _specs(args, target.max_model_len(sim_kwargs), tokenizer)
    if not specs:
        raise ValueError("no requests in the trace")
    _print_traffic(specs, where)
    kv = target.kv_tokens(sim_kwargs)
    print(f"    KV budget: {kv} tokens ({target.model.name} on {target.hw.name})")
    defaults_real = None
    if first_engine is not None:
        from pacer.tune.verify import measure_defaults, refit_target

        defaults_real, recorder = measure_defaults(first_engine, specs, slo)
        if args.refit and target.hw.is_cpu:
            refit_target(target, recorder, sim_kwargs)
    seqs = seqs or list(DEFAULT_SEQS)
    budgets = budgets or list(DEFAULT_BUDGETS)
    result = run_method(target, sim_kwargs, specs, slo, args.target_attainment, seqs, budgets)
    d, c = result.defaults, result.chosen
    print(f"chosen: {c.label} (predicted SLO met {c.attainment:.0%}; out-of-the-box defaults "
          f"{d.attainment:.0%})")
    if result.runner_up is not None:
        print(f"runner-up: {result.runner_up.label} (predicted {result.runner_up.attainment:.0%})")
    if c.attainment < args.target_attainment:
        print(why_no_configuration(c, slo, args.target_attainment))
    if not args.verify:
        return 0 if c.attainment >= args.target_attainment else 1
    return _verify(args, result, real_kwargs, specs, slo, defaults_real)


def _verify(args: argparse.Namespace, result: Any, real_kwargs: dict[str, Any], specs: Sequence[RequestSpec],
            slo: Any, defaults_real: Any) -> int:
    from pacer.tune.verify import print_verification, verify_inprocess, verify_server

    if args.base_url:
        rows = verify_server(result, args.base_url, specs, slo)
    else:
        rows = verify_inprocess(result, real_kwargs, specs, slo, defaults=defaults_real)
    ok = print_verification(rows, args.target_attainment)
    defaults_met = next((r.attainment for n, _, r in rows if n == "defaults"), None)
    print(f"    load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if ok:
        tail = "" if defaults_met is None else (
            f"; the defaults {'also meet it' if defaults_met >= args.target_attainment else 'do not'}"
            f" ({defaults_met:.0%})")
        print(f"the chosen configuration meets the SLA on the real engine{tail}")
    else:
        print("the chosen configuration misses the SLA on the real engine: see the measured columns")
    return 0 if ok else 1


def why_no_configuration(best: Any, slo: Any, target: float) -> str:
    """The numbers behind "no configuration in the sweep meets the SLA": the best point's p99
    against each target it has (overall; per-class targets are in the tables above)."""
    from pacer.diagnose.replay import fmt_ms

    missed = []
    for key, limit in slo.default.as_dict().items():
        p99 = best.summary.get(f"{key}_p99")
        if limit is not None and p99 is not None and p99 > limit:
            missed.append(f"{key} p99 {fmt_ms(p99)} vs target {fmt_ms(limit)}")
    detail = "; ".join(missed) or "the misses are in a class's own targets (see its rows)"
    return (f"no configuration in the sweep meets the SLA: the best ({best.label or 'pacer defaults'}) is "
            f"predicted to meet it for {best.attainment:.0%} of requests (< {target:.0%}): {detail}. "
            "On this hardware, for this traffic, relax the SLA, add replicas, or shorten the requests.")

