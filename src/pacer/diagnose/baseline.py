"""What a request would take alone on the hardware: the cost model's isolated prefill of its
uncached prompt and its batch-1 decode steps. `pacer diagnose` names as the bottleneck the part
with the largest excess over this (queue wait and preemption loss are all excess)."""

from __future__ import annotations

import functools

from pacer.perf.cost_model import BatchFeatures, CostModel, make_cost_model
from pacer.perf.profiles import get_hardware, get_model

__all__ = ["Baseline"]


class Baseline:
    def __init__(self, hardware: str = "cpu-local", model: str | None = None, tp: int = 1) -> None:
        hw, m = get_hardware(hardware), get_model(model)
        self.description = f"{m.name} alone on {hw.name}" + (f" x{tp}" if tp > 1 else "")
        self._cm: CostModel = make_cost_model(hw, m, hw.default_dtype, tp, 16)

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one Baseline per run; keys are rounded ints
    def _prefill(self, n: int) -> float:
        f = BatchFeatures(num_tokens=n, num_seqs=1, num_chunks=1, chunk_attn_pairs=n * (n + 1) // 2,
                          chunk_kv_tokens=n, num_sampled=1, num_prefill_tokens=n)
        return self._cm.step_cost(f).time_s

    @functools.lru_cache(maxsize=4096)  # noqa: B019
    def _decode(self, ctx: int) -> float:
        f = BatchFeatures(num_tokens=1, num_seqs=1, num_single=1, single_kv_tokens=ctx, single_max_ctx=ctx,
                          num_sampled=1, num_decode_tokens=1)
        return self._cm.step_cost(f).time_s

    def prefill_s(self, tokens: int) -> float:
        return self._prefill(_round(tokens))

    def tpot_s(self, context: int) -> float:
        return self._decode(_round(context))

    def decode_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """Output tokens after the first at batch 1, at the mean context."""
        return max(0, output_tokens - 1) * self.tpot_s(prompt_tokens + output_tokens // 2)


def _round(n: int) -> int:
    return max(1, (int(n) + 15) // 16 * 16)
