"""The default GGUF run as shipped (--quantization gguf), and its greedy output is the dequantized
float32 path's (weight-only, float activations: equal up to summation order, so apart from near-ties)."""

from __future__ import annotations

import torch

from pacer import LLM, SamplingParams
from pacer.engine import Engine
from pacer.model.llama import LlamaModel
from pacer.model.loader import load_checkpoint, quantize_checkpoint, resolve_quantization
from pacer.model.quant import QuantLinear
from tests.conftest import llm_over


def test_default_gguf_runs_quantized_and_matches_float32(base: Engine) -> None:
    ckpt = load_checkpoint(None)
    quantize_checkpoint(ckpt, "gguf")
    model = LlamaModel(ckpt.arch, ckpt.tensors, dtype=torch.float32, quantized=ckpt.quantized)
    assert isinstance(model.lm_head, QuantLinear) and isinstance(model.layers[0].gate_up, QuantLinear)
    assert model.quantization == ["Q4_1", "Q8_0"]
    assert model.weight_bytes < 0.25 * sum(x.out_features * x.in_features * 4 for x in model._projections())

    ref = base.executor.model   # the reference: --quantization none (auto) keeps the float32 path
    prompt = base.tokenizer.encode("The capital of France is")
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=2)
    outs = []
    for m in (model, ref):
        llm = llm_over(base)
        llm.engine.executor.model = m
        outs.append(llm.generate([prompt], params)[0].outputs[0])
    got, want = outs
    for i, (a, b) in enumerate(zip(got.token_ids, want.token_ids)):
        if a != b:   # a counted near-tie: the float path's top two logprobs within float rounding
            top = sorted(want.logprobs[i].values(), key=lambda lp: -lp.logprob)
            assert top[0].logprob - top[1].logprob < 1e-3, (i, got.token_ids, want.token_ids)
            break


def test_quantization_choices_resolve() -> None:
    assert resolve_quantization("auto", None, "cpu", torch.float32) == "none"
    assert resolve_quantization("gguf", None, "cpu", torch.float32) == "gguf"
    assert resolve_quantization("auto", None, "cpu", torch.bfloat16) == "none"
    assert resolve_quantization("none", None, "cpu", torch.float32) == "none"
    for bad, kw in (("gguf", {"path": "/some/hf_dir"}), ("int8", {"dtype": torch.bfloat16})):
        args = {"path": None, "device": "cpu", "dtype": torch.float32} | kw
        try:
            resolve_quantization(bad, **args)
        except ValueError as e:
            assert "quantization" in str(e)
        else:
            raise AssertionError(f"{bad} with {kw} was accepted")


def test_int8_weight_only_checkpoint(base: Engine) -> None:
    ckpt = load_checkpoint(None)
    quantize_checkpoint(ckpt, "int8")
    assert {w.fmt for w in ckpt.quantized.values()} == {"int8"}
    model = LlamaModel(ckpt.arch, ckpt.tensors, dtype=torch.float32, quantized=ckpt.quantized)
    llm: LLM = llm_over(base)
    llm.engine.executor.model = model
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=4, temperature=0))[0].outputs[0]
    assert "Paris" in out.text
