"""kv_cache_dtype on the real model (SmolLM2-135M): the capacity gain for the same
kv_cache_memory, the C++ kernels against the torch path on quantized KV, greedy outputs with
quantized KV close to full precision, and swap preemption moving quantized blocks intact."""

from __future__ import annotations

import pytest
import torch

from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.model.executor import ModelExecutor
from pacer.model.kv_calibrate import forward_stream, stream_nll
from pacer.request import SamplingParams
from pacer.sched.contract import SchedulerOutput
from tests.conftest import make
from tests.engine.test_prefix_cache_model import QUESTIONS, chat_ids, generate

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def test_capacity_for_the_same_kv_cache_memory_and_a_bad_dtype(base: Engine) -> None:
    model = base.executor.model       # float32 on CPU
    a = model.arch
    blocks = {}
    for name in ("auto", "int8", "fp8"):
        cfg = EngineConfig.from_kwargs(kv_cache_memory="64MiB", kv_cache_dtype=name)
        fmt = model.kv_format(name)
        blocks[name] = cfg.cache.resolve_num_blocks(fmt.bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim))
    bf16 = EngineConfig.from_kwargs(kv_cache_memory="64MiB").cache.resolve_num_blocks(model.kv_bytes_per_token // 2)
    assert blocks["int8"] >= 3.8 * blocks["auto"] and blocks["int8"] >= 1.9 * bf16
    assert blocks["fp8"] >= 3.99 * blocks["auto"]
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, int8, fp8"):
        EngineConfig.from_kwargs(kv_cache_dtype="int4")


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_kernels_and_torch_path_agree_on_quantized_kv(base: Engine, name: str) -> None:
    model = base.executor.model
    if model.kernel is None:
        pytest.skip("C++ kernels could not be built here")
    ids = list(base.tokenizer.encode(" The harbour was quiet before dawn, and the boats rocked gently." * 6))
    fmt = model.kv_format(name)
    got: list[torch.Tensor] = []
    want: list[torch.Tensor] = []
    forward_stream(model, ids, fmt, chunk=24, on_logits=lambda s, lg: got.append(lg))
    kernel, model.kernel = model.kernel, None
    try:
        forward_stream(model, ids, fmt, chunk=24, on_logits=lambda s, lg: want.append(lg))
    finally:
        model.kernel = kernel
    # Layer 0 stores identical bytes on both paths; past it the paths' float rounding flips a
    # few values to the neighbouring quantization step, so compare what the logits decide.
    top_got, top_want = torch.cat(got).argmax(-1), torch.cat(want).argmax(-1)
    assert float((top_got == top_want).float().mean()) >= 0.95


def test_int8_kv_keeps_perplexity_and_greedy_outputs_close(base: Engine) -> None:
    model = base.executor.model
    ids = [chat_ids(base, q) for q in QUESTIONS]
    stream = [t for p in ids for t in p]
    full = stream_nll(model, stream, model.kv_format("auto"), chunk=32)
    q8 = stream_nll(model, stream, model.kv_format("int8"), chunk=32)
    assert abs(sum(q8) / sum(full) - 1) < 0.01
    want = generate(make(base, num_kv_blocks=64), ids, GREEDY)
    got = generate(make(base, num_kv_blocks=64, kv_cache_dtype="int8"), ids, GREEDY)
    same = sum(got[i].token_ids[:8] == want[i].token_ids[:8] for i in range(len(ids)))
    assert same >= len(ids) - 1


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_swap_moves_quantized_blocks_byte_for_byte(base: Engine, name: str) -> None:
    model = base.executor.model
    ex = ModelExecutor(model, 6, 4, kv_format=model.kv_format(name))
    g = torch.Generator().manual_seed(0)
    for k, v in ex.kv_caches:
        k.view(torch.uint8).copy_(torch.randint(0, 120, k.shape, generator=g, dtype=torch.uint8))
        v.view(torch.uint8).copy_(torch.randint(0, 120, v.shape, generator=g, dtype=torch.uint8))
    before = [(k[[1, 2]].view(torch.uint8).clone(), v[[1, 2]].view(torch.uint8).clone()) for k, v in ex.kv_caches]
    ex.execute(SchedulerOutput(0, [], 0, 0, swap_out=[(1, 0), (2, 1)]))
    ex.execute(SchedulerOutput(1, [], 0, 0, swap_in=[(0, 4), (1, 5)]))
    for (k, v), (k0, v0) in zip(ex.kv_caches, before):
        assert torch.equal(k[[4, 5]].view(torch.uint8), k0) and torch.equal(v[[4, 5]].view(torch.uint8), v0)
    assert ex.kv_block_bytes == model.kv_format(name).bytes_per_token(30, 3, 64) * 4


def test_swap_preemption_runs_on_quantized_kv(base: Engine) -> None:
    prompts = [chat_ids(base, q, system="Be brief.") for q in QUESTIONS]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    kw = dict(num_kv_blocks=10, block_size=8, enable_prefix_caching=False, kv_cache_dtype="int8")
    swap = make(base, preemption_mode="swap", num_cpu_blocks=64, **kw)
    got = generate(swap, prompts, params)
    assert swap.snapshot().num_swap_preemptions > 0
    assert all(len(got[i].token_ids) == 16 for i in range(len(prompts)))
