"""Engine: add_request / abort_request / step(). The loop reads schedule -> execute -> update -> emit.

Thread-safety: `add_request` and `abort_request` may be called from any thread (the server's
event loop); they validate synchronously and hand the work to the stepping thread through
an inbox of typed items (`AddRequest`, `AbortRequest`, `SessionAnswered`) that `step()`
drains first. Only the stepping thread touches the scheduler. Structured outputs run through
the scheduler's runtime (pacer.sched.structured), installed by `pacer.engine.constraints`; the
engine only starts a constrained request's compile.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pacer.clock import Clock, WallClock
from pacer.config import EngineConfig
from pacer.config.slo import ClassRules, Slo
from pacer.engine.constraints import Constraints
from pacer.engine.outputs import RequestOutput, TrackedRequest
from pacer.engine.prepare import (
    PrepareContext,
    PreparedRequest,
    check_reasoning,
    check_session,
    prepare,
    think_tags,
    tokenize_prompt,
)
from pacer.engine.retry import execute_each
from pacer.engine.stats import EngineSnapshot, StepStats, snapshot_of, step_stats_of
from pacer.engine.tier_hooks import KVTierFactory, KVTierHook
from pacer.kv.events import BlockEvent, EventSinks
from pacer.kv.manager import KVCacheManager
from pacer.request import FinishReason, Request, RequestStatus, SamplingParams, check_context_length
from pacer.sched.contract import Executor, ModelOutput, RequestResult, SchedulerOutput
from pacer.sched.scheduler import Scheduler
from pacer.sched.step_cost import StepCostModel, StepShape
from pacer.sched.structured import GrammarCompile

__all__ = ["Engine", "RequestOutput", "StepStats", "EngineSnapshot", "Executor", "AddRequest", "AbortRequest"]

log = logging.getLogger("pacer.engine")


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Inbox: queue a validated request; a constrained one with its grammar's compile."""

    tracked: TrackedRequest
    grammar: GrammarCompile | None = None   # from the structured runtime's `request`; None: unconstrained


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """Inbox: abort a request (nothing happens if it already finished)."""

    request_id: str


@dataclass(frozen=True, slots=True)
class SessionAnswered:
    """Inbox: a session's finished chat turn answered without calling a tool (its window closes)."""

    tenant: str
    session: str


