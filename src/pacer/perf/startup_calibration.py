"""Start-up calibration of the slo policy's step-time predictor: seconds, cached on disk.

When `scheduling_policy="slo"` runs on the real engine and `pacer sim calibrate` has made no fit
for this model, dtype and thread count, the engine times a dozen synthetic steps on its own
executor before serving (prefill chunks, decode batches, one mix; two passes, a few seconds
for the default model on two cores) and sets the predictor's per-regime corrections
(`SchedulerCostModel.scale`, the same ones the online refit keeps moving) to the median of
measured / predicted. The result is cached as JSON under `$PACER_CACHE_DIR/slo/` (else
`~/.cache/pacer/slo/`), keyed by machine, device, model, dtype, threads and the base fit,
so the next start reads it instead of timing again. A full fit: `pacer sim calibrate`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pacer.perf.grid import GridPoint, decode_point, synthetic_output, time_points
from pacer.perf.step_model import SchedulerCostModel
from pacer.sched.contract import Executor
from pacer.sched.step_cost import StepShape

__all__ = ["STARTUP_GRID", "calibration_key", "startup_cache_path", "calibrate_at_startup"]

log = logging.getLogger("pacer.sim")


# a dozen steps: enough to place both regimes, small enough for seconds on a 2-core CPU
STARTUP_GRID: tuple[GridPoint, ...] = (
    *(GridPoint(f"prefill {n}", ((n, 0, True),)) for n in (32, 96, 256)),
    GridPoint("chunk 96@256", ((96, 256, False),)),
    GridPoint("4 chunks of 32", tuple((32, 0, True) for _ in range(4))),
    *(decode_point(b, c) for b in (1, 8, 32) for c in (64, 512)),
    GridPoint("decode 8@256 + chunk 128", (*decode_point(8, 256).rows, (128, 0, True))),
)
_SCALE_LIMITS = (0.02, 50.0)


def calibration_key(*, device: str, model: str, dtype: str, threads: int, base: str, weights: str = "") -> str:
    """A file-name-safe key: machine, device, model, dtype, threads, the base fit's name and the
    weights the executor runs (its weights line: float32 or packed, which kernel path)."""
    machine = f"{platform.machine()}-{platform.processor() or 'cpu'}-{os.cpu_count()}cpus"
    raw = f"{machine}|{device}|{model}|{dtype}|{threads}t|{base}" + (f"|{weights}" if weights else "")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{Path(model).name}-{dtype}-{threads}t-{device}")[:80]
    return f"{slug}-{hashlib.blake2b(raw.encode(), digest_size=6).hexdigest()}"


def startup_cache_path(key: str) -> Path:
    """`$PACER_CACHE_DIR/slo/<key>.json`, else `~/.cache/pacer/slo/<key>.json` (read at call time)."""
    root = os.environ.get("PACER_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "pacer"
    return base / "slo" / f"{key}.json"


def _time_steps(executor: Executor, grid: Sequence[GridPoint], block_size: int, num_blocks: int,
                repeats: int) -> list[tuple[StepShape, float]]:
    """(shape, median seconds) per grid point; a first pass over the grid warms up, uncounted."""
    times = time_points(executor, grid, block_size, num_blocks, repeats, warmup=grid)
    return [(StepShape.from_output(synthetic_output(p, 0, block_size, num_blocks)), statistics.median(ts))
            for p, ts in zip(grid, times)]


def _scales(cost_model: SchedulerCostModel, samples: Sequence[tuple[StepShape, float]]) -> dict[str, float]:
    lo, hi = _SCALE_LIMITS
    out: dict[str, float] = {}
    for regime in cost_model.scale:
        ratios = [t / p for shape, t in samples
                  if SchedulerCostModel._regime(shape) == regime and (p := cost_model.base_time_s(shape)) > 0]
        if ratios:
            out[regime] = min(hi, max(lo, statistics.median(ratios)))
    return out


def calibrate_at_startup(cost_model: SchedulerCostModel, executor: Executor, *, key: str, block_size: int,
                         num_blocks: int, repeats: int = 2, path: Path | None = None) -> dict[str, Any]:
    """Set `cost_model.scale` from the cache entry for `key` (at `path`, default
    `startup_cache_path(key)`), or time STARTUP_GRID and cache it there. Returns the entry
    (with `"cached": True` when it was read, not measured)."""
    path = path or startup_cache_path(key)
    try:
        entry: dict[str, Any] = json.loads(path.read_text())
        scales = {k: float(v) for k, v in entry["scales"].items() if k in cost_model.scale}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        scales = {}
    if scales:
        cost_model.scale.update(scales)
        return {**entry, "path": str(path), "cached": True}
    t0 = time.perf_counter()
    samples = _time_steps(executor, STARTUP_GRID, block_size, max(1, num_blocks), repeats)
    scales = _scales(cost_model, samples)
    cost_model.scale.update(scales)
    entry = {"key": key, "base": cost_model.base.name, "scales": scales, "seconds": time.perf_counter() - t0,
             "samples": [{"tokens": s.num_tokens, "seqs": s.num_seqs, "measured_s": t} for s, t in samples],
             "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry, indent=1) + "\n")
        tmp.replace(path)
    except OSError as e:   # a read-only home still serves, it only calibrates again next time
        log.warning("could not cache the start-up calibration at %s: %s", path, e)
    return {**entry, "path": str(path), "cached": False}
