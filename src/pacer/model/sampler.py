"""Batched sampling: penalties, greedy, temperature, top-k, top-p, per-request seeds, logprobs.

The order is vLLM V1's: logprobs come from the raw logits (a log_softmax before anything
else touches them); then `min_tokens` (a row short of it cannot sample its stop tokens: EOS
unless `ignore_eos`, and `stop_token_ids`); then penalties (repetition over prompt and output tokens, frequency and
presence over output tokens); then greedy rows take the argmax and the others go through
temperature, top-k and top-p. Rows that ask for no penalties and no logprobs pay for neither.

Sampling uses the exponential race (argmax of p / E, E ~ Exp(1)), which equals drawing
from p. A seeded request draws its noise from a generator seeded by (seed, output index),
so its tokens do not depend on batch composition or on preemption and recompute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pacer.request import SamplingParams

__all__ = ["Sampler", "SamplingRow", "SamplerOutput", "TokenHistory"]


class TokenHistory:
    """One request's tokens as its penalties see them, kept on the logits' device: how often
    each token was generated, and which tokens occurred at all (prompt or output).

    The executor seeds it from a new request's `prompt_token_ids` and `output_token_ids`
    (resumed requests included) and shows it every later chunk; tokens past the known ones
    are new outputs. Tensors are created at the first sample and updated there with what
    arrived since, in one op each."""

    __slots__ = ("num_tokens", "_pending_prompt", "_pending_output", "_counts", "_seen", "output_ids")

    def __init__(self, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]) -> None:
        self.num_tokens = len(prompt_token_ids) + len(output_token_ids)
        self._pending_prompt = list(prompt_token_ids)
        self._pending_output = list(output_token_ids)
        self.output_ids = list(output_token_ids)   # the output so far (bad words match its tail)
        self._counts: torch.Tensor | None = None
        self._seen: torch.Tensor | None = None

    def observe(self, start_position: int, token_ids: Sequence[int]) -> None:
        """Record a scheduled chunk (positions start_position...); only its unseen tail is new."""
        known = self.num_tokens - start_position
        if known < 0:
            raise ValueError(f"token history holds {self.num_tokens} tokens but a chunk starts at {start_position}")
        if known < len(token_ids):
            new = token_ids[known:]
            self._pending_output.extend(new)
            self.output_ids.extend(new)
            self.num_tokens += len(new)

    def tensors(self, vocab_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(output token counts float32 [V], seen in prompt or output bool [V])."""
        if self._counts is None or self._seen is None:
            self._counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
            self._seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        if self._pending_prompt:
            self._seen[torch.tensor(self._pending_prompt, device=device)] = True
            self._pending_prompt = []
        if self._pending_output:
            ids = torch.tensor(self._pending_output, device=device)
            self._counts.index_add_(0, ids, torch.ones(len(self._pending_output), device=device))
            self._seen[ids] = True
            self._pending_output = []
        return self._counts, self._seen


@dataclass(frozen=True, slots=True)
class SamplingRow:
    params: SamplingParams
    output_index: int                     # how many tokens the request generated before this one
    history: TokenHistory | None = None   # set when params.needs_history


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    # row -> {token_id: logprob}: the sampled token first, then the row's top-k in descending
    # order (k or k + 1 entries); only rows whose params ask for logprobs
    logprobs: dict[int, dict[int, float]] = field(default_factory=dict)


