"""The serving layer between HTTP and the engine loop: builds engine requests from parsed
OpenAI requests (one per prompt and choice: `n` fans out into n engine requests), classifies
them, applies admission control, and keeps metrics and the request log as outputs arrive.
A streamed job's queue is bounded (`ServiceOptions.max_queued_outputs` per choice): a client
that falls that far behind is aborted, counted, and its stream ends with an error.
Runs on the event loop; touches the engine only through `EngineLoop` (thread-safe add/abort)
and read-only attributes (tokenizer, limits, clock).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pacer.config.slo import SLO_KEYS, ClassRules, Slo
from pacer.engine import Engine, RequestOutput
from pacer.engine.prepare import PreparedRequest
from pacer.errors import FieldError
from pacer.request import ContextLengthError, SamplingParams
from pacer.sched.admission import AdmissionController
from pacer.server.access.auth import Access, APIKey, bound_slo_targets
from pacer.server.access.key_limits import KeyLimiters
from pacer.server.api import errors
from pacer.server.api.errors import APIError, bad_request
from pacer.server.api.limits import RequestLimits
from pacer.server.api.logprobs import TokenText
from pacer.server.api.protocol import ParsedRequest
from pacer.server.engine_loop import EngineLoop, Route
from pacer.server.tools.serving import ToolOptions, plan_tools
from pacer.telemetry.collectors import KVTierCollector, SpecDecodeCollector, StructuredOutputsCollector
from pacer.telemetry.prometheus import ServingMetrics
from pacer.telemetry.request_log import RequestLogWriter, make_log_record

__all__ = ["Service", "ServiceOptions", "Job", "RequestContext"]

log = logging.getLogger("pacer.server")


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    served_model_names: tuple[str, ...]
    max_waiting: int | None = None
    metrics_prefix: str = "pacer"
    request_log: str | None = None
    class_rules: ClassRules = field(default_factory=ClassRules)
    tenant_weights: dict[str, float] | None = None   # shares of max_waiting (equal by default)
    access: Access = field(default_factory=Access)    # API keys (none: open)
    limits: RequestLimits = field(default_factory=RequestLimits)
    tools: ToolOptions = field(default_factory=ToolOptions)
    # outputs a streaming client may leave unread, per choice, before its request is aborted
    max_queued_outputs: int = 256


@dataclass(slots=True)
class RequestContext:
    """Server-side facts about one engine request, for metrics and the request log."""

    api_id: str
    index: int
    endpoint: str
    model: str
    stream: bool
    tenant: str
    request_class: str
    priority: int
    max_tokens: int
    slo: Slo = Slo()           # the targets it is held to (class's with its own on top)
    api_key_name: str | None = None   # the key's name (never the key), for limits and the log
    status: int = 200          # what the client got: 200, 408 (read too slowly), 429 (displaced), 499 (went away), 500
    started: bool = False


@dataclass(frozen=True, slots=True)
class _Spec:
    """One engine request of a job: its id, what the engine queues, and the server's facts."""

    request_id: str
    prepared: PreparedRequest
    context: RequestContext


@dataclass(slots=True)
class Job:
    """One HTTP request: one engine request per prompt and choice (choice index
    `prompt * n + j`), all feeding one queue of `(index, RequestOutput)` items or `APIError`s:
    streamed, every output (a delta); otherwise only the finished ones."""

    api_id: str
    parsed: ParsedRequest
    created: int
    request_ids: list[str]
    contexts: list[RequestContext]
    queue: asyncio.Queue[Any]
    finished: set[int] = field(default_factory=set)
    tool_parser: Any = None     # pacer.server.tools.parsers.ToolParser reading the output's tool calls

    @property
    def done(self) -> bool:
        return len(self.finished) == len(self.request_ids)


