"""The serving layer between HTTP and the engine loop: charges the key, turns a parsed OpenAI
request into engine requests (pacer.server.requests: one per prompt and choice, `n` fans out
into n; the chat template and tokenizer off the event loop, after the key's charge for its
places), applies admission control, and keeps metrics and the request log as outputs arrive.
A streamed job's queue is bounded (`ServiceOptions.max_queued_outputs` per choice): a client
that falls that far behind is aborted, counted, and its stream ends with an error.
Runs on the event loop; touches the engine only through `EngineLoop` (thread-safe add/abort)
and read-only attributes (tokenizer, limits, clock).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pacer.config.slo import ClassRules, Slo
from pacer.engine import Engine, RequestOutput
from pacer.errors import FieldError
from pacer.sched.admission import AdmissionController
from pacer.server.access.auth import Access, APIKey
from pacer.server.access.key_limits import KeyLimiters
from pacer.server.api import errors
from pacer.server.api.errors import APIError, bad_request
from pacer.server.api.limits import RequestLimits
from pacer.server.api.logprobs import TokenText
from pacer.server.api.protocol import ParsedRequest
from pacer.server.engine_loop import EngineLoop, Route
from pacer.server.engine_thread import EngineThread
from pacer.server.job import Job
from pacer.server.reasoning import ReasoningSyntax
from pacer.server.requests import RequestBuilder, RequestContext, Spec, num_engine_requests
from pacer.server.tools.serving import ToolOptions, plan_tools
from pacer.telemetry.collectors import (
    KVTierCollector,
    PrefillDedupCollector,
    SegmentReuseCollector,
    SessionRetentionCollector,
    SpecDecodeCollector,
    StructuredOutputsCollector,
    TenantServiceCollector,
)
from pacer.telemetry.prometheus import ServingMetrics
from pacer.telemetry.request_log import RequestLogWriter, make_log_record
from pacer.telemetry.step_log import StepLogWriter

__all__ = ["Service", "ServiceOptions", "Job", "RequestContext"]   # Job: pacer.server.job; RequestContext: pacer.server.requests

log = logging.getLogger("pacer.server")


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    served_model_names: tuple[str, ...]
    max_waiting: int | None = 512                 # None: no cap (an operator's explicit choice)
    metrics_prefix: str = "pacer"
    request_log: str | None = None
    step_log: str | None = None                   # pacer.telemetry.step_log: a line per engine step
    class_rules: ClassRules = field(default_factory=ClassRules)
    tenant_weights: dict[str, float] | None = None   # shares of max_waiting (equal by default)
    access: Access = field(default_factory=Access)    # API keys (none: open)
    limits: RequestLimits = field(default_factory=RequestLimits)
    tools: ToolOptions = field(default_factory=ToolOptions)
    # outputs a streaming client may leave unread, per choice, before its request is aborted
    max_queued_outputs: int = 256
    # the watchdog: seconds work may be pending without a step finishing before /health is 503
    engine_iteration_timeout: float | None = 60.0
    # under keys, a trusted key's own SLO targets are no tighter than its class's (--allow-tighter-slo: off)
    floor_trusted_slo: bool = True
    # client-named tenants that get their own Prometheus label; the rest share `other`
    max_tenant_labels: int = 100
    # every response carries each choice's metrics (else only when the body asks: return_metrics)
    per_request_metrics: bool = False


class Service:
    def __init__(self, engine: Engine, options: ServiceOptions, thread: EngineThread | None = None) -> None:
        """`thread`: the one `engine` was built on, to step it there (pacer.server.engine_thread)."""
        self.engine = engine
        self.options = options
        self.model_name = options.served_model_names[0]
        self.loop = EngineLoop(engine, stall_timeout=options.engine_iteration_timeout, thread=thread)
        self.builder = RequestBuilder(engine, options.class_rules, options.tools.chat_template, self._on_refused,
                                      options.floor_trusted_slo, options.tools.chat_template_kwargs)
        self.admission = AdmissionController(options.max_waiting, tenant_weights=options.tenant_weights)
        self.key_limits = KeyLimiters()
        self.output_tokens_by_key: collections.Counter[str] = collections.Counter()   # read by replicas' ingress
        self.metrics = ServingMetrics(self.model_name, options.metrics_prefix, options.max_tenant_labels,
                                      _named_tenants(options))
        self.request_log = RequestLogWriter(options.request_log) if options.request_log else None
        self.step_log = StepLogWriter(options.step_log) if options.step_log else None
        self.draining = False
        self.token_text = TokenText(engine.tokenizer)   # logprobs' token strings
        parser = engine.config.structured.reasoning_parser
        self.reasoning = ReasoningSyntax.named(parser, engine.think_tags) if parser is not None else None
        self._log_start = engine.clock.now()
        self._clock_to_unix = time.time() - engine.clock.now()
        self._contexts: dict[str, RequestContext] = {}
        self._all_finished = asyncio.Event()   # set whenever _contexts empties
        for collector in (StructuredOutputsCollector, KVTierCollector, SpecDecodeCollector, SessionRetentionCollector,
                          PrefillDedupCollector, SegmentReuseCollector):   # read loop.state
            self.metrics.registry.register(collector(lambda: self.loop.state, self.metrics.name, self.model_name))
        self.metrics.registry.register(TenantServiceCollector(lambda: self.loop.state, self.metrics.name,
                                                              self.model_name, self.metrics.tenant_label))
        self.loop.listeners.append(self._on_output)
        engine.stats_listeners.append(self.metrics.on_step)
        if self.step_log is not None:
            engine.schedule_listeners.append(self.step_log.on_schedule)
            engine.stats_listeners.append(self.step_log.on_stats)
        self.loop.failure_listeners.append(self._on_failure)
        self.loop.overflow_listeners.append(self._on_overflow)
        self.closers: list[Callable[[], None]] = []   # run at shutdown (e.g. the KV event publisher)
        self.kv_publisher: Any = None                  # pacer.telemetry.kv_events.KVEventPublisher when enabled
        snap = engine.snapshot()
        self.metrics.set_cache_config(block_size=engine.config.cache.block_size, num_gpu_blocks=snap.num_blocks,
                                      enable_prefix_caching=snap.prefix_caching)

    @property
    def shared_cache(self) -> bool:
        """Whether every tenant's prompts share one prefix cache (`--tenant-isolation shared`)."""
        return self.engine.config.cache.tenant_isolation == "shared"

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
        if self.step_log is not None:   # the loop has stopped: no step writes to it any more
            self.engine.schedule_listeners.remove(self.step_log.on_schedule)
            self.engine.stats_listeners.remove(self.step_log.on_stats)
            self.step_log.close()

    # ------------------------------------------------------------------ submitting

    async def submit(self, parsed: ParsedRequest, is_agent: bool = False, declared_class: str | None = None,
                     header_slo: Slo | None = None, key: APIKey | None = None) -> Job:
        """Validate, charge the key, tokenize, classify, admit and queue; raises APIError
        (4xx/5xx) instead. `parsed` already carries the tenant, priority and salt the key
        allows. The key's places are charged before any work on the request; the chat template
        and the tokenizer then run in a thread, and the token charge follows."""
        self._check_open(parsed)
        parsed, tool_parser = plan_tools(parsed, self.options.tools)
        num_requests = num_engine_requests(parsed)
        limiter = self._charged(parsed.tenant, lambda now: self.key_limits.acquire_requests(key, num_requests, now))
        num_tokens = 0
        try:
            prompts = await asyncio.to_thread(self.builder.prompt_ids, parsed)
            prefix = "chatcmpl" if parsed.endpoint == "chat" else "cmpl"
            job = Job(f"{prefix}-{uuid.uuid4().hex}", parsed, int(time.time()), [], [], asyncio.Queue(),
                      tool_parser=tool_parser, reasoning=self.reasoning if parsed.endpoint == "chat" else None,
                      return_metrics=parsed.return_metrics or self.options.per_request_metrics)
            specs = self.builder.specs(job.api_id, self.model_name, parsed, prompts, is_agent=is_agent,
                                       declared_class=declared_class, header_slo=header_slo, key=key)
            if parsed.session is not None and parsed.tools is not None:   # a window only while a tool runs
                for spec in specs:
                    spec.context.session, spec.context.called_tool = parsed.session, job.called_tool
            total = sum(s.prepared.num_tokens for s in specs)
            self._charged(parsed.tenant, lambda now: self.key_limits.acquire_tokens(limiter, total, now))
            num_tokens = total
            self._admit(job, [s.request_id for s in specs])
        except BaseException:   # refused, or the client went away while the prompt was tokenized
            self.key_limits.cancel(limiter, num_requests, num_tokens, self.engine.clock.now())
            raise
        self._queue(job, specs, limiter)
        return job

    def _check_open(self, parsed: ParsedRequest) -> None:
        if self.draining:
            self.metrics.on_refused("draining", parsed.tenant)
            raise errors.unavailable("the server is shutting down")
        if not self.loop.alive:
            raise errors.unavailable("the engine is not running")
        if parsed.model not in self.options.served_model_names:
            raise APIError(404, f"The model `{parsed.model}` does not exist", "invalid_request_error",
                           "model", "model_not_found")

    def _queue(self, job: Job, specs: list[Spec], limiter: str | None) -> None:
        """Hand the admitted requests to the engine loop; one it refuses undoes the job."""
        stream = job.parsed.stream
        max_queued = self.options.max_queued_outputs * len(specs) if stream else None
        try:
            for spec in specs:
                route = Route(job.queue, spec.context.index, spec.context, stream=stream, max_queued=max_queued)
                self.loop.add(spec.request_id, spec.prepared, route)
                self._contexts[spec.request_id] = spec.context
                job.request_ids.append(spec.request_id)
                job.contexts.append(spec.context)
        except FieldError as e:
            self._undo(job, specs, limiter)
            raise bad_request(e.field, str(e), e.code) from None
        except RuntimeError:
            self._undo(job, specs, limiter)
            raise errors.unavailable("the engine is not running") from None

    def cancel(self, job: Job, status: int) -> None:
        """Abort the job's unfinished engine requests (client gone, error in a sibling, ...)."""
        for i, rid in enumerate(job.request_ids):
            if i not in job.finished:
                ctx = job.contexts[i]
                if ctx.status == 200:
                    ctx.status = status
                self.loop.abort(rid)

    @contextlib.contextmanager
    def charged_tokenize(self, key: APIKey | None) -> Iterator[Callable[[int], None]]:
        """/tokenize and /detokenize: one request charged to the key before the work (429
        instead), the tokens it counted debited after (call the yielded function with them)."""
        tenant = key.tenant if key is not None and key.tenant else "default"
        limiter = self._charged(tenant, lambda now: self.key_limits.acquire_requests(key, 1, now))
        try:
            yield lambda num_tokens: self.key_limits.debit_tokens(limiter, num_tokens, self.engine.clock.now())
        finally:
            self.key_limits.release(limiter, 0, self.engine.clock.now())

    def _charged(self, tenant: str, charge: Callable[[float], Any]) -> Any:
        """Run one charge of the key's limits; a refusal is counted and raised (a 429)."""
        try:
            return charge(self.engine.clock.now())
        except APIError as e:
            self.metrics.on_refused(e.code or "rate_limited", tenant)
            self.admission.refuse(e.code or "rate_limited")
            raise

    def _on_refused(self, reason: str, tenant: str) -> None:
        self.metrics.on_refused(reason, tenant)
        self.admission.refuse(reason)

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

    def _undo(self, job: Job, specs: list[Spec], limiter: str | None) -> None:
        """The engine refused one of the job's requests: release what was not added (the
        added ones are aborted and released when the engine reports them finished)."""
        added = set(job.request_ids)
        for spec in specs:
            self.admission.release(spec.request_id)
        left = [s for s in specs if s.request_id not in added]
        self.key_limits.cancel(limiter, len(left), sum(s.prepared.num_tokens for s in left), self.engine.clock.now())
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
        if ctx.api_key_name is not None:
            self.output_tokens_by_key[ctx.api_key_name] += out.num_output_tokens
        self._contexts.pop(out.request_id, None)
        if not self._contexts:
            self._all_finished.set()
        reason = out.finish_reason or "abort"
        if ctx.called_tool is not None and ctx.session is not None and reason in ("stop", "length") \
                and not ctx.called_tool(out):
            self.loop.session_answered(ctx.tenant, ctx.session)
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

    def _on_failure(self, request_ids: list[str], error_id: str) -> None:
        """The engine failed these requests; the client gets the log's error id, never the error."""
        for rid in request_ids:
            ctx = self._contexts.get(rid)
            route = self.loop.route(rid)
            if ctx is not None:
                ctx.status = 500
            if route is not None:
                route.queue.put_nowait(errors.internal("the engine failed while running this request", error_id))

    # ------------------------------------------------------------------ introspection

    def debug_state(self) -> dict[str, Any]:
        return {
            "engine": {**self.loop.state.as_dict(), "alive": self.loop.alive, "healthy": self.loop.healthy,
                       "stalled_for_s": round(self.loop.stalled_for(), 3)},
            "server": {"num_in_flight": self.loop.num_routes, "num_admission_waiting": self.admission.num_waiting,
                       "draining": self.draining, "refused": dict(self.admission.num_refused)},
        }

    def update_gauges(self) -> None:
        s = self.loop.state
        self.metrics.set_engine_state(s.num_running, s.num_waiting, s.kv_usage, s.num_preemptions,
                                      s.prefix_cache_queried_tokens, s.prefix_cache_hit_tokens)


def _named_tenants(options: ServiceOptions) -> set[str]:
    """The tenants the operator named (keys file, weights): they always get a metrics label."""
    names = set(options.tenant_weights or {})
    for key in options.access.api_keys.keys:
        names.update([key.tenant] if key.tenant else [])
        names.update(key.allowed_tenants or ())
    return names
