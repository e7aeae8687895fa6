"""Token masks of one step, computed on a side thread while the model's forward runs.

The engine starts a `TokenMasks` right after scheduling, for the constrained requests that
sample this step; the executor calls `apply()` after its forward, before sampling. On the
mask thread llguidance fills a preallocated packed bitmask ([rows, vocab/32] int32, 6 KB a
row for a 49k vocabulary) with the GIL released, on the cores torch's threads leave (at least
one). `apply` then writes -inf into the forbidden entries of the constrained rows in place,
straight from the bits (the C++ kernel `apply_token_bitmask_`: one pass a row, nothing
allocated); without the kernels it unpacks the picked rows into a float bias (numpy, one
table gather) and adds it in place. Rows without a constraint are never touched.

Cost on this machine (2 cores, SmolLM2's 49k vocabulary, 16 JSON-schema rows): the fill ~5-30
us a row (more on the first visit of a lexer state). Unpacking every row to a float bias on
the mask thread, as this module first did, took ~15 us a row alone and ~50-120 us beside
the forward (4 bytes a token written, the forward's cache evicted), and slowed the forward
itself: a 16-row decode step ran ~8% slower than its unconstrained twin.
`pacer.sim.structured` prices masks with these figures.
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


_TABLE = _byte_table()


class TokenMasks:
    """The masks of one step: request id -> row of `bitmask()` ([rows, ceil(vocab/32)] int32)."""

    def __init__(self, request_ids: Sequence[str], future: Future[torch.Tensor], stats: Any,
                 kernels: Any | None = None) -> None:
        self.rows = {rid: i for i, rid in enumerate(request_ids)}
        self._future = future
        self._stats = stats
        self._kernels = kernels   # pacer's C++ kernels (None: the bias fallback)
        self._bits: torch.Tensor | None = None

    def bitmask(self) -> torch.Tensor:
        """Wait for the masks (time counted as the step's mask wait) and return them packed."""
        if self._bits is None:
            t0 = time.perf_counter()
            self._bits = self._future.result()
            self._stats.add_mask_wait(time.perf_counter() - t0)
        return self._bits

    def apply(self, logits: torch.Tensor, request_ids: Sequence[str]) -> torch.Tensor:
        """Mask, in place, the rows of `logits` ([len(request_ids), V]) whose request is
        constrained (forbidden tokens, and ids past the tokenizer's, to -inf); returns `logits`."""
        picked = [(i, self.rows[rid]) for i, rid in enumerate(request_ids) if rid in self.rows]
        if not picked:
            return logits
        bits = self.bitmask()
        dst = torch.tensor([i for i, _ in picked], dtype=torch.int64)
        src = torch.tensor([j for _, j in picked], dtype=torch.int64)
        with torch.inference_mode():   # the forward's logits are inference tensors
            if self._kernels is not None and logits.device.type == "cpu" and logits.stride(-1) == 1:
                self._kernels.apply_token_bitmask_(logits, bits, dst, src)
            else:
                _apply_bias(logits, bits, dst, src)
        return logits


def _apply_bias(logits: torch.Tensor, bits: torch.Tensor, dst: torch.Tensor, src: torch.Tensor) -> None:
    """The fallback without the C++ kernels: the picked rows unpacked to a float bias, added."""
    packed = bits.numpy()[src.numpy()]
    bias = torch.from_numpy(np.take(_TABLE, packed.view(np.uint8), axis=0).reshape(len(packed), -1))
    width = min(logits.shape[-1], bias.shape[1])
    bias = bias.to(device=logits.device, dtype=logits.dtype)
    dst = dst.to(logits.device)
    logits[:, :width].index_add_(0, dst, bias[:, :width])
    if logits.shape[-1] > width:
        logits[dst, width:] = float("-inf")


class MaskComputer:
    """Owns the mask thread, llguidance's parallel executor and the bitmask buffers."""

    def __init__(self, vocab_size: int, stats: Any, num_threads: int | None = None) -> None:
        import llguidance as llg

        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._stats = stats
        if num_threads is None:   # the cores torch's threads leave (1 here: 2 cores, 2 torch threads)
            num_threads = max(1, (os.cpu_count() or 1) - torch.get_num_threads())
        self._llexec = llg.LLExecutor(num_threads)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pacer-masks")
        # two bitmask buffers, used by alternate steps, so a step's masks are never overwritten
        # while they may still be read (the engine's per-request retry re-reads them)
        self._buffers: list[np.ndarray] = []
        self._flip = 0
        from pacer.model import kernels

        self._kernels = kernels.load()   # built (or found) now, not in the first constrained step

    def start(self, items: Sequence[tuple[str, Any]]) -> TokenMasks:
        """Begin computing the masks of `(request id, matcher)` pairs (matchers must not be
        advanced until the result was read)."""
        matchers = [m for _, m in items]
        future = self._pool.submit(self._compute, matchers)
        return TokenMasks([rid for rid, _ in items], future, self._stats, self._kernels)

    def _take_buffer(self, rows: int) -> np.ndarray:
        if not self._buffers or self._buffers[0].shape[0] < rows:
            cap = max(rows, 2 * (self._buffers[0].shape[0] if self._buffers else 8))
            self._buffers = [np.empty((cap, self.words), dtype=np.int32) for _ in range(2)]
        self._flip ^= 1
        return self._buffers[self._flip][:rows]

    def _compute(self, matchers: list[Any]) -> torch.Tensor:
        t0 = time.perf_counter()
        rows = len(matchers)
        packed = self._take_buffer(rows)
        self._llexec.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], packed.ctypes.data,
                                             self.words * 4, rows)
        self._stats.add_mask_compute(time.perf_counter() - t0, rows)
        return torch.from_numpy(packed)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
