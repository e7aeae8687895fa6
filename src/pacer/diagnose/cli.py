"""`pacer diagnose SOURCE... | --metrics-url URL`: classify the traffic, decompose its latency,
name the bottleneck per class, recommend the next experiment (and `--what-if` it)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pacer.config.args import add_engine_args, engine_kwargs_from_args
from pacer.config.slo import ClassRules

__all__ = ["add_args", "run", "load_sources", "today_kwargs", "SIM_SKIP"]

# engine options that do not describe scheduling or KV (dropped before simulating)
SIM_SKIP = ("model", "device", "num_threads", "attention_backend", "linear_backend", "quant_activations", "seed")


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Read request logs, bench/sim runs, CSV/JSONL tables or a live /metrics endpoint; "
                     "decompose latency into queue / prefill / decode / preemption, name the bottleneck "
                     "per class and recommend the next experiment.")
    p.add_argument("sources", nargs="*", help="request log (.jsonl), pacer bench/sim run (.json), or a table "
                                              "(.csv/.jsonl: input_tokens, output_tokens, ttft, total_latency, feature)")
    s = p.add_argument_group("sources")
    s.add_argument("--metrics-url", default=None, help="a live pacer or vLLM Prometheus endpoint (…/metrics)")
    s.add_argument("--window", default="60s", help="with --metrics-url: the measurement window (default 60s)")
    s.add_argument("--time-unit", default="s", help="unit of table time columns without a suffix: s | ms | us")
    s.add_argument("--long-context-threshold", type=int, default=ClassRules().rag_min_tokens,
                   help="classify unlabelled rows: prompt tokens above this are rag (long context; as pacer serve)")
    s.add_argument("--batch-max-tokens", type=int, default=ClassRules().batch_max_tokens,
                   help="classify unlabelled rows: max_tokens at or above this are batch (as pacer serve)")
    a = p.add_argument_group("analysis")
    a.add_argument("--slo", action="append", default=[],
                   help="targets, e.g. ttft=2s,tpot=100ms or per class rag:ttft=5s (repeatable)")
    a.add_argument("--target-attainment", type=float, default=0.9,
                   help="a class misses an SLO metric when more than 1 - this share of its requests miss it")
    a.add_argument("--hardware", default="cpu-local", help="the source's hardware (baseline and --what-if)")
    a.add_argument("--tp", type=int, default=1, help="tensor-parallel devices of --hardware")
    a.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of device memory for weights + KV (GPU profiles)")
    a.add_argument("--what-if", action="store_true", help="replay the source through pacer sim with today's and "
                                                          "the recommended settings")
    a.add_argument("--seed", type=int, default=0, help="seed of the --what-if replay (arrivals and prompt text)")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    o.add_argument("--plots", default=None, metavar="DIR", help="write breakdown, TTFT-vs-prompt and ITL plots")
    add_engine_args(p, skip=("seed",))
    p.epilog = "engine flags describe today's settings (a run file's own engine_args are used when present)"


def load_sources(paths: list[str], time_unit: str = "s", rules: Any = None) -> Any:
    from pacer.diagnose.records import merge
    from pacer.diagnose.sources import load_source

    return merge([load_source(path, time_unit=time_unit, rules=rules) for path in paths])


def today_kwargs(source_args: dict[str, Any], cli_args: dict[str, Any]) -> dict[str, Any]:
    """Today's engine settings for the simulator: the source's, overridden by explicit flags."""
    from pacer.config import option_names

    known = set(option_names())
    merged = {k: v for k, v in {**source_args, **cli_args}.items() if k in known and v is not None}
    return {k: v for k, v in merged.items() if k not in SIM_SKIP}


def _describe(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(kwargs.items())) or "pacer's defaults"


def _analyze(args: argparse.Namespace, slo: Any, base: Any) -> tuple[dict[str, Any], Any, str, list[str],
                                                                   dict[str, Any]]:
    """(class reports, source or None for a metrics endpoint, description, notes, the source's settings)."""
    from pacer.diagnose.analysis import analyze

    if args.metrics_url:
        from pacer.diagnose.prometheus import analyze_metrics, collect, parse_window

        window = parse_window(args.window)
        before, after = collect(args.metrics_url, window)
        args._window_s = window
        reports, description = analyze_metrics(before, after, window, base, slo, args.target_attainment)
        return reports, None, description, [], {}
    rules = ClassRules(args.long_context_threshold, args.batch_max_tokens)
    source = load_sources(args.sources, args.time_unit, rules)
    from pacer.config import EngineConfig

    seqs = EngineConfig.from_kwargs(**today_kwargs(source.engine_args, engine_kwargs_from_args(args))).scheduler.max_num_seqs
    reports = analyze(source, base, slo, args.target_attainment, max_num_seqs=seqs)
    description = f"{source.name} ({len(source.records)} requests" + (
        f", {source.num_skipped} unfinished or failed left out)" if source.num_skipped else ")")
    notes = list(source.notes)
    if not source.has_queue_wait:
        notes.append("the source has no queue wait: prefill is all of TTFT")
    return reports, source, description, notes, source.engine_args


def run(args: argparse.Namespace) -> int:
    from pacer.diagnose.analysis import OVERALL
    from pacer.diagnose.baseline import Baseline
    from pacer.diagnose.recommend import Settings, recommend
    from pacer.diagnose.render import print_report, to_json
    from pacer.diagnose.replay import SimTarget
    from pacer.workload.report import parse_slo

    if bool(args.sources) == bool(args.metrics_url):
        raise ValueError("give SOURCE files or --metrics-url (one of them)")
    if not 0 < args.target_attainment <= 1:
        raise ValueError(f"--target-attainment must be in (0, 1], got {args.target_attainment}")
    slo = parse_slo(args.slo)
    base = Baseline(args.hardware, args.model if _is_profile(args.model) else None, args.tp)
    reports, source, description, notes, engine_args = _analyze(args, slo, base)
    today = today_kwargs(engine_args, engine_kwargs_from_args(args))
    target = SimTarget(args.hardware, args.model if _is_profile(args.model) else None, args.tp,
                       args.gpu_memory_utilization)
    settings = Settings.from_kwargs(today, target.kv_tokens(today), target.max_model_len(today), target.hw.is_cpu)
    ttft_target = slo.default.ttft
    for name, rep in reports.items():
        records = source.records if source is not None and name == OVERALL else (
            source.of_class(name) if source is not None else [])
        rep.recommendations = recommend(rep, records, settings, slo.for_class(name).ttft or ttft_target)
    what = None
    if args.what_if:
        if source is None:
            from pacer.diagnose.prometheus import synthetic_source

            source_for_replay = synthetic_source(reports, args._window_s, args.seed)
        else:
            source_for_replay = source
        from pacer.diagnose.whatif import what_if

        what = what_if(source_for_replay, reports, today, target, slo, args.seed)
    if args.json:
        print(json.dumps(to_json(source, description, reports, notes, base.description, today, what), indent=1,
                         default=str))
    else:
        print_report(description, reports, notes, base.description, _describe(today), what)
    if args.plots:
        from pacer.diagnose.plots import plot_diagnosis

        for path in plot_diagnosis(reports, source, args.plots):
            if not args.json:
                print(f"plot saved to {path}")
    return 0


def _is_profile(model: str | None) -> bool:
    """Whether --model names a simulator profile (a built-in name or an HF config), not a .gguf file."""
    return model is not None and not str(model).endswith(".gguf")

