"""Greedy outputs equal HF transformers (float32, same weights), under chunking, mixed
prefill/decode steps and preemption, for the default model and tiny Llama/Qwen2/Qwen3."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from pacer import LLM, SamplingParams
from pacer.model.hf_reference import hf_llama_from_checkpoint
from pacer.model.loader import load_checkpoint

MAX_NEW = 12


def hf_greedy(model: torch.nn.Module, prompts: list[list[int]], n: int = MAX_NEW) -> list[list[int]]:
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=0)
            outs.append(g[0, len(p):].tolist())
    return outs


def hf_from_checkpoint(path: str | None) -> tuple[torch.nn.Module, list[int]]:
    ckpt = load_checkpoint(path)
    return hf_llama_from_checkpoint(ckpt), list(ckpt.arch.eos_token_ids)


def default_prompts_from(tok) -> list[list[int]]:
    texts = ["The capital of France is", "def fibonacci(n):",
             "Once upon a time, in a quiet village by the sea, there lived an old fisherman who " * 3,
             "List three prime numbers:"]
    prompts = [tok.encode(t) for t in texts]
    prompts.append([(i * 37) % 40000 + 50 for i in range(120)])
    return prompts


@pytest.fixture(scope="module")
def hf_default():
    return hf_from_checkpoint(None)


@pytest.fixture(scope="module")
def default_expected(hf_default):
    prompts = default_prompts_from(load_checkpoint(None).tokenizer)
    return prompts, hf_greedy(hf_default[0], prompts)


@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_default_model_matches_hf_with_chunking_and_preemption(default_expected, backend):
    # "cpp": the C++ attention kernel and auto linears (oneDNN-packed on CPU);
    # "torch": the reference paths for both, as on a build without either.
    prompts, expected = default_expected
    llm = LLM(max_num_batched_tokens=32, num_kv_blocks=12, block_size=16, attention_backend=backend,
              linear_backend="auto" if backend == "cpp" else "torch", enable_prefix_caching=False,
              quantization="none")   # HF runs the dequantized float32 weights
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True))
    assert [o.token_ids for o in outs] == expected
    assert llm.engine.scheduler.num_preemptions > 0, "the KV budget was meant to force preemption"
    steps = list(llm.engine.step_stats)
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in steps), "expected mixed steps"
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in steps) <= 32


def test_default_model_chat_answer_and_text(hf_default):
    llm = LLM(quantization="none")
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(max_tokens=24, temperature=0))[0]
    ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    hf, eos = hf_default
    with torch.inference_mode():
        g = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=eos)
    expected = g[0, len(ids):].tolist()
    assert out.token_ids == expected
    assert "Paris" in out.text
    assert out.finish_reason == "stop"
    assert out.text == llm.tokenizer.decode(out.token_ids)


def _tiny(kind: str, folder: Path) -> str:
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.15,
                  tie_word_embeddings=False)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common, rope_theta=10000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})
        cls = transformers.LlamaForCausalLM
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**common, rope_theta=1000000.0)
        cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.Qwen3Config(**common, head_dim=16, rope_theta=1000000.0)
        cls = transformers.Qwen3ForCausalLM
    torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3}[kind])
    model = cls(cfg).eval()
    if kind == "qwen2":  # make the q/k/v biases matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    model.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_tiny_architectures_match_hf(tmp_path, kind):
    path = _tiny(kind, tmp_path / kind)
    hf = getattr(transformers, {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                "qwen3": "Qwen3ForCausalLM"}[kind]).from_pretrained(path, dtype=torch.float32).eval()
    prompts = [[(i * 7 + j * 3) % 127 + 1 for j in range(n)] for i, n in enumerate([3, 17, 40, 90, 150, 8])]
    n_new = 24
    expected = hf_greedy(hf, prompts, n_new)
    for kwargs in (dict(max_num_batched_tokens=24, num_kv_blocks=64),      # chunked, mixed steps
                   dict(max_num_batched_tokens=64, num_kv_blocks=14),      # preemption
                   dict(enable_chunked_prefill=False, max_model_len=512, num_kv_blocks=128)):
        llm = LLM(model=path, block_size=16, enable_prefix_caching=False, **kwargs)
        outs = llm.generate(prompts, SamplingParams(max_tokens=n_new, temperature=0, ignore_eos=True))
        assert [o.token_ids for o in outs] == expected, kwargs
        if kwargs.get("num_kv_blocks") == 14:
            assert llm.engine.scheduler.num_preemptions > 0


def test_bfloat16_runs_and_mostly_agrees(default_expected):
    prompts, expected = default_expected
    llm = LLM(dtype="bfloat16")
    outs = llm.generate(prompts[:2], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert all(len(o.token_ids) == 8 for o in outs)
    assert outs[0].token_ids[:2] == expected[0][:2]  # bf16 may drift from fp32 on near-ties later
