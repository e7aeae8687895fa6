"""SchedulerOutput: the only contract between scheduling and execution. Plain data.

New requests (first time on the executor, or resumed after preemption) carry their whole
block table and sampling params; known requests carry only the blocks added this step.
Finished and preempted ids tell an executor which mirrored state to drop.

A new request whose params use penalties also carries its token history (the whole prompt
and every token generated so far, which a resumed request has): an executor mirrors it and
extends it with later chunks' tokens past those it holds (the decode tokens), since
`token_ids` is only this step's chunk and may start after a prefix-cache hit. Requests
without penalties carry no history, so the common path copies nothing.

The way back is `ModelOutput`, one frozen record whatever runs the step (the model, the
simulator, the engine's per-request retry, a test fake): per request its sampled token ids,
their logprobs when asked for, or an error. `Executor` is the protocol they all implement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pacer.kv.segment_store import SegmentCopy
from pacer.request import SamplingParams

__all__ = ["SegmentCopy", "ScheduledRequest", "SchedulerOutput", "RequestResult", "ModelOutput", "Executor", "TokenMasks"]


class TokenMasks(Protocol):
    """Allowed-token masks of the constrained requests that sample this step (structured
    outputs; pacer.structured.masks). The executor calls `apply` after its forward, before
    sampling; rows of other requests are returned untouched."""

    rows: Mapping[str, int]   # request id -> row of its mask

    def apply(self, logits: Any, request_ids: Sequence[str]) -> Any:
        """Logits [len(request_ids), vocab] with forbidden tokens at -inf in constrained rows."""
        ...


@dataclass(slots=True)   # not frozen: a frozen init costs ~2 us per row per step; executors only read it
class ScheduledRequest:
    request_id: str
    token_ids: list[int]          # the tokens computed this step (a prefill chunk or one decode token)
    start_position: int           # position of token_ids[0] == num_computed_tokens before this step
    block_ids: list[int]          # is_new: the full block table; else: blocks appended this step
    is_new: bool                  # executor has no state for it (new, or resumed after preemption)
    sample: bool                  # this chunk reaches the end of known tokens: sample the next one
    is_prefill: bool              # for stats: False only for a plain decode token
    num_output_tokens: int        # tokens generated before this step (seeded sampling position)
    sampling_params: SamplingParams | None = None  # set when is_new
    prompt_token_ids: list[int] | None = None      # set when is_new and has_penalties or prompt_logprobs
    output_token_ids: list[int] | None = None      # likewise: the tokens generated before this step
    # Room for the sampler's next per-request inputs (unset today; executors must reject what
    # they cannot honour rather than ignore it). Token masks travel per step, not per request:
    # see SchedulerOutput.token_masks.
    draft_token_ids: Sequence[int] = ()            # drafted tokens to verify after token_ids (speculation)
    # prompt_logprobs: prompt tokens this chunk scores, each a full-vocabulary logits row beyond
    # the sampled one (the step's cost models charge them as LM-head rows)
    prompt_logits_rows: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(slots=True)   # not frozen (read-only by convention): one a step, and a frozen init cost ~4x
class SchedulerOutput:
    step_id: int
    scheduled: list[ScheduledRequest]
    num_prefill_tokens: int
    num_decode_tokens: int
    preempted_ids: list[str] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)  # ended since the previous step
    # KV copies to run before this step's forward, swap-outs first: (device block, cpu slot)
    # pairs to save, then (cpu slot, device block) pairs to restore (preemption_mode="swap").
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    # set by the scheduler (from its structured-outputs runtime, pacer.sched.structured) when
    # constrained requests sample this step: their allowed-token masks, being computed while the
    # forward runs (so per step, not per request); None: no constraint
    token_masks: TokenMasks | None = None
    token_budget: int = 0                          # the step's token budget as chosen (<= max_num_batched_tokens)
    budget_reason: str = "max_num_batched_tokens"  # what set it (slo: "itl 45.0ms of req-7")
    # segment reuse (pacer.sched.segments): saves run after swap-outs, fills after swap-ins (all before the forward)
    segment_saves: list[SegmentCopy] = field(default_factory=list)
    segment_fills: list[SegmentCopy] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What one step produced for one request."""

    token_ids: Sequence[int] = ()     # sampled: one today, several once drafted tokens are verified
    # one {token_id: logprob} per sampled token (the token first, then the top-k); None: not asked for
    logprobs: Sequence[Mapping[int, float]] | None = None
    error: str | None = None          # this request failed on the executor: the engine finishes it alone

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """An executor's answer to one SchedulerOutput: a result for every request that sampled
    (or failed) this step, and where the step's time went (seconds; None: not measured, the
    engine counts the whole execute call as forward)."""

    results: Mapping[str, RequestResult] = field(default_factory=dict)
    prepare_s: float = 0.0
    forward_s: float | None = None
    sample_s: float = 0.0
    # requests asking for prompt logprobs whose prompt tokens this step scored: request id ->
    # (index of the first prompt token scored, one {token_id: logprob} per token, the token first)
    prompt_logprobs: Mapping[str, tuple[int, Sequence[Mapping[int, float]]]] = field(default_factory=dict)

    @classmethod
    def sampled(cls, tokens: Mapping[str, int], prepare_s: float = 0.0, forward_s: float | None = None,
                sample_s: float = 0.0) -> ModelOutput:
        """One sampled token per request id, no logprobs."""
        return cls({rid: RequestResult((tok,)) for rid, tok in tokens.items()}, prepare_s=prepare_s,
                   forward_s=forward_s, sample_s=sample_s)


class Executor(Protocol):
    """Runs one SchedulerOutput: mirrors block tables and sampling params from it alone (it
    never reads scheduler state), applies its KV swaps, then computes its chunks."""

    @property
    def kv_block_bytes(self) -> int | None:
        """Bytes of one KV block over all layers (sizes the CPU swap tier); None: unknown."""
        ...

    def execute(self, out: SchedulerOutput) -> ModelOutput: ...
