"""GGUF checkpoints: metadata to `ModelArch`, tensors dequantised with the `gguf` package and
renamed to HF's names, the tokenizer and chat template from the metadata.

Tensors are dequantized once and cached as a safetensors file (see `gguf_cache_stem`) so later
loads skip both GGUF parsing and dequantization. llama.cpp stores Llama Q/K rows permuted for its
interleaved rope; they are permuted back here, so every consumer sees HF's (rotate_half) layout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pacer.model.checkpoint import Checkpoint, ModelArch, as_token_ids, check_tensors, projection_names
from pacer.model.tokenizer import Tokenizer, gguf_cache_stem

if TYPE_CHECKING:
    from pacer.model.quant import QuantWeight

__all__ = ["load_gguf", "load_gguf_blocks"]

logger = logging.getLogger(__name__)

_GGUF_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
# Gemma's four norms per layer; llama.cpp's converter stores them with Gemma's +1 already added,
# so they are plain RMSNorm weights here (HF's Gemma3RMSNorm adds the 1 at run time)
_GEMMA_NORM_NAMES = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
}
_GEMMA3_LAYER_NAMES = _GGUF_LAYER_NAMES | _GEMMA_NORM_NAMES
_GEMMA3_SWA_PATTERN, _GEMMA3_LOCAL_ROPE_BASE = 6, 10000.0   # as llama.cpp sets them for gemma3
_GGUF_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_ARCH_METADATA_KEY = "pacer.arch"


def load_gguf(path: Path, cache_dir: str | None = None) -> Checkpoint:
    """Weights under HF names, the arch and the tokenizer of a GGUF file (cached dequantised)."""
    stem = gguf_cache_stem(str(path), cache_dir)
    cached = stem.with_name(stem.name + ".safetensors")
    loaded = _read_cache(cached) if cached.is_file() else None
    if loaded is not None:
        arch, tensors = loaded
        tokenizer = Tokenizer.load(str(path), cache_dir=cache_dir)
        check_tensors(arch, tensors, str(path))
    else:
        import gguf

        reader = gguf.GGUFReader(str(path))
        arch = _arch_from_gguf(reader, path)
        tokenizer = Tokenizer.load(str(path), cache_dir=cache_dir, gguf_reader=reader)
        tensors = {_hf_name(t.name, path, arch.arch): _dequantize(t) for t in reader.tensors}
        check_tensors(arch, tensors, str(path))
        if arch.arch == "llama":  # undo llama.cpp's interleaved-rope row order
            for i in range(arch.num_layers):
                for proj, n_head in (("q_proj", arch.num_heads), ("k_proj", arch.num_kv_heads)):
                    key = f"model.layers.{i}.self_attn.{proj}.weight"
                    tensors[key] = _unpermute_rows(tensors[key], n_head)
        _write_cache(cached, arch, tensors)
    return Checkpoint(arch=arch, tensors=tensors, tokenizer=tokenizer, path=str(path))


def load_gguf_blocks(path: Path, arch: ModelArch) -> dict[str, QuantWeight]:
    """The projection weights (and the LM head, tied or not) as packed blocks, read straight from
    the file (memory-mapped; no dequantization), q/k rows un-permuted as `load_gguf` does.
    Weights of a type without a packed kernel (float, K-quants) are left out: they run float32."""
    import gguf

    from pacer.model.quant import GGUF_BLOCK_TYPES, from_gguf_blocks

    wanted = set(projection_names(arch))
    out: dict[str, QuantWeight] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        tied_head = t.name == "token_embd.weight" and arch.tie_word_embeddings
        name = "lm_head.weight" if tied_head else _hf_name(t.name, path, arch.arch)
        if name not in wanted or t.tensor_type.name not in GGUF_BLOCK_TYPES:
            continue
        shape = (int(t.shape[1]), int(t.shape[0]))   # GGUF lists dims innermost first
        qw = from_gguf_blocks(t.tensor_type.name, t.data, shape)
        if arch.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            n_head = arch.num_heads if "q_proj" in name else arch.num_kv_heads
            order = _unpermute_rows(torch.arange(shape[0], dtype=torch.float64).unsqueeze(1), n_head)
            qw = qw.rows(order.squeeze(1).long())
        out[name] = qw
    return out


def _field(fields: Any, key: str, default: Any = ...) -> Any:
    if key in fields:
        return fields[key].contents()
    if default is ...:
        raise ValueError(f"GGUF metadata lacks {key!r}")
    return default


def _arch_from_gguf(reader: Any, path: Path) -> ModelArch:
    fields, shapes = reader.fields, {t.name: t.shape for t in reader.tensors}
    a = str(_field(fields, "general.architecture"))
    if a not in _GGUF_ARCHS:
        raise ValueError(f"{path.name}: GGUF architecture {a!r} is not supported; supported: {list(_GGUF_ARCHS)}")
    if "token_embd.weight" not in shapes:
        raise ValueError(f"{path.name}: GGUF has no token_embd.weight tensor")
    if "rope_freqs.weight" in shapes:
        raise ValueError(f"{path.name}: llama3-style rope scaling stored as rope_freqs is not supported "
                         f"from GGUF; load the model's HF directory instead")
    hidden, heads = int(_field(fields, f"{a}.embedding_length")), int(_field(fields, f"{a}.attention.head_count"))
    head_dim = int(_field(fields, f"{a}.attention.key_length", hidden // heads))
    rope_dims = int(_field(fields, f"{a}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(f"{path.name}: partial rotary (rope dims {rope_dims} < head_dim {head_dim}) is not supported")
    scaling_type = str(_field(fields, f"{a}.rope.scaling.type", "none"))
    if scaling_type not in ("none", "linear"):
        raise ValueError(f"{path.name}: rope scaling {scaling_type!r} is not supported (none, linear)")
    scaling = ({"rope_type": "linear", "factor": float(_field(fields, f"{a}.rope.scaling.factor"))}
               if scaling_type == "linear" else None)
    eos = as_token_ids(*(_field(fields, f"tokenizer.ggml.{k}_token_id", None) for k in ("eos", "eot", "eom")))
    layers = int(_field(fields, f"{a}.block_count"))
    gemma: dict[str, Any] = {}
    if a == "gemma3":
        gemma = dict(activation="gelu_tanh", scale_embeddings=True, sandwich_norms=True,
                     sliding_window=int(_field(fields, f"{a}.attention.sliding_window")),
                     sliding_layers=tuple(i for i in range(layers) if (i + 1) % _GEMMA3_SWA_PATTERN),
                     rope_local_theta=_GEMMA3_LOCAL_ROPE_BASE,
                     # llama.cpp's rule: the 27B (62 layers) scales by hidden / heads, the rest by head_dim
                     attention_scale=(hidden / heads) ** -0.5 if layers == 62 else 0.0)
    return ModelArch(
        arch=a, vocab_size=int(shapes["token_embd.weight"][-1]), hidden_size=hidden,
        intermediate_size=int(_field(fields, f"{a}.feed_forward_length")),
        num_layers=layers, num_heads=heads,
        num_kv_heads=int(_field(fields, f"{a}.attention.head_count_kv", heads)), head_dim=head_dim,
        rms_norm_eps=float(_field(fields, f"{a}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(fields, f"{a}.rope.freq_base", 10000.0)), rope_scaling=scaling,
        max_position_embeddings=int(_field(fields, f"{a}.context_length")),
        tie_word_embeddings="output.weight" not in shapes, attention_bias=a == "qwen2",
        qk_norm=a in ("qwen3", "gemma3"),
        bos_token_id=next(iter(as_token_ids(_field(fields, "tokenizer.ggml.bos_token_id", None))), None),
        eos_token_ids=eos,
        name=str(_field(fields, "general.name", path.stem)), **gemma,
    )


def _hf_name(gguf_name: str, path: Path, arch: str) -> str:
    if gguf_name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[gguf_name]
    m = _GGUF_LAYER_RE.fullmatch(gguf_name)
    names = _GEMMA3_LAYER_NAMES if arch == "gemma3" else _GGUF_LAYER_NAMES
    if m is None or m.group(2) not in names:
        raise ValueError(f"{path.name}: unexpected GGUF tensor {gguf_name!r}")
    return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"


def _dequantize(t: Any) -> torch.Tensor:
    import numpy as np
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists dims innermost first
    values = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
    return torch.from_numpy(values.copy())


def _unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).transpose(1, 2).reshape(out, inp).contiguous()


def _read_cache(path: Path) -> tuple[ModelArch, dict[str, torch.Tensor]] | None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})[_ARCH_METADATA_KEY])
        meta["eos_token_ids"] = tuple(meta["eos_token_ids"])
        meta["sliding_layers"] = tuple(meta.get("sliding_layers", ()))
        return ModelArch(**meta), load_file(str(path))
    except (OSError, KeyError, TypeError, ValueError) as e:  # unreadable or stale: rebuild it
        logger.warning("ignoring GGUF cache %s: %s", path, e)
        return None


def _write_cache(path: Path, arch: ModelArch, tensors: dict[str, torch.Tensor]) -> None:
    """Write under a temporary name and rename into place, so a concurrent reader never sees a
    partial file. A cache that cannot be written only costs speed."""
    from safetensors.torch import save_file

    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp-")
        os.close(fd)
        save_file(tensors, tmp, metadata={_ARCH_METADATA_KEY: json.dumps(asdict(arch))})
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        logger.warning("not caching dequantized GGUF weights at %s: %s", path, e)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
