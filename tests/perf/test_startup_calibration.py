"""The slo policy's predictor on the real engine: the start-up calibration (measured once, then
read from its cache) and the online refit moving predictions toward the measured steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.model.runner import executor_for
from pacer.perf.cost_model import LINEAR_FEATURES, LinearCostModel, make_cost_model
from pacer.perf.profiles import get_hardware, get_model
from pacer.perf.startup_calibration import STARTUP_GRID, calibrate_at_startup, calibration_key
from pacer.perf.step_model import SchedulerCostModel
from pacer.request import SamplingParams
from pacer.sched.step_cost import StepShape


def _predictor() -> SchedulerCostModel:
    return SchedulerCostModel(make_cost_model(get_hardware("cpu-local"), get_model(None), "float32", 1, 16))


class _Counting:
    """The real executor, counting the steps it runs."""

    def __init__(self, inner: object) -> None:
        self.inner, self.num_steps = inner, 0
        self.kv_block_bytes = getattr(inner, "kv_block_bytes", None)

    def execute(self, out):   # type: ignore[no-untyped-def]
        self.num_steps += bool(out.scheduled)
        return self.inner.execute(out)   # type: ignore[attr-defined]


def test_refit_moves_each_regime_toward_the_measured_times() -> None:
    cm = _predictor()
    decode = StepShape().with_decode(200).with_decode(300)
    prefill = StepShape().with_chunk(256, 0)
    truth = 3.0 * cm.predict_step_s(decode)
    before = cm.predict_step_s(prefill)
    errors = []
    for _ in range(30):
        errors.append(abs(cm.predict_step_s(decode) - truth))
        cm.observe(decode, truth)
    assert errors == sorted(errors, reverse=True) and errors[-1] < 0.1 * errors[0]
    assert cm.predict_step_s(prefill) == before          # the other regime keeps its correction
    cm.observe(decode, 1000 * truth)                     # a hiccup moves it by a bounded step only
    assert cm.scale["decode"] < 3.0 * 1.5


def test_key_names_machine_model_dtype_threads_base_and_weights() -> None:
    kw = {"device": "cpu", "model": "smollm2-135m", "dtype": "float32", "threads": 1, "base": "fit-a"}
    keys = {calibration_key(**kw), calibration_key(**{**kw, "threads": 2}), calibration_key(**{**kw, "base": "b"}),
            calibration_key(**{**kw, "dtype": "bfloat16"}),
            calibration_key(**kw, weights="projections Q4_1,Q8_0 (avx2/int8/tiled): 111.5 MB read per decode step")}
    assert len(keys) == 5 and all("/" not in k for k in keys)
    assert calibration_key(**kw) == calibration_key(**kw)


def test_startup_calibration_measures_once_then_reads_its_cache(base: Engine, tmp_path: Path) -> None:
    path = tmp_path / "slo" / "k.json"
    ex = _Counting(base.executor)
    cm = _predictor()
    first = calibrate_at_startup(cm, ex, key="k", block_size=16, num_blocks=base.snapshot().num_blocks, path=path)
    assert not first["cached"] and ex.num_steps == 3 * len(STARTUP_GRID)   # a warm-up pass and two timed
    saved = json.loads(path.read_text())
    assert saved["scales"] == cm.scale and set(saved["scales"]) == {"decode", "prefill"}
    assert all(s > 0 for s in cm.scale.values())
    again = _predictor()
    second = calibrate_at_startup(again, ex, key="k", block_size=16, num_blocks=base.snapshot().num_blocks, path=path)
    assert second["cached"] and ex.num_steps == 3 * len(STARTUP_GRID) and again.scale == cm.scale
    # the base engine still serves: the synthetic rows were freed
    base.add_request("Hello", SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(base.run_until_done()[0].token_ids) == 3


@pytest.mark.parametrize("wrong", [25.0, 0.04])
def test_the_serving_engine_refits_a_wrong_predictor_toward_its_measured_steps(base: Engine, wrong: float) -> None:
    cm = _predictor()
    cm.scale = {"decode": wrong, "prefill": wrong}
    cfg = EngineConfig.from_kwargs(scheduling_policy="slo", slo=("ttft=60s,itl=10s",), num_kv_blocks=256)
    executor = executor_for(base.executor.model, cfg.cache, tokenizer=base.tokenizer)
    eng = Engine(cfg, executor, base.tokenizer, executor.num_blocks, base.max_model_len, base.eos_token_ids,
                 vocab_size=base.vocab_size, cost_model=cm)
    for i in range(10):   # one newcomer per step: ten steps with a prefill chunk, the rest decodes
        eng.add_request(f"Request {i}: tell me", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
        eng.step()
    eng.run_until_done()
    assert cm.num_observed >= 20
    for regime in ("decode", "prefill"):
        moved = cm.scale[regime] / wrong
        assert (moved < 0.6) if wrong > 1 else (moved > 1.5), (regime, cm.scale)


def test_the_simulator_can_advance_with_the_real_engines_corrections() -> None:
    from pacer.perf.cost_model import BatchFeatures
    from pacer.perf.step_model import CorrectedCostModel, features_of

    cm = _predictor()
    cm.scale = {"decode": 2.0, "prefill": 3.0}
    sim = CorrectedCostModel(cm)
    for shape, k in ((StepShape().with_decode(100).with_decode(40), 2.0), (StepShape().with_chunk(64, 0), 3.0)):
        f: BatchFeatures = features_of(shape)
        assert sim.step_cost(f).time_s == pytest.approx(k * cm.base.step_cost(f).time_s)
        assert sim.step_cost(f).time_s == pytest.approx(cm.predict_step_s(shape))
    assert "decode 2.00" in sim.name and "prefill 3.00" in sim.name


def test_a_noisy_saved_fit_is_not_planned_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A `pacer sim calibrate` fit made on a busy machine (engine steps missed by 45%) is not the
    slo policy's base: the shipped fit is, scaled at start-up; a quiet one (3%) is used as saved."""
    from pacer.engine.build import step_cost_model
    from pacer.perf.default_calibration import DEFAULT_CPU_CALIBRATION
    from pacer.perf.profiles import fit_is_trusted

    path = tmp_path / "cpu-local.json"
    monkeypatch.setenv("PACER_SIM_CALIBRATION", str(path))
    monkeypatch.setenv("PACER_CACHE_DIR", str(tmp_path / "cache"))
    saved = {**DEFAULT_CPU_CALIBRATION, "coefficients": {**DEFAULT_CPU_CALIBRATION["coefficients"], "const": 0.5}}
    cfg = EngineConfig.from_kwargs(scheduling_policy="slo", num_threads=1)

    def base_const(err: float) -> float:
        path.write_text(json.dumps({**saved, "engine_fit": {"median_rel_err": err}}))
        base = step_cost_model(cfg, None).base
        assert isinstance(base, LinearCostModel)
        return base.coef[LINEAR_FEATURES.index("const")]

    assert not fit_is_trusted({"engine_fit": {"median_rel_err": 0.45}}) and fit_is_trusted({})
    assert not fit_is_trusted({"engine_fit": {"median_rel_err": 0.078}, "fit": {"p90_rel_err": 0.92}})
    assert fit_is_trusted({"engine_fit": {"median_rel_err": 0.04}, "fit": {"p90_rel_err": 0.085}})
    # a p90 of 19% (a median of 5.7%): the skewed fit that priced long prefills 25% too high
    assert not fit_is_trusted({"engine_fit": {"median_rel_err": 0.057}, "fit": {"p90_rel_err": 0.193}})
    assert base_const(0.03) == 0.5
    assert base_const(0.45) == DEFAULT_CPU_CALIBRATION["coefficients"]["const"]
