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
from pacer.core.outputs import Executor, ModelOutput, ScheduledRequest, SchedulerOutput
from pacer.request import SamplingParams
from pacer.sim.cost_model import LINEAR_FEATURES, BatchFeatures, StepCounts, batch_features, feature_vector
from pacer.sim.fit import FitStats, fit_relative
from pacer.sim.profiles import HardwareProfile, ModelProfile, get_hardware

__all__ = ["GridPoint", "default_grid", "synthetic_output", "fit_samples", "calibrate", "Sample"]

Row = tuple[int, int, bool]   # (tokens this step, start position, sample)


@dataclass(frozen=True, slots=True)
class GridPoint:
    name: str
    rows: tuple[Row, ...]


@dataclass(frozen=True, slots=True)
class Sample:
    features: BatchFeatures
    seconds: float


def _decode(batch: int, ctx: int) -> GridPoint:
    return GridPoint(f"decode b={batch} ctx={ctx}", tuple((1, ctx - 1, True) for _ in range(batch)))


def default_grid(quick: bool = False) -> list[GridPoint]:
    """Prefill sizes x start positions, decode batch x context, and mixed steps."""
    prefill = [16, 64, 256, 1024] if quick else [16, 32, 64, 128, 256, 512, 1024, 2048]
    grid = [GridPoint(f"prefill {n}", ((n, 0, True),)) for n in prefill]
    for n, start in ([(256, 1024)] if quick else [(256, 256), (256, 1024), (256, 2048), (512, 1536), (1024, 64)]):
        grid.append(GridPoint(f"chunk {n}@{start}", ((n, start, False),)))
    grid.append(GridPoint("4 chunks of 128", tuple((128, 0, True) for _ in range(4))))
    if not quick:
        grid.append(GridPoint("8 chunks of 64", tuple((64, 0, True) for _ in range(8))))
    batches = [1, 4, 16, 64] if quick else [1, 2, 4, 8, 16, 32, 64]
    contexts = [64, 1024] if quick else [32, 256, 1024, 2048]
    grid += [_decode(b, c) for b in batches for c in contexts]
    rng = random.Random(0)
    grid.append(GridPoint("decode b=16 ctx 32..2048", tuple((1, rng.randrange(32, 2048), True) for _ in range(16))))
    grid.append(GridPoint("decode 16@512 + chunk 256", (*_decode(16, 512).rows, (256, 0, True))))
    if not quick:
        grid.append(GridPoint("decode 64@128 + chunk 512@512", (*_decode(64, 128).rows, (512, 512, False))))
        grid.append(GridPoint("decode 8@1024 + chunk 512", (*_decode(8, 1024).rows, (512, 0, True))))
    return grid


def synthetic_output(point: GridPoint, step_id: int, block_size: int, num_blocks: int,
                     finished_ids: Sequence[str] = ()) -> SchedulerOutput:
    """A SchedulerOutput for one grid point: every row is a new request with its own block
    table (block ids wrap around the pool; only the timing matters)."""
    scheduled: list[ScheduledRequest] = []
    params = SamplingParams(temperature=0.0, max_tokens=1)
    offset = 0
    num_prefill = num_decode = 0
    for i, (n, start, sample) in enumerate(point.rows):
        nb = -(-(start + n) // block_size)
        blocks = [(offset + j) % num_blocks for j in range(nb)]
        offset += nb
        is_prefill = n > 1
        scheduled.append(ScheduledRequest(
            request_id=f"cal-{step_id}-{i}", token_ids=[(17 * (start + k)) % 1000 + 1 for k in range(n)],
            start_position=start, block_ids=blocks, is_new=True, sample=sample, is_prefill=is_prefill,
            num_output_tokens=0, sampling_params=params))
        if is_prefill:
            num_prefill += n
        else:
            num_decode += n
    return SchedulerOutput(step_id=step_id, scheduled=scheduled, num_prefill_tokens=num_prefill,
                           num_decode_tokens=num_decode, finished_ids=list(finished_ids))


def time_grid(executor: Any, grid: Sequence[GridPoint], block_size: int, num_blocks: int, repeats: int = 3,
              log: Callable[[str], None] = print) -> list[Sample]:
    """Median executor time of each grid point. The grid is timed in `repeats` round-robin
    passes (after warming up on a small prefill and a small decode) rather than point by point,
    so a slow spell of a shared machine spreads over all points instead of skewing a few."""
    times: list[list[float]] = [[] for _ in grid]
    step = 0
    prev: list[str] = []
    for point in (GridPoint("warm-up prefill", ((32, 0, True),)), _decode(4, 64)):
        executor.execute(synthetic_output(point, step, block_size, num_blocks, prev))
        prev = [f"cal-{step}-{i}" for i in range(len(point.rows))]
        step += 1
    for r in range(1, repeats + 1):
        for i, point in enumerate(grid):
            out = synthetic_output(point, step, block_size, num_blocks, prev)
            t0 = time.perf_counter()
            executor.execute(out)
            dt = time.perf_counter() - t0
            prev = [sr.request_id for sr in out.scheduled]
            step += 1
            times[i].append(dt)
        log(f"  pass {r}/{repeats} done")
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
