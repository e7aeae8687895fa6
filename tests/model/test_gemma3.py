"""Gemma 3 (270M, the Q4_K_M GGUF of a PyPI wheel), a second pretrained model of another
architecture: sandwich norms, a GELU MLP, scaled embeddings, and five of every six layers
attending through a 512-token sliding window with their own rope base.

The reference is HF transformers loading the same GGUF itself (its own dequantization, its own
Gemma3ForCausalLM): pacer's float32 log-softmax at every scheduled position (prefill chunks that
cross the window, decodes, preemption) must stay within a small factor of HF float32's own error
against HF in float64 — the bound test_logit_parity.py puts on the default model. Also: the
sliding window itself against a dense masked attention, on both of the torch path's row kinds
(the C++ kernels' window is held to the torch path in test_kernels.py).
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pacer import LLM
from pacer.model.attention import ChunkSpan, build_metadata, paged_attention, write_kv
from pacer.model.gguf_loader import _arch_from_gguf
from pacer.model.loader import gemma3_270m_path
from pacer.workload.text import TextSource
from tests.model.test_logit_parity import assert_within_hf_error, compare, run_captured

WINDOW = 512


@pytest.fixture(scope="module")
def gemma():
    from transformers import AutoModelForCausalLM

    path = Path(gemma3_270m_path())
    hf32 = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    hf64 = copy.deepcopy(hf32).double()
    return str(path), hf32, hf64


@pytest.mark.slow   # parsing the metadata's 262k-token vocabulary takes ~10 s
def test_arch_from_gguf():
    """The shape and conventions read from the metadata alone (no tensors dequantized)."""
    import gguf

    path = Path(gemma3_270m_path())
    a = _arch_from_gguf(gguf.GGUFReader(str(path)), path)
    assert (a.arch, a.activation, a.scale_embeddings, a.sandwich_norms, a.qk_norm) == ("gemma3", "gelu_tanh", True,
                                                                                       True, True)
    assert a.sliding_window == WINDOW and a.rope_local_theta == 10000.0 and a.rope_theta == 1e6
    assert [i for i in range(a.num_layers) if a.window(i) == 0] == [5, 11, 17]   # every sixth layer is global


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_log_softmax_at_every_position_past_the_window(gemma, backend):
    """One prompt longer than the window (so the sliding layers drop keys the global ones keep),
    one short; prefill in 160-token chunks beside decodes, a KV pool small enough to preempt."""
    path, hf32, hf64 = gemma
    llm = LLM(model=path, quantization="none", attention_backend=backend, max_num_batched_tokens=160, num_kv_blocks=48, block_size=16,
              enable_prefix_caching=False, num_threads=1)
    assert llm.engine.executor.model.attention_backend == backend
    src = TextSource(llm.tokenizer)
    rng = random.Random(3)
    long_prompt = llm.tokenizer.encode(src.segment(WINDOW + 180, rng).text)
    short = llm.tokenizer.encode(src.segment(90, rng).text)
    assert len(long_prompt) > WINDOW + 100
    log, outs = run_captured(llm, [short, long_prompt], 8)
    assert log.num_mixed_steps > 0 and llm.engine.scheduler.num_preemptions > 0
    pacer, hf = compare(log, outs, hf64, hf32)
    assert_within_hf_error(pacer, hf, f"gemma3 270m {backend}")
    llm.close()


def _dense(q, keys, vals, q_pos, k_pos, window, scale):
    mask = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] > q_pos[:, None] - window)
    return F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1), vals.transpose(0, 1),
                                          attn_mask=mask, scale=scale).transpose(0, 1)


@pytest.mark.parametrize("window", [1, 5, 40])
def test_sliding_window_matches_dense_attention(window):
    """A decode row and a later prefill chunk over a paged cache, against masked dense attention."""
    torch.manual_seed(0)
    bs, heads, d, ctx = 4, 2, 8, 30
    k_cache = torch.zeros(16, bs, heads, d)
    v_cache = torch.zeros(16, bs, heads, d)
    keys, vals = torch.randn(ctx + 7, heads, d), torch.randn(ctx + 7, heads, d)
    table = list(range(3, 13))
    slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(ctx + 7)])
    write_kv(k_cache, v_cache, keys, vals, slots)
    q = torch.randn(1 + 7, heads, d)
    # row 0: a decode at position ctx - 1 (context ctx); rows 1..7: a chunk at positions ctx..ctx+6
    meta = build_metadata(slots[ctx - 1:].tolist(), [table], [ctx], [ChunkSpan(1, 7, ctx, table)], bs, "cpu",
                          use_kernel=False)
    out = paged_attention(q, keys[ctx - 1:], vals[ctx - 1:], k_cache, v_cache, meta, 0.3, window=window)
    k_pos = torch.arange(ctx + 7)
    want_decode = _dense(q[:1], keys[:ctx], vals[:ctx], torch.tensor([ctx - 1]), k_pos[:ctx], window, 0.3)
    want_chunk = _dense(q[1:], keys, vals, torch.arange(ctx, ctx + 7), k_pos, window, 0.3)
    torch.testing.assert_close(out[:1], want_decode)
    torch.testing.assert_close(out[1:], want_chunk)
    full = paged_attention(q, keys[ctx - 1:], vals[ctx - 1:], k_cache, v_cache, meta, 0.3)
    if window < ctx:
        assert not torch.allclose(full[1:], out[1:])   # the window changed what the chunk saw
