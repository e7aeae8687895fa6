"""One schedule() call's working state: the step's remaining token and sequence budget, and
what has been decided so far (tokens per request, new blocks, preemptions, drafts). Pure
Python; the scheduler (pacer.core.scheduler) is its only writer."""

from __future__ import annotations

from pacer.request import Request

__all__ = ["Budget", "StepPlan"]


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

    def add(self, req: Request, n: int, blocks: list[int], is_new: bool) -> None:
        self.num_tokens[req.request_id] = n
        self.new_blocks[req.request_id] = blocks
        if is_new:
            self.is_new.add(req.request_id)
        self.budget.tokens_left -= n
        self.budget.seqs_left -= 1

    def undo(self, req: Request) -> None:
        n = self.num_tokens.pop(req.request_id, None)
        if n is not None:
            self.new_blocks.pop(req.request_id)
            self.is_new.discard(req.request_id)
            self.budget.tokens_left += n
            self.budget.seqs_left += 1
