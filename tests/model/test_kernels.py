"""The C++ kernels against the torch reference path they replace, on random data."""

import pytest
import torch
import torch.nn.functional as F

from pacer.model import kernels
from pacer.model.attention import AttentionMetadata, PrefillSeq, paged_attention, write_kv
from pacer.model.llama import LlamaModel

# the level this CPU gets in `make test`; every other level it runs (the portable one included: its
# build alone took a minute of a fresh `make test` on the 2-core AVX2 machine) in the slow set
NATIVE = kernels.kernel_isa()
ISAS = [pytest.param(isa, marks=() if isa == NATIVE else pytest.mark.slow) for isa in kernels.supported_isas()]


@pytest.fixture(scope="module", params=ISAS)
def K(request):
    """The kernels built for one ISA level this CPU runs (forced, whatever the default is)."""
    module = kernels.load(request.param)
    if module is None:
        pytest.skip("C++ kernels could not be built here")
    assert module.isa == request.param
    return module

TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _random_batch(dtype, seqs, n_heads=6, n_kv=2, d=32, bs=4, seed=0):
    """seqs: (start_pos, q_len) per prefill chunk. Caches hold every sequence's context on
    shuffled blocks; q views a fused qkv buffer as the model produces it."""
    g = torch.Generator().manual_seed(seed)
    n_blocks = sum(-(-(s + n) // bs) for s, n in seqs) + 3
    k_cache = torch.randn(n_blocks, bs, n_kv, d, generator=g).to(dtype)
    v_cache = torch.randn(n_blocks, bs, n_kv, d, generator=g).to(dtype)
    perm = torch.randperm(n_blocks, generator=g).tolist()
    T = sum(n for _, n in seqs)
    qkv = torch.randn(T, n_heads + 2 * n_kv, d, generator=g).to(dtype)
    q, k, v = qkv.split([n_heads, n_kv, n_kv], dim=1)
    prefills, tables, slots, row = [], [], [], 0
    for start, n in seqs:
        nb = -(-(start + n) // bs)
        table = [perm.pop() for _ in range(nb)]
        tables.append(table)
        prefills.append(PrefillSeq(row, n, start, torch.tensor(table)))
        slots += [table[p // bs] * bs + p % bs for p in range(start, start + n)]
        row += n
    slot_mapping = torch.tensor(slots)
    write_kv(k_cache, v_cache, k, v, slot_mapping)
    width = max(len(t) for t in tables)
    batch = (torch.tensor([p.q_start for p in prefills]), torch.tensor([p.q_len for p in prefills]),
             torch.tensor([p.start_pos for p in prefills]), torch.tensor([t + [0] * (width - len(t)) for t in tables]))
    return q, k, v, k_cache, v_cache, prefills, batch, slot_mapping


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seqs", [[(0, 1)], [(0, 37)], [(0, 70), (13, 5), (40, 33), (0, 2)], [(5, 64), (64, 64)],
                                  [(30, 170), (0, 129)]])
@pytest.mark.parametrize("d", [32, 64, 128])   # 64 and 128 take the vectorised tile path where there is one
def test_prefill_attention_matches_torch_reference(K, dtype, seqs, d):
    q, k, v, kc, vc, prefills, batch, slots = _random_batch(dtype, seqs, n_heads=6 if d != 64 else 9,
                                                             n_kv=2 if d != 64 else 3, d=d)
    meta = AttentionMetadata(slot_mapping=slots, num_single=0, single_block_tables=None, single_mask=None,
                             single_context_lens=None, prefills=prefills)
    want = paged_attention(q, k, v, kc, vc, meta, 0.17, kernel=None)
    got = torch.full_like(want, float("nan"))
    K.paged_prefill_attention(got, q, kc, vc, *batch, 0.17, 1.0, 1.0)
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])



@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("seqs", [[(0, 130)], [(1500, 130)], [(200, 257), (0, 40)], [(64, 33), (0, 17), (9, 16)]])
def test_prefill_attention_row_tiles_cut_for_the_threads_give_the_same_rows(K, threads, seqs):
    """The kernel cuts a chunk's rows finer when its tasks would not spread evenly over the
    threads (3 kv heads, 2 threads): each row's attention is the same however it is cut."""
    q, k, v, kc, vc, prefills, batch, slots = _random_batch(torch.float32, seqs, n_heads=9, n_kv=3, d=64, bs=16)
    meta = AttentionMetadata(slot_mapping=slots, num_single=0, single_block_tables=None, single_mask=None,
                             single_context_lens=None, prefills=prefills)
    want = paged_attention(q, k, v, kc, vc, meta, 0.125, kernel=None)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = torch.full_like(want, float("nan"))
        K.paged_prefill_attention(got, q, kc, vc, *batch, 0.125, 1.0, 1.0)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, want, **TOL[torch.float32])

