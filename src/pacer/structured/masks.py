"""Token masks of one step, computed on a side thread while the model's forward runs.

The engine starts a `TokenMasks` right after scheduling, for the constrained requests that
sample this step; the executor calls `apply()` after its forward, before sampling. On the
mask thread llguidance fills a preallocated packed bitmask ([rows, vocab/32] int32) with the
GIL released (on the cores torch's threads leave, at least one), and numpy unpacks it into a preallocated additive float bias (0 allowed, -inf
forbidden) with one table gather, also GIL-free and single-threaded (it never competes with
torch's intra-op threads for more than one core). What the step waits for after its forward
is at most the rest of that work; applying the masks is one in-place `index_add_` over the
constrained rows of the logits. Rows without a constraint are never touched, and a step
allocates nothing but two small index tensors.

Cost on this machine (2 cores, SmolLM2's 49k vocabulary, 16 JSON-schema rows, torch at 1
thread): the fill ~5-30 us per row (more on the first visit of a lexer state), the unpack
~15 us per row (a per-step torch gather with int64 indices took ~60-120), the apply ~4 us per
row (the old out-of-place index_add ~12-23). `pacer.sim.structured` prices masks with these.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

__all__ = ["TokenMasks", "MaskComputer"]


def _byte_table() -> np.ndarray:
    """[256, 8] float32: bit i of byte b as 0.0 (allowed) or -inf (forbidden)."""
    bits = (np.arange(256)[:, None] >> np.arange(8)) & 1
    return np.where(bits.astype(bool), np.float32(0.0), np.float32(-np.inf)).astype(np.float32)


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
        """Mask, in place, the rows of `logits` ([len(request_ids), V]) whose request is
        constrained; returns `logits`."""
        picked = [(i, self.rows[rid]) for i, rid in enumerate(request_ids) if rid in self.rows]
        if not picked:
            return logits
        bias = self.bias()
        if bias.device != logits.device or bias.dtype != logits.dtype:
            bias = bias.to(device=logits.device, dtype=logits.dtype)
        width = min(logits.shape[-1], bias.shape[1])
        dst = torch.tensor([i for i, _ in picked], device=logits.device)
        src = [j for _, j in picked]
        with torch.inference_mode():   # the forward's logits are inference tensors
            if src != list(range(bias.shape[0])):   # a subset or another order (rows with drafts)
                bias = bias.index_select(0, torch.tensor(src, device=bias.device))
            logits[:, :width].index_add_(0, dst, bias[:, :width])
            if logits.shape[-1] > width:   # logits wider than the tokenizer: the extra ids are never allowed
                logits[dst, width:] = float("-inf")
        return logits


class MaskComputer:
    """Owns the mask thread, llguidance's parallel executor and the mask buffers."""

    def __init__(self, vocab_size: int, stats: Any, num_threads: int | None = None) -> None:
        import llguidance as llg

        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._stats = stats
        if num_threads is None:   # the cores torch's threads leave (1 here: 2 cores, 2 torch threads)
            num_threads = max(1, (os.cpu_count() or 1) - torch.get_num_threads())
        self._llexec = llg.LLExecutor(num_threads)
        self._table = _byte_table()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pacer-masks")
        # two sets of (packed, bias) buffers, used by alternate steps, so a step's bias is never
        # overwritten while it may still be read (the engine's per-request retry re-reads it)
        self._buffers: list[tuple[np.ndarray, np.ndarray]] = []
        self._flip = 0

    def start(self, items: Sequence[tuple[str, Any]]) -> TokenMasks:
        """Begin computing the masks of `(request id, matcher)` pairs (matchers must not be
        advanced until the result was read)."""
        matchers = [m for _, m in items]
        future = self._pool.submit(self._compute, matchers)
        return TokenMasks([rid for rid, _ in items], future, self._stats)

    def _take_buffers(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        if not self._buffers or self._buffers[0][0].shape[0] < rows:
            cap = max(rows, 2 * (self._buffers[0][0].shape[0] if self._buffers else 8))
            self._buffers = [(np.empty((cap, self.words), dtype=np.int32),
                              np.empty((cap, self.words * 32), dtype=np.float32)) for _ in range(2)]
        self._flip ^= 1
        packed, bias = self._buffers[self._flip]
        return packed[:rows], bias[:rows]

    def _compute(self, matchers: list[Any]) -> torch.Tensor:
        t0 = time.perf_counter()
        rows = len(matchers)
        packed, bias = self._take_buffers(rows)
        self._llexec.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], packed.ctypes.data,
                                             self.words * 4, rows)
        np.take(self._table, packed.view(np.uint8).reshape(-1), axis=0, out=bias.reshape(-1, 8))
        self._stats.add_mask_compute(time.perf_counter() - t0, rows)
        return torch.from_numpy(bias)[:, :self.vocab_size]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
