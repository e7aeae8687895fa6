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
    """Every format; 100 rows: groups of 16 with a partial last one (and a partial AVX2 half)."""
    torch.manual_seed(0)
    return [_gguf_blocks(f, 100, 160) for f in ("Q4_0", "Q4_1", "Q8_0")] + [Q.quantize_int8(torch.randn(100, 160))]


def _needs(isa: str) -> None:
    if not Q.available_isas():
        pytest.skip("the quantized-linear kernel cannot be built here (no compiler)")
    if isa not in Q.available_isas():
        pytest.skip(f"this CPU does not run the {isa} path")


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


@pytest.mark.parametrize("rows", [1, 3, 32, 257])   # GEMV, a small batch, a decode batch, a prefill chunk
@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512vnni"])
def test_kernel_matches_dequantize_then_matmul(isa: str, rows: int) -> None:
    _needs(isa)
    for w in _weights():
        ref_w = Q.dequantize(w)
        x = torch.randn(rows, 160)
        ref = F.linear(x, ref_w)
        y = Q.QuantLinear(w, act="float", isa=isa)(x)
        torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
        lin = Q.QuantLinear(w, act="int8", isa=isa)
        assert lin.path.endswith("/tiled") == (isa != "scalar")
        yq = lin(x)
        assert float((yq - ref).abs().max()) < 0.03 * float(ref.abs().max()), (w.fmt, rows, isa)
        # the integer sums are exact: every path gives the scalar path's result to float rounding
        torch.testing.assert_close(yq, Q.QuantLinear(w, act="int8", isa="scalar")(x), rtol=1e-5,
                                   atol=1e-5 * float(ref.abs().max()))


@pytest.mark.parametrize("isa", ["scalar", "avx2"])
def test_float_panels_cover_every_row(isa: str) -> None:
    """Panels smaller than N (the last one partial) put every row's product in its place."""
    _needs(isa)
    k = Q._kernel()
    for w in _weights():
        x = torch.randn(40, 160)
        y = k.quant_linear_panel(x, w.qs, w.d, w.m, w.bits, Q.ISAS.index(isa), 48)
        torch.testing.assert_close(y, F.linear(x, Q.dequantize(w)), rtol=1e-4, atol=1e-4)


def test_tiled_layout_holds_each_value_once() -> None:
    """Group 0, block 0, quad j of the tiled 4-bit layout holds row r's values 4j..4j+3 (low
    nibbles) and 4(j+4).. (high), and the 8-bit layout q + 128: read back against the plain blocks."""
    for w in _weights()[1:3]:
        qt, dt, mt = Q.tile_weight(w)
        g, nb = -(-100 // 16), 160 // 32
        q = torch.cat([w.qs & 15, w.qs >> 4], -1) if w.bits == 4 else (w.qs.view(torch.int8).int() + 128).byte()
        if w.bits == 4:
            t = qt.reshape(g, nb, 4, 16, 4)
            got = torch.cat([t & 15, t >> 4], dim=2)           # [g, nb, 8, 16, 4]
        else:
            got = qt.reshape(g, nb, 8, 16, 4)
        got = got.permute(0, 3, 1, 2, 4).reshape(g * 16, nb, 32)[:100]
        assert torch.equal(got, q)
        assert torch.equal(dt.reshape(g, nb, 16).transpose(1, 2).reshape(-1, nb)[:100], w.d)
        assert mt.numel() == (dt.numel() if w.bits == 4 else 0)


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
