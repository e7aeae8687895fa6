"""Verifying drafted tokens in the executor's packed forward (speculative decoding).

A row with d drafts is a chunk of 1 + d tokens (its last token and the drafts) whose logits
are kept at every position: position i gives the target's distribution for output index
`num_output_tokens + i`. The sampler samples every position as it would sample that token
without speculation (same temperature, top-k/top-p, min_tokens; a seeded request draws the
same noise for the same output index), and the drafts are accepted while each equals the
token sampled before it; the first mismatch emits the sampled token instead, and when all
drafts hold the last position gives one more.

For drafts from a deterministic proposer (n-gram, suffix: the draft distribution q is a point
mass on the draft x) this is exactly rejection sampling: the draft is accepted with
probability p(x) = min(1, p(x)/q(x)), and on rejection the emitted token is distributed as p
restricted to tokens other than x, renormalised, which is max(0, p - q) normalised. So the
output distribution is the target's. Greedy rows take the argmax at every position, so
greedy outputs equal those without speculation up to floating-point near-ties.

Logprobs come per emitted position (the sampler's rows). Requests with penalties or
structured outputs are never drafted (pacer.sched.spec).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pacer.kv.block_pool import kept_blocks
from pacer.model.sampler import SamplingRow, TokenHistory
from pacer.request import SamplingParams
from pacer.sched.contract import RequestResult, ScheduledRequest

__all__ = ["accept_drafts", "sampling_rows", "fold_results"]


def accept_drafts(drafts: Sequence[int], sampled: Sequence[int]) -> list[int]:
    """`sampled[i]`: the token sampled at draft position i (len(drafts) + 1 of them). Returns
    the emitted tokens: the accepted drafts, then the first sampled token that differs (or
    the bonus token after the last draft)."""
    out: list[int] = []
    for draft, target in zip(drafts, sampled):
        out.append(target)
        if draft != target:
            return out
    out.append(sampled[len(drafts)])
    return out


def sampling_rows(sample_reqs: Sequence[ScheduledRequest], params: Sequence[SamplingParams],
                  histories: Sequence[TokenHistory | None]) -> tuple[list[SamplingRow], list[int]]:
    """One sampler row per logits row: 1 + d for a row with d drafts. Returns the rows and,
    per request, how many rows it has."""
    rows: list[SamplingRow] = []
    spans: list[int] = []
    for sr, p, history in zip(sample_reqs, params, histories):
        n = 1 + len(sr.draft_token_ids)
        rows.extend(SamplingRow(p, sr.num_output_tokens + i, history) for i in range(n))
        spans.append(n)
    return rows, spans


def fold_results(sample_reqs: Sequence[ScheduledRequest], spans: Sequence[int], token_ids: Sequence[int],
                 logprobs: Mapping[int, Mapping[int, float]], tables: Mapping[str, list[int]],
                 block_size: int) -> dict[str, RequestResult]:
    """Per request its emitted tokens (and their logprobs); trims the mirrored block table of
    each drafted request to the blocks of its verified tokens (`kept_blocks`, the
    scheduler's rule)."""
    results: dict[str, RequestResult] = {}
    row = 0
    for sr, n in zip(sample_reqs, spans):
        sampled = token_ids[row:row + n]
        emitted = accept_drafts(sr.draft_token_ids, sampled) if n > 1 else list(sampled)
        lps = [logprobs.get(row + i) for i in range(len(emitted))]
        results[sr.request_id] = RequestResult(
            tuple(emitted), None if lps[0] is None else tuple(lp or {} for lp in lps))
        if n > 1:
            verified = sr.start_position + len(emitted)   # the last token + the accepted drafts
            del tables[sr.request_id][kept_blocks(verified, block_size):]
        row += n
    return results
