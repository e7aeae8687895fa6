"""The step log, defined once: one JSON object per engine step that ran (JSONL): what the
scheduler put in it (the cost model's batch features), how long it took, and the budget it chose.

`pacer serve --step-log FILE.jsonl` writes it. Read back (`read_step_log`) and priced with a cost
model (`priced_work_s`, e.g. this machine's `pacer sim calibrate` fit), it gives the work a run did
in seconds of the fit, whatever the machine's speed was while it ran: on a shared 2-core machine
that speed swings by 10-20% between consecutive 25-second runs, more than a scheduling policy's
own cost, and a throughput ratio alone cannot tell the two apart (benchmarks/slo_overload.py
--step-log prints both).

Keys (stable; new ones may be added, none renamed):

===========================  =====================================================================
``step_id``                  the engine's step number
``end_time``                 when the step ended, on the engine clock (s)
``measured_s``               its wall time: schedule + prepare + forward + sample + update (s)
``forward_s``                of it, the model's forward (s)
``kind``                     ``prefill``, ``decode`` or ``mixed``
``token_budget``             the budget the scheduler chose, and ``budget_reason`` why
``num_running``              requests running and waiting after the step, ``num_waiting``
``num_preempted``            requests preempted in it
(the rest)                   `pacer.perf.cost_model.BatchFeatures`' fields: ``num_tokens``,
                             ``num_seqs``, ``num_single``, ``single_kv_tokens``, ``single_max_ctx``,
                             ``num_chunks``, ``chunk_attn_pairs``, ``chunk_kv_tokens``,
                             ``num_sampled``, ``num_prefill_tokens``, ``num_decode_tokens``,
                             ``num_swap_blocks``, ``num_segment_copy_tokens``
===========================  =====================================================================
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pacer.perf.cost_model import BatchFeatures, CostModel, batch_features

if TYPE_CHECKING:
    from pacer.engine.stats import StepStats
    from pacer.sched.contract import SchedulerOutput

__all__ = ["StepLogWriter", "read_step_log", "priced_work_s", "FEATURE_KEYS"]

FEATURE_KEYS = tuple(f.name for f in dataclasses.fields(BatchFeatures))


class StepLogWriter:
    """Listens to an engine (`on_schedule` before a step runs, `on_stats` after) and appends a
    line per step to `path`, flushed as it is written. Both run on the engine's thread."""

    def __init__(self, path: str | Path) -> None:
        self._file = open(path, "a", encoding="utf-8", buffering=1)   # noqa: SIM115  (closed by close())
        self._pending: tuple[int, BatchFeatures] | None = None   # the step scheduled and not yet recorded

    def on_schedule(self, out: SchedulerOutput) -> None:
        self._pending = (out.step_id, batch_features(out)) if out.scheduled else None

    def on_stats(self, stats: StepStats) -> None:
        pending, self._pending = self._pending, None
        if pending is None or pending[0] != stats.step_id or self._file.closed:
            return
        row: dict[str, Any] = {
            "step_id": stats.step_id, "end_time": round(stats.time, 6), "measured_s": round(stats.total_s, 6),
            "forward_s": round(stats.forward_s, 6), "kind": stats.kind, "token_budget": stats.token_budget,
            "budget_reason": stats.budget_reason, "num_running": stats.num_running,
            "num_waiting": stats.num_waiting, "num_preempted": stats.num_preempted,
        }
        row.update(dataclasses.asdict(pending[1]))
        self._file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self._file.close()


def read_step_log(path: str | Path, skip_lines: int = 0) -> list[dict[str, Any]]:
    """The log's rows from line `skip_lines` on (a server's log spans every run it served: skip
    the lines it had before a run to read that run's steps)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for i, line in enumerate(f) if i >= skip_lines and line.strip()]


def priced_work_s(rows: Iterable[dict[str, Any]], cost_model: CostModel) -> float:
    """The steps' time as `cost_model` predicts it from their batch features (s)."""
    return sum(cost_model.step_cost(BatchFeatures(**{k: r[k] for k in FEATURE_KEYS if k in r})).time_s
               for r in rows)
