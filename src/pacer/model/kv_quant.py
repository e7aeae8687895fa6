"""KV cache storage formats (`kv_cache_dtype`, vLLM's names) and their torch reference arithmetic.

- ``auto``: the model's dtype, ``[blocks, block_size, kv_heads, head_dim]``.
- ``int8``: int8 values followed by a float16 scale per (token, kv head),
  ``[blocks, block_size, kv_heads, head_dim + 2]`` int8; ``x = q * scale`` with
  ``scale = max|x| / 127`` rounded to float16 first.
- ``fp8`` / ``fp8_e4m3`` (float8 e4m3fn) and ``fp8_e5m2``: ``x = f8 * scale``, one float32
  scale per layer for K and one for V (1.0, vLLM's default, unless calibrated).

The C++ kernels (csrc/kv_quant.h) read and write the same bytes with the same arithmetic;
this module is what the torch path and the parity tests use. It owns no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pacer.config import KV_CACHE_DTYPES

__all__ = ["KV_CACHE_DTYPES", "KVFormat", "kv_format", "quantize", "dequantize", "store_rows", "FP8_MAX"]
_STORAGE = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
_INV_127 = 1.0 / 127.0


@dataclass(frozen=True, slots=True)
class KVFormat:
    """How one engine's KV cache is stored; `k_scales` / `v_scales` (per layer) apply to fp8."""

    name: str                       # auto | int8 | fp8_e4m3 | fp8_e5m2 ("fp8" resolves to fp8_e4m3)
    storage: torch.dtype            # element dtype of the cache tensors
    k_scales: tuple[float, ...] = ()
    v_scales: tuple[float, ...] = ()

    @property
    def quantized(self) -> bool:
        return self.name != "auto"

    def head_width(self, head_dim: int) -> int:
        """Elements per (token, kv head) in the cache tensor's last dimension."""
        return head_dim + 2 if self.name == "int8" else head_dim

    def bytes_per_token(self, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        """K and V bytes of one token over all layers, scales included."""
        el = torch.tensor([], dtype=self.storage).element_size()
        return 2 * num_layers * num_kv_heads * self.head_width(head_dim) * el

    def scales(self, layer: int) -> tuple[float, float]:
        if self.k_scales:
            return self.k_scales[layer], self.v_scales[layer]
        return 1.0, 1.0

    def with_scales(self, k_scales: list[float], v_scales: list[float]) -> KVFormat:
        return KVFormat(self.name, self.storage, tuple(k_scales), tuple(v_scales))


def kv_format(name: str, model_dtype: torch.dtype) -> KVFormat:
    """The format of `kv_cache_dtype=name` for a model computing in `model_dtype`."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got {name!r}")
    if name == "auto":
        return KVFormat("auto", model_dtype)
    resolved = "fp8_e4m3" if name == "fp8" else name
    return KVFormat(resolved, _STORAGE[resolved])


def quantize(fmt: KVFormat, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """x [..., head_dim] (any float dtype) -> stored rows [..., head_width] of `fmt.storage`."""
    if not fmt.quantized:
        return x.to(fmt.storage)
    xf = x.float()
    if fmt.name == "int8":
        amax = xf.abs().amax(dim=-1, keepdim=True)
        s16 = (amax * _INV_127).to(torch.float16)
        s = s16.float()
        inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
        q = torch.round(xf * inv).clamp_(-127, 127).to(torch.int8)
        return torch.cat((q, s16.view(torch.int8)), dim=-1)
    lim = FP8_MAX[fmt.name]
    inv_scale = float(torch.tensor(1.0 / scale, dtype=torch.float32))
    return (xf * inv_scale).clamp_(-lim, lim).to(fmt.storage)


def dequantize(fmt: KVFormat, stored: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Stored rows [..., head_width] -> values [..., head_dim] in `dtype` (float32 arithmetic)."""
    if not fmt.quantized:
        return stored.to(dtype)
    if fmt.name == "int8":
        d = stored.shape[-1] - 2
        s = stored[..., d:].contiguous().view(torch.float16).float()
        return (stored[..., :d].float() * s).to(dtype)
    return (stored.float() * float(torch.tensor(scale, dtype=torch.float32))).to(dtype)


def store_rows(cache: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """cache [blocks, block_size, kv_heads, width][slot] = rows [T, kv_heads, width], by slot.

    Float8 tensors have no index_copy_ on CPU: they are written through a uint8 view."""
    nkv, w = cache.shape[2], cache.shape[3]
    flat = cache.view(-1, nkv, w)
    if cache.element_size() == 1 and cache.dtype != torch.int8:
        flat, rows = flat.view(torch.uint8), rows.view(torch.uint8)
    flat.index_copy_(0, slot_mapping, rows)
