"""Step-time noise in the simulator (pacer.sim.noise): its statistics, that a noisy run stays
reproducible under its seed, and that the scheduler's predictor learns the margin from it, as
the real engine's does from its measured steps."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from pacer.cli.main import main
from pacer.config import EngineConfig
from pacer.perf.profiles import get_hardware, get_model
from pacer.sim.noise import StepNoise
from pacer.sim.simulator import build_sim_engine, simulate
from pacer.workload.arrivals import Poisson
from pacer.workload.generator import generate_requests
from pacer.workload.spec import builtin_workload

A100, L8B = get_hardware("a100-80g"), get_model("llama-3-8b")


def _factors(noise: StepNoise, step_s: float, n: int) -> list[float]:
    return [noise.factor(i * step_s, step_s) for i in range(n)]


def _autocorr(xs: list[float], lag: int) -> float:
    m = statistics.fmean(xs)
    var = statistics.pvariance(xs, m)
    return sum((a - m) * (b - m) for a, b in zip(xs, xs[lag:])) / (len(xs) - lag) / var


def test_short_steps_take_the_noise_measured_on_the_avx2_machine() -> None:
    f = _factors(StepNoise(0.14, seed=3), 0.015, 100_000)
    logs = [math.log(x) for x in f]
    assert statistics.fmean(f) == pytest.approx(1.0, abs=0.01)
    assert statistics.pstdev(f) == pytest.approx(0.14, rel=0.15)
    assert _autocorr(logs, 1) == pytest.approx(0.79, abs=0.05)     # measured 0.77-0.79
    assert _autocorr(logs, 10) == pytest.approx(0.52, abs=0.08)    # measured 0.46-0.56
    assert _autocorr(logs, 50) == pytest.approx(0.28, abs=0.1)     # measured 0.16-0.25


def test_a_long_step_averages_the_fast_part_out() -> None:
    short = _factors(StepNoise(0.3, seed=1), 0.015, 20_000)
    long = _factors(StepNoise(0.3, seed=1), 3.0, 2_000)
    assert statistics.fmean(long) == pytest.approx(1.0, abs=0.03)
    assert statistics.pstdev(long) < 0.6 * statistics.pstdev(short)


def test_idle_time_passes_and_a_seed_repeats_its_draws() -> None:
    assert {StepNoise(0.0, seed=1).factor(i, 0.01) for i in range(10)} == {1.0}
    a, b, c = StepNoise(0.2, seed=7), StepNoise(0.2, seed=7), StepNoise(0.2, seed=8)
    draws = _factors(a, 0.01, 50)
    assert draws == _factors(b, 0.01, 50)
    assert draws != _factors(c, 0.01, 50)
    # two steps 10 s apart are as good as unrelated; back to back, nearly the same
    near = [(n.factor(0.0, 0.01), n.factor(0.01, 0.01)) for n in (StepNoise(0.3, seed=s) for s in range(400))]
    far = [(n.factor(0.0, 0.01), n.factor(10.0, 0.01)) for n in (StepNoise(0.3, seed=s) for s in range(400))]
    assert statistics.correlation(*zip(*near)) > 0.6 > 0.2 > abs(statistics.correlation(*zip(*far)))


@pytest.mark.parametrize("cv", [-0.1, math.nan, math.inf])
def test_bad_noise_settings_name_the_flag(cv: float) -> None:
    with pytest.raises(ValueError, match="--step-noise"):
        StepNoise(cv)


def _run(noise: StepNoise | None) -> tuple[list[tuple[str, float | None, float | None]], float]:
    cfg = EngineConfig.from_kwargs(scheduling_policy="slo", slo=["chat:ttft=1s,itl=50ms", "rag:ttft=4s"])
    engine, ex, clock = build_sim_engine(cfg, A100, L8B, step_noise=noise)
    specs = generate_requests(builtin_workload("mixed"), Poisson(40.0), seed=2, num_requests=60, max_model_len=8192)
    res = simulate(engine, ex, clock, specs)
    assert engine.cost_model is not None
    return [(r.request_id, r.ttft, r.e2e) for r in res.records], engine.cost_model.upper_ratio()


def test_a_noisy_simulation_repeats_under_its_seed_and_the_predictor_learns_its_margin() -> None:
    exact, exact_margin = _run(None)
    noisy, margin = _run(StepNoise(0.25, seed=5))
    assert noisy == _run(StepNoise(0.25, seed=5))[0]
    assert noisy != exact and noisy != _run(StepNoise(0.25, seed=6))[0]
    assert exact_margin == 1.0       # exact steps: nothing to learn, no refit
    assert margin > 1.2              # the slo policy's budgets keep this much more room


def test_sim_cli_records_the_noise_and_refuses_it_on_a_cluster(tmp_path, capsys) -> None:
    out = tmp_path / "run.json"
    argv = ["sim", "--hardware", "a100-80g", "--model", "llama-3-8b", "--workload", "chat", "--num-prompts", "8",
            "--request-rate", "20", "--seed", "1"]
    assert main([*argv, "--step-noise", "0.2", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["meta"]["step_noise"] == 0.2
    capsys.readouterr()
    assert main([*argv, "--step-noise", "-1"]) == 2
    assert "--step-noise" in capsys.readouterr().err
    assert main([*argv, "--step-noise", "0.2", "--replicas", "2"]) == 2
    assert "exact steps only" in capsys.readouterr().err
