"""Measurements over one token stream run through the paged KV path: fp8 scale calibration
(`calculate_kv_scales`) and per-token negative log-likelihood (the KV-quality benchmark).

The stream is prefilled in chunks into fresh caches of the given format, so every chunk after
the first reads the earlier context back from the (possibly quantized) cache, as serving does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from pacer.model.attention import AttentionMetadata, PrefillSeq
from pacer.model.kv_quant import FP8_MAX, KVFormat
from pacer.model.llama import LlamaModel

__all__ = ["calibrate_fp8_scales", "stream_nll", "forward_stream"]

Caches = list[tuple[torch.Tensor, torch.Tensor]]


def forward_stream(model: LlamaModel, token_ids: Sequence[int], fmt: KVFormat, chunk: int = 256,
                   on_logits: Callable[[int, torch.Tensor], None] | None = None, block_size: int = 16) -> Caches:
    """Prefill `token_ids` chunk by chunk; `on_logits(start, logits [chunk, vocab])` sees every
    row's logits (when given). Returns the caches, holding the whole stream."""
    n = len(token_ids)
    if n < 1 or chunk < 1:
        raise ValueError(f"need >= 1 token and chunk >= 1, got {n} tokens, chunk={chunk}")
    nb = -(-n // block_size)
    caches = model.allocate_kv_cache(nb, block_size, fmt)
    table = torch.arange(nb, device=model.device)
    dev = model.device
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        ctx_blocks = -(-(start + m) // block_size)
        seq = PrefillSeq(0, m, start, table[:ctx_blocks])
        batch: Any = None
        if model.kernel is not None:
            batch = (torch.tensor([0]), torch.tensor([m]), torch.tensor([start]), table[:ctx_blocks].unsqueeze(0))
        meta = AttentionMetadata(slot_mapping=torch.arange(start, start + m, device=dev), num_single=0,
                                 single_block_tables=None, single_mask=None, single_context_lens=None,
                                 prefills=[seq], prefill_batch=batch)
        ids = torch.tensor(list(token_ids[start:start + m]), device=dev)
        rows = torch.arange(m, device=dev) if on_logits is not None else torch.tensor([m - 1], device=dev)
        logits = model.forward(ids, torch.arange(start, start + m, device=dev), meta, caches, rows, fmt)
        if on_logits is not None:
            on_logits(start, logits)
    return caches


def stream_nll(model: LlamaModel, token_ids: Sequence[int], fmt: KVFormat, chunk: int = 256) -> list[float]:
    """Negative log-likelihood of each token after the first, given all before it."""
    target = torch.tensor(list(token_ids))
    out: list[float] = []

    def collect(start: int, logits: torch.Tensor) -> None:
        nxt = target[start + 1:start + 1 + logits.shape[0]]
        lp = torch.log_softmax(logits[:nxt.shape[0]].float(), dim=-1)
        out.extend((-lp.gather(1, nxt.unsqueeze(1)).squeeze(1)).tolist())

    forward_stream(model, token_ids, fmt, chunk, collect)
    return out


def calibrate_fp8_scales(model: LlamaModel, fmt: KVFormat, tokenizer: Any, num_tokens: int = 512) -> KVFormat:
    """Per-layer K / V scales, max |x| / fp8 max, from a warm-up prefill in the model's dtype over
    the bench corpus (text shipped in pacer.workload.text). int8 and auto need none: returned as is."""
    if fmt.name not in FP8_MAX:
        return fmt
    from pacer.corpus import CORPUS

    ids = list(tokenizer.encode(" ".join(CORPUS)))[:num_tokens]
    caches = forward_stream(model, ids, model.kv_format("auto"))
    lim = FP8_MAX[fmt.name]
    n = len(ids)

    def scale(t: torch.Tensor) -> float:
        amax = float(t.reshape(-1, *t.shape[2:])[:n].abs().max())
        return amax / lim if amax > 0 else 1.0

    return fmt.with_scales([scale(k) for k, _ in caches], [scale(v) for _, v in caches])
