"""A tiny Qwen3-architecture model built locally for the reasoning tests: random weights (tied
embeddings, per-head q/k RMSNorm, no attention bias) over SmolLM2's tokenizer with Qwen3's
`<think>` and `</think>` added as (non-special) tokens, so the mechanics run end to end without a
hub download. Its text is noise; the tests force what they assert (budgets, grammars)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from pacer.model.loader import default_model_path
from pacer.model.tokenizer import Tokenizer

THINK_TAGS = ("<think>", "</think>")


def build_tiny_qwen3(folder: Path, chat_template: str | None = None) -> str:
    """Write the model (config, safetensors, tokenizer) into `folder`; returns its path."""
    smol = Tokenizer.load(default_model_path())
    assert smol is not None
    smol.hf.save_pretrained(folder)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.add_tokens([transformers.AddedToken(t, special=False, normalized=False) for t in THINK_TAGS])
    tok.chat_template = chat_template
    tok.save_pretrained(folder)
    cfg = transformers.Qwen3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, initializer_range=0.2,
        tie_word_embeddings=True, rope_theta=1e6, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).eval().save_pretrained(folder)
    return str(folder)
