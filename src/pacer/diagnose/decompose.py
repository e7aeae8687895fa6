"""The latency decomposition: e2e = queue wait + prefill + decode + preemption loss, per request.

- queue = queue wait (first scheduled - arrival); 0 when the source has none (then prefill is
  all of TTFT, and the report says so);
- preemption = the measured loss (`preempted_time`: waiting preempted plus recompute or
  swap-in); where a source has only counts, estimated from the gaps: the longest gap's excess
  over the request's TPOT (`itl_max - tpot`), else its decode time's excess over the TPOT of the
  class's unpreempted requests;
- prefill = TTFT - queue - the preemption loss before the first token;
- decode = e2e - TTFT - the preemption loss after it.

The four parts add up to e2e exactly.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pacer.diagnose.records import Record

__all__ = ["Parts", "decompose", "decompose_all", "mean_parts", "reference_tpot", "PARTS"]

PARTS = ("queue", "prefill", "decode", "preemption")


@dataclass(frozen=True, slots=True)
class Parts:
    queue: float
    prefill: float
    decode: float
    preemption: float
    preemption_estimated: bool = False

    @property
    def total(self) -> float:
        return self.queue + self.prefill + self.decode + self.preemption

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in PARTS}


def _estimate_loss(r: Record, reference_tpot: float | None) -> float:
    """Preemption loss of a request that has only a preemption count."""
    if not r.preemptions:
        return 0.0
    decode = r.e2e - r.ttft
    if r.itl_max is not None and r.tpot is not None:
        return min(decode, max(0.0, r.itl_max - r.tpot))
    if reference_tpot is not None and r.output_tokens > 1:
        return min(decode, max(0.0, decode - (r.output_tokens - 1) * reference_tpot))
    return 0.0


def decompose(r: Record, reference_tpot: float | None = None) -> Parts:
    """One request's parts; `reference_tpot` is the TPOT of its class's unpreempted requests
    (used only to estimate the loss of a request with a preemption count and no gaps)."""
    queue = r.queue_wait or 0.0
    decode_side = r.e2e - r.ttft
    estimated = False
    if r.preempted_time is not None:
        if r.preempted_time_ttft is not None:
            before = r.preempted_time_ttft
        else:   # total only: the loss after the first token first, the rest before it
            before = max(0.0, r.preempted_time - decode_side)
        after = r.preempted_time - before
    else:
        before, after = 0.0, _estimate_loss(r, reference_tpot)
        estimated = after > 0
    return Parts(queue=queue, prefill=r.ttft - queue - before, decode=decode_side - after,
                 preemption=before + after, preemption_estimated=estimated)


def reference_tpot(records: Sequence[Record]) -> float | None:
    values = [r.tpot for r in records if not r.preemptions and r.tpot is not None]
    return statistics.median(values) if values else None


def decompose_all(records: Sequence[Record]) -> list[Parts]:
    """Parts of every record, with the class-level TPOT reference for estimated losses."""
    refs: dict[str, float | None] = {}
    out = []
    for r in records:
        if r.request_class not in refs:
            refs[r.request_class] = reference_tpot([x for x in records if x.request_class == r.request_class])
        out.append(decompose(r, refs[r.request_class]))
    return out


def mean_parts(parts: Sequence[Parts]) -> Parts:
    """The mean per request of each part (what `--json` reports as `decomposition`)."""
    n = len(parts)
    if not n:
        return Parts(0.0, 0.0, 0.0, 0.0)
    q, pre, dec, pm = (sum(getattr(p, k) for p in parts) / n for k in PARTS)
    return Parts(q, pre, dec, pm, preemption_estimated=any(p.preemption_estimated for p in parts))
