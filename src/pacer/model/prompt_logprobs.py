"""Prompt logprobs (vLLM's `SamplingParams.prompt_logprobs`): which logits rows of a packed
forward score prompt tokens, and their {token_id: logprob} entries.

The logits at position p give the distribution of the token at p + 1, so a chunk covering
positions [start, start + n) scores prompt tokens start + 1 .. start + n (those that are prompt
tokens); the last one's target is the next chunk's first token, hence the executor keeps the
prompt's ids. Entries are the log-softmax of the raw float32 logits: the prompt token first,
then the k most likely, as the sampler's output logprobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["PromptRows", "prompt_rows_of", "prompt_entries"]


@dataclass(frozen=True, slots=True)
class PromptRows:
    """One request's prompt-scoring rows in a step: packed rows, each scoring the token at
    `first_index + i` (`targets[i]`) with `k` top logprobs."""

    request_id: str
    first_index: int
    rows: list[int]
    targets: list[int]
    k: int


def prompt_rows_of(request_id: str, prompt_ids: Sequence[int], k: int, first_row: int, start: int,
                   num_tokens: int) -> PromptRows | None:
    """The rows of a chunk at packed row `first_row` (positions start..start+num_tokens) that
    score a prompt token; None when it scores none (a decode, or the prompt's last token)."""
    end = min(start + num_tokens, len(prompt_ids) - 1)
    if end <= start:
        return None
    return PromptRows(request_id, start + 1, list(range(first_row, first_row + end - start)),
                      list(prompt_ids[start + 1:end + 1]), k)


def prompt_entries(logits: torch.Tensor, groups: Sequence[PromptRows]) -> dict[str, tuple[int, list[dict[int, float]]]]:
    """`logits`: float32 [sum of the groups' rows, vocab], in the groups' order. Returns per
    request (index of the first token scored, one entry per token)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor([t for g in groups for t in g.targets], device=logits.device)
    chosen = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
    max_k = max(g.k for g in groups)
    top_ids: list[list[int]] = []
    top_lps: list[list[float]] = []
    if max_k > 0:
        values, indices = logprobs.topk(max_k, dim=-1)
        top_ids, top_lps = indices.tolist(), values.tolist()
    out: dict[str, tuple[int, list[dict[int, float]]]] = {}
    row = 0
    for g in groups:
        entries = []
        for target in g.targets:
            entry = {target: chosen[row]}
            if g.k:
                entry.update(zip(top_ids[row][:g.k], top_lps[row][:g.k]))
            entries.append(entry)
            row += 1
        out[g.request_id] = (g.first_index, entries)
    return out
