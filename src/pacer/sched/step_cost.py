"""The step-time predictor the scheduler may ask: a small protocol and the counts it reads. Pure Python.

`StepShape` reduces a (planned or finished) step to counts: one-token rows (decodes) and the
KV they read, multi-token rows (prefill chunks) as (tokens, start position), and rows
sampled. A `StepCostModel` answers "how long would this step take" and "what does one more
token cost in this step", and learns from the engine's measured steps (`observe`). The
simulator's cost models implement it (`pacer.perf.cost_model.SchedulerCostModel`), so the
scheduler, the simulator and the real engine predict with the same numbers; the core never
imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pacer.sched.contract import SchedulerOutput

__all__ = ["StepShape", "StepCostModel", "FixedCostModel"]


@dataclass(frozen=True, slots=True)
class StepShape:
    num_decodes: int = 0                           # one-token rows
    decode_kv_tokens: int = 0                      # keys those rows read (sum of their contexts)
    decode_max_ctx: int = 0                        # longest such context
    chunks: tuple[tuple[int, int], ...] = ()       # multi-token rows: (tokens, start position)
    num_sampled: int = 0                           # rows through the LM head

    @property
    def num_tokens(self) -> int:
        return self.num_decodes + sum(n for n, _ in self.chunks)

    @property
    def num_seqs(self) -> int:
        return self.num_decodes + len(self.chunks)

    def with_decode(self, context_len: int) -> StepShape:
        """This step plus one decode row whose context (with the new token) is `context_len`."""
        return StepShape(self.num_decodes + 1, self.decode_kv_tokens + context_len,
                         max(self.decode_max_ctx, context_len), self.chunks, self.num_sampled + 1)

    def with_chunk(self, num_tokens: int, start: int, sample: bool = True, logits_rows: int = 0) -> StepShape:
        """This step plus a prefill chunk of `num_tokens` from position `start` (one token: a decode row);
        `logits_rows`: LM-head rows it computes beyond the sampled one (prompt_logprobs)."""
        if num_tokens <= 0:
            return self
        if num_tokens == 1:
            shape = self.with_decode(start + 1)
            return shape if sample else StepShape(shape.num_decodes, shape.decode_kv_tokens, shape.decode_max_ctx,
                                                  shape.chunks, shape.num_sampled - 1)
        return StepShape(self.num_decodes, self.decode_kv_tokens, self.decode_max_ctx,
                         (*self.chunks, (num_tokens, start)), self.num_sampled + (1 if sample else 0) + logits_rows)

    @classmethod
    def from_output(cls, out: SchedulerOutput) -> StepShape:
        shape = cls()
        for sr in out.scheduled:
            # a row with drafts is one chunk of 1 + d tokens, every position through the LM head
            shape = shape.with_chunk(len(sr.token_ids) + len(sr.draft_token_ids), sr.start_position, sr.sample)
            extra_rows = len(sr.draft_token_ids) + sr.prompt_logits_rows   # drafts, prompt_logprobs' rows
            if extra_rows:
                shape = StepShape(shape.num_decodes, shape.decode_kv_tokens, shape.decode_max_ctx, shape.chunks,
                                  shape.num_sampled + extra_rows)
        return shape


class StepCostModel(Protocol):
    """Predicts step times from counts; implementations may refit from measured steps."""

    @property
    def name(self) -> str: ...

    def predict_step_s(self, shape: StepShape) -> float:
        """Seconds the step would take (0 for an empty step)."""
        ...

    def token_cost_s(self, shape: StepShape, context_len: int) -> float:
        """Seconds one more decode-like token (context `context_len`) adds to this step."""
        ...

    def observe(self, shape: StepShape, measured_s: float) -> None:
        """A step of this shape took `measured_s` seconds (the model may refit)."""
        ...

    def upper_ratio(self) -> float:
        """measured / predicted that nearly all (about 99%) recent steps with prefill stayed
        under: the margin a planner keeps for prediction noise (1.0 for an exact model)."""
        ...


class FixedCostModel:
    """step = per_step_s + per_token_s x tokens (+ per_pair_s x prefill attention pairs): a
    stated model for tests and hand-built cases; it does not refit."""

    def __init__(self, per_step_s: float, per_token_s: float, per_pair_s: float = 0.0) -> None:
        for name, v in (("per_step_s", per_step_s), ("per_token_s", per_token_s), ("per_pair_s", per_pair_s)):
            if not v >= 0:
                raise ValueError(f"{name} must be >= 0, got {v!r}")
        self.per_step_s, self.per_token_s, self.per_pair_s = per_step_s, per_token_s, per_pair_s
        self.num_observed = 0

    @property
    def name(self) -> str:
        return f"fixed:{self.per_step_s:g}+{self.per_token_s:g}/token"

    def predict_step_s(self, shape: StepShape) -> float:
        if shape.num_seqs == 0:
            return 0.0
        pairs = sum(n * s + n * (n + 1) // 2 for n, s in shape.chunks)
        return self.per_step_s + self.per_token_s * shape.num_tokens + self.per_pair_s * pairs

    def token_cost_s(self, shape: StepShape, context_len: int) -> float:
        return self.predict_step_s(shape.with_decode(context_len)) - self.predict_step_s(shape)

    def observe(self, shape: StepShape, measured_s: float) -> None:
        self.num_observed += 1

    def upper_ratio(self) -> float:
        return 1.0
