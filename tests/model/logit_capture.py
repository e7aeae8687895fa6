"""Test helpers: pacer's logits at every scheduled position of a real engine run, and HF's
log-softmax on the same sequences, for the logit parity tests.

`capture(engine)` swaps the executor's model for a proxy whose forward asks the real model for
logits at every packed row (not only the rows that sample) and records them, and listens to
each step's SchedulerOutput (`Engine.schedule_listeners`; the engine's executor is never swapped); rows are mapped back to (request, position) by
the packed layout that `pacer.model.attention` documents (single-token rows first, then the
prefill chunks, each in scheduled order), which is checked against the recorded input ids
and positions. The engine's own outputs are unchanged: the sampler sees the rows it asked for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


class _AllRowsModel:
    def __init__(self, inner: Any, log: _Capture) -> None:
        self.inner = inner
        self.log = log

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any, kv_caches: Any,
                logits_rows: torch.Tensor, *args: Any) -> torch.Tensor:
        every = torch.arange(input_ids.shape[0], device=input_ids.device)
        logits = self.inner.forward(input_ids, positions, meta, kv_caches, every, *args)
        self.log.record(input_ids, positions, logits)
        return logits.index_select(0, logits_rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class _Capture:
    pending: Any = None
    # request id -> [(position, float32 log-softmax [V])], in step order (recomputes included)
    rows: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=lambda: defaultdict(list))
    num_steps: int = 0
    num_mixed_steps: int = 0

    def on_schedule(self, out: Any) -> None:
        self.pending = out

    def record(self, input_ids: torch.Tensor, positions: torch.Tensor, logits: torch.Tensor) -> None:
        out, self.pending = self.pending, None
        assert out is not None, "a forward without a SchedulerOutput"
        packed = [sr for sr in out.scheduled if sr.num_tokens == 1] + [sr for sr in out.scheduled if sr.num_tokens > 1]
        ids = [t for sr in packed for t in sr.token_ids]
        pos = [p for sr in packed for p in range(sr.start_position, sr.start_position + sr.num_tokens)]
        assert input_ids.tolist() == ids and positions.tolist() == pos, "the packed layout changed"
        lsm = torch.log_softmax(logits.float(), dim=-1)
        row = 0
        for sr in packed:
            for j in range(sr.num_tokens):
                self.rows[sr.request_id].append((sr.start_position + j, lsm[row]))
                row += 1
        self.num_steps += 1
        self.num_mixed_steps += any(sr.num_tokens == 1 for sr in packed) and any(sr.num_tokens > 1 for sr in packed)


def capture(engine: Any) -> _Capture:
    log = _Capture()
    executor = engine.executor
    executor.model = _AllRowsModel(executor.model, log)
    engine.schedule_listeners.append(log.on_schedule)
    return log


def hf_log_softmax(model: torch.nn.Module, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Per sequence, HF's log-softmax at every position [len - 1, V] (position p predicts p + 1),
    in the model's own dtype, returned as float64."""
    outs = []
    with torch.inference_mode():
        for seq in sequences:
            ids = torch.tensor([list(seq[:-1])])
            logits = model(ids, attention_mask=torch.ones_like(ids)).logits[0]
            outs.append(torch.log_softmax(logits.double() if logits.dtype == torch.float64 else logits.float(),
                                          dim=-1).double())
    return outs


@dataclass
class Errors:
    """Per position: max |log-softmax difference| over the vocabulary."""

    per_position: list[float]

    @property
    def max(self) -> float:
        return max(self.per_position)

    @property
    def mean(self) -> float:
        return sum(self.per_position) / len(self.per_position)


def position_errors(got: list[tuple[int, torch.Tensor]], ref: torch.Tensor, top: int | None = None) -> Errors:
    """Errors of `got` rows against `ref` [positions, V]; `top`: only over ref's `top` most likely tokens."""
    errs = []
    for p, row in got:
        r = ref[p]
        if top is None:
            errs.append(float((row.double() - r).abs().max()))
        else:
            idx = r.topk(top).indices
            errs.append(float((row.double()[idx] - r[idx]).abs().max()))
    return Errors(errs)
