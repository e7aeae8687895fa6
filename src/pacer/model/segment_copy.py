"""Segment KV copies on the KV cache tensors (the executor's half of segment reuse,
`pacer.sched.segments`): token slots copied from a stored segment into a request's blocks, or
from a request's blocks into the store, with K re-rotated by RoPE.

RoPE rotates each (2i, 2i + d/2) pair of a key by position * inv_freq[i]; rotations compose, so a
key stored at position s becomes the key at position s + delta by one more rotation of
delta * inv_freq (V carries no position and is copied as stored). A quantized cache is
dequantized, rotated in float32 and quantized again with the format's own arithmetic (int8: a
fresh per-token scale; fp8: the layer's scale), so the written rows are what `write_kv` would
store for those values.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pacer.kv.segment_store import SegmentCopy
from pacer.model.kv_quant import KVFormat, dequantize, quantize

__all__ = ["apply_segment_copies", "rotate_keys", "rotation"]


def rotation(delta: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, 1, d/2] (float32) of `delta` [T] positions (angles in float64: a large
    delta times a small frequency keeps its precision)."""
    angles = delta.to(torch.float64).unsqueeze(1) * inv_freq.to(torch.float64).unsqueeze(0)   # [T, d/2]
    return angles.cos().float().unsqueeze(1), angles.sin().float().unsqueeze(1)


def rotate_keys(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """k [T, heads, d] (float32, rotate_half layout) rotated by the angles of `rotation`."""
    half = k.shape[-1] // 2
    k1, k2 = k[..., :half], k[..., half:]
    return torch.cat((k1 * cos - k2 * sin, k2 * cos + k1 * sin), dim=-1)


def _flat(cache: torch.Tensor) -> torch.Tensor:
    """[blocks, block_size, heads, width] -> [slots, heads, width]; float8 through its bytes."""
    flat = cache.view(-1, cache.shape[2], cache.shape[3])
    return flat.view(torch.uint8) if flat.element_size() == 1 and flat.dtype != torch.int8 else flat


def apply_segment_copies(kv_caches: list[tuple[torch.Tensor, torch.Tensor]], copies: Sequence[SegmentCopy],
                         fmt: KVFormat, inv_freqs: Sequence[torch.Tensor]) -> int:
    """Run `copies` (in one gather and one scatter per layer and tensor); returns tokens copied.
    `inv_freqs`: each layer's rope frequencies (`LlamaModel.layer_inv_freqs`)."""
    copies = [c for c in copies if c.num_tokens]
    if not copies:
        return 0
    device = kv_caches[0][0].device
    src = torch.tensor([s for c in copies for s in c.src_slots], device=device)
    dst = torch.tensor([s for c in copies for s in c.dst_slots], device=device)
    deltas = [c.position_delta for c in copies for _ in range(c.num_tokens)]
    delta_t = torch.tensor(deltas, device=device) if any(deltas) else None
    rotations: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # by the frequencies' identity
    for layer, (k_cache, v_cache) in enumerate(kv_caches):
        inv = inv_freqs[layer]
        if delta_t is not None and id(inv) not in rotations:
            rotations[id(inv)] = rotation(delta_t, inv)
        cos_sin = rotations.get(id(inv))
        k_flat, v_flat = _flat(k_cache), _flat(v_cache)
        v_flat.index_copy_(0, dst, v_flat.index_select(0, src))
        rows = k_flat.index_select(0, src)
        if cos_sin is not None:
            k_scale = fmt.scales(layer)[0]
            stored = rows.view(k_cache.dtype) if rows.dtype != k_cache.dtype else rows
            keys = dequantize(fmt, stored, torch.float32, k_scale)
            keys = rotate_keys(keys, *cos_sin)
            rows = quantize(fmt, keys, k_scale)
            if rows.dtype != k_flat.dtype:
                rows = rows.view(k_flat.dtype)
        k_flat.index_copy_(0, dst, rows)
    return len(deltas)
