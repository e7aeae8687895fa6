"""Speed work on the shared hot path (scheduler, KV manager, request bookkeeping, the engine's
output path, the simulator's executor) changes no decision: fixed-seed simulations, each through
`pacer sim`'s own code path, must give exactly what the code gave before (`golden_sim.json`,
written by the code before the speed work of issue 26 item 5).

Each case hashes every SchedulerOutput (who ran, from which position, how many tokens, which
blocks, preemptions, finishes, swaps, budgets), every StepStats field that is not a wall-clock
timing, and every request's record (all timestamps, token times included). The cases cover
chunked and classic prefill, recompute and swap preemption, prefix caching on and off, the
slo, fair, priority and lpm policies and n-gram speculation.

Regenerate (only when a decision is meant to change, and say so in the commit):
    PYTHONPATH=src python tests/sim/test_sim_golden.py --regenerate
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pacer.config import EngineConfig
from pacer.config.args import engine_kwargs_from_args
from pacer.perf.profiles import get_hardware, get_model
from pacer.request import SamplingParams
from pacer.sched.contract import SchedulerOutput
from pacer.sim.cli import add_args, build_specs
from pacer.sim.simulator import build_sim_engine, simulate
from pacer.workload.report import OVERALL, build_report

GOLDEN = Path(__file__).with_name("golden_sim.json")
H200_70B = ["--hardware", "h200-sxm", "--tp", "8", "--model", "llama-3.1-70b", "--max-num-batched-tokens", "8192"]
A100_8B = ["--hardware", "a100-80g", "--model", "llama-3-8b"]
CASES: dict[str, list[str]] = {
    # the benchmark's run (benchmarks/sim_speed.py), shorter
    "h200x8-mixed": [*H200_70B, "--workload", "mixed", "--request-rate", "20", "--num-prompts", "150"],
    # a small KV: recompute preemptions, prefix-cache evictions
    "recompute": [*A100_8B, "--workload", "mixed", "--request-rate", "40", "--num-prompts", "120",
                  "--num-kv-blocks", "420", "--max-num-seqs", "48"],
    "swap": [*A100_8B, "--workload", "mixed", "--request-rate", "40", "--num-prompts", "120",
             "--num-kv-blocks", "420", "--max-num-seqs", "48", "--preemption-mode", "swap", "--swap-space", "4"],
    "classic-no-cache": [*A100_8B, "--workload", "chat", "--request-rate", "30", "--num-prompts", "100",
                         "--no-enable-chunked-prefill", "--no-enable-prefix-caching", "--max-num-seqs", "16"],
    "slo": [*A100_8B, "--workload", "mixed", "--request-rate", "30", "--num-prompts", "100",
            "--scheduling-policy", "slo", "--slo", "ttft=500ms,itl=60ms", "--shed-hopeless",
            "--max-num-batched-tokens", "2048"],
    "fair": [*A100_8B, "--workload", "tenants", "--request-rate", "30", "--num-prompts", "100",
             "--scheduling-policy", "fair", "--max-num-seqs", "24", "--num-kv-blocks", "800"],
    "priority-threshold": [*A100_8B, "--workload", "mixed", "--request-rate", "30", "--num-prompts", "100",
                           "--scheduling-policy", "priority", "--long-prefill-token-threshold", "256",
                           "--num-kv-blocks", "600", "--max-num-seqs", "32"],
    # longest prefix first: queue look-ups touch what waiting requests will read (queue-aware eviction)
    "lpm-evicting": [*A100_8B, "--workload", "mixed", "--request-rate", "40", "--num-prompts", "100",
                     "--scheduling-policy", "lpm", "--num-kv-blocks", "500", "--max-num-seqs", "32"],
    "ngram-spec": [*A100_8B, "--workload", "chat", "--request-rate", "10", "--num-prompts", "60",
                   "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
}
# StepStats fields measured on the wall clock (they differ run to run); the rest must match
WALL_FIELDS = {"schedule_s", "prepare_s", "sample_s", "update_s"}


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_args(p)
    return p.parse_args(argv)


def _output_row(out: SchedulerOutput) -> list[Any]:
    rows = [[sr.request_id, list(sr.token_ids), sr.start_position, list(sr.block_ids), sr.is_new, sr.sample,
             sr.is_prefill, sr.num_output_tokens, list(sr.draft_token_ids), sr.prompt_logits_rows,
             sr.sampling_params is not None] for sr in out.scheduled]
    return [out.step_id, rows, out.num_prefill_tokens, out.num_decode_tokens, list(out.preempted_ids),
            list(out.finished_ids), out.swap_out, out.swap_in, out.token_masks is not None, out.token_budget,
            out.budget_reason]


def run_case(argv: list[str]) -> dict[str, Any]:
    """One fixed-seed simulation: digests of its steps, step stats and records, and a few readable numbers."""
    args = _args(argv)
    config = EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    hw, model = get_hardware(args.hardware), get_model(args.model)
    engine, executor, clock = build_sim_engine(config, hw, model, tp=args.tp,
                                               gpu_memory_utilization=args.gpu_memory_utilization)
    specs, _, _ = build_specs(args, float(args.request_rate), engine.max_model_len)
    steps = hashlib.sha256()
    engine.schedule_listeners.append(lambda out: steps.update(json.dumps(_output_row(out)).encode()))
    result = simulate(engine, executor, clock, specs)
    stats = hashlib.sha256()
    for s in result.steps:
        d = {k: v for k, v in dataclasses.asdict(s).items() if k not in WALL_FIELDS}
        stats.update(json.dumps(d, sort_keys=True, default=str).encode())
    records = hashlib.sha256()
    for r in result.records:
        d = r.as_dict()
        d["token_times"] = r.token_times
        records.update(json.dumps(d, sort_keys=True, default=str).encode())
    summary = build_report(result.records).summary[OVERALL]
    snap = engine.snapshot()
    return {
        "steps": result.num_steps, "preemptions": result.num_preemptions, "kv_blocks": result.num_kv_blocks,
        "sim_duration_s": result.sim_duration_s, "busy_s": result.busy_s,
        "finished": sum(1 for r in result.records if r.ok), "ttft_p99": summary["ttft_p99"],
        "tpot_p50": summary["tpot_p50"], "swap_out_requests": snap.swap_out_requests,
        "draft_tokens": sum(s.num_draft_tokens for s in result.steps),
        "outputs_sha": steps.hexdigest(), "stats_sha": stats.hexdigest(), "records_sha": records.hexdigest(),
    }


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulation_equals_golden(name: str) -> None:
    golden = _golden()
    assert name in golden, f"no golden for {name}: regenerate (see the module docstring)"
    got = run_case(CASES[name])
    want = golden[name]
    # readable numbers first (a changed decision usually shows in them), then the digests
    for key in ("steps", "preemptions", "kv_blocks", "finished", "sim_duration_s", "busy_s", "ttft_p99", "tpot_p50",
                "swap_out_requests", "draft_tokens"):
        assert got[key] == want[key], f"{name}: {key} {got[key]!r} != golden {want[key]!r}"
    for key in ("outputs_sha", "stats_sha", "records_sha"):
        assert got[key] == want[key], f"{name}: {key} differs from the golden run's"


def test_the_cases_exercise_what_they_name() -> None:
    """The golden cases are not vacuous: preemptions happen, swap swaps, speculation drafts."""
    golden = _golden()
    assert golden["recompute"]["preemptions"] > 0
    assert golden["swap"]["swap_out_requests"] > 0
    assert golden["ngram-spec"]["draft_tokens"] > 0
    assert golden["h200x8-mixed"]["finished"] == 150


def test_finished_outputs_only_returns_finished_outputs_and_changes_nothing() -> None:
    """The simulator's engines build no running deltas; their steps return finished outputs
    only, and the run is the same as with every delta built."""
    argv = CASES["h200x8-mixed"][:-1] + ["40"]
    args = _args(argv)
    config = EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    hw, model = get_hardware(args.hardware), get_model(args.model)
    runs = []
    for quiet in (True, False):
        engine, executor, clock = build_sim_engine(config, hw, model, tp=args.tp)
        assert engine.finished_outputs_only   # the simulator's default
        engine.finished_outputs_only = quiet
        specs, _, _ = build_specs(args, float(args.request_rate), engine.max_model_len)
        for spec in specs:
            engine.add_request(list(spec.prompt_token_ids), SamplingParams(max_tokens=spec.output_tokens,
                                                                           ignore_eos=True))
        outs = [o for _ in range(100_000) if engine.has_unfinished_requests() for o in engine.step()]
        assert not engine.has_unfinished_requests()
        runs.append(([(o.request_id, o.finished, o.num_output_tokens, list(o.token_ids) if o.finished else None,
                       o.metrics.token_times) for o in outs if o.finished], [o.finished for o in outs]))
    (quiet_finals, quiet_flags), (loud_finals, loud_flags) = runs
    assert quiet_finals == loud_finals and len(quiet_finals) == 40
    assert all(quiet_flags) and not all(loud_flags)


if __name__ == "__main__" and sys.argv[1:] == ["--regenerate"]:
    GOLDEN.write_text(json.dumps({name: run_case(argv) for name, argv in CASES.items()}, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
