"""Requests (and, re-exported from `pacer.sampling_params`, their sampling parameters): plain
Python, shared by the core, engine and simulator.

A `Request` is the scheduler's unit of work. Its one piece of progress state is
`num_computed_tokens`, which catches up with `num_tokens` (prompt + generated) under each
step's token budget: prefill chunks, decode tokens and recompute after preemption all
follow that one rule.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from pacer.errors import FieldValueError
from pacer.sampling_params import MAX_LOGPROBS, SamplingParams, StructuredOutputsParams, sample_seed

if TYPE_CHECKING:
    from pacer.config.slo import Slo

__all__ = ["TOP_GAPS", "SamplingParams", "StructuredOutputsParams", "Request", "TokenPrefix", "RequestStatus", "RequestMetrics", "Latencies",
           "FinishReason", "MAX_LOGPROBS", "sample_seed", "ContextLengthError", "check_context_length"]


TOP_GAPS = 4   # a stream's largest gaps `RequestMetrics` keeps (the 99th percentile of up to ~400 moves with them)


class ContextLengthError(FieldValueError):
    """A request that can never fit: its prompt plus max_tokens exceed max_model_len or the
    whole KV cache. Carries the field to blame, so an API maps it by type."""

    code = "context_length_exceeded"

    def __init__(self, num_prompt_tokens: int, max_tokens: int, limit: int, limit_name: str,
                 field: str = "prompt") -> None:
        self.limit = limit
        self.num_prompt_tokens, self.max_tokens = num_prompt_tokens, max_tokens
        total = num_prompt_tokens + max_tokens
        super().__init__(field, f"This model's maximum context length is {limit} tokens ({limit_name}). However, "
                                f"you requested {total} tokens ({num_prompt_tokens} in the {field}, {max_tokens} "
                                f"for the completion): {total} exceeds {limit_name}")


def check_context_length(num_prompt_tokens: int, max_tokens: int, max_model_len: int, kv_capacity_tokens: int,
                         field: str = "prompt") -> None:
    """The one context-length check (engine, scheduler and server call it)."""
    total = num_prompt_tokens + max_tokens
    if total > max_model_len:
        raise ContextLengthError(num_prompt_tokens, max_tokens, max_model_len, f"max_model_len={max_model_len}",
                                 field)
    if total > kv_capacity_tokens:
        raise ContextLengthError(num_prompt_tokens, max_tokens, kv_capacity_tokens,
                                 f"the KV cache capacity of {kv_capacity_tokens} tokens", field)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    # queued but not ready to run (vLLM's WAITING_FOR_FSM): its grammar is compiling. The
    # scheduler skips it when admitting and counts it; `Scheduler.mark_ready` makes it WAITING.
    WAITING_FOR_GRAMMAR = "waiting_for_grammar"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"

    @property
    def finished(self) -> bool:
        return self is RequestStatus.FINISHED


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class Latencies:
    """Derived latencies over a request's timestamps, shared by `RequestMetrics` and the
    benchmark's `RequestRecord`. TPOT divides the decode time by the output tokens after the
    first, counted by `_tpot_tokens` (a benchmark counts the server's usage, not its chunks)."""

    __slots__ = ()
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    token_times: list[float]

    def _tpot_tokens(self) -> int:
        return len(self.token_times)

    @property
    def queue_wait(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive emissions: tokens stamped at the same time came out of one
        step (accepted drafts) and are one emission, so a multi-token step is one gap (TPOT
        stays per token)."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:]) if b != a]

    @property
    def tpot(self) -> float | None:
        n = self._tpot_tokens()
        if n < 2 or self.first_token_time is None or not self.token_times:
            return None
        return (self.token_times[-1] - self.first_token_time) / (n - 1)

    @property
    def e2e(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclass(slots=True)
class RequestMetrics(Latencies):
    """Per-request timestamps (clock seconds) and counts; derived latencies from `Latencies`."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cached_tokens_host: int = 0    # of cached_tokens, those promoted from the host tier (the rest: device hits)
    retention_hit_tokens: int = 0  # of cached_tokens, those its session's retention window kept (pacer.kv.retention)
    preemptions: int = 0
    prefill_tokens: int = 0  # tokens actually computed (prefill + recompute), excludes cache hits
    segment_reused_tokens: int = 0      # prompt tokens filled from the segment store (K re-rotated), not computed
    segment_recomputed_tokens: int = 0  # of reused segments, the tokens computed with the real context
    # preemption loss: seconds from each preemption until the request has its KV back (recomputed
    # or swapped in) at the end of a step; of which before the first token (inside TTFT)
    preempted_time: float = 0.0
    preempted_time_ttft: float = 0.0
    preempted_at: float | None = None   # an open preemption: when it began
    # the stream's gaps so far (`stamp`): how many, and the TOP_GAPS largest, descending, which
    # are what its 99th-percentile gap can still be moved by (pacer.sched.itl_tail)
    num_gaps: int = 0
    top_gaps: list[float] = field(default_factory=list)
    resume_tokens: int = 0              # computed tokens to regain before it closes

    def stamp(self, now: float) -> None:
        """A token came out at `now`: one more gap if it is the first of its step (tokens of one
        step, accepted drafts, share a stamp and are one emission, as `itl` counts)."""
        times = self.token_times
        if times and now != times[-1]:
            gap, top = now - times[-1], self.top_gaps
            self.num_gaps += 1
            if len(top) < TOP_GAPS or gap > top[-1]:
                bisect.insort(top, gap, key=lambda g: -g)
                del top[TOP_GAPS:]
        times.append(now)

    def on_preempted(self, now: float, num_computed_tokens: int) -> None:
        """A preemption begins (a second one before the first closed extends it)."""
        if self.preempted_at is None:
            self.preempted_at = now
        self.resume_tokens = max(self.resume_tokens, num_computed_tokens)

    def on_step_end(self, now: float, num_computed_tokens: int) -> None:
        """After a step that ran the request: close an open preemption once its KV is back."""
        if self.preempted_at is None or num_computed_tokens < self.resume_tokens:
            return
        lost = now - self.preempted_at
        self.preempted_time += lost
        if self.first_token_time is None:
            self.preempted_time_ttft += lost
        self.preempted_at, self.resume_tokens = None, 0
    ttft_deadline: float | None = None       # arrival + the TTFT target (clock seconds), when it has one
    slack_at_admission: float | None = None  # slo policy: latest start - now when first queued, s
    deprioritized: bool = False   # slo policy: went behind feasible requests once it could not meet TTFT
    shed: bool = False            # refused as hopeless (shed_hopeless) before it was scheduled
    tenant_service_at_admission: float | None = None   # its tenant's normalized service (cost units / weight)
    #                                                    when it was first scheduled (pacer.sched.fair_share)

    def as_dict(self) -> dict[str, object]:
        return {
            "arrival_time": self.arrival_time,
            "first_scheduled_time": self.first_scheduled_time,
            "first_token_time": self.first_token_time,
            "finish_time": self.finish_time,
            "queue_wait": self.queue_wait,
            "ttft": self.ttft,
            "itl": self.itl,
            "tpot": self.tpot,
            "e2e": self.e2e,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": len(self.token_times),
            "cached_tokens": self.cached_tokens,
            "cached_tokens_host": self.cached_tokens_host,
            "retention_hit_tokens": self.retention_hit_tokens,
            "prefill_tokens": self.prefill_tokens,
            "segment_reused_tokens": self.segment_reused_tokens,
            "segment_recomputed_tokens": self.segment_recomputed_tokens,
            "preemptions": self.preemptions,
            "preempted_time": self.preempted_time,
            "preempted_time_ttft": self.preempted_time_ttft,
            "ttft_deadline": self.ttft_deadline,
            "slack_at_admission": self.slack_at_admission,
            "deprioritized": self.deprioritized,
            "shed": self.shed,
        }


class TokenPrefix(Sequence[int]):
    """The first `n` of a request's tokens (its prompt, then its outputs) as a sequence, without
    copying them: what the prefix cache slices when it caches a running request's blocks."""

    __slots__ = ("_prompt", "_output", "_n")

    def __init__(self, prompt: list[int], output: list[int], n: int) -> None:
        if not 0 <= n <= len(prompt) + len(output):
            raise ValueError(f"a prefix of {n} tokens of {len(prompt) + len(output)}")
        self._prompt, self._output, self._n = prompt, output, n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if not isinstance(index, slice):
            i = range(self._n)[index]   # IndexError past the prefix, as a list
            p = len(self._prompt)
            return self._prompt[i] if i < p else self._output[i - p]
        start, stop, step = index.indices(self._n)
        p = len(self._prompt)
        if step != 1:
            return [self[i] for i in range(start, stop, step)]
        if stop <= p:
            return self._prompt[start:stop]
        if start >= p:
            return self._output[start - p:stop - p]
        return self._prompt[start:] + self._output[:stop - p]


class Request:
    """One generation request as the scheduler sees it."""

    __slots__ = (
        "request_id", "prompt_token_ids", "sampling_params", "priority", "tenant", "arrival_seq",
        "output_token_ids", "num_computed_tokens", "status", "finish_reason", "metrics",
        "eos_token_ids", "stop_reason", "num_cached_tokens", "request_class", "slo", "policy_state", "cache_salt",
        "session", "retention_ttl", "retention_release", "segments", "segment_reuse",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        arrival_time: float,
        priority: int = 0,
        tenant: str = "default",
        arrival_seq: int = 0,
        eos_token_ids: tuple[int, ...] = (),
        request_class: str = "default",
        slo: Slo | None = None,
        cache_salt: str | None = None,
        session: str | None = None,
        retention_ttl: float | None = None,
        retention_release: bool = False,
        segments: Sequence[tuple[int, int]] = (),
        segment_reuse: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.priority = priority
        self.tenant = tenant
        self.arrival_seq = arrival_seq  # tie-breaker among equal arrival times
        self.eos_token_ids = eos_token_ids
        self.cache_salt = cache_salt  # vLLM's: cached blocks are shared only with the same salt
        # agent sessions (pacer.kv.retention): the conversation this turn belongs to, and its
        # kv_retention hint (keep its KV this many seconds after it finishes / drop it now)
        self.session = session
        self.retention_ttl = retention_ttl
        self.retention_release = retention_release
        # segment reuse (pacer.sched.segments): prompt spans (start, length), sorted and disjoint,
        # whose KV may be reused away from their prefix; `segment_reuse` "off" opts this request out
        self.segments: tuple[tuple[int, int], ...] = tuple(segments)
        self.segment_reuse = segment_reuse
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first schedule
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None
        self.metrics = RequestMetrics(arrival_time=arrival_time, prompt_tokens=len(self.prompt_token_ids))
        self.request_class = request_class
        self.slo = None if slo is None or slo.is_empty() else slo   # resolved targets (class + own)
        self.policy_state: Any = None   # a policy's per-request cache (the slo policy's predictions)
        if self.slo is not None and self.slo.ttft is not None:
            self.metrics.ttft_deadline = arrival_time + self.slo.ttft

    @property
    def arrival_time(self) -> float:
        return self.metrics.arrival_time

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens not yet in the KV cache (the one token rule)."""
        return self.num_tokens - self.num_computed_tokens

    def penalty_history(self) -> tuple[list[int] | None, list[int] | None]:
        """Copies of the prompt and of the tokens generated so far when the params use
        penalties or ask for prompt logprobs (an executor seeing the request anew mirrors
        them), else (None, None)."""
        sp = self.sampling_params
        if not sp.needs_history and sp.prompt_logprobs is None:
            return None, None
        return list(self.prompt_token_ids), list(self.output_token_ids)

    def prompt_logits_rows(self, start: int, end: int) -> int:
        """With prompt_logprobs: the prompt tokens a chunk over positions [start, end) scores
        (position p's logits score token p + 1; the last prompt position's row is the sampled
        one), each a full-vocabulary logits row; else 0."""
        if self.sampling_params.prompt_logprobs is None:
            return 0
        return max(0, min(end, self.num_prompt_tokens - 1) - start)

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt:end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    def stop_on(self, token: int, max_model_len: int) -> FinishReason | None:
        """Why the request stops at `token`, its newest output (appended), or None. A stop token
        that is also the last allowed one reports "stop", as vLLM does."""
        sp = self.sampling_params
        n_out = len(self.output_token_ids)
        if n_out >= sp.min_tokens:
            if token in sp.stop_token_ids:
                self.stop_reason = token
                return FinishReason.STOP
            if not sp.ignore_eos and token in self.eos_token_ids:
                return FinishReason.STOP
        if n_out >= sp.max_tokens or len(self.prompt_token_ids) + n_out >= max_model_len:
            return FinishReason.LENGTH
        return None

    def first_possible_stop(self, max_model_len: int) -> int:
        """The fewest outputs at which `stop_on` may give a reason: with fewer it gives None,
        whatever the token (its params and prompt do not change, so a caller may keep this)."""
        sp = self.sampling_params
        bound = min(sp.max_tokens, max_model_len - len(self.prompt_token_ids))
        if sp.stop_token_ids or (not sp.ignore_eos and self.eos_token_ids):
            bound = min(bound, sp.min_tokens)
        return bound

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, prio={self.priority}, status={self.status.value}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )
