"""A step's results into its requests: the scheduler's other half (pacer.sched.scheduler plans
the step, this applies what the executor returned). Pure Python.

Per scheduled row that samples: verify drafts (pacer.sched.spec, which rolls the computed tokens
back), append the tokens kept and stamp their times, apply the token stop rules (a request that
stops keeps none of the tokens after its stop), then advance a constrained request's thinking
tracker and grammar matcher by the tokens it kept, finishing it when its grammar completes or
was left. Runs once per step, every decode row through its loop: the engine's hot path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pacer.request import FinishReason, Request, RequestStatus
from pacer.sched.contract import ModelOutput, SchedulerOutput

if TYPE_CHECKING:
    from pacer.clock import Clock
    from pacer.kv.manager import KVCacheManager
    from pacer.sched.reasoning import ReasoningTracker
    from pacer.sched.segments import SegmentPlanner
    from pacer.sched.spec import SpecDecoder
    from pacer.sched.structured import StructuredOutputs

__all__ = ["apply_results", "drop_output_tail"]


class ResultsTarget(Protocol):
    """What applying a step's results reads and changes of the scheduler
    (pacer.sched.scheduler.Scheduler, the one implementation)."""

    @property
    def clock(self) -> Clock: ...
    @property
    def kv(self) -> KVCacheManager: ...
    @property
    def requests(self) -> dict[str, Request]: ...
    @property
    def reasoning(self) -> ReasoningTracker: ...
    @property
    def structured(self) -> StructuredOutputs: ...
    @property
    def segments(self) -> SegmentPlanner: ...
    @property
    def spec(self) -> SpecDecoder | None: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def _stop_floor(self) -> dict[str, int]: ...

    def finish_request(self, req: Request, reason: FinishReason) -> None: ...


def apply_results(sched: ResultsTarget, output: SchedulerOutput, result: ModelOutput) -> list[tuple[Request, int]]:
    """Append sampled tokens, stamp times, apply token-based stop rules, then advance a
    constrained request's matcher by the tokens it kept. Requests the executor failed must be
    finished before this is called.

    Returns the requests that received tokens this step (finished ones included), each
    with how many it kept.
    """
    now = sched.clock.now()
    touched: list[tuple[Request, int]] = []
    get, results, running = sched.requests.get, result.results, RequestStatus.RUNNING
    reasoning, max_len = sched.reasoning, sched.max_model_len
    # whether any request thinks: it may stop during the loop (finished), never start; an
    # untracked request's advance only hands its tokens back
    tracking, stop_floor = reasoning.tracking, sched._stop_floor
    sched.segments.after_step(output.scheduled, get)   # store the segments completed (before a finish frees them)
    for sr in output.scheduled:
        rid = sr.request_id
        req = get(rid)
        if req is None or req.status is not running:
            continue  # aborted or failed while the step ran
        if (metrics := req.metrics).preempted_at is not None:   # else on_step_end closes nothing
            metrics.on_step_end(now, req.num_computed_tokens)
        if not sr.sample:
            continue
        tokens, drafts = results[rid].token_ids, sr.draft_token_ids
        if drafts and sched.spec is not None:
            tokens = sched.spec.verified(req, sr, tokens)   # rolls num_computed_tokens back
        kept, outputs, floor = 0, req.output_token_ids, stop_floor.get(rid, 0)
        for token in tokens:
            kept += 1
            outputs.append(token)
            metrics.stamp(now)
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            reason = req.stop_on(token, max_len) if len(outputs) >= floor else None
            if reason is not None:
                # a stop inside accepted drafts: tokens after it are dropped, and so is their KV
                req.num_computed_tokens = min(req.num_computed_tokens, req.num_tokens)
                sched.finish_request(req, reason)
                break
        constrained = req.sampling_params.structured_outputs is not None   # else, untracked: no one reads
        if kept and (constrained or tracking):
            _advance_matchers(sched, req, kept, constrained)
        touched.append((req, kept))
        if drafts and not req.is_finished:
            sched.kv.trim_to_computed(req)   # frees blocks only rejected drafts used
    return touched


def _advance_matchers(sched: ResultsTarget, req: Request, kept: int, constrained: bool) -> None:
    """The tokens a request kept this step go through its thinking tracker, then (once its
    thinking ended) its grammar's matcher, which may finish it."""
    answer = sched.reasoning.advance(req.request_id, req.output_token_ids[-kept:])
    if answer and not req.is_finished and constrained:
        reason = sched.structured.advance(req.request_id, answer)
        if reason is not None:
            sched.finish_request(req, reason)


def drop_output_tail(req: Request, num_tokens: int) -> None:
    """Drop the newest `num_tokens` outputs of a request about to finish (a stop string
    ended it inside a multi-token step), and the KV claim past them."""
    del req.output_token_ids[len(req.output_token_ids) - num_tokens:]
    del req.metrics.token_times[len(req.metrics.token_times) - num_tokens:]
    req.num_computed_tokens = min(req.num_computed_tokens, req.num_tokens)

