"""`pacer sim calibrate`: time the real engine on this machine and fit the step-time model.

Two measurements, one fit:

1. The real `ModelExecutor` runs a grid of synthetic steps -- prefill chunks of several sizes
   and starting positions, decode batches of several sizes and context lengths, and mixes
   of both -- built as plain `SchedulerOutput`s (the KV contents do not matter for timing,
   so a decode at context 2,048 costs one step, not a 2,048-token prefill).
2. A short run of the real `Engine` on a small trace measures what a step costs beyond the
   executor (scheduling, updates, detokenisation), as a constant plus a per-sequence term.

The executor times are fitted non-negatively on `LINEAR_FEATURES` (relative error), the
engine overhead is added to the constant and per-sequence coefficients, and the result is
saved as the `cpu-local` calibration JSON that `get_hardware("cpu-local")` loads.
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pacer.config import EngineConfig
from pacer.perf.cost_model import LINEAR_FEATURES, BatchFeatures, StepCounts, batch_features, feature_vector
from pacer.perf.grid import GridPoint, decode_point, default_grid, synthetic_output, time_points
from pacer.perf.profiles import HardwareProfile, ModelProfile, get_hardware
from pacer.request import SamplingParams
from pacer.sched.contract import Executor, ModelOutput, SchedulerOutput
from pacer.sim.fit import FitStats, fit_relative

__all__ = ["time_grid", "fit_samples", "calibrate", "Sample"]

@dataclass(frozen=True, slots=True)
class Sample:
    features: BatchFeatures
    seconds: float


def time_grid(executor: Any, grid: Sequence[GridPoint], block_size: int, num_blocks: int, repeats: int = 3,
              log: Callable[[str], None] = print) -> list[Sample]:
    """Median executor time of each grid point, timed in `repeats` round-robin passes after
    warming up on a small prefill and a small decode (`pacer.perf.grid.time_points`)."""
    warmup = (GridPoint("warm-up prefill", ((32, 0, True),)), decode_point(4, 64))
    times = time_points(executor, grid, block_size, num_blocks, repeats, warmup,
                        on_pass=lambda r: log(f"  pass {r}/{repeats} done"))
    samples: list[Sample] = []
    for point, ts in zip(grid, times):
        sec = statistics.median(ts)
        samples.append(Sample(batch_features(synthetic_output(point, 0, block_size, num_blocks)), sec))
        spread = (max(ts) - min(ts)) / sec if sec > 0 else 0.0
        log(f"  {point.name:32s} {sec * 1000:9.1f} ms  (spread {spread * 100:.0f}%)")
    return samples


class _TimedExecutor:
    """Wraps the real executor to time execute() and remember the step's features."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.last: tuple[BatchFeatures, float] | None = None

    @property
    def kv_block_bytes(self) -> int | None:
        return self.inner.kv_block_bytes

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        t0 = time.perf_counter()
        result = self.inner.execute(out)
        if out.scheduled:
            self.last = (batch_features(out), time.perf_counter() - t0)
        return result


def time_engine(engine: Any, executor: _TimedExecutor, num_requests: int = 24, seed: int = 0
                ) -> list[tuple[BatchFeatures, float, float]]:
    """Run a small trace through the real engine: (features, step wall s, executor s) per step."""
    rng = random.Random(seed)
    vocab = engine.vocab_size or 1000
    for _ in range(num_requests):
        prompt = [rng.randrange(10, vocab) for _ in range(rng.randrange(16, 96))]
        engine.add_request(prompt, SamplingParams(max_tokens=rng.randrange(8, 48), ignore_eos=True, temperature=0.0))
    steps: list[tuple[BatchFeatures, float, float]] = []
    while engine.has_unfinished_requests():
        executor.last = None
        t0 = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t0
        if executor.last is not None:
            steps.append((executor.last[0], dt, executor.last[1]))
    return steps


def fit_samples(samples: Sequence[Sample], model: ModelProfile, hw: HardwareProfile, dtype: str
                ) -> tuple[dict[str, float], FitStats]:
    counts = StepCounts(model, dtype)
    peak_f, peak_bw = hw.flops(dtype), hw.mem_bandwidth
    rows = [feature_vector(s.features, counts, peak_f, peak_bw) for s in samples]
    coef = fit_relative(rows, [s.seconds for s in samples])
    pred = [sum(c * x for c, x in zip(coef, row)) for row in rows]
    return dict(zip(LINEAR_FEATURES, coef)), FitStats(pred, [s.seconds for s in samples])


def _overhead_fit(steps: Sequence[tuple[BatchFeatures, float, float]]) -> tuple[float, float]:
    """Engine time beyond the executor = a + b x num_seqs (least squares, clipped at 0)."""
    xs = [float(f.num_seqs) for f, _, _ in steps]
    ys = [max(0.0, wall - ex) for _, wall, ex in steps]
    if len(steps) < 2 or len(set(xs)) < 2:
        return (statistics.median(ys) if ys else 0.0), 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    b = max(0.0, b)
    return max(0.0, my - b * mx), b


def calibrate(engine_kwargs: dict[str, Any], model: ModelProfile, *, quick: bool = False, repeats: int = 3,
              out_path: Path | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time the real engine and return (and save) the calibration of `cpu-local` for `model`."""
    import torch

    from pacer.engine import Engine
    from pacer.model.runner import build_model_executor, resolve_dtype

    config = EngineConfig.from_kwargs(**engine_kwargs)
    t_load = time.perf_counter()
    executor, ckpt, num_blocks = build_model_executor(config)
    dtype = str(resolve_dtype(config.model.dtype, config.model.device)).replace("torch.", "")
    log(f"loaded {ckpt.path} ({dtype}, {torch.get_num_threads()} threads, {num_blocks} KV blocks) "
        f"in {time.perf_counter() - t_load:.1f}s")
    block_size = config.cache.block_size
    hw = get_hardware("cpu-local")
    log("timing the executor on the grid:")
    samples = time_grid(executor, default_grid(quick), block_size, num_blocks, repeats, log)
    timed = _TimedExecutor(executor)
    engine = Engine(config, timed, ckpt.tokenizer, num_blocks, ckpt.arch.max_position_embeddings,
                    ckpt.arch.eos_token_ids, vocab_size=ckpt.arch.vocab_size)
    log("timing engine steps (scheduler + executor + updates) on a small trace ...")
    steps = time_engine(engine, timed)
    samples += [Sample(f, ex) for f, _, ex in steps]
    coef, stats = fit_samples(samples, model, hw, dtype)
    a, b = _overhead_fit(steps)
    coef["const"] += a
    coef["seqs"] += b
    walls = [w for _, w, _ in steps]
    preds = [_predict(coef, f, model, hw, dtype) for f, _, _ in steps]
    engine_stats = FitStats(preds, walls)
    calib: dict[str, Any] = {
        "model": model.name, "dtype": dtype, "coefficients": coef,
        "weights": executor.model.weights_line(),   # what was timed: the packed default or float32
        "engine_overhead": {"per_step_s": a, "per_seq_s": b},
        "fit": stats.as_dict(), "engine_fit": engine_stats.as_dict(),
        "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "quick": quick,
    }
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(calib, indent=1) + "\n")
    return calib


def _predict(coef: dict[str, float], f: BatchFeatures, model: ModelProfile, hw: HardwareProfile, dtype: str) -> float:
    x = feature_vector(f, StepCounts(model, dtype), hw.flops(dtype), hw.mem_bandwidth)
    return sum(coef[k] * v for k, v in zip(LINEAR_FEATURES, x))
