"""Projection weights packed once for the CPU GEMM that runs them fastest.

On CPU, `F.linear` goes through the BLAS torch was built with (MKL on x86). On some
CPUs (AMD Zen among them) that path runs well below the machine's matmul roofline,
while oneDNN's JIT kernels, given a weight reordered once into their blocked layout,
run 2-4x faster in float32 and 1.2-2x faster in bfloat16 at decode-sized batches. The
results agree with `F.linear` to float rounding (a different summation order).

`backend="auto"` packs for oneDNN when torch's build has it and the device is the CPU,
and otherwise keeps the plain weight for `F.linear` (CUDA, builds without mkldnn).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

__all__ = ["Linear", "onednn_available"]

log = logging.getLogger("pacer.model")

_probe: dict[torch.dtype, bool] = {}


def onednn_available(dtype: torch.dtype) -> bool:
    """True when torch can pack and run a `dtype` weight with oneDNN on this CPU."""
    if dtype not in _probe:
        ok = False
        try:
            if torch.backends.mkldnn.is_available():
                w = torch.randn(16, 32).to(dtype)
                x = torch.randn(3, 32).to(dtype)
                packed = torch.ops.mkldnn._reorder_linear_weight(w)
                y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
                tol = 1e-4 if dtype == torch.float32 else 5e-2
                ok = bool(torch.allclose(y.float(), F.linear(x, w).float(), atol=tol, rtol=tol))
        except (RuntimeError, AttributeError) as e:
            log.info("oneDNN linear unavailable for %s: %s", dtype, e)
        _probe[dtype] = ok
    return _probe[dtype]


class Linear:
    """`y = x @ weight.T + bias` with the weight kept in the layout its backend wants."""

    __slots__ = ("weight", "bias", "backend", "out_features", "in_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, backend: str = "auto") -> None:
        if weight.dim() != 2:
            raise ValueError(f"Linear weight must be 2-D, got shape {tuple(weight.shape)}")
        self.out_features, self.in_features = weight.shape
        if backend == "auto":
            cpu = weight.device.type == "cpu"
            backend = "onednn" if cpu and onednn_available(weight.dtype) else "torch"
        if backend == "onednn":
            if weight.device.type != "cpu" or not onednn_available(weight.dtype):
                raise RuntimeError(f"linear_backend='onednn' is not available for {weight.dtype} on {weight.device}")
            weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
        elif backend != "torch":
            raise ValueError(f"linear_backend must be one of auto, onednn, torch; got {backend!r}")
        self.backend = backend
        self.weight = weight
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
