"""The real-engine parts of benchmarks/slo_scheduling.py: targets scaled to this CPU, fcfs vs slo
interleaved on one seeded trace, the simulator's attainment for the same trace, and the
"one long prompt slows every chat" case."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
from typing import Any

from pacer.config.slo import parse_slo
from pacer.engine import Engine
from pacer.perf.step_model import CorrectedCostModel
from pacer.request import SamplingParams
from pacer.workload.arrivals import make_arrivals
from pacer.workload.generator import generate_requests
from pacer.workload.report import OVERALL, Report, build_report
from pacer.workload.runner import run_inprocess
from pacer.workload.spec import ClassSpec, LengthDist, RequestSpec, Workload
from slo_common import class_table, loadavg, sim_specs_report

# the mixed workload's classes at CPU scale (a 135M model on two shared cores)
CPU_MIXED = Workload("mixed-cpu", (
    ClassSpec("chat", LengthDist(64, 0.5), LengthDist(32, 0.4), weight=0.6, shared_prefix_len=32),
    ClassSpec("rag", LengthDist(700, 0.3, min=256), LengthDist(16, 0.3), weight=0.2, shared_prefix_len=16),
    ClassSpec("agent", LengthDist(64, 0.6), LengthDist(16, 0.4), weight=0.1, shared_prefix_len=256),
    ClassSpec("batch", LengthDist(128, 0.4), LengthDist(64, 0.3), weight=0.1, priority=1),
))


def _engine(args: argparse.Namespace, policy: str, slo: list[str]) -> Engine:
    eng = Engine.from_kwargs(scheduling_policy=policy, slo=tuple(slo), num_threads=args.num_threads,
                             max_model_len=args.max_model_len)
    for n in (700, 32, 32):   # warm-up: allocations, kernels, the cost model's first refits
        eng.add_request(list(range(1000, 1000 + n)), SamplingParams(max_tokens=8, ignore_eos=True))
    eng.run_until_done()
    return eng


def _median_spec(specs: list[RequestSpec], cls: str) -> RequestSpec:
    own = sorted((s for s in specs if s.request_class == cls), key=lambda s: s.prompt_tokens)
    return own[len(own) // 2]


def calibrate_targets(args: argparse.Namespace) -> tuple[list[str], Workload]:
    """TTFT = 3x unloaded TTFT of the class's median prompt; ITL = 2x the unloaded decode step
    at batch 8; batch e2e = 3x the unloaded e2e of its median request. One request at a time,
    on an slo engine, whose predictor (start-up calibration + the refits of these runs) the
    simulator then uses (`args.sim_cost_model`)."""
    eng = _engine(args, "slo", [])
    specs = generate_requests(CPU_MIXED, make_arrivals(1.0, 1.0, None), seed=args.seed, num_requests=200,
                              tokenizer=eng.tokenizer, max_model_len=eng.max_model_len)
    unloaded: dict[str, Any] = {}
    for cls in ("chat", "rag", "agent", "batch"):
        s = _median_spec(specs, cls)
        eng.add_request(list(s.prompt_token_ids), SamplingParams(max_tokens=s.output_tokens, ignore_eos=True))
        unloaded[cls] = eng.run_until_done()[0].metrics
    for i in range(8):
        eng.add_request(list(range(2000 + i, 2032 + i)), SamplingParams(max_tokens=40, ignore_eos=True))
    first = len(eng.step_stats)
    eng.run_until_done()
    decode = [s.total_s for s in list(eng.step_stats)[first:] if s.batch_size == 8 and not s.num_prefill_tokens]
    step8 = statistics.median(decode)
    ms = {c: m.ttft * 3000 for c, m in unloaded.items()}
    targets = [f"chat:ttft={ms['chat']:.0f}ms,itl={step8 * 2000:.0f}ms", f"rag:ttft={ms['rag']:.0f}ms",
               f"agent:ttft={ms['agent']:.0f}ms", f"batch:e2e={unloaded['batch'].e2e * 3000:.0f}ms"]
    print("unloaded: " + ", ".join(f"{c} ttft {m.ttft * 1000:.0f} ms" for c, m in unloaded.items())
          + f", batch e2e {unloaded['batch'].e2e * 1000:.0f} ms, batch-8 decode step {step8 * 1000:.1f} ms "
            f"(median of {len(decode)})")
    args.sim_cost_model = CorrectedCostModel(eng.cost_model)
    print(f"simulator for the real engine: cpu-local with this engine's predictor, {args.sim_cost_model.name} "
          f"({eng.cost_model.num_observed} measured steps)")
    del eng
    gc.collect()
    return targets, CPU_MIXED


def real_specs(args: argparse.Namespace, rate: float, wl: Workload, tokenizer: Any) -> list[RequestSpec]:
    return generate_requests(wl, make_arrivals(rate, 1.0, None), seed=args.seed, num_requests=args.real_requests,
                             tokenizer=tokenizer, max_model_len=args.max_model_len)


def real_reports(args: argparse.Namespace, targets: list[str], rate: float, wl: Workload) -> dict[str, list[Report]]:
    """fcfs and slo, interleaved, `args.repeats` times each, on one seeded trace."""
    out: dict[str, list[Report]] = {"fcfs": [], "slo": []}
    specs: list[RequestSpec] | None = None
    for rep in range(args.repeats):
        for policy in ("fcfs", "slo") if rep % 2 == 0 else ("slo", "fcfs"):
            eng = _engine(args, policy, targets)
            specs = specs or real_specs(args, rate, wl, eng.tokenizer)
            records, _, _ = run_inprocess(specs, eng)
            out[policy].append(build_report(records, slo=parse_slo(targets)))
            del eng
            gc.collect()
    assert specs is not None
    out["specs"] = specs   # type: ignore[assignment]
    return out


def sim_for(args: argparse.Namespace, specs: list[RequestSpec], policy: str, targets: list[str]) -> Report:
    return sim_specs_report(policy=policy, specs=specs, hardware="cpu-local", model="smollm2-135m", slo=targets,
                            max_model_len=args.max_model_len, cost_model=getattr(args, "sim_cost_model", None))


def long_prompt_case(args: argparse.Namespace, targets: list[str]) -> None:
    """Short chats decoding while long prompts arrive: chats' ITL p99 and throughput, fcfs vs slo."""
    chat_slo = next(t for t in targets if t.startswith("chat:"))
    slo = [chat_slo, "rag:ttft=30s"]
    chats = Workload("chats", (ClassSpec("chat", LengthDist(48, 0.3), LengthDist(96)),))
    reports: dict[str, Report] = {}
    for policy in ("fcfs", "slo"):
        eng = _engine(args, policy, slo)
        tok = eng.tokenizer
        specs = generate_requests(chats, make_arrivals(4.0, 1.0, None), seed=args.seed,
                                  num_requests=args.long_chats, tokenizer=tok, max_model_len=args.max_model_len)
        longs = generate_requests(Workload("long", (ClassSpec("rag", LengthDist(1800), LengthDist(4)),)),
                                  make_arrivals(1.0, 1.0, None), seed=args.seed + 1, num_requests=args.long_prompts,
                                  tokenizer=tok, max_model_len=args.max_model_len)
        longs = [dataclasses.replace(s, request_id=f"long-{i}", arrival_time=(s.arrival_time or 0) + 1.0)
                 for i, s in enumerate(longs)]
        mixed = sorted([*specs, *longs],
                       key=lambda s: s.arrival_time or 0.0)
        records, _, _ = run_inprocess(mixed, eng)
        reports[policy] = build_report(records, slo=parse_slo(slo))
        del eng
        gc.collect()
    f, s = (reports[p].summary for p in ("fcfs", "slo"))
    print(f"-- long prompts among chats: {args.long_chats} chats x 96 tokens, {args.long_prompts} prompts of "
          f"1,800 tokens; chat target {chat_slo}  (load {loadavg()})")
    print(class_table(reports))
    ratio = (s["chat"]["itl_p99"] or 0) / max(f["chat"]["itl_p99"] or 1e-9, 1e-9)
    thr = s[OVERALL]["total_tok_s"] / max(f[OVERALL]["total_tok_s"], 1e-9)
    print(f"chat ITL p99: fcfs {f['chat']['itl_p99'] * 1000:.0f} ms, slo {s['chat']['itl_p99'] * 1000:.0f} ms "
          f"({ratio:.2f}x, target <= 0.5x); throughput slo/fcfs {thr:.2f}x (target within 10%)")
