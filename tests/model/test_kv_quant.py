"""Quantized KV (kv_cache_dtype int8 / fp8): round-trip bounds of the reference arithmetic, the
C++ write bit-exact against it, and the attention kernels against the torch path reading the
same quantized blocks."""

import pytest
import torch

from pacer.model import kernels
from pacer.model.attention import AttentionMetadata, PrefillSeq, paged_attention, write_kv
from pacer.model.kv_quant import FP8_MAX, dequantize, kv_format, quantize

K = kernels.load()
needs_kernels = pytest.mark.skipif(K is None, reason="C++ kernels could not be built here")
QUANT = ["int8", "fp8_e4m3", "fp8_e5m2"]
TOL = {torch.float32: dict(atol=3e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def test_int8_round_trip_is_within_half_a_step_per_token_and_head():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 64, generator=g) * torch.logspace(-3, 2, 64).view(64, 1, 1)
    x[5, 1] = 0.0                                   # an all-zero head stays zero
    fmt = kv_format("int8", torch.float32)
    stored = quantize(fmt, x)
    assert stored.dtype == torch.int8 and stored.shape == (64, 3, 66)
    back = dequantize(fmt, stored, torch.float32)
    amax = x.abs().amax(-1, keepdim=True)
    step = (amax / 127).to(torch.float16).float()
    # half a step, plus the float16 rounding of the scale (relative 2^-11 of max|x|)
    assert bool(((back - x).abs() <= step / 2 + amax * 2.0 ** -10 + 1e-12).all())
    assert bool((back[5, 1] == 0).all())


@pytest.mark.parametrize("name, mantissa_bits", [("fp8_e4m3", 3), ("fp8_e5m2", 2)])
@pytest.mark.parametrize("scale", [1.0, 0.05])
def test_fp8_round_trip_relative_error_and_saturation(name, mantissa_bits, scale):
    g = torch.Generator().manual_seed(1)
    fmt = kv_format(name, torch.bfloat16)
    x = torch.randn(4096, generator=g) * 3 * scale
    back = dequantize(fmt, quantize(fmt, x, scale), torch.float32, scale)
    normal = x.abs() >= 2.0 ** (-6 if name == "fp8_e4m3" else -14) * scale
    rel = ((back - x).abs() / x.abs())[normal]
    assert float(rel.max()) <= 2.0 ** -(mantissa_bits + 1) + 1e-6
    big = torch.tensor([1e9, -1e9])             # saturates to the largest finite value, never NaN
    assert dequantize(fmt, quantize(fmt, big, scale), torch.float32, scale).tolist() == pytest.approx(
        [FP8_MAX[name] * scale, -FP8_MAX[name] * scale], rel=1e-6)


def test_kv_format_names_sizes_and_a_bad_name():
    assert kv_format("fp8", torch.float32).name == "fp8_e4m3"   # vLLM: fp8 means e4m3
    per_token = {n: kv_format(n, torch.float32).bytes_per_token(30, 3, 64) for n in ["auto", *QUANT]}
    bf16 = kv_format("auto", torch.bfloat16).bytes_per_token(30, 3, 64)
    assert bf16 / per_token["int8"] >= 1.9 and per_token["auto"] / per_token["int8"] >= 3.8
    assert bf16 / per_token["fp8_e4m3"] == 2.0 and per_token["auto"] / per_token["fp8_e5m2"] == 4.0
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        kv_format("int4", torch.float32)


def _random_caches(name, dtype, n_blocks, bs, n_kv, d, g):
    """Caches of format `name`: int8 from quantize(), float8 as random bytes over the finite
    codes (subnormals included) so the kernels' bit tricks meet every value."""
    fmt = kv_format(name, dtype)
    if name == "int8":
        k = quantize(fmt, torch.randn(n_blocks, bs, n_kv, d, generator=g) * 2)
        v = quantize(fmt, torch.randn(n_blocks, bs, n_kv, d, generator=g))
        return fmt, k, v
    # every finite code up to 448 (all of e4m3; e5m2 past that gives scores so large that
    # the bfloat16 reference's rounding decides the softmax)
    every = torch.arange(256, dtype=torch.uint8)
    values = every.view(fmt.storage).float()
    codes = every[values.isfinite() & (values.abs() <= 448)]

    def pick():
        idx = torch.randint(0, len(codes), (n_blocks, bs, n_kv, d), generator=g)
        return codes[idx].view(fmt.storage)
    return fmt, pick(), pick()


@needs_kernels
@pytest.mark.parametrize("name", QUANT)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [32, 64])     # 64 takes the AVX-512 tile path where there is one
def test_decode_kernel_reads_quantized_blocks_like_the_reference(name, dtype, d):
    g = torch.Generator().manual_seed(d)
    n_heads, n_kv, bs, lens = 6, 2, 16, [1, 17, 40, 130, 600]   # 600: split into parts
    width = max(-(-n // bs) for n in lens)
    n_blocks = len(lens) * width + 2
    fmt, kc, vc = _random_caches(name, dtype, n_blocks, bs, n_kv, d, g)
    scales = (0.02, 0.03) if name != "int8" else (1.0, 1.0)
    tables = torch.randperm(n_blocks, generator=g)[:len(lens) * width].view(len(lens), width).contiguous()
    ctx = torch.tensor(lens)
    q = torch.randn(len(lens), n_heads, d, generator=g).to(dtype)
    mask = (torch.arange(width * bs).unsqueeze(0) < ctx.unsqueeze(1))[:, None, None, :]
    meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), num_single=len(lens),
                             single_block_tables=tables, single_mask=mask, single_context_lens=ctx, prefills=[])
    empty = torch.empty(0, n_kv, d, dtype=dtype)
    want = paged_attention(q, empty, empty, kc, vc, meta, 0.2, None, fmt, scales)
    got = torch.full_like(q, float("nan"))
    K.paged_decode_attention(got, q, kc, vc, tables, ctx, 0.2, *scales)
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@needs_kernels
@pytest.mark.parametrize("name", QUANT)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [32, 64])
def test_prefill_kernel_reads_quantized_blocks_like_the_reference(name, dtype, d):
    g = torch.Generator().manual_seed(100 + d)
    n_heads, n_kv, bs, seqs = 6, 2, 4, [(0, 37), (13, 5), (40, 70)]
    n_blocks = sum(-(-(s + n) // bs) for s, n in seqs) + 2
    fmt, kc, vc = _random_caches(name, dtype, n_blocks, bs, n_kv, d, g)
    scales = (0.05, 0.01) if name != "int8" else (1.0, 1.0)
    perm = torch.randperm(n_blocks, generator=g).tolist()
    prefills, tables, row = [], [], 0
    for start, n in seqs:
        table = [perm.pop() for _ in range(-(-(start + n) // bs))]
        tables.append(table)
        prefills.append(PrefillSeq(row, n, start, torch.tensor(table)))
        row += n
    q = torch.randn(row, n_heads, d, generator=g).to(dtype)
    meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), num_single=0, single_block_tables=None,
                             single_mask=None, single_context_lens=None, prefills=prefills)
    unused = torch.empty(row, n_kv, d, dtype=dtype)   # a quantized cache is read for the chunk's own keys too
    want = paged_attention(q, unused, unused, kc, vc, meta, 0.3, None, fmt, scales)
    w = max(len(t) for t in tables)
    batch = (torch.tensor([p.q_start for p in prefills]), torch.tensor([p.q_len for p in prefills]),
             torch.tensor([p.start_pos for p in prefills]), torch.tensor([t + [0] * (w - len(t)) for t in tables]))
    got = torch.full_like(q, float("nan"))
    K.paged_prefill_attention(got, q, kc, vc, *batch, 0.3, *scales)
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@needs_kernels
@pytest.mark.parametrize("name", QUANT)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_write_kv_quantizes_exactly_as_the_reference(name, dtype):
    """At position 0 the rotation is the identity, so the stored bytes must equal quantize()."""
    g = torch.Generator().manual_seed(3)
    T, nh, nkv, d, bs, nb = 13, 4, 2, 64, 4, 8
    qkv = (torch.randn(T, nh + 2 * nkv, d, generator=g) * torch.logspace(-2, 1, T).view(T, 1, 1)).to(dtype)
    slots = torch.randperm(nb * bs, generator=g)[:T]
    cos, sin = torch.ones(4, d // 2), torch.zeros(4, d // 2)
    fmt = kv_format(name, dtype)
    scales = (0.5, 0.25) if name != "int8" else (1.0, 1.0)
    k, v = qkv[:, nh:nh + nkv].clone(), qkv[:, nh + nkv:].clone()
    shape = (nb, bs, nkv, fmt.head_width(d))
    want_k, want_v = torch.zeros(shape, dtype=fmt.storage), torch.zeros(shape, dtype=fmt.storage)
    write_kv(want_k, want_v, k, v, slots, fmt, scales)
    got_k, got_v = torch.zeros(shape, dtype=fmt.storage), torch.zeros(shape, dtype=fmt.storage)
    K.rope_write_kv(qkv, torch.zeros(T, dtype=torch.long), cos, sin, got_k, got_v, slots, nh, *scales)
    assert torch.equal(got_k.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(got_v.view(torch.uint8), want_v.view(torch.uint8))


@needs_kernels
def test_kernels_refuse_a_cache_of_another_format():
    q = torch.zeros(1, 4, 64)
    kc = vc = torch.zeros(4, 16, 2, 64, dtype=torch.int8)    # int8 needs head_dim + 2 (the scales)
    with pytest.raises(RuntimeError, match="cache width 64 should be 66"):
        K.paged_decode_attention(torch.empty_like(q), q, kc, vc, torch.tensor([[0]]), torch.tensor([1]), 1.0, 1.0, 1.0)
    kc = vc = torch.zeros(4, 16, 2, 64, dtype=torch.float16)   # neither q's dtype nor a quantized one
    with pytest.raises(RuntimeError, match="not a KV format"):
        K.paged_decode_attention(torch.empty_like(q), q, kc, vc, torch.tensor([[0]]), torch.tensor([1]), 1.0, 1.0, 1.0)