def test_prefill_attention_rejects_a_context_beyond_its_table(K):
    q, _, _, kc, vc, _, batch, _ = _random_batch(torch.float32, [(0, 9)])
    q_starts, q_lens, _, tables = batch
    with pytest.raises(RuntimeError, match="block table"):
        K.paged_prefill_attention(torch.empty_like(q), q, kc, vc, q_starts, q_lens, torch.tensor([40]), tables, 1.0, 1.0, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_write_kv_matches_rotate_then_write(K, dtype):
    g = torch.Generator().manual_seed(1)
    T, nh, nkv, d, bs, nb = 11, 4, 2, 16, 4, 8
    qkv = torch.randn(T, nh + 2 * nkv, d, generator=g).to(dtype)
    positions = torch.randint(0, 50, (T,), generator=g)
    slots = torch.randperm(nb * bs, generator=g)[:T]
    freqs = torch.outer(torch.arange(64, dtype=torch.float32), 1.0 / (10000 ** (torch.arange(0, d, 2) / d)))
    cos, sin = freqs.cos(), freqs.sin()
    q, k, v = qkv.split([nh, nkv, nkv], dim=1)
    c, s = cos[positions].to(dtype).unsqueeze(1), sin[positions].to(dtype).unsqueeze(1)
    want_q, want_k = LlamaModel._rope(q.float(), c.float(), s.float()), LlamaModel._rope(k.float(), c.float(), s.float())
    want_kc, want_vc = torch.zeros(nb, bs, nkv, d, dtype=dtype), torch.zeros(nb, bs, nkv, d, dtype=dtype)
    write_kv(want_kc, want_vc, want_k.to(dtype), v, slots)
    kc, vc = torch.zeros_like(want_kc), torch.zeros_like(want_vc)
    K.rope_write_kv(qkv, positions, cos, sin, kc, vc, slots, nh, 1.0, 1.0)
    torch.testing.assert_close(q.float(), want_q, **TOL[dtype])
    torch.testing.assert_close(k.float(), want_k, **TOL[dtype])
    torch.testing.assert_close(kc.float(), want_kc.float(), **TOL[dtype])
    assert torch.equal(vc, want_vc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_and_add_rms_norm_match_torch(K, dtype):
    g = torch.Generator().manual_seed(2)
    gate_up = torch.randn(9, 2 * 40, generator=g).to(dtype)
    gate, up = gate_up.float().chunk(2, dim=-1)
    torch.testing.assert_close(K.silu_and_mul(gate_up).float(), F.silu(gate) * up, **TOL[dtype])

    x = torch.randn(9, 48, generator=g).to(dtype)
    delta = torch.randn(9, 48, generator=g).to(dtype)
    w = torch.rand(48, generator=g).to(dtype)
    summed = (x.float() + delta.float()).to(dtype)
    want = F.rms_norm(summed.float(), (48,), w.float(), 1e-5)
    x2 = x.clone()
    got = K.add_rms_norm_(x2, delta, w, 1e-5)
    assert torch.equal(x2, summed), "the residual is updated in place"
    torch.testing.assert_close(got.float(), want, **TOL[dtype])
    torch.testing.assert_close(K.add_rms_norm_(x.clone(), None, w, 1e-5).float(),
                               F.rms_norm(x.float(), (48,), w.float(), 1e-5), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [32, 64, 128])   # 64 and 128 take the vectorised path where there is one
# past 256 tokens a context is split into parts attended apart and combined (flash-decoding);
# [700] alone also splits its kv heads across the threads
@pytest.mark.parametrize("lens", [[1], [16, 17, 5, 40], [3, 100, 64, 1, 33, 250], [700], [257, 1, 512, 900]])
def test_decode_attention_matches_torch_reference(K, dtype, d, lens):
    g = torch.Generator().manual_seed(sum(lens) + d)
    n_heads, n_kv, bs = 6, 2, 16
    width = max(-(-n // bs) for n in lens)
    n_blocks = len(lens) * width + 2
    kc = torch.randn(n_blocks, bs, n_kv, d, generator=g).to(dtype)
    vc = torch.randn(n_blocks, bs, n_kv, d, generator=g).to(dtype)
    tables = torch.randperm(n_blocks, generator=g)[:len(lens) * width].view(len(lens), width).contiguous()
    ctx = torch.tensor(lens)
    # q as the model passes it: the query heads of a packed qkv row (rows strided)
    q = torch.randn(len(lens), n_heads + 2 * n_kv, d, generator=g).to(dtype)[:, :n_heads]
    mask = (torch.arange(width * bs).unsqueeze(0) < ctx.unsqueeze(1))[:, None, None, :]
    meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), num_single=len(lens),
                             single_block_tables=tables, single_mask=mask, single_context_lens=ctx, prefills=[])
    empty = torch.empty(0, n_kv, d, dtype=dtype)
    want = paged_attention(q, empty, empty, kc, vc, meta, 0.2, kernel=None)
    buf = torch.full((len(lens), n_heads + 1, d), 7.0, dtype=dtype)   # the kernel writes rows of a wider buffer
    K.paged_decode_attention(buf[:, :n_heads], q, kc, vc, tables, ctx, 0.2, 1.0, 1.0)
    torch.testing.assert_close(buf[:, :n_heads].float(), want.float(), **TOL[dtype])
    assert bool((buf[:, n_heads] == 7.0).all()), "wrote outside its output rows"


def test_kernels_refuse_tables_and_positions_outside_the_cache(K):
    kc = vc = torch.zeros(4, 16, 2, 64)
    q = torch.zeros(1, 4, 64)
    with pytest.raises(RuntimeError, match="outside the cache"):
        K.paged_decode_attention(torch.empty_like(q), q, kc, vc, torch.tensor([[7]]), torch.tensor([5]), 1.0, 1.0, 1.0)
    with pytest.raises(RuntimeError, match="outside the cache"):
        K.paged_prefill_attention(torch.empty_like(q), q, kc, vc, torch.tensor([0]), torch.tensor([1]),
                                  torch.tensor([0]), torch.tensor([[-1]]), 1.0, 1.0, 1.0)
    qkv = torch.zeros(1, 8, 64)
    cos = sin = torch.zeros(10, 32)
    with pytest.raises(RuntimeError, match="rope table"):
        K.rope_write_kv(qkv, torch.tensor([10]), cos, sin, kc, vc, torch.tensor([0]), 4, 1.0, 1.0)


@pytest.mark.parametrize("d", [32, 64, 256])   # 64 would take a vectorised path without the window
@pytest.mark.parametrize("window", [1, 6, 40])
def test_sliding_window_attention_matches_torch_reference(K, d, window):
    """Decode rows and prefill chunks through a sliding window (Gemma's sliding layers), against
    the torch path's windowed masks."""
    q, k, v, kc, vc, prefills, batch, slots = _random_batch(torch.float32, [(0, 37), (13, 5), (40, 33)], d=d)
    meta = AttentionMetadata(slot_mapping=slots, num_single=0, single_block_tables=None, single_mask=None,
                             single_context_lens=None, prefills=prefills)
    want = paged_attention(q, k, v, kc, vc, meta, 0.17, kernel=None, window=window)
    got = torch.full_like(want, float("nan"))
    K.paged_prefill_attention(got, q, kc, vc, *batch, 0.17, 1.0, 1.0, window)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    # decode: each chunk's context as single rows (the last position of each)
    tables, ctx = batch[3], batch[1] + batch[2]
    bs = kc.shape[1]
    mask = (torch.arange(tables.shape[1] * bs).unsqueeze(0) < ctx.unsqueeze(1))[:, None, None, :]
    single = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), num_single=len(ctx),
                               single_block_tables=tables, single_mask=mask, single_context_lens=ctx, prefills=[])
    rows = q[batch[0] + batch[1] - 1]
    empty = torch.empty(0, kc.shape[2], d)
    want = paged_attention(rows, empty, empty, kc, vc, single, 0.2, kernel=None, window=window)
    got = torch.full_like(want, float("nan"))
    K.paged_decode_attention(got, rows, kc, vc, tables, ctx, 0.2, 1.0, 1.0, window)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert not torch.allclose(want, paged_attention(rows, empty, empty, kc, vc, single, 0.2, kernel=None))
