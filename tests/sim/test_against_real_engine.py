"""The simulator against the real engine on the same trace (default model, CPU).

With every request arriving at t=0 scheduling does not depend on step times, so the real
engine and the simulator must take exactly the same steps; latencies are only checked for
sanity here (the numeric targets are `pacer sim validate`'s job on a quiet machine)."""

from __future__ import annotations

import dataclasses

import pytest

from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.perf.profiles import get_hardware, get_model
from pacer.sim.simulator import build_sim_engine, simulate
from pacer.workload.arrivals import make_arrivals
from pacer.workload.generator import generate_requests
from pacer.workload.runner import run_inprocess
from pacer.workload.spec import builtin_workload


@pytest.fixture(scope="module")
def real_engine():
    try:
        return Engine.from_kwargs(max_num_seqs=4, max_num_batched_tokens=96, num_kv_blocks=64)
    except FileNotFoundError as e:   # pragma: no cover - the default model is part of `make venv`
        pytest.skip(str(e))


def test_same_trace_same_steps_as_the_real_engine(real_engine):
    wl = builtin_workload("chat").with_lengths(prompt_mean=40, output_mean=6)
    specs = generate_requests(wl, make_arrivals(float("inf")), seed=3, num_requests=10,
                              tokenizer=real_engine.tokenizer, max_model_len=real_engine.max_model_len)
    real_records, _, _ = run_inprocess(specs, real_engine)
    real_steps = [(s.batch_size, s.num_prefill_tokens, s.num_decode_tokens) for s in real_engine.step_stats]

    cfg = EngineConfig.from_kwargs(max_num_seqs=4, max_num_batched_tokens=96, num_kv_blocks=64)
    model = dataclasses.replace(get_model(None), max_model_len=real_engine.max_model_len)
    engine, ex, clock = build_sim_engine(cfg, get_hardware("cpu-local"), model)
    result = simulate(engine, ex, clock, specs)
    sim_steps = [(s.batch_size, s.num_prefill_tokens, s.num_decode_tokens) for s in result.steps]

    assert sim_steps == real_steps
    assert [r.output_tokens for r in result.records] == [r.output_tokens for r in real_records]
    assert [r.cached_tokens for r in result.records] == [r.cached_tokens for r in real_records]
    assert [r.preemptions for r in result.records] == [r.preemptions for r in real_records]
    for sim_r, real_r in zip(result.records, real_records):
        assert sim_r.ttft is not None and real_r.ttft is not None and sim_r.ttft > 0


@pytest.mark.slow
def test_validate_command_prints_each_metric_error(tmp_path, capsys):
    from pacer.cli.main import main

    out = tmp_path / "val.json"
    rc = main(["sim", "validate", "--input-len", "24", "--output-len", "4", "--num-prompts", "4", "--request-rate",
               "inf", "--max-num-seqs", "4", "--num-kv-blocks", "64", "--out", str(out),
               "--sim-out", str(tmp_path / "sim.json"), "--real-out", str(tmp_path / "real.json"),
               "--steps-out", str(tmp_path / "steps.jsonl")])
    assert rc == 0
    text = capsys.readouterr().out
    for metric in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "output_tok_s"):
        assert text.count(metric) == 2   # saved calibration, then refitted on the run
    assert "measured/predicted" in text
    import json

    saved = json.loads(out.read_text())
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert steps and {r["kind"] for r in steps} <= {"prefill", "decode", "mixed"}
    assert sum(r["num_prefill_tokens"] for r in steps) == 4 * 24 and all(r["measured_s"] > 0 for r in steps)
    assert {e["metric"] for e in saved["errors"]} >= {"ttft_p50", "tpot_p99", "output_tok_s"}
