"""One schedule() call's working state: the step's remaining token and sequence budget, and
what has been decided so far (tokens per request, new blocks, preemptions, drafts). Pure
Python; the scheduler (pacer.sched.scheduler) is its only writer. A policy reads it and may
answer a `StepLimit` (pacer.sched.policy, `Policy.step_limit`), which the scheduler applies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pacer.request import Request
from pacer.sched.step_cost import StepShape

__all__ = ["Budget", "StepPlan", "StepLimit", "ChunkFit"]

# (the plan: passed, not captured, or a plan holding it is a cycle; the step so far, the request, tokens
# wanted, chunk start, whether the whole chunk samples, whether it is the step's first chunk) -> tokens that fit
ChunkFit = Callable[["StepPlan", StepShape, Request, int, int, bool, bool], int]


@dataclass(frozen=True, slots=True)
class StepLimit:
    """A policy's cap on the rest of one step: the tokens it may still take, why (reported as
    the step's `budget_reason`), and the fit every chunk added from here on must pass (slo:
    the predicted step time; None: the token count alone)."""

    tokens: int
    reason: str
    chunk_fit: ChunkFit | None = None


class Budget:
    """The step's remaining token and sequence budget."""

    __slots__ = ("tokens_left", "seqs_left")

    def __init__(self, tokens: int, seqs: int) -> None:
        self.tokens_left = tokens
        self.seqs_left = seqs


class StepPlan:
    """What has been decided so far in one schedule() call."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.num_tokens: dict[str, int] = {}      # request id -> tokens this step (insertion order)
        self.new_blocks: dict[str, list[int]] = {}
        self.is_new: set[str] = set()
        self.preempted: list[str] = []
        self.drafts: dict[str, list[int]] = {}    # request id -> drafted tokens to verify (speculation)
        self.token_budget = budget.tokens_left
        self.budget_reason = "max_num_batched_tokens"
        self.requests: dict[str, Request] = {}   # request id -> the request (the same order as num_tokens)
        self.chunk_fit: ChunkFit | None = None              # slo: keeps each added chunk within the step's time
        self._shape: StepShape | None = None   # of the rows: built on the first fit, then kept as rows are added

    def limit(self, limit: StepLimit) -> None:
        """Apply a policy's cap on the rest of the step."""
        self.budget.tokens_left = limit.tokens
        self.token_budget = limit.tokens + sum(self.num_tokens.values())
        self.budget_reason = limit.reason
        self.chunk_fit = limit.chunk_fit

    def shape(self) -> StepShape:
        """The step decided so far, as counts (drafts excluded)."""
        if self._shape is None:   # first asked, or after an undo
            self._shape = StepShape()
            for rid, req in self.requests.items():   # a row's start and length as added (drafts come later)
                n = self.num_tokens[rid] - len(self.drafts.get(rid, ()))
                self._shape = self._shape.with_chunk(*_row(req, n, req.num_computed_tokens))
        return self._shape

    def fit(self, req: Request, n: int, start: int) -> int:
        """Of `n` prefill tokens of `req` from `start`, how many keep the step within its time
        (all of them without a limit); the step's first chunk always gets the prefill floor."""
        if self.chunk_fit is None or n <= 1:
            return n
        shape = self.shape()
        first = not shape.chunks and shape.num_sampled == shape.num_seqs   # only sampling one-token rows yet
        return self.chunk_fit(self, shape, req, n, start, n >= req.num_tokens - start, first)

    def add(self, req: Request, n: int, blocks: list[int], is_new: bool) -> None:
        rid = req.request_id
        self.num_tokens[rid] = n
        self.requests[rid] = req
        if self._shape is not None:
            self._shape = self._shape.with_chunk(*_row(req, n, req.num_computed_tokens))
        self.new_blocks[rid] = blocks
        if is_new:
            self.is_new.add(rid)
        self.budget.tokens_left -= n
        self.budget.seqs_left -= 1

    def add_decodes(self, reqs: list[Request], start: int, stop: int) -> None:
        """`add(req, 1, [], is_new=False)` for each of `reqs[start:stop]`, in order (a run of
        decode rows that needed no new block); the shape, if built, is built again when next asked."""
        self._shape = None
        num_tokens, requests, new_blocks = self.num_tokens, self.requests, self.new_blocks
        for i in range(start, stop):
            req = reqs[i]
            rid = req.request_id
            num_tokens[rid] = 1
            requests[rid] = req
            new_blocks[rid] = []   # a list each: drafts' blocks may be added to it
        self.budget.tokens_left -= stop - start
        self.budget.seqs_left -= stop - start

    def undo(self, req: Request) -> None:
        n = self.num_tokens.pop(req.request_id, None)
        if self.requests.pop(req.request_id, None) is not None:
            self._shape = None
        if n is not None:
            self.new_blocks.pop(req.request_id)
            self.is_new.discard(req.request_id)
            self.budget.tokens_left += n
            self.budget.seqs_left += 1


def _row(req: Request, n: int, start: int) -> tuple[int, int, bool, int]:
    """A row's (tokens, start, whether it samples, prompt_logprobs' logits rows) for the step's shape."""
    logits_rows = 0 if req.sampling_params.prompt_logprobs is None else req.prompt_logits_rows(start, start + n)
    return n, start, n >= len(req.prompt_token_ids) + len(req.output_token_ids) - start, logits_rows
