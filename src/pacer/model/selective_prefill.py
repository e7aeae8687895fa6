"""A dense float32 forward in which only chosen tokens are computed: the reference for comparing
segment reuse's selection rules (which tokens of a reused segment to recompute).

`selective_forward` runs a span of tokens after an exact context (`past`, per layer K and V). An
*active* token is computed at every layer with the real context before it; an inactive one is
never computed: at every layer its K and V are the given `reuse` rows (a stored segment's KV,
re-rotated to the new positions). Active queries attend, causally by position, to the context,
the inactive rows and the active ones. With every token active this is ordinary prefill; with
the first k of a segment active it is the engine's rule (EPIC: recompute the segment's first
tokens); with the tokens whose KV deviates most at an early layer active it is CacheBlend's.

It runs on `LlamaModel`'s weights without the paged cache or the C++ kernels (one dense attention
per layer), so it is a measuring tool: `benchmarks/segment_selection.py` prints the quality of
each rule at equal recompute fractions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pacer.model.llama import LlamaModel

__all__ = ["SpanResult", "deviation", "selective_forward"]

KV = list[tuple[torch.Tensor, torch.Tensor]]   # per layer: K [T, kv heads, d] (rotated), V [T, kv heads, d]


@dataclass
class SpanResult:
    kv: KV                      # per layer, every token of the span (inactive rows as given)
    logprobs: torch.Tensor      # [active rows at or after `logits_from`, vocab] log-softmax


def _rope(model: LlamaModel, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    angles = positions.to(torch.float64).unsqueeze(1) * model.inv_freq.to(torch.float64)
    cos, sin = angles.cos().float().unsqueeze(1), angles.sin().float().unsqueeze(1)
    half = x.shape[-1] // 2
    return torch.cat((x[..., :half] * cos - x[..., half:] * sin, x[..., half:] * cos + x[..., :half] * sin), -1)


def _norm(model: LlamaModel, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, model.arch.rms_norm_eps)


@torch.inference_mode()
def selective_forward(model: LlamaModel, ids: torch.Tensor, positions: torch.Tensor, past: KV | None,
                      past_positions: torch.Tensor | None, active: torch.Tensor, reuse: KV | None = None,
                      logits_from: int | None = None, num_layers: int | None = None) -> SpanResult:
    """Run span `ids` [T] at `positions` after `past` (context KV at `past_positions`).

    `active` [T] bool: the tokens computed; the others take `reuse`'s rows at every layer (`reuse`
    may be None only when every token is active). `logits_from`: log-probs of the active rows
    whose span index is >= it (None: none). `num_layers`: stop after that many layers (the
    returned KV then covers only those; no logits)."""
    a = model.arch
    nh, nkv, d = a.num_heads, a.num_kv_heads, a.head_dim
    if a.sandwich_norms or a.sliding_layers or a.activation != "silu":
        raise ValueError(f"selective_forward runs Llama-layout layers; {a.arch} has sliding windows and sandwich norms")
    if reuse is None and not bool(active.all()):
        raise ValueError("inactive tokens need `reuse` KV")
    layers = model.layers[:num_layers] if num_layers is not None else model.layers
    idx = active.nonzero().flatten()
    q_pos = positions[idx]
    k_pos = positions if past_positions is None else torch.cat([past_positions, positions])
    mask = q_pos.unsqueeze(1) >= k_pos.unsqueeze(0)                     # [active, context + T]
    x = F.embedding(ids[idx], model.embed).float()
    out: KV = []
    for i, layer in enumerate(layers):
        h = _norm(model, x, layer.in_norm)
        q, k, v = layer.qkv(h).float().view(len(idx), nh + 2 * nkv, d).split([nh, nkv, nkv], dim=1)
        if layer.q_norm is not None and layer.k_norm is not None:
            q, k = F.rms_norm(q, (d,), layer.q_norm, a.rms_norm_eps), F.rms_norm(k, (d,), layer.k_norm, a.rms_norm_eps)
        q, k = _rope(model, q, q_pos), _rope(model, k, q_pos)
        if reuse is not None:
            span_k, span_v = reuse[i][0].clone().float(), reuse[i][1].clone().float()
        else:
            span_k = torch.zeros(len(ids), nkv, d)
            span_v = torch.zeros(len(ids), nkv, d)
        span_k[idx], span_v[idx] = k, v
        out.append((span_k, span_v))
        keys, vals = (span_k, span_v) if past is None else (torch.cat([past[i][0], span_k]), torch.cat([past[i][1], span_v]))
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1), keys.transpose(0, 1).repeat_interleave(nh // nkv, 0),
            vals.transpose(0, 1).repeat_interleave(nh // nkv, 0), attn_mask=mask, scale=model.scale)
        x = x + layer.o(attn.transpose(0, 1).reshape(len(idx), nh * d)).float()
        h = _norm(model, x, layer.post_norm)
        gate, up = layer.gate_up(h).float().chunk(2, dim=-1)
        x = x + layer.down(F.silu(gate) * up).float()
    if num_layers is not None or logits_from is None:
        return SpanResult(out, torch.empty(0))
    rows = idx >= logits_from
    logits = model.lm_head(_norm(model, x[rows], model.final_norm)).float()
    return SpanResult(out, logits.log_softmax(-1))


def deviation(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Per token, the squared L2 distance between two layers' K and V rows (CacheBlend's KV
    deviation): [T]."""
    return (a[0] - b[0]).pow(2).sum((1, 2)) + (a[1] - b[1]).pow(2).sum((1, 2))
