"""`pacer tune --verify`: the chosen configuration and the runner-up (and the out-of-the-box
defaults) on the real engine, in-process, or against `--base-url`, on the same trace as the
simulation, with measured against predicted attainment."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pacer.diagnose.replay import Replay, SimTarget, fmt_ms, run_real, run_server
from pacer.tune.method import MethodResult, Point
from pacer.workload.report import SloSet
from pacer.workload.spec import RequestSpec

__all__ = ["measure_defaults", "refit_target", "verify_inprocess", "verify_server", "print_verification"]

_REAL_ONLY = ("model", "device", "num_threads", "attention_backend", "linear_backend", "dtype", "quantization",
              "quant_activations")


def _engine(kwargs: dict[str, Any]) -> Any:
    from pacer.engine import Engine
    from pacer.sim.cli import _warm_up

    engine = Engine.from_kwargs(**kwargs)
    _warm_up(engine)
    return engine


def measure_defaults(engine: Any, specs: Sequence[RequestSpec], slo: SloSet,
                     say: Callable[[str], None] = print) -> tuple[Replay, Any]:
    """The out-of-the-box defaults on the real engine first, every step recorded (for the refit)."""
    from pacer.sim.validate import StepRecorder

    say(f"verify: defaults (pacer defaults) on the real engine first, {len(specs)} requests, every step "
        "recorded ...")
    recorder = StepRecorder()
    return run_real("defaults", engine, specs, slo, recorder), recorder


def refit_target(target: SimTarget, recorder: Any, kwargs: dict[str, Any],
                 say: Callable[[str], None] = print) -> None:
    """Step times refitted on the real run's own steps replace the hardware's calibration in
    `target` (this machine's speed drifts ~2x between days; a fixed fit was off ~55%)."""
    from pacer.config import EngineConfig
    from pacer.perf.cost_model import LinearCostModel, make_cost_model
    from pacer.sim.simulator import resolve_dtype
    from pacer.sim.validate import refit_on_steps

    cfg = EngineConfig.from_kwargs(**kwargs)
    dtype = resolve_dtype(cfg.model.dtype, target.hw)
    block, kv_dtype = cfg.cache.block_size, cfg.cache.kv_cache_dtype
    shipped = make_cost_model(target.hw, target.model, dtype, target.tp, block, kv_dtype)
    coef, fit = refit_on_steps(recorder, target.model, target.hw, dtype)
    target.cost_model = LinearCostModel(target.hw, target.model, dtype, coef, block, kv_dtype)
    errs = recorder.step_errors(shipped)
    say(f"    step times refitted on the defaults run's {fit.n} steps (median fit error "
        f"{fit.median_rel_err * 100:.1f}%); the method below predicts with them, not with {shipped.name}, "
        f"which measured/predicted: {'; '.join(errs[:3])}")


def verify_inprocess(result: MethodResult, real_kwargs: dict[str, Any], specs: Sequence[RequestSpec],
                     slo: SloSet, say: Callable[[str], None] = print,
                     defaults: Replay | None = None) -> list[tuple[str, Point, Replay]]:
    """Chosen and runner-up on a fresh real engine each, beside the defaults' run (`defaults`,
    measured before the method ran, or run here)."""
    fixed = {k: v for k, v in real_kwargs.items() if k in _REAL_ONLY}
    rows = []
    runs = [("chosen", result.chosen)]
    if result.runner_up is not None:
        runs.append(("runner-up", result.runner_up))
    if defaults is None:
        runs.insert(0, ("defaults", result.defaults))
    else:
        rows.append(("defaults", result.defaults, defaults))
    for name, point in runs:
        say(f"verify: {name} ({point.label or 'pacer defaults'}) on the real engine, {len(specs)} requests ...")
        engine = _engine({**fixed, **point.kwargs})
        rows.append((name, point, run_real(name, engine, specs, slo)))
        del engine
    return rows


def verify_server(result: MethodResult, base_url: str, specs: Sequence[RequestSpec], slo: SloSet,
                  say: Callable[[str], None] = print) -> list[tuple[str, Point, Replay]]:
    """The server as it runs now, compared with the chosen configuration's prediction: restart it
    with the printed flags first."""
    say(f"verify: {base_url} (restart it with: pacer serve {result.chosen.label} and the fixed flags), "
        f"{len(specs)} requests ...")
    return [("chosen (server)", result.chosen, run_server("server", base_url, specs, slo))]


def print_verification(rows: Sequence[tuple[str, Point, Replay]], target: float,
                       say: Callable[[str], None] = print) -> bool:
    """Measured against predicted; returns whether the chosen configuration met the SLA for real."""
    say("measured on the real engine vs predicted by the simulator (same trace):")
    say(f"    {'config':<12} {'SLO met real/sim':>17} {'TTFT p50 real/sim':>21} {'TTFT p99 real/sim':>21} "
        f"{'TPOT p99 real/sim':>19} {'preempt real/sim':>17}")
    chosen_ok = False
    for name, point, rep in rows:
        s, p = rep.summary, point.summary
        say(f"    {name:<12} {rep.attainment:>8.0%} / {point.attainment:<6.0%} "
            f"{fmt_ms(s.get('ttft_p50')):>9} / {fmt_ms(p.get('ttft_p50')):<9} "
            f"{fmt_ms(s.get('ttft_p99')):>9} / {fmt_ms(p.get('ttft_p99')):<9} "
            f"{fmt_ms(s.get('tpot_p99')):>8} / {fmt_ms(p.get('tpot_p99')):<8} "
            f"{s.get('preemptions', 0):>7} / {p.get('preemptions', 0):<7}   {point.label}")
        if name.startswith("chosen"):
            chosen_ok = rep.attainment >= target
    return chosen_ok
