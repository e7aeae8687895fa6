"""Paged attention on packed variable-length batches (torch reference backend; CPU and GPU).

The packed batch puts every single-token row first (decodes, and any one-token chunk):
those are attended to in one batched call over their gathered block tables, with no Python
loop per request. Multi-token rows (prefill chunks) follow: with the C++ kernels, one call over all of them
reading the paged cache; on the torch path one SDPA call each, where a chunk that starts at
position 0 attends to its own keys directly and a later chunk also reads the earlier
context from the cache.

With a quantized cache (`kv_cache_dtype` int8 / fp8, kv_quant.py) keys and values are
quantised as they are written and dequantised as they are read, by the C++ kernels in
registers and here with the same arithmetic; every chunk then reads its keys from the cache,
so both paths see the same numbers.

A sliding-window layer (`window` > 0, Gemma 3) lets each query see only its `window` latest keys,
itself included (HF's and llama.cpp's rule), on both paths (the C++ kernels' portable loops).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pacer.model.kv_quant import KVFormat, dequantize, quantize, store_rows

__all__ = ["AttentionMetadata", "PrefillSeq", "ChunkSpan", "build_metadata", "paged_attention", "write_kv"]


@dataclass(slots=True)
class PrefillSeq:
    q_start: int            # row of its first token in the packed batch
    q_len: int
    start_pos: int          # tokens of this request already in the cache before this chunk
    block_table: torch.Tensor | None  # [num_blocks_of_request] long (torch path only)


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor          # [T] long: cache slot of each packed token
    num_single: int                     # leading rows with one token each
    single_block_tables: torch.Tensor | None   # [D, max_blocks] long (padded)
    single_mask: torch.Tensor | None    # [D, 1, 1, max_blocks*block_size] bool: key visible (torch path)
    single_context_lens: torch.Tensor | None  # [D] long (C++ path)
    prefills: list[PrefillSeq]
    # C++ path: (q_starts, q_lens, start_positions, padded block tables) of `prefills`, one row each
    prefill_batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # torch path, sliding layers: `single_mask` narrowed to the window, built by the first such layer
    single_window_mask: tuple[int, torch.Tensor] | None = None


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    """A multi-token row of the packed batch, as the executor lays it out."""

    q_start: int
    q_len: int
    start_pos: int
    block_table: list[int]   # the request's blocks up to the chunk's end


def build_metadata(slot_mapping: list[int], single_tables: list[list[int]], single_context_lens: list[int],
                   chunks: list[ChunkSpan], block_size: int, device: torch.device | str,
                   use_kernel: bool, prefill_kernel: bool | None = None) -> AttentionMetadata:
    """The step's tensors in the layout its backend reads: the C++ kernels take padded block
    tables and context lengths; the torch path takes a visibility mask for the single rows and
    one block table per chunk. `prefill_kernel` (default `use_kernel`): whether the chunks go to
    the C++ kernel too (`LlamaModel.rows_on_kernel`)."""
    prefill_kernel = use_kernel if prefill_kernel is None else prefill_kernel
    single_block_tables = single_mask = lens = None
    if single_tables:
        single_block_tables = _padded(single_tables, device)
        lens = torch.tensor(single_context_lens, device=device)
        if not use_kernel:
            positions = torch.arange(single_block_tables.shape[1] * block_size, device=device).unsqueeze(0)
            single_mask = (positions < lens.unsqueeze(1))[:, None, None, :]
    prefills = [PrefillSeq(c.q_start, c.q_len, c.start_pos,
                           None if prefill_kernel else torch.tensor(c.block_table, device=device)) for c in chunks]
    prefill_batch = None
    if chunks and prefill_kernel:
        prefill_batch = (torch.tensor([c.q_start for c in chunks], device=device),
                         torch.tensor([c.q_len for c in chunks], device=device),
                         torch.tensor([c.start_pos for c in chunks], device=device),
                         _padded([c.block_table for c in chunks], device))
    return AttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping, device=device), num_single=len(single_tables),
        single_block_tables=single_block_tables, single_mask=single_mask, single_context_lens=lens,
        prefills=prefills, prefill_batch=prefill_batch,
    )


def _padded(tables: list[list[int]], device: torch.device | str) -> torch.Tensor:
    """Block tables of different lengths as one [rows, longest] tensor, padded with block 0
    (never read: each row's context length bounds what a kernel or mask looks at)."""
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], device=device)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor, fmt: KVFormat | None = None,
             kv_scales: tuple[float, float] = (1.0, 1.0)) -> None:
    """Store this step's keys/values, quantised when `fmt` is. Caches are
    [num_blocks, block_size, n_kv, width] (width: head_dim, or head_dim + 2 for int8)."""
    if fmt is None or not fmt.quantized:
        store_rows(k_cache, k.to(k_cache.dtype), slot_mapping)
        store_rows(v_cache, v.to(v_cache.dtype), slot_mapping)
        return
    store_rows(k_cache, quantize(fmt, k, kv_scales[0]), slot_mapping)
    store_rows(v_cache, quantize(fmt, v, kv_scales[1]), slot_mapping)