class Sampler:
    def __init__(self, seed: int = 0, eos_token_ids: Sequence[int] = ()) -> None:
        self._gen = torch.Generator(device="cpu")
        self._gen.manual_seed(seed)
        self.eos_token_ids = tuple(eos_token_ids)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
        """logits: float32 [R, V]; returns one token id per row (and logprobs where asked)."""
        logprob_rows = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        raw_logprobs = None
        if logprob_rows:
            idx = torch.tensor(logprob_rows, device=logits.device)
            raw_logprobs = torch.log_softmax(logits.index_select(0, idx), dim=-1)
        banned = {i: self._stop_token_ids(r.params) for i, r in enumerate(rows) if r.output_index < r.params.min_tokens}
        if any(banned.values()):
            logits = logits.clone()
            for i, ids in banned.items():
                logits[i, list(ids)] = float("-inf")
        if any(r.params.has_token_filters for r in rows):
            logits = _apply_token_filters(logits, rows)
        penalty_rows = [i for i, r in enumerate(rows) if r.history is not None and r.params.has_penalties]
        if penalty_rows:
            logits = self._apply_penalties(logits, rows, penalty_rows)
        tokens = self._sample_tokens(logits, rows)
        out = SamplerOutput(tokens.tolist())
        if raw_logprobs is not None:
            out.logprobs = self._gather_logprobs(raw_logprobs, tokens, rows, logprob_rows)
        return out

    def _stop_token_ids(self, params: SamplingParams) -> tuple[int, ...]:
        """The tokens a row short of `min_tokens` may not sample (vLLM's all_stop_token_ids)."""
        return params.stop_token_ids + (() if params.ignore_eos else self.eos_token_ids)

    def _sample_tokens(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        greedy_ids = logits.argmax(dim=-1)
        random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
        if not random_rows:
            return greedy_ids
        out = greedy_ids.clone()
        idx = torch.tensor(random_rows, device=logits.device)
        sub = logits.index_select(0, idx)
        temps = torch.tensor([rows[i].params.temperature for i in random_rows],
                             dtype=sub.dtype, device=sub.device).unsqueeze(1)
        sub = sub / temps
        sub = self._apply_top_k_top_p(sub, [rows[i].params for i in random_rows])
        probs = torch.softmax(sub, dim=-1)
        min_ps = [rows[i].params.min_p for i in random_rows]
        if any(min_ps):   # vLLM's min_p: drop tokens below min_p x the top token's probability
            floor = torch.tensor(min_ps, dtype=probs.dtype, device=probs.device).unsqueeze(1)
            probs = probs.masked_fill(probs < floor * probs.max(dim=-1, keepdim=True).values, 0.0)
        noise = self._exponential_noise(probs.shape, [rows[i] for i in random_rows])
        out[idx] = (probs / noise.to(probs.device)).argmax(dim=-1)
        return out

    @staticmethod
    def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow], penalty_rows: list[int]) -> torch.Tensor:
        """vLLM's penalties on the rows that have them; returns new logits (the input is kept)."""
        vocab, dev = logits.shape[-1], logits.device
        histories = [h.tensors(vocab, dev) for h in (rows[i].history for i in penalty_rows) if h is not None]
        counts = torch.stack([c for c, _ in histories])
        seen = torch.stack([s for _, s in histories])
        params = [rows[i].params for i in penalty_rows]

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=logits.dtype, device=dev).unsqueeze(1)

        idx = torch.tensor(penalty_rows, device=dev)
        sub = logits.index_select(0, idx)
        rep = column([p.repetition_penalty for p in params])
        penalties = torch.where(seen, rep, torch.ones_like(rep))
        sub = sub * torch.where(sub > 0, 1.0 / penalties, penalties)
        sub = sub - column([p.frequency_penalty for p in params]) * counts
        sub = sub - column([p.presence_penalty for p in params]) * (counts > 0)
        return logits.index_copy(0, idx, sub)

    @staticmethod
    def _gather_logprobs(raw: torch.Tensor, tokens: torch.Tensor, rows: list[SamplingRow],
                         logprob_rows: list[int]) -> dict[int, dict[int, float]]:
        """raw: log_softmax of the raw logits of `logprob_rows` [L, V]."""
        idx = torch.tensor(logprob_rows, device=raw.device)
        chosen = tokens.index_select(0, idx)
        chosen_lp = raw.gather(1, chosen.unsqueeze(1)).squeeze(1)
        ks = [rows[i].params.logprobs or 0 for i in logprob_rows]
        top_ids: list[list[int]] = [[] for _ in ks]
        top_lps: list[list[float]] = [[] for _ in ks]
        if max(ks) > 0:
            values, indices = raw.topk(max(ks), dim=-1)
            top_ids, top_lps = indices.tolist(), values.tolist()
        out: dict[int, dict[int, float]] = {}
        for j, (row, tok, lp, k) in enumerate(zip(logprob_rows, chosen.tolist(), chosen_lp.tolist(), ks)):
            entry = {tok: lp}
            entry.update(zip(top_ids[j][:k], top_lps[j][:k]))
            out[row] = entry
        return out

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


def _apply_token_filters(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """vLLM's per-request logits processors, on a copy: `allowed_token_ids` (every other token
    at -inf), `bad_words_token_ids` (a word's last token at -inf when the output ends with the
    rest of it) and `logit_bias` (added)."""
    logits = logits.clone()
    vocab = logits.shape[-1]
    for i, r in enumerate(rows):
        p = r.params
        if p.allowed_token_ids:
            keep = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
            keep[[t for t in p.allowed_token_ids if t < vocab]] = True
            logits[i].masked_fill_(~keep, float("-inf"))
        outputs = r.history.output_ids if r.history is not None else []
        for word in p.bad_words_token_ids:
            if len(word) == 1 or (len(outputs) >= len(word) - 1 and outputs[len(outputs) - len(word) + 1:] == list(word[:-1])):
                logits[i, word[-1]] = float("-inf")
        pairs = p.logit_bias_pairs
        if pairs:
            ids = [t for t, _ in pairs if t < vocab]
            logits[i, ids] += torch.tensor([b for t, b in pairs if t < vocab], dtype=logits.dtype,
                                           device=logits.device)
    return logits
