"""What a loaded checkpoint is: the model's shape (`ModelArch`), its float32 tensors under HF names
(`Checkpoint`), and the check that the tensors match the shape. Both readers (`loader` for HF
directories, `gguf_loader` for GGUF files) build these; neither is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from pacer.model.tokenizer import Tokenizer

if TYPE_CHECKING:
    from pacer.model.quant import QuantWeight

__all__ = ["ModelArch", "Checkpoint", "as_token_ids", "expected_shapes", "check_tensors", "projection_names"]


@dataclass(frozen=True, slots=True)
class ModelArch:
    """Shape and conventions of a Llama-family decoder (Gemma 3 is one with the fields after
    `name` set: sandwich norms, GELU, scaled embeddings, sliding-window layers with their own
    rope base)."""

    arch: str  # "llama" | "qwen2" | "qwen3" | "gemma3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # HF style, e.g. {"rope_type": "llama3", "factor": 8.0, ...}
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections have a bias (qwen2)
    qk_norm: bool  # per-head RMSNorm on q and k (qwen3)
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    name: str
    activation: str = "silu"  # of the gated MLP: "silu" | "gelu_tanh" (gemma)
    scale_embeddings: bool = False  # embeddings times sqrt(hidden_size) (gemma)
    sandwich_norms: bool = False  # a norm after attention and around the MLP too (gemma)
    sliding_window: int = 0  # keys a sliding layer's query sees, itself included (0: none)
    sliding_layers: tuple[int, ...] = ()  # the layers that attend through the window
    rope_local_theta: float = 0.0  # the sliding layers' rope base (0: rope_theta; never scaled)
    attention_scale: float = 0.0  # softmax scale (0: head_dim ** -0.5)

    @property
    def softmax_scale(self) -> float:
        return self.attention_scale or self.head_dim ** -0.5

    def window(self, layer: int) -> int:
        """The sliding window of `layer` (0: it attends to the whole context)."""
        return self.sliding_window if layer in self.sliding_layers else 0


@dataclass
class Checkpoint:
    """Weights (float32, CPU, HF names; `lm_head.weight` only when untied) and what describes them.

    `quantized`: projection weights kept packed (HF names; `lm_head.weight` also when tied), which
    the model runs instead of their float32 copies in `tensors`; empty when not quantized."""

    arch: ModelArch
    tensors: dict[str, torch.Tensor]
    tokenizer: Tokenizer | None
    path: str
    quantized: dict[str, QuantWeight] = field(default_factory=dict)


def as_token_ids(*values: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for v in values:
        for i in v if isinstance(v, list) else ([] if v is None else [v]):
            if int(i) not in ids:
                ids.append(int(i))
    return tuple(ids)



# ---------------------------------------------------------------- validation


def expected_shapes(arch: ModelArch) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of `arch` must hold, with its shape."""
    h, q, kv, hd = arch.hidden_size, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim, arch.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, h), "model.norm.weight": (h,)}
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, h)
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (arch.intermediate_size, h),
            p + "mlp.up_proj.weight": (arch.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, arch.intermediate_size),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        }
        if arch.sandwich_norms:
            shapes |= {p + "pre_feedforward_layernorm.weight": (h,), p + "post_feedforward_layernorm.weight": (h,)}
        if arch.attention_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}
        if arch.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
    return shapes


def projection_names(arch: ModelArch) -> list[str]:
    """The weights a quantized model runs packed: every layer's projections and the LM head
    (`lm_head.weight` names the tied embedding's matrix too)."""
    layer = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    return [f"model.layers.{i}.{p}.weight" for i in range(arch.num_layers) for p in layer] + ["lm_head.weight"]


def check_tensors(arch: ModelArch, tensors: dict[str, torch.Tensor], source: str) -> None:
    shapes = expected_shapes(arch)
    missing = sorted(set(shapes) - set(tensors))
    extra = sorted(set(tensors) - set(shapes))
    if missing or extra:
        raise ValueError(f"{source}: tensors do not match a {arch.arch} model of this config: "
                         f"missing {missing[:5]} ({len(missing)} in all), unexpected {extra[:5]} ({len(extra)} in all)")
    wrong = [f"{k}: {tuple(tensors[k].shape)} != {s}" for k, s in shapes.items() if tuple(tensors[k].shape) != s]
    if wrong:
        raise ValueError(f"{source}: tensor shapes do not match the config: {wrong[:5]} ({len(wrong)} in all)")
