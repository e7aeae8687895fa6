"""The quantized-linear kernel against dequantize-then-matmul, for every block format, both
activation modes and every path this CPU runs (scalar always; avx2 / avx512vnni where present)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pacer.model import quant as Q


def _gguf_blocks(fmt: str, n: int, k: int, seed: int = 0) -> Q.QuantWeight:
    """Random raw GGUF blocks of `fmt` (float16 scales/offsets in the real byte layout)."""
    rng = np.random.default_rng(seed)
    size, _ = Q.GGUF_BLOCK_TYPES[fmt]
    raw = rng.integers(0, 256, size=(n, k // 32, size), dtype=np.uint8)
    raw[..., 0:2] = (rng.random((n, k // 32)) * 0.01).astype(np.float16).view(np.uint8).reshape(n, k // 32, 2)
    if fmt == "Q4_1":
        raw[..., 2:4] = (rng.standard_normal((n, k // 32)) * 0.05).astype(np.float16).view(np.uint8).reshape(
            n, k // 32, 2)
    return Q.from_gguf_blocks(fmt, raw.reshape(n, -1), (n, k))


def _weights() -> list[Q.QuantWeight]:
    torch.manual_seed(0)
    return [_gguf_blocks(f, 96, 160) for f in ("Q4_0", "Q4_1", "Q8_0")] + [Q.quantize_int8(torch.randn(96, 160))]


def test_gguf_repack_matches_gguf_dequantize() -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(1)
    for fmt in ("Q4_0", "Q4_1", "Q8_0"):
        size, _ = Q.GGUF_BLOCK_TYPES[fmt]
        raw = rng.integers(0, 256, size=(8, 2 * size), dtype=np.uint8)
        raw.reshape(8, 2, size)[..., 0:2] = np.array([0.02], np.float16).view(np.uint8)
        if fmt == "Q4_1":
            raw.reshape(8, 2, size)[..., 2:4] = np.array([-0.1], np.float16).view(np.uint8)
        ref = np.asarray(dequantize(raw, GGMLQuantizationType[fmt]), dtype=np.float32).reshape(8, 64)
        torch.testing.assert_close(Q.dequantize(Q.from_gguf_blocks(fmt, raw, (8, 64))), torch.from_numpy(ref))


def test_int8_weight_only_is_close_to_float() -> None:
    w = torch.randn(64, 128)
    err = (Q.dequantize(Q.quantize_int8(w)) - w).abs().max() / w.abs().max()
    assert err < 1 / 127


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512vnni"])
def test_kernel_matches_dequantize_then_matmul(isa: str) -> None:
    if not Q.available_isas():
        pytest.skip("the quantized-linear kernel cannot be built here (no compiler)")
    if isa not in Q.available_isas():
        pytest.skip(f"this CPU does not run the {isa} path")
    for w in _weights():
        ref_w = Q.dequantize(w)
        for rows in (1, 3, 17):   # GEMV, a small batch, and the dequantize-then-BLAS rows
            x = torch.randn(rows, 160)
            ref = F.linear(x, ref_w)
            y = Q.QuantLinear(w, act="float", isa=isa)(x)
            torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
            yq = Q.QuantLinear(w, act="int8", isa=isa)(x)
            assert float((yq - ref).abs().max()) < 0.03 * float(ref.abs().max()), (w.fmt, rows, isa)
            # the integer sums are exact: every path gives the scalar path's result to float rounding
            torch.testing.assert_close(yq, Q.QuantLinear(w, act="int8", isa="scalar")(x), rtol=1e-5, atol=1e-5)


def test_torch_path_and_forced_path_by_env(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _weights()[1]
    x = torch.randn(2, 160)
    ref = F.linear(x, Q.dequantize(w))
    torch.testing.assert_close(Q.QuantLinear(w, isa="torch")(x), ref)
    if Q.available_isas():
        monkeypatch.setenv("PACER_QUANT_ISA", "scalar")
        lin = Q.QuantLinear(w)
        assert lin.isa == "scalar" and lin.path == "scalar/float"
        monkeypatch.setenv("PACER_QUANT_ISA", "sse9")
        with pytest.raises(ValueError, match="PACER_QUANT_ISA"):
            Q.QuantLinear(w)


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="quant_activations"):
        Q.QuantLinear(_weights()[0], act="int4")
    with pytest.raises(ValueError, match="GGUF type"):
        Q.from_gguf_blocks("Q5_K", np.zeros((1, 176), np.uint8), (1, 256))
