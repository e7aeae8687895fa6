"""The timing grid: synthetic steps built as plain `SchedulerOutput`s, and the round-robin pass
that times them on an executor. `pacer sim calibrate` fits the step-time model on a full grid;
the start-up calibration of the slo policy's predictor times a dozen points of it. Pure
Python: any `Executor` (the real one, a simulated one) runs the steps.

The KV contents do not matter for timing, so a decode at context 2,048 costs one step, not a
2,048-token prefill: every row is a new request with its own block table (block ids wrap
around the pool)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pacer.request import SamplingParams
from pacer.sched.contract import Executor, ScheduledRequest, SchedulerOutput

__all__ = ["Row", "GridPoint", "decode_point", "default_grid", "synthetic_output", "time_points"]

Row = tuple[int, int, bool]   # (tokens this step, start position, sample)


@dataclass(frozen=True, slots=True)
class GridPoint:
    name: str
    rows: tuple[Row, ...]


def decode_point(batch: int, ctx: int) -> GridPoint:
    """A decode step of `batch` rows at context `ctx`."""
    return GridPoint(f"decode b={batch} ctx={ctx}", tuple((1, ctx - 1, True) for _ in range(batch)))


def default_grid(quick: bool = False) -> list[GridPoint]:
    """Prefill sizes x start positions, decode batch x context, and mixed steps (`pacer sim calibrate`)."""
    prefill = [16, 64, 256, 1024] if quick else [16, 32, 64, 128, 256, 512, 1024, 2048]
    grid = [GridPoint(f"prefill {n}", ((n, 0, True),)) for n in prefill]
    for n, start in ([(256, 1024)] if quick else [(256, 256), (256, 1024), (256, 2048), (512, 1536), (1024, 64)]):
        grid.append(GridPoint(f"chunk {n}@{start}", ((n, start, False),)))
    grid.append(GridPoint("4 chunks of 128", tuple((128, 0, True) for _ in range(4))))
    if not quick:
        grid.append(GridPoint("8 chunks of 64", tuple((64, 0, True) for _ in range(8))))
    batches = [1, 4, 16, 64] if quick else [1, 2, 4, 8, 16, 32, 64]
    contexts = [64, 1024] if quick else [32, 256, 1024, 2048]
    grid += [decode_point(b, c) for b in batches for c in contexts]
    rng = random.Random(0)
    grid.append(GridPoint("decode b=16 ctx 32..2048", tuple((1, rng.randrange(32, 2048), True) for _ in range(16))))
    grid.append(GridPoint("decode 16@512 + chunk 256", (*decode_point(16, 512).rows, (256, 0, True))))
    # narrow prefill steps (a few dozen rows), as the slo policy runs them: an ITL-bound chunk beside decodes
    grid.append(GridPoint("decode 8@512 + chunk 24@1024", (*decode_point(8, 512).rows, (24, 1024, False))))
    grid.append(GridPoint("chunk 32@1024", ((32, 1024, False),)))
    if not quick:
        grid.append(GridPoint("decode 4@1024 + chunk 44@1536", (*decode_point(4, 1024).rows, (44, 1536, False))))
        grid.append(GridPoint("decode 64@128 + chunk 512@512", (*decode_point(64, 128).rows, (512, 512, False))))
        grid.append(GridPoint("decode 8@1024 + chunk 512", (*decode_point(8, 1024).rows, (512, 0, True))))
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


def time_points(executor: Executor, grid: Sequence[GridPoint], block_size: int, num_blocks: int, repeats: int,
                warmup: Sequence[GridPoint] = (), on_pass: Callable[[int], None] | None = None) -> list[list[float]]:
    """Seconds of each grid point in each of `repeats` round-robin passes (after the `warmup`
    points, not counted), rather than point by point, so a slow spell of a shared machine
    spreads over all points instead of skewing a few. Every synthetic row is freed after."""
    times: list[list[float]] = [[] for _ in grid]
    prev: list[str] = []
    step = 0
    for point in warmup:
        out = synthetic_output(point, step, block_size, num_blocks, prev)
        executor.execute(out)
        prev = [sr.request_id for sr in out.scheduled]
        step += 1
    for r in range(1, repeats + 1):
        for i, point in enumerate(grid):
            out = synthetic_output(point, step, block_size, num_blocks, prev)
            t0 = time.perf_counter()
            executor.execute(out)
            times[i].append(time.perf_counter() - t0)
            prev = [sr.request_id for sr in out.scheduled]
            step += 1
        if on_pass is not None:
            on_pass(r)
    executor.execute(SchedulerOutput(step_id=step, scheduled=[], num_prefill_tokens=0, num_decode_tokens=0,
                                     finished_ids=prev))
    return times