class Engine(Constraints):
    def __init__(self, config: EngineConfig, executor: Executor, tokenizer: Any | None,
                 num_kv_blocks: int, model_max_len: int, eos_token_ids: Sequence[int] = (),
                 clock: Clock | None = None, vocab_size: int | None = None,
                 cost_model: StepCostModel | None = None, refit_cost_model: bool = True,
                 tiers: Sequence[KVTierFactory] = ()) -> None:
        """`tiers`: the KV tiers that do I/O each step (`pacer.engine.build.kv_tiers`), each
        opened over this engine's KV manager now."""
        self.config = config
        self.clock: Clock = clock or WallClock()
        self.scheduler_config = config.scheduler.resolved(model_max_len)
        self.kv = KVCacheManager.from_config(config.cache, num_kv_blocks, self.clock.now,
                                             block_bytes=executor.kv_block_bytes,
                                             max_model_len=self.scheduler_config.max_model_len or model_max_len)
        self.scheduler = Scheduler(self.scheduler_config, self.kv, self.clock, cost_model)
        self.cost_model = cost_model
        self._refit = refit_cost_model and cost_model is not None
        self.slo_set = self.scheduler_config.slo_set()
        self.class_rules = ClassRules()
        self._executor = executor   # fixed: wrap it when building the engine, never swap it
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.vocab_size = vocab_size
        self._inbox: deque[AddRequest | AbortRequest | SessionAnswered] = deque()
        self._ids = itertools.count()
        self._seq = itertools.count()
        self._live_ids: set[str] = set()
        self._id_lock = threading.Lock()
        self._tracked: dict[str, TrackedRequest] = {}
        self._num_stateful = 0   # of them, those not `stateless` (a delta not built would change them)
        self.step_stats: deque[StepStats] = deque(maxlen=10_000)
        self.stats_listeners: list[Callable[[StepStats], None]] = []       # after every step that ran
        self.schedule_listeners: list[Callable[[SchedulerOutput], None]] = []  # each step's plan, before it runs
        self._kv_sinks = EventSinks()
        self._hit_tokens_seen = 0   # kv.stats.hit_tokens at the last StepStats
        self._num_steps = 0
        self.finished_outputs_only = False   # True: no running deltas that change nothing (the simulator's)
        self._structured_outputs = None   # pacer.engine.constraints: the default, made on first use
        self.tiers: tuple[KVTierHook, ...] = tuple(open_tier(self.kv) for open_tier in tiers)
        if config.structured.reasoning_parser is not None:
            self.install_think_tags(think_tags(config.structured.reasoning_parser, tokenizer))

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_config(cls, config: EngineConfig, clock: Clock | None = None) -> Engine:
        """An engine on the model `config` names: its parts (executor, cost model, KV tiers) come
        from `pacer.engine.build.build_parts`."""
        from pacer.engine.build import build_parts

        p = build_parts(config)
        return cls(config, p.executor, p.tokenizer, p.num_kv_blocks, p.model_max_len, p.eos_token_ids,
                   clock=clock, vocab_size=p.vocab_size, cost_model=p.cost_model, tiers=p.tiers)

    def shutdown(self) -> None:
        """Graceful shutdown: each KV tier flushes (the disk tier writes the device's and host's
        cached blocks, so a restarted engine hits them). Idempotent; the engine stays usable."""
        for tier in self.tiers:
            tier.flush()

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> Engine:
        return cls.from_config(EngineConfig.from_kwargs(**kwargs))

    @property
    def executor(self) -> Executor:
        return self._executor

    @property
    def num_steps(self) -> int:
        """Steps that ran (scheduled work); an idle step does not count."""
        return self._num_steps

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    # ------------------------------------------------------------------ requests

    def tokenize_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        return tokenize_prompt(prompt, self.tokenizer, self.vocab_size)

    @property
    def max_context_tokens(self) -> int:
        """The most tokens (prompt + output) one request may have: max_model_len or the whole KV cache."""
        return min(self.max_model_len, self.kv.capacity_tokens)

    def check_fits(self, num_prompt_tokens: int, max_tokens: int, field: str = "prompt") -> None:
        """Raises ContextLengthError (naming `field`) when such a request can never run."""
        check_context_length(num_prompt_tokens, max_tokens, self.max_model_len, self.kv.capacity_tokens, field)

    def prepare(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *, priority: int = 0,
                tenant: str = "default", request_class: str | None = None,
                slo: Slo | Mapping[str, Any] | None = None, cache_salt: str | None = None,
                field: str = "prompt", segments: Sequence[Sequence[int]] | None = None,
                segment_reuse: str | None = None) -> PreparedRequest:
        """Check and resolve a request once (any thread): its token ids, arguments, fit and SLO
        class and targets; raises a `pacer.errors.FieldError` naming the field at fault. See
        `pacer.engine.prepare.prepare`; `add_request` queues the result."""
        ctx = PrepareContext(self.tokenizer, self.vocab_size, self.max_model_len, self.kv.capacity_tokens,
                             self.class_rules, self.slo_set, self.scheduler_config.allow_tighter_slo,
                             self.config.cache.segment_reuse)
        prepared = prepare(ctx, prompt, params, priority=priority, tenant=tenant, request_class=request_class,
                           slo=slo, cache_salt=cache_salt, field=field, segments=segments,
                           segment_reuse=segment_reuse)
        check_reasoning(prepared.params, self.think_tags is not None)
        return prepared

    @property
    def retention_max_ttl(self) -> float:
        """The longest session retention window (a `kv_retention.ttl_s` hint's bound), seconds."""
        return self.kv.retention.max_ttl

    def add_request(self, prompt: str | Sequence[int] | PreparedRequest, params: SamplingParams | None = None, *,
                    request_id: str | None = None, priority: int = 0, tenant: str = "default",
                    arrival_time: float | None = None, request_class: str | None = None,
                    slo: Slo | Mapping[str, Any] | None = None, cache_salt: str | None = None,
                    session: str | None = None, kv_retention: Mapping[str, Any] | None = None,
                    segments: Sequence[Sequence[int]] | None = None, segment_reuse: str | None = None) -> str:
        """Queue a request (any thread): a `PreparedRequest`, or the arguments of `prepare`, which
        checks them first (raising a FieldError naming the bad field). `cache_salt` (vLLM's):
        the request shares cached blocks only with requests of the same salt. `session` names
        the agent conversation it continues (its KV is retained between turns, `pacer.kv.retention`);
        `kv_retention` is its hint: {"ttl_s": 30} keeps it that long, {"release": true} drops it now."""
        ttl, release = check_session(session, kv_retention, self.kv.retention.max_ttl)
        if isinstance(prompt, PreparedRequest) and session is None:   # checked when it was prepared
            session, ttl, release = prompt.session, prompt.retention_ttl, prompt.retention_release
        if isinstance(prompt, PreparedRequest):
            prepared = prompt
        else:
            prepared = self.prepare(prompt, params, priority=priority, tenant=tenant, request_class=request_class,
                                    slo=slo, cache_salt=cache_salt, segments=segments, segment_reuse=segment_reuse)
        params = prepared.params
        with self._id_lock:
            if request_id is None:
                request_id = f"req-{next(self._ids)}"
                while request_id in self._live_ids:
                    request_id = f"req-{next(self._ids)}"
            elif request_id in self._live_ids:
                raise ValueError(f"request_id {request_id!r} is already in use")
            self._live_ids.add(request_id)
        req = Request(request_id, prepared.prompt_token_ids, params,   # Request copies the ids
                      arrival_time=self.clock.now() if arrival_time is None else arrival_time,
                      priority=prepared.priority, tenant=prepared.tenant, arrival_seq=next(self._seq),
                      eos_token_ids=self.eos_token_ids, request_class=prepared.request_class, slo=prepared.slo,
                      cache_salt=prepared.cache_salt, session=session, retention_ttl=ttl, retention_release=release,
                      segments=prepared.segments, segment_reuse=prepared.segment_reuse)
        detok = None
        if self.tokenizer is not None:
            from pacer.model.tokenizer import IncrementalDetokenizer

            detok = IncrementalDetokenizer(self.tokenizer)
        tracked = TrackedRequest(req, detok, prepared.prompt_text)
        if params.structured_outputs is None:
            self._inbox.append(AddRequest(tracked))
            return request_id
        try:
            grammar = self._structured_runtime().request(params.structured_outputs, req.tenant)
        except BaseException:
            with self._id_lock:
                self._live_ids.discard(request_id)
            raise
        self._inbox.append(AddRequest(tracked, grammar))
        return request_id

    def abort_request(self, request_id: str) -> None:
        """Abort from any thread; takes effect at the start of the next step."""
        self._inbox.append(AbortRequest(request_id))
        self.scheduler.structured.wake()

    def session_answered(self, tenant: str, session: str) -> None:
        """From any thread: the session's last turn ended in an answer, not a tool call, so no
        tool is running and its retention window closes (applied at the next step). The server
        calls it for chat turns with `tools`; a window stays open when nobody can tell."""
        self._inbox.append(SessionAnswered(tenant, session))

    def has_unfinished_requests(self) -> bool:
        return bool(self._inbox) or self.scheduler.has_unfinished_requests()

    # ------------------------------------------------------------------ the loop

    def _drain_inbox(self) -> list[RequestOutput]:
        outs: list[RequestOutput] = []
        while self._inbox:
            item = self._inbox.popleft()
            if isinstance(item, AbortRequest):
                tracked = self._tracked.get(item.request_id)
                if tracked is not None and self.scheduler.abort_request(item.request_id) is not None:
                    outs.append(self._finish_output(tracked, [], ""))
                continue
            if isinstance(item, SessionAnswered):
                self.kv.retention.answered(item.tenant, item.session)
                continue
            self._tracked[item.tracked.req.request_id] = item.tracked
            self._num_stateful += not item.tracked.stateless
            if item.grammar is None:
                self.scheduler.add_request(item.tracked.req)
            else:   # WAITING_FOR_GRAMMAR until its compile finishes (the scheduler sees to it)
                self.scheduler.add_waiting_for_grammar(item.tracked.req, item.grammar)
        return outs

    def _finished_in_schedule(self) -> list[RequestOutput]:
        """Outputs of the requests `schedule()` finished before running them: those whose grammar
        failed to compile (`RequestOutput.error`), then those the policy shed."""
        outs = []
        for rid, error in self.scheduler.take_grammar_failures():
            self._tracked[rid].error = error
            outs.append(self._finish_output(self._tracked[rid], [], ""))
        for rid in self.scheduler.take_shed():
            outs.append(self._finish_output(self._tracked[rid], [], ""))
        return outs

    def step(self) -> list[RequestOutput]:
        """One iteration: schedule -> execute -> update -> emit. Returns outputs of requests that
        gained tokens or finished."""
        outputs = self._drain_inbox()
        self.kv.drop_expired()
        t0, began = time.perf_counter(), self.clock.now()   # the clock: simulated steps take virtual time
        sched_out = self.scheduler.schedule()
        t1 = time.perf_counter()
        for tier in self.tiers:   # e.g. the disk tier notes which host copies this step runs
            tier.before_step(sched_out)
        for listener in self.schedule_listeners:
            listener(sched_out)
        outputs.extend(self._finished_in_schedule())
        if sched_out.is_empty:   # still run its KV copies (a TTL expiry demotes while nothing runs)
            if (sched_out.finished_ids or sched_out.preempted_ids or sched_out.swap_out or sched_out.swap_in
                    or sched_out.segment_saves):
                self._executor.execute(sched_out)
            for tier in self.tiers:
                tier.after_step()
            self._kv_sinks.publish(self.clock.now, self.kv.take_events)
            if not outputs and self.num_waiting_for_grammar:
                self.scheduler.structured.wait(0.05)   # only compiles pending: sleep until one finishes
            return outputs
        try:
            result = self._executor.execute(sched_out)
        except Exception:
            log.exception("executor failed on step %d; retrying its requests one by one", sched_out.step_id)
            result = execute_each(self._executor, sched_out, self.scheduler.requests, self.kv.block_table)
        t2 = time.perf_counter()
        for rid, (first, entries) in result.prompt_logprobs.items():
            if rid in self._tracked:
                self._tracked[rid].put_prompt_logprobs(first, entries)
        self._finish_failed(sched_out, result, outputs)
        updated = self.scheduler.update_from_output(sched_out, result)
        emit_all, all_stateless, tracked = not self.finished_outputs_only, not self._num_stateful, self._tracked
        finished = RequestStatus.FINISHED   # a local: an enum member read off its class costs ~70 ns
        for req, num_new in updated:   # quiet: a running delta whose building changes nothing is skipped
            if emit_all or req.status is finished or not (all_stateless or tracked[req.request_id].stateless):
                outputs.append(self._emit(req, num_new, result.results[req.request_id]))
        t3 = time.perf_counter()
        for tier in self.tiers:   # e.g. the disk tier writes the blocks this step copied to the host
            tier.after_step()
        self._record_stats(sched_out, result, t1 - t0, t2 - t1, t3 - t2)
        if self._refit and self.cost_model is not None:
            self.cost_model.observe(StepShape.from_output(sched_out), self.clock.now() - began)
        self._kv_sinks.publish(self.clock.now, self.kv.take_events)
        return outputs

    def add_kv_event_sink(self, sink: Callable[[float, list[BlockEvent]], None]) -> None:
        """After every step that changed the prefix cache, `sink(now, events)` gets its
        store/remove events in order (blocks cached already arrive first as stores)."""
        if self.kv.enable_events() is None:
            raise ValueError("KV cache events need enable_prefix_caching=True")
        self._kv_sinks.add(sink)

    def reset_prefix_cache(self) -> int:
        """Drop every cached block no request holds (vLLM's reset_prefix_cache); KV event sinks
        hear of it now, not at the next step. Returns the number of blocks freed."""
        freed = self.kv.reset_prefix_cache()
        self._kv_sinks.publish(self.clock.now, self.kv.take_events)
        return freed

    def remove_kv_event_sink(self, sink: Callable[[float, list[BlockEvent]], None]) -> None:
        self._kv_sinks.remove(sink)

    def _finish_failed(self, out: SchedulerOutput, result: ModelOutput, outputs: list[RequestOutput]) -> None:
        """Finish the requests the executor failed with FinishReason.ERROR; the others keep going."""
        for each in result.results.values():   # a loop, not any(): every step asks it of every row
            if each.error is not None:
                break
        else:
            return
        for sr in out.scheduled:
            res = result.results.get(sr.request_id)
            req = self.scheduler.requests.get(sr.request_id)
            if res is None or not res.failed or req is None or req.is_finished:
                continue
            req.num_computed_tokens = sr.start_position   # this step's KV is unreliable: never cache it
            self.scheduler.finish_request(req, FinishReason.ERROR)
            outputs.append(self._finish_output(self._tracked[sr.request_id], [], ""))

    def _emit(self, req: Request, num_new: int, result: RequestResult) -> RequestOutput:
        """The output of a request that gained `num_new` tokens this step: what they add (a delta)."""
        tracked = self._tracked[req.request_id]
        new_ids, new_text, new_logprobs, stop = tracked.push_tokens(num_new, result.logprobs)
        if len(new_ids) < num_new:   # a stop string inside a multi-token step: the tokens after it go
            self.scheduler.drop_output_tail(req, num_new - len(new_ids))
            num_new = len(new_ids)
        if stop is not None:
            req.stop_reason = stop
            self.scheduler.finish_request(req, FinishReason.STOP)
        if req.is_finished:
            return self._finish_output(tracked, new_ids, new_text, new_logprobs)
        return tracked.delta(new_ids, new_text, new_logprobs)

    def _finish_output(self, tracked: TrackedRequest, new_ids: list[int], new_text: str,
                       new_logprobs: list[dict[int, float]] | None = None) -> RequestOutput:
        """A finished request's last output (its step's delta and its whole output); forgets it."""
        out = tracked.finish(new_ids, new_text, new_logprobs)
        rid = tracked.req.request_id
        if self._tracked.pop(rid, None) is not None:
            self._num_stateful -= not tracked.stateless
        with self._id_lock:
            self._live_ids.discard(rid)
        return out

    def _record_stats(self, out: SchedulerOutput, result: ModelOutput, sched_s: float,
                      exec_s: float, update_s: float) -> None:
        spec = self.scheduler.spec
        stats = step_stats_of(out, result, self.kv, self.scheduler, now=self.clock.now(), sched_s=sched_s,
                              exec_s=exec_s, update_s=update_s,
                              cached_tokens=self.kv.stats.hit_tokens - self._hit_tokens_seen,
                              spec_counts=spec.take_step_counts() if spec is not None else {})
        self._hit_tokens_seen = self.kv.stats.hit_tokens
        self._num_steps += 1
        self.step_stats.append(stats)
        for listener in self.stats_listeners:
            listener(stats)

    def snapshot(self) -> EngineSnapshot:
        """The engine's state now, as one frozen record (the one view the server, the simulator
        and reports read). Call it from the stepping thread, between steps."""
        return snapshot_of(self.kv, self.scheduler, num_steps=self._num_steps, max_model_len=self.max_model_len,
                           block_bytes=self._executor.kv_block_bytes or 0,
                           io_tiers={tier.name: tier.stats() for tier in self.tiers})

    def run_until_done(self) -> list[RequestOutput]:
        """Step until every queued request finished; returns the final outputs."""
        finals: list[RequestOutput] = []
        while self.has_unfinished_requests():
            finals.extend(o for o in self.step() if o.finished)
        return finals
