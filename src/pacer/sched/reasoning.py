"""Reasoning as the scheduler sees it: where a request's thinking ends, and its token budget. Pure.

A reasoning model thinks first, between a start and an end tag (`<think>` ... `</think>` for
Qwen3 and DeepSeek-R1; `--reasoning-parser`), then answers. Two things follow, as in vLLM:

- a grammar (structured outputs, forced tool calls) constrains the answer only: its masks start
  and its matcher is fed from the token after the end tag (a JSON mode does not switch thinking
  off);
- `thinking_token_budget` (vLLM's): once a request has thought that many tokens, the end tag's
  tokens are forced, one a step (a mask that allows that token alone).

Whether a request starts inside its thinking is read from its prompt, as vLLM's
`is_reasoning_end`: a prompt whose last tag is the end tag (Qwen3's template with
`enable_thinking: false` writes an empty `<think></think>`) has finished thinking; any other
prompt has not (its output's end tag ends it). Only requests with a grammar or a budget are
tracked; the rest cost nothing. The budget is also part of a request's predicted output length
(`predicted_output_tokens`), which the length-aware policies read in place of `max_tokens`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pacer.request import Request
from pacer.sampling_params import SamplingParams
from pacer.sched.contract import TokenMasks

__all__ = ["ThinkTags", "ReasoningTracker", "predicted_output_tokens", "ANSWER_TOKENS_ESTIMATE"]

# What a budgeted request is predicted to write after its thinking, when max_tokens allows more:
# the length of a typical chat answer (ShareGPT's mean reply is ~200-300 tokens).
ANSWER_TOKENS_ESTIMATE = 256


def predicted_output_tokens(params: SamplingParams) -> int:
    """The output length the policies plan with: `max_tokens`, or with a thinking budget the
    budget plus an answer (`ANSWER_TOKENS_ESTIMATE`), never above `max_tokens`."""
    budget = params.thinking_token_budget
    if budget is None:
        return params.max_tokens
    return min(params.max_tokens, budget + 1 + ANSWER_TOKENS_ESTIMATE)


@dataclass(frozen=True, slots=True)
class ThinkTags:
    """The token ids of the start and end tags (one token each in Qwen3 / DeepSeek-R1 vocabularies)."""

    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.start_ids or not self.end_ids:
            raise ValueError("reasoning tags must each be at least one token")

    def ended_in(self, token_ids: Sequence[int]) -> bool:
        """Whether the last tag in `token_ids` is the end tag."""
        end, start = _rfind(token_ids, self.end_ids), _rfind(token_ids, self.start_ids)
        return end > start

    def started_in(self, token_ids: Sequence[int]) -> bool:
        """Whether the last tag in `token_ids` is the start tag (the text after it is thinking)."""
        end, start = _rfind(token_ids, self.end_ids), _rfind(token_ids, self.start_ids)
        return start > end


def _rfind(ids: Sequence[int], seq: tuple[int, ...]) -> int:
    n = len(seq)
    for i in range(len(ids) - n, -1, -1):
        if tuple(ids[i:i + n]) == seq:
            return i
    return -1


class _Thinking:
    """One tracked request still thinking: tokens thought, and the end tag's tokens matched so far."""

    __slots__ = ("budget", "num_thought", "matched", "recent")

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.num_thought = 0
        self.matched = 0          # forced: how many of the end tag's tokens have been generated
        self.recent: list[int] = []   # the last tokens, to find a multi-token tag

    @property
    def forcing(self) -> bool:
        return self.budget is not None and self.num_thought >= self.budget


