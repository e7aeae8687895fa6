"""HF transformers reference model on pacer's own loaded weights (for parity tests and
side-by-side benchmarks): the same tensors, so any difference is the forward pass."""

from __future__ import annotations

from typing import Any

import torch

from pacer.model.checkpoint import Checkpoint

__all__ = ["hf_llama_from_checkpoint"]


def hf_llama_from_checkpoint(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> Any:
    """A `transformers.LlamaForCausalLM` holding `ckpt`'s weights (Llama-architecture checkpoints)."""
    import transformers

    a = ckpt.arch
    if a.arch != "llama" or a.rope_scaling:
        raise ValueError(f"hf_llama_from_checkpoint supports plain llama checkpoints, got {a.arch} {a.rope_scaling}")
    # rope_theta: a keyword of transformers 4 that 5 still accepts (into rope_parameters)
    cfg = transformers.LlamaConfig(  # type: ignore[call-arg]
        vocab_size=a.vocab_size, hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
        num_hidden_layers=a.num_layers, num_attention_heads=a.num_heads, num_key_value_heads=a.num_kv_heads,
        head_dim=a.head_dim, rms_norm_eps=a.rms_norm_eps, rope_theta=a.rope_theta,
        max_position_embeddings=a.max_position_embeddings, tie_word_embeddings=a.tie_word_embeddings,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict(ckpt.tensors, strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"}:
        raise ValueError(f"weights do not fit LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.to(dtype)
