"""Token masks of one step, computed on a side thread while the model's forward runs.

The engine starts a `TokenMasks` right after scheduling, for the constrained requests that
sample this step; the executor calls `bias()` after its forward and adds the result to those
rows' logits before sampling. llguidance fills a packed bitmask with the GIL released; this
thread then unpacks it into an additive float bias (0 allowed, -inf forbidden), so what the
step waits for after its forward is at most the rest of that work, and applying the mask is
one add over the constrained rows. Rows without a constraint are never touched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["TokenMasks", "MaskComputer"]


def _byte_table() -> torch.Tensor:
    """[256, 8] float: bit i of byte b as 0.0 (allowed) or -inf (forbidden)."""
    bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
    return torch.where(bits.bool(), 0.0, float("-inf")).to(torch.float32)


class TokenMasks:
    """The masks of one step: request id -> row of `bias()` ([rows, vocab] float32)."""

    def __init__(self, request_ids: Sequence[str], future: Future[torch.Tensor], stats: Any) -> None:
        self.rows = {rid: i for i, rid in enumerate(request_ids)}
        self._future = future
        self._stats = stats
        self._bias: torch.Tensor | None = None

    def bias(self) -> torch.Tensor:
        """Wait for the masks (time counted as the step's mask wait) and return the bias."""
        if self._bias is None:
            t0 = time.perf_counter()
            self._bias = self._future.result()
            self._stats.add_mask_wait(time.perf_counter() - t0)
        return self._bias

    def apply(self, logits: torch.Tensor, request_ids: Sequence[str]) -> torch.Tensor:
        """Mask the rows of `logits` ([len(request_ids), V]) whose request is constrained;
        returns logits (a new tensor when any row was masked)."""
        picked = [(i, self.rows[rid]) for i, rid in enumerate(request_ids) if rid in self.rows]
        if not picked:
            return logits
        bias = self.bias().to(device=logits.device, dtype=logits.dtype)
        vocab = logits.shape[-1]
        if bias.shape[1] < vocab:   # logits wider than the tokenizer: the extra ids are never allowed
            pad = torch.full((bias.shape[0], vocab - bias.shape[1]), float("-inf"), dtype=bias.dtype,
                             device=bias.device)
            bias = torch.cat([bias, pad], dim=1)
        dst = torch.tensor([i for i, _ in picked], device=logits.device)
        src = torch.tensor([j for _, j in picked], device=bias.device)
        return logits.index_add(0, dst, bias[:, :vocab].index_select(0, src))


class MaskComputer:
    """Owns the mask thread and llguidance's parallel executor."""

    def __init__(self, vocab_size: int, stats: Any, num_threads: int | None = None) -> None:
        import llguidance as llg

        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._stats = stats
        self._llexec = llg.LLExecutor(num_threads)
        self._table = _byte_table()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pacer-masks")
        self._lock = threading.Lock()

    def start(self, items: Sequence[tuple[str, Any]]) -> TokenMasks:
        """Begin computing the masks of `(request id, matcher)` pairs (matchers must not be
        advanced until the result was read)."""
        matchers = [m for _, m in items]
        future = self._pool.submit(self._compute, matchers)
        return TokenMasks([rid for rid, _ in items], future, self._stats)

    def _compute(self, matchers: list[Any]) -> torch.Tensor:
        t0 = time.perf_counter()
        rows = len(matchers)
        packed = torch.zeros((rows, self.words), dtype=torch.int32)
        self._llexec.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], packed.data_ptr(),
                                             self.words * 4, rows)
        bias = self._table[packed.view(torch.uint8).long()].view(rows, -1)[:, :self.vocab_size].contiguous()
        self._stats.add_mask_compute(time.perf_counter() - t0, rows)
        return bias

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