class ReasoningTracker:
    """Which tracked requests still think, and the token each must be forced to. Scheduler thread."""

    def __init__(self, tags: ThinkTags | None = None, gate_grammars: bool = True) -> None:
        """`tags` None: the model does not reason (nothing is tracked). `gate_grammars` False: only
        budgeted requests are tracked (the simulator, whose outputs never write an end tag)."""
        self.tags = tags
        self.gate_grammars = gate_grammars
        self._thinking: dict[str, _Thinking] = {}

    def add(self, req: Request) -> None:
        """Track `req` when it has a grammar or a thinking budget and its prompt has not ended thinking."""
        sp = req.sampling_params
        gated = sp.structured_outputs is not None and self.gate_grammars
        if self.tags is None or (not gated and sp.thinking_token_budget is None):
            return
        if not self.tags.ended_in(req.prompt_token_ids):
            self._thinking[req.request_id] = _Thinking(sp.thinking_token_budget)

    @property
    def tracking(self) -> bool:
        """Whether any request is tracked (still thinking) now."""
        return bool(self._thinking)

    def not_thinking(self, request_ids: Iterable[str]) -> Iterable[str]:
        """Those of `request_ids` not thinking now (their grammars apply): all of them, as given,
        when no request is tracked."""
        if not self._thinking:
            return request_ids
        return (r for r in request_ids if r not in self._thinking)

    def is_thinking(self, request_id: str) -> bool:
        return request_id in self._thinking

    def release(self, request_id: str) -> None:
        self._thinking.pop(request_id, None)

    def forced_token(self, request_id: str) -> int | None:
        """The token the request must sample next (its budget is spent), or None."""
        t = self._thinking.get(request_id)
        if t is None or not t.forcing or self.tags is None:
            return None
        return self.tags.end_ids[t.matched]

    def advance(self, request_id: str, token_ids: Sequence[int]) -> Sequence[int]:
        """Take a request's new tokens; returns those after its thinking ended (for its grammar):
        all of them when it was not thinking, none while it still is."""
        t = self._thinking.get(request_id)
        if t is None or self.tags is None:
            return token_ids
        start, end = self.tags.start_ids, self.tags.end_ids
        for i, token in enumerate(token_ids):
            if t.forcing:
                t.matched += 1
            else:
                t.recent = (t.recent + [token])[-max(len(start), len(end)):]
                if tuple(t.recent[-len(start):]) != start:   # the start tag is not thinking
                    t.num_thought += 1
            if t.matched == len(end) or tuple(t.recent[-len(end):]) == end:
                del self._thinking[request_id]
                return token_ids[i + 1:]
        return ()

    def masks(self, sampling_ids: Iterable[str], grammar: TokenMasks | None) -> TokenMasks | None:
        """The step's masks: a tracked request forced to its end tag gets a one-token mask,
        the grammar's (`grammar`, from the structured runtime, for the others) is kept."""
        if not self._thinking:   # nothing tracked: nothing forced (every step of most engines)
            return grammar
        forced = {rid: tok for rid in sampling_ids if (tok := self.forced_token(rid)) is not None}
        if not forced:
            return grammar
        return ForcedTokens(forced, grammar)


class ForcedTokens:
    """TokenMasks that force one token in some rows, and apply the grammar's masks (if any) to
    the rest. `rows` are the grammar's (what the simulator prices); a forced row costs nothing."""

    def __init__(self, forced: Mapping[str, int], grammar: TokenMasks | None) -> None:
        self.forced = dict(forced)
        self.grammar = grammar
        self.rows: Mapping[str, int] = grammar.rows if grammar is not None else {}

    def apply(self, logits: Any, request_ids: Sequence[str]) -> Any:
        if self.grammar is not None:
            logits = self.grammar.apply(logits, request_ids)
        rows = [(row, self.forced[rid]) for row, rid in enumerate(request_ids) if rid in self.forced]
        if rows:
            # a copy: the forward's logits may be read-only (torch inference tensors); forcing
            # happens once per budgeted request, so the copy is rare
            logits = logits.clone() if hasattr(logits, "clone") else logits.copy()
            for row, token in rows:
                logits[row] = float("-inf")
                logits[row, token] = 0.0
        return logits