class Service:
    def __init__(self, engine: Engine, options: ServiceOptions) -> None:
        self.engine = engine
        self.options = options
        self.model_name = options.served_model_names[0]
        self.loop = EngineLoop(engine)
        self.admission = AdmissionController(options.max_waiting, tenant_weights=options.tenant_weights)
        self.key_limits = KeyLimiters()
        self.metrics = ServingMetrics(self.model_name, options.metrics_prefix)
        self.request_log = RequestLogWriter(options.request_log) if options.request_log else None
        self.draining = False
        self.token_text = TokenText(engine.tokenizer)   # logprobs' token strings
        self._log_start = engine.clock.now()
        self._clock_to_unix = time.time() - engine.clock.now()
        self._contexts: dict[str, RequestContext] = {}
        self._all_finished = asyncio.Event()   # set whenever _contexts empties
        for collector in (StructuredOutputsCollector, KVTierCollector, SpecDecodeCollector):   # read loop.state
            self.metrics.registry.register(collector(lambda: self.loop.state, self.metrics.name, self.model_name))
        self.loop.listeners.append(self._on_output)
        engine.stats_listeners.append(self.metrics.on_step)
        self.loop.failure_listeners.append(self._on_failure)
        self.loop.overflow_listeners.append(self._on_overflow)
        self.closers: list[Callable[[], None]] = []   # run at shutdown (e.g. the KV event publisher)
        self.kv_publisher: Any = None                  # pacer.telemetry.kv_events.KVEventPublisher when enabled
        snap = engine.snapshot()
        self.metrics.set_cache_config(block_size=engine.config.cache.block_size, num_gpu_blocks=snap.num_blocks,
                                      enable_prefix_caching=snap.prefix_caching)

    def start(self) -> None:
        self.loop.start(asyncio.get_running_loop())

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Abort what is still running, let the engine report those aborts (metrics, request
        log) for up to `timeout` seconds, then stop the engine thread."""
        self.draining = True
        for rid, ctx in list(self._contexts.items()):
            if ctx.status == 200:
                ctx.status = 503
            self.loop.abort(rid)
        if self._contexts and self.loop.alive:
            self._all_finished.clear()
            try:
                await asyncio.wait_for(self._all_finished.wait(), timeout)
            except TimeoutError:
                log.warning("%d requests still unfinished at shutdown", len(self._contexts))
        self.loop.stop()
        self.engine.shutdown()   # after the loop: the disk tier writes the cached blocks
        for close in self.closers:
            close()
        if self.metrics.on_step in self.engine.stats_listeners:
            self.engine.stats_listeners.remove(self.metrics.on_step)
        if self.request_log is not None:
            self.request_log.close()

    # ------------------------------------------------------------------ submitting

    def submit(self, parsed: ParsedRequest, is_agent: bool = False, declared_class: str | None = None,
               header_slo: Slo | None = None, key: APIKey | None = None) -> Job:
        """Validate, classify, charge the key's limits, admit and queue; raises APIError
        (4xx/5xx) instead. `parsed` already carries the tenant and priority the key allows;
        its SLO targets are bounded by the key's `tightest_slo`."""
        if self.draining:
            self.metrics.on_refused("draining", parsed.tenant)
            raise errors.unavailable("the server is shutting down")
        if not self.loop.alive:
            raise errors.unavailable("the engine is not running")
        if parsed.model not in self.options.served_model_names:
            raise APIError(404, f"The model `{parsed.model}` does not exist", "invalid_request_error",
                           "model", "model_not_found")
        parsed, tool_parser = plan_tools(parsed, self.options.tools)
        prompts = self._prompt_ids(parsed)
        prefix = "chatcmpl" if parsed.endpoint == "chat" else "cmpl"
        api_id = f"{prefix}-{uuid.uuid4().hex}"
        job = Job(api_id, parsed, int(time.time()), [], [], asyncio.Queue(), tool_parser=tool_parser)
        specs: list[_Spec] = []
        for p, ids in enumerate(prompts):
            params = self._params(parsed, len(ids))
            try:
                rclass = self.options.class_rules.classify(len(ids), parsed.max_tokens,
                                                           is_agent or parsed.has_tools, declared_class)
            except ValueError as e:
                raise bad_request("x-pacer-class", str(e)) from None
            own = (header_slo or Slo()).merged(parsed.slo)
            if key is not None and key.tightest_slo:
                asked = {k: v for k in SLO_KEYS if (v := getattr(own, k)) is not None}
                own = Slo(**bound_slo_targets(key, asked))
            prepared = self._prepare(parsed, ids, params, rclass, own)
            for j in range(parsed.n):
                i = p * parsed.n + j
                ctx = RequestContext(api_id, i, parsed.endpoint, self.model_name, parsed.stream, parsed.tenant,
                                     rclass, parsed.priority, params.max_tokens, prepared.slo,
                                     key.name if key else None)
                specs.append(_Spec(f"{api_id}-{i}", dataclasses.replace(prepared, params=params.for_sample(j)), ctx))
        self._charge(job, key, sum(s.prepared.num_tokens for s in specs), len(specs))
        try:
            self._admit(job, [s.request_id for s in specs])
        except APIError:
            self._refund(specs)
            raise
        max_queued = self.options.max_queued_outputs * len(specs) if parsed.stream else None
        try:
            for spec in specs:
                route = Route(job.queue, spec.context.index, spec.context, stream=parsed.stream, max_queued=max_queued)
                self.loop.add(spec.request_id, spec.prepared, route)
                self._contexts[spec.request_id] = spec.context
                job.request_ids.append(spec.request_id)
                job.contexts.append(spec.context)
        except FieldError as e:
            self._undo(job, specs)
            raise bad_request(e.field, str(e), e.code) from None
        except RuntimeError as e:
            self._undo(job, specs)
            raise errors.unavailable(str(e)) from None
        return job

    def cancel(self, job: Job, status: int) -> None:
        """Abort the job's unfinished engine requests (client gone, error in a sibling, ...)."""
        for i, rid in enumerate(job.request_ids):
            if i not in job.finished:
                ctx = job.contexts[i]
                if ctx.status == 200:
                    ctx.status = status
                self.loop.abort(rid)

    def _prompt_ids(self, parsed: ParsedRequest) -> list[list[int]]:
        try:
            if parsed.messages is not None:
                tok = self.engine.tokenizer
                if tok is None:
                    raise bad_request("messages", "this model has no tokenizer / chat template")
                from pacer.server.tools.template import render_chat

                tools = parsed.tools.tools if parsed.tools is not None else None
                return [render_chat(tok, parsed.messages, tools, self.options.tools.chat_template)]
            return [self.engine.tokenize_prompt(p) for p in parsed.prompts]
        except APIError:
            raise
        except (ValueError, TypeError) as e:
            raise bad_request("messages" if parsed.messages is not None else "prompt", str(e)) from None
        except Exception as e:   # template errors (jinja) and the like are the client's input
            raise bad_request("messages", f"cannot apply the chat template: {e}") from None

    def _params(self, parsed: ParsedRequest, num_prompt_tokens: int) -> SamplingParams:
        """The request's sampling params; chat without max_tokens gets the room the context leaves."""
        max_tokens = parsed.max_tokens
        if max_tokens is None:   # chat: whatever room the context leaves (at least 1, or the fit refuses)
            max_tokens = 16 if parsed.endpoint == "completions" else max(
                1, self.engine.max_context_tokens - num_prompt_tokens)
        try:
            return SamplingParams(max_tokens=max_tokens, **parsed.sampling)
        except FieldError as e:
            raise bad_request(e.field, str(e), e.code) from None

    def _prepare(self, parsed: ParsedRequest, ids: list[int], params: SamplingParams, request_class: str,
                 own_slo: Slo) -> PreparedRequest:
        """The engine's one prepare of a prompt (fit, class targets with the request's own on top);
        a prompt that can never fit is counted as refused."""
        try:
            return self.engine.prepare(ids, params.for_sample(0), priority=parsed.priority, tenant=parsed.tenant,
                                       request_class=request_class, slo=own_slo, cache_salt=parsed.cache_salt,
                                       field="messages" if parsed.endpoint == "chat" else "prompt")
        except ContextLengthError as e:
            self.metrics.on_refused(e.code, parsed.tenant)
            self.admission.refuse(e.code)
            raise bad_request(e.field, str(e), e.code) from None
        except FieldError as e:
            raise bad_request(e.field, str(e), e.code) from None

    def _charge(self, job: Job, key: APIKey | None, num_tokens: int, num_requests: int) -> None:
        """Charge the key's rate and concurrency limits (prompt + max_tokens of every choice)."""
        try:
            self.key_limits.acquire(key, num_requests, num_tokens, self.engine.clock.now())
        except APIError as e:
            self.metrics.on_refused(e.code or "rate_limited", job.parsed.tenant)
            self.admission.refuse(e.code or "rate_limited")
            raise

    def _refund(self, specs: list[_Spec]) -> None:
        """Give back the whole charge of engine requests that never reached the engine."""
        now = self.engine.clock.now()
        for spec in specs:
            self.key_limits.release(spec.context.api_key_name, spec.prepared.num_tokens, now, refund_request=True)

    def _admit(self, job: Job, request_ids: list[str]) -> None:
        now = self.engine.clock.now()
        admitted: list[str] = []
        tenant = job.parsed.tenant
        for rid in request_ids:
            decision = self.admission.try_admit(rid, job.parsed.priority, now, tenant)
            if not decision.admitted:
                for a in admitted:
                    self.admission.release(a)
                self.metrics.on_refused(decision.reason or "queue_full", tenant)
                raise errors.queue_full(decision.retry_after_s)
            admitted.append(rid)
            if decision.displaced_id is not None:
                self._displace(decision.displaced_id, now)

    def _displace(self, request_id: str, now: float) -> None:
        ctx = self._contexts.get(request_id)
        self.metrics.on_refused("displaced", ctx.tenant if ctx is not None else None)
        route = self.loop.route(request_id)
        if ctx is not None:
            ctx.status = 429
        if route is not None:
            route.queue.put_nowait(errors.displaced(self.admission.retry_after(now)))
        self.loop.abort(request_id)

    def _undo(self, job: Job, specs: list[_Spec]) -> None:
        """The engine refused one of the job's requests: release what was not added (the
        added ones are aborted and released when the engine reports them finished)."""
        added = set(job.request_ids)
        for spec in specs:
            self.admission.release(spec.request_id)
        self._refund([s for s in specs if s.request_id not in added])
        self.cancel(job, 500)

    # ------------------------------------------------------------------ outputs (event loop)

    def _on_output(self, out: RequestOutput, route: Route) -> None:
        ctx: RequestContext = route.context
        self.metrics.on_tokens(len(out.new_token_ids))
        if not ctx.started and out.new_token_ids:
            ctx.started = True
            self.admission.mark_started(out.request_id, self.engine.clock.now())
            self.metrics.on_first_token(len(out.prompt_token_ids))
        if not out.finished:
            return
        self.admission.release(out.request_id)
        self.key_limits.release(ctx.api_key_name, ctx.max_tokens - out.num_output_tokens, self.engine.clock.now())
        self._contexts.pop(out.request_id, None)
        if not self._contexts:
            self._all_finished.set()
        reason = out.finish_reason or "abort"
        if out.metrics.shed:
            ctx.status = 429
            self.metrics.on_refused("slo_unattainable")
            route.queue.put_nowait(errors.slo_unattainable())
        met = None if ctx.slo.is_empty() else ctx.slo.met_by(out.metrics, ok=reason in ("stop", "length"))
        if met is not None:
            self.metrics.on_slo(ctx.request_class, met)
        if reason == "error":
            ctx.status = 500
        elif reason == "abort" and ctx.status == 200:
            ctx.status = 499
        self.metrics.on_finish(out.metrics, ctx.request_class, reason)
        if self.request_log is not None:
            self.request_log.write(make_log_record(
                metrics=out.metrics, start=self._log_start, clock_to_unix=self._clock_to_unix,
                request_id=out.request_id, api_id=ctx.api_id, index=ctx.index, endpoint=ctx.endpoint,
                model=ctx.model, stream=ctx.stream, tenant=ctx.tenant, priority=ctx.priority,
                max_tokens=ctx.max_tokens, finish_reason=reason, status=ctx.status, slo_met=met,
                api_key_name=ctx.api_key_name,
                **{"class": ctx.request_class},
            ))

    def _on_overflow(self, request_ids: list[str], route: Route) -> None:
        """A streaming client read too slowly: its requests are being aborted; count them and
        end its stream with the reason (the queue's backlog is already dropped)."""
        for rid in request_ids:
            ctx = self._contexts.get(rid)
            if ctx is not None and ctx.status == 200:
                ctx.status = 408
        self.metrics.on_slow_client(len(request_ids))
        limit = self.options.max_queued_outputs
        log.warning("aborted %s: the client left %d outputs per choice unread", ", ".join(request_ids), limit)
        route.queue.put_nowait(errors.slow_client(limit))

    def _on_failure(self, request_ids: list[str], error: BaseException) -> None:
        for rid in request_ids:
            ctx = self._contexts.get(rid)
            route = self.loop.route(rid)
            if ctx is not None:
                ctx.status = 500
            if route is not None:
                route.queue.put_nowait(errors.internal(f"the engine failed while running this request: {error}"))

    # ------------------------------------------------------------------ introspection

    def debug_state(self) -> dict[str, Any]:
        return {
            "engine": {**self.loop.state.as_dict(), "alive": self.loop.alive},
            "server": {"num_in_flight": self.loop.num_routes, "num_admission_waiting": self.admission.num_waiting,
                       "draining": self.draining, "refused": dict(self.admission.num_refused)},
        }

    def update_gauges(self) -> None:
        s = self.loop.state
        self.metrics.set_engine_state(s.num_running, s.num_waiting, s.kv_usage, s.num_preemptions,
                                      s.prefix_cache_queried_tokens, s.prefix_cache_hit_tokens)
