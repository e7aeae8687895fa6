"""Batched sampling: greedy, temperature, top-k, top-p, per-request seeds.

Sampling uses the exponential race (argmax of p / E, E ~ Exp(1)), which equals drawing
from p. A seeded request draws its noise from a generator seeded by (seed, output index),
so its tokens do not depend on batch composition or on preemption and recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pacer.request import SamplingParams

__all__ = ["Sampler", "SamplingRow"]


@dataclass(frozen=True, slots=True)
class SamplingRow:
    params: SamplingParams
    output_index: int   # how many tokens the request generated before this one


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self._gen = torch.Generator(device="cpu")
        self._gen.manual_seed(seed)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
        """logits: float32 [R, V]; returns one token id per row."""
        greedy_ids = logits.argmax(dim=-1)
        random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
        if not random_rows:
            return greedy_ids.tolist()
        out = greedy_ids.clone()
        idx = torch.tensor(random_rows, device=logits.device)
        sub = logits.index_select(0, idx)
        temps = torch.tensor([rows[i].params.temperature for i in random_rows],
                             dtype=sub.dtype, device=sub.device).unsqueeze(1)
        sub = sub / temps
        sub = self._apply_top_k_top_p(sub, [rows[i].params for i in random_rows])
        probs = torch.softmax(sub, dim=-1)
        noise = self._exponential_noise(probs.shape, [rows[i] for i in random_rows])
        out[idx] = (probs / noise.to(probs.device)).argmax(dim=-1)
        return out.tolist()

    @staticmethod
    def _apply_top_k_top_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        if all(p.top_k == 0 and p.top_p >= 1.0 for p in params):
            return logits
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        vocab = logits.shape[-1]
        ks = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=logits.device)
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        drop = ranks >= ks.unsqueeze(1)
        top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype, device=logits.device).unsqueeze(1)
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= top_p      # keep the smallest prefix whose mass reaches top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.empty_like(logits).scatter_(-1, order, sorted_logits)

    def _exponential_noise(self, shape: torch.Size, rows: list[SamplingRow]) -> torch.Tensor:
        noise = torch.empty(shape, dtype=torch.float32)
        for i, r in enumerate(rows):
            if r.params.seed is None:
                noise[i].exponential_(generator=self._gen)
            else:
                g = torch.Generator(device="cpu")
                g.manual_seed((r.params.seed * 1_000_003 + r.output_index) % (2**63))
                noise[i].exponential_(generator=g)
        return noise.clamp_min_(1e-20)
