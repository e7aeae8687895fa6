"""Weight-only quantized linears: GGUF Q4_0 / Q4_1 / Q8_0 blocks kept packed, and int8 for float
checkpoints, computed by the C++ kernel in csrc_quant/ (dispatched on CPU features at run time).

One packed layout serves every format (`QuantWeight`): blocks of 32 weights along K, each with a
float32 scale `d` and, for 4-bit blocks, an offset `m`, so w = d * q + m (Q4_1; Q4_0 is Q4_1 with
m = -8d) or w = d * q (Q8_0 and int8, q signed). GGUF's raw blocks are repacked into it once at
load (a slice and a float16 -> float32 cast per field; the nibbles keep GGUF's order).

Activations are float (`act="float"`: each row is dequantized inside the kernel, the result is the
dequantized float32 path's up to summation order) or int8 per token and block of 32
(`act="int8"`: integer dot products, llama.cpp's approach, over a tiled copy of the blocks that
serves 16 rows per vector: `tile_weight`). With float activations and many tokens the kernel
dequantizes panels of rows that stay in cache and multiplies them by BLAS. Paths: "scalar", "avx2",
"avx512vnni"; the fastest the CPU runs unless forced by argument or `PACER_QUANT_ISA`. Without the
compiled kernel the weight is dequantized once and run with `F.linear` (the torch path).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["QuantWeight", "QuantLinear", "from_gguf_blocks", "quantize_int8", "dequantize", "available_isas", "tile_weight",
           "GGUF_BLOCK_TYPES", "ISAS", "QUANT_ACTIVATIONS"]

log = logging.getLogger("pacer.model")

QK = 32
ISAS = ("scalar", "avx2", "avx512vnni")
QUANT_ACTIVATIONS = ("float", "int8")
# GGUF type name -> (bytes per block, bits of our layout)
GGUF_BLOCK_TYPES = {"Q4_0": (18, 4), "Q4_1": (20, 4), "Q8_0": (34, 8)}
# Float activations: from this many rows on, dequantize panels of rows into a buffer that stays in
# cache and run BLAS on each (measured: the one-row kernel is faster below, BLAS above).
PANEL_MIN_ROWS = 8
PANEL_BYTES = 1 << 20    # float32 bytes of one dequantized panel (about L2: 0.72-0.79x float32 alone, 8 MB 0.51-0.68x)


@dataclass(frozen=True, slots=True)
class QuantWeight:
    """A [N, K] weight as blocks of 32: qs uint8 [N, K/32, 16 (4-bit) or 32 (8-bit, int8 bits)],
    d float32 [N, K/32], m float32 [N, K/32] for 4-bit (empty for 8-bit)."""

    fmt: str            # where it came from: Q4_0 | Q4_1 | Q8_0 | int8
    bits: int
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.qs.shape[0]), int(self.qs.shape[1]) * QK

    @property
    def nbytes(self) -> int:
        """Bytes a GEMV reads: the packed values and their float32 scales and offsets."""
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m))

    def rows(self, index: torch.Tensor) -> QuantWeight:
        """The weight with its rows reordered (index into N)."""
        m = self.m[index].contiguous() if self.m.numel() else self.m
        return QuantWeight(self.fmt, self.bits, self.qs[index].contiguous(), self.d[index].contiguous(), m)

    @staticmethod
    def cat(parts: list[QuantWeight]) -> QuantWeight:
        """Row-wise concatenation (the fused qkv and gate_up projections)."""
        bits = {p.bits for p in parts}
        if len(bits) != 1 or len({p.shape[1] for p in parts}) != 1:
            raise ValueError(f"cannot fuse quantized weights of shapes/bits {[(p.shape, p.bits) for p in parts]}")
        fmt = parts[0].fmt if len({p.fmt for p in parts}) == 1 else "mixed"
        m = torch.cat([p.m for p in parts]) if parts[0].bits == 4 else parts[0].m
        return QuantWeight(fmt, parts[0].bits, torch.cat([p.qs for p in parts]), torch.cat([p.d for p in parts]), m)


def from_gguf_blocks(type_name: str, raw: np.ndarray, shape: tuple[int, int]) -> QuantWeight:
    """Repack a GGUF tensor's raw blocks (uint8 [N, K/32 * block bytes]) for the kernel."""
    if type_name not in GGUF_BLOCK_TYPES:
        raise ValueError(f"GGUF type {type_name} has no packed kernel (supported: {sorted(GGUF_BLOCK_TYPES)})")
    size, bits = GGUF_BLOCK_TYPES[type_name]
    n, k = shape
    if k % QK:
        raise ValueError(f"quantized weight K={k} is not a multiple of {QK}")
    blocks = np.ascontiguousarray(raw).reshape(n, k // QK, size)

    def f16(lo: int) -> torch.Tensor:
        return torch.from_numpy(blocks[..., lo:lo + 2].copy().view(np.float16)[..., 0].astype(np.float32))

    d = f16(0)
    if type_name == "Q4_1":
        m, qs = f16(2), blocks[..., 4:20]
    elif type_name == "Q4_0":
        m, qs = -8.0 * d, blocks[..., 2:18]
    else:
        m, qs = torch.empty(0), blocks[..., 2:34]
    return QuantWeight(type_name, bits, torch.from_numpy(np.ascontiguousarray(qs)), d.contiguous(), m.contiguous())


def quantize_int8(w: torch.Tensor) -> QuantWeight:
    """Symmetric int8 per block of 32 along K (scale max|w| / 127): weight-only int8."""
    n, k = w.shape
    if k % QK:
        raise ValueError(f"int8 quantization needs in_features divisible by {QK}, got {k}")
    blocks = w.detach().float().reshape(n, k // QK, QK)
    d = blocks.abs().amax(dim=-1) / 127.0
    q = torch.round(blocks / d.clamp_min(1e-30).unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return QuantWeight("int8", 8, q.view(torch.uint8).contiguous(), d.contiguous(), torch.empty(0))


def dequantize(qw: QuantWeight) -> torch.Tensor:
    """The float32 [N, K] weight (torch reference: what the kernel must match)."""
    n, k = qw.shape
    if qw.bits == 4:
        q = torch.cat([qw.qs & 15, qw.qs >> 4], dim=-1).float()
        return (qw.d.unsqueeze(-1) * q + qw.m.unsqueeze(-1)).reshape(n, k)
    return (qw.d.unsqueeze(-1) * qw.qs.view(torch.int8).float()).reshape(n, k)


def tile_weight(qw: QuantWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tiled layout of the int8-activation kernels (csrc_quant/quant_tiled.h): rows in groups
    of 16, and 4 consecutive values of each of the 16 rows side by side, so one vector holds a
    group's 4 values and a broadcast of 4 activation bytes multiplies them all. Returns (qt, dt, mt)."""
    n, k = qw.shape
    nb, g = k // QK, -(-n // 16)
    if qw.bits == 4:
        q = torch.cat([qw.qs & 15, qw.qs >> 4], dim=-1)          # [N, nb, 32] in element order
    else:
        q = (qw.qs.view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
    q = F.pad(q, (0, 0, 0, 0, 0, g * 16 - n)).reshape(g, 16, nb, 8, 4).permute(0, 2, 3, 1, 4)
    if qw.bits == 4:
        q = q[:, :, :4] | (q[:, :, 4:] << 4)                   # quads j and j + 4 share a byte
    dt = F.pad(qw.d, (0, 0, 0, g * 16 - n)).reshape(g, 16, nb).transpose(1, 2)
    mt = F.pad(qw.m, (0, 0, 0, g * 16 - n)).reshape(g, 16, nb).transpose(1, 2) if qw.bits == 4 else torch.empty(0)
    return q.contiguous(), dt.contiguous(), mt.contiguous()


def _kernel() -> Any | None:
    from pacer.model import kernels

    return kernels.load_quant()


def available_isas() -> tuple[str, ...]:
    """The kernel paths this CPU runs (empty when the kernel cannot be built)."""
    k = _kernel()
    return tuple(k.cpu_isas()) if k is not None else ()


def _resolve_isa(isa: str | None) -> str:
    isa = isa or os.environ.get("PACER_QUANT_ISA") or "auto"
    k = _kernel()
    if isa == "torch" or k is None:
        if isa not in ("auto", "torch"):
            raise RuntimeError(f"quantized-linear path {isa!r} needs the C++ kernel, which could not be built")
        return "torch"
    if isa == "auto":
        return ISAS[k.best_isa()]
    if isa not in ISAS:
        raise ValueError(f"PACER_QUANT_ISA / isa must be one of auto, torch, {', '.join(ISAS)}; got {isa!r}")
    if isa not in k.cpu_isas():
        raise ValueError(f"quantized-linear path {isa!r} is not supported on this CPU (it runs {k.cpu_isas()})")
    return isa


class QuantLinear:
    """`y = x @ W.T + bias` over a `QuantWeight` (float32 activations in and out, CPU)."""

    __slots__ = ("weight", "bias", "act", "isa", "out_features", "in_features", "_isa_id", "_kernel", "_float",
                 "_tiled", "_panel_rows")

    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None = None, act: str = "float",
                 isa: str | None = None) -> None:
        if act not in QUANT_ACTIVATIONS:
            raise ValueError(f"quant_activations must be one of {', '.join(QUANT_ACTIVATIONS)}; got {act!r}")
        self.weight, self.bias, self.act = weight, bias, act
        self.out_features, self.in_features = weight.shape
        self.isa = _resolve_isa(isa)
        self._kernel = _kernel() if self.isa != "torch" else None
        self._isa_id = ISAS.index(self.isa) if self.isa in ISAS else -1
        self._float: torch.Tensor | None = None
        # int8 activations on a SIMD path: the tiled layout, built once here (a second copy of the
        # packed weight: the float and scalar paths read the plain one)
        self._tiled = tile_weight(weight) if act == "int8" and self.isa in ("avx2", "avx512vnni") else None
        self._panel_rows = max(16, PANEL_BYTES // (4 * self.in_features))

    @property
    def path(self) -> str:
        """The path that runs a decode-sized batch: e.g. 'avx512vnni/int8' or 'avx2/float'."""
        if self.isa == "torch":
            return "torch"
        isa = "avx2" if self.act == "float" and self.isa == "avx512vnni" else self.isa   # float path: AVX2 code
        return f"{isa}/{self.act}" + ("/tiled" if self._tiled is not None else "")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        if self._kernel is None:
            if self._float is None:
                self._float = dequantize(w)
            y = F.linear(x2, self._float)
        elif self._tiled is not None:
            y = self._kernel.quant_linear_tiled(x2, *self._tiled, w.bits, self.out_features, self._isa_id)
        elif self.act == "float" and x2.shape[0] >= PANEL_MIN_ROWS:
            y = self._kernel.quant_linear_panel(x2, w.qs, w.d, w.m, w.bits, self._isa_id, self._panel_rows)
        else:
            y = self._kernel.quant_linear(x2, w.qs, w.d, w.m, w.bits, 1 if self.act == "int8" else 0, self._isa_id)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)