def _gather(cache: torch.Tensor, block_table: torch.Tensor, fmt: KVFormat | None, scale: float,
            dtype: torch.dtype) -> torch.Tensor:
    """[..., blocks] table -> [..., blocks*block_size, n_kv, d] keys or values in `dtype`."""
    g = cache[block_table]
    g = g.view(*block_table.shape[:-1], -1, cache.shape[2], cache.shape[3])
    return g if fmt is None or not fmt.quantized else dequantize(fmt, g, dtype, scale)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    kernel: Any = None, fmt: KVFormat | None = None,
                    kv_scales: tuple[float, float] = (1.0, 1.0), window: int = 0) -> torch.Tensor:
    """q [T, n_heads, d]; k, v [T, n_kv, d] (already written to the cache). Returns [T, n_heads, d].

    `kernel`: the compiled module of `kernels.py`, or None for the torch reference path;
    `fmt` / `kv_scales`: the cache's format and this layer's (k, v) scales; `window`: the layer's
    sliding window (0: none)."""
    out = torch.empty_like(q)
    n_single = meta.num_single
    if n_single and kernel is not None:
        assert meta.single_block_tables is not None and meta.single_context_lens is not None
        kernel.paged_decode_attention(out[:n_single], q[:n_single], k_cache, v_cache,
                                      meta.single_block_tables, meta.single_context_lens, scale, *kv_scales, window)
    elif n_single:
        _single_rows(out, q, k_cache, v_cache, meta, scale, fmt, kv_scales, window)
    if meta.prefills and kernel is not None and meta.prefill_batch is not None:
        kernel.paged_prefill_attention(out, q, k_cache, v_cache, *meta.prefill_batch, scale, *kv_scales, window)
    elif meta.prefills:
        _prefill_rows(out, q, k, v, k_cache, v_cache, meta.prefills, scale, fmt, kv_scales, window)
    return out


def _compute_dtype(q: torch.Tensor, fmt: KVFormat | None) -> torch.dtype:
    """A quantized cache is dequantised to float32 and attended to in float32, as the kernels do."""
    return torch.float32 if fmt is not None and fmt.quantized else q.dtype


def _single_rows(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata, scale: float, fmt: KVFormat | None,
                 kv_scales: tuple[float, float], window: int = 0) -> None:
    assert meta.single_block_tables is not None and meta.single_mask is not None
    n, cdt = meta.num_single, _compute_dtype(q, fmt)
    mask = meta.single_mask
    if window:
        if meta.single_window_mask is None or meta.single_window_mask[0] != window:
            assert meta.single_context_lens is not None
            keys_at = torch.arange(mask.shape[-1], device=mask.device).unsqueeze(0)
            newest = (keys_at >= meta.single_context_lens.unsqueeze(1) - window)[:, None, None, :]
            meta.single_window_mask = (window, mask & newest)
        mask = meta.single_window_mask[1]
    keys = _gather(k_cache, meta.single_block_tables, fmt, kv_scales[0], cdt).transpose(1, 2)   # [D, n_kv, S, d]
    vals = _gather(v_cache, meta.single_block_tables, fmt, kv_scales[1], cdt).transpose(1, 2)
    qs = q[:n].to(cdt).unsqueeze(2)                                               # [D, n_heads, 1, d]
    o = F.scaled_dot_product_attention(qs, keys, vals, attn_mask=mask, scale=scale, enable_gqa=True)
    out[:n] = o.squeeze(2)


def _prefill_rows(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, prefills: list[PrefillSeq], scale: float, fmt: KVFormat | None,
                  kv_scales: tuple[float, float], window: int = 0) -> None:
    cdt = _compute_dtype(q, fmt)
    reads_cache = fmt is not None and fmt.quantized   # then its own keys too, as stored
    for p in prefills:
        qs = q[p.q_start:p.q_start + p.q_len].to(cdt).transpose(0, 1).unsqueeze(0)   # [1, H, L, d]
        if p.start_pos == 0 and not reads_cache and not (window and p.q_len > window):
            ks = k[p.q_start:p.q_start + p.q_len].transpose(0, 1).unsqueeze(0)
            vs = v[p.q_start:p.q_start + p.q_len].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        else:
            assert p.block_table is not None, "the torch path needs each chunk's block table"
            ctx = p.start_pos + p.q_len
            ks = _gather(k_cache, p.block_table, fmt, kv_scales[0], cdt)[:ctx].transpose(0, 1).unsqueeze(0)
            vs = _gather(v_cache, p.block_table, fmt, kv_scales[1], cdt)[:ctx].transpose(0, 1).unsqueeze(0)
            rows = torch.arange(p.q_len, device=q.device).unsqueeze(1) + p.start_pos
            keys_at = torch.arange(ctx, device=q.device).unsqueeze(0)
            mask = keys_at <= rows
            if window:
                mask &= keys_at > rows - window
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
        out[p.q_start:p.q_start + p.q_len] = o.squeeze(0).transpose(0, 1)
