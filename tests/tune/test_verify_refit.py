"""`pacer tune --verify` refits step times on the defaults' measured run before the method
predicts: here the "machine" is the simulator running 2.2x slower than the saved calibration,
and the refitted target must predict those slower steps, not the calibration's."""

import dataclasses
import statistics

from pacer.config import EngineConfig
from pacer.diagnose.replay import SimTarget
from pacer.perf.cost_model import make_cost_model
from pacer.sim.simulator import build_sim_engine, resolve_dtype, simulate
from pacer.sim.validate import StepRecorder
from pacer.tune.verify import refit_target
from pacer.workload.arrivals import Poisson
from pacer.workload.generator import generate_requests
from pacer.workload.spec import builtin_workload

SLOWDOWN = 2.2


class Slower:
    """The saved calibration, every step `SLOWDOWN` times longer (a busier, slower day)."""

    def __init__(self, base):
        self.base, self.name = base, f"{base.name} x{SLOWDOWN}"

    def step_cost(self, f):
        c = self.base.step_cost(f)
        return dataclasses.replace(c, time_s=c.time_s * SLOWDOWN)


def test_refit_target_predicts_the_measured_steps_not_the_saved_calibration():
    target = SimTarget("cpu-local")
    kwargs = {"kv_cache_memory": "64MiB", "max_num_seqs": 8}
    cfg = EngineConfig.from_kwargs(**kwargs)
    dtype = resolve_dtype(cfg.model.dtype, target.hw)
    shipped = make_cost_model(target.hw, target.model, dtype)
    engine, executor, clock = build_sim_engine(cfg, target.hw, target.model, cost_model=Slower(shipped))
    recorder = StepRecorder()
    engine.schedule_listeners.append(recorder.on_schedule)
    engine.stats_listeners.append(recorder.on_stats)
    specs = generate_requests(builtin_workload("mixed"), Poisson(4.0), seed=3, num_requests=24, max_model_len=2048)
    simulate(engine, executor, clock, specs)
    said: list[str] = []
    assert target.cost_model is None
    refit_target(target, recorder, kwargs, say=said.append)
    features = [recorder.features[s.step_id] for s in recorder.stats if s.step_id in recorder.features]
    assert len(features) > 50
    ratio = statistics.median(target.cost_model.step_cost(f).time_s / shipped.step_cost(f).time_s for f in features)
    assert abs(ratio - SLOWDOWN) < 0.1 * SLOWDOWN, ratio
    assert "refitted on the defaults run's" in said[0]
    # the method's simulations now run on the refitted model
    engine2, executor2, _ = target._build(kwargs)
    assert executor2.cost_model is target.cost_model


def test_when_no_configuration_meets_the_sla_tune_says_which_target_with_numbers():
    from pacer.tune.method import Point
    from pacer.tune.method_cli import why_no_configuration
    from pacer.workload.report import parse_slo

    best = Point({"max_num_seqs": 8}, {"slo_attainment": 0.62, "ttft_p99": 1.5, "tpot_p99": 0.156})
    msg = why_no_configuration(best, parse_slo(["ttft=2s,tpot=100ms"]), 0.9)
    assert "62% of requests (< 90%)" in msg
    assert "tpot p99 156 ms vs target 100 ms" in msg and "ttft p99" not in msg   # TTFT is within its target
