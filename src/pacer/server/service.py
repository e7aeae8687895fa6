"""The serving layer between HTTP and the engine loop: builds engine requests from parsed
OpenAI requests (one per prompt and choice: `n` fans out into n engine requests), classifies
them, applies admission control, and keeps metrics and the request log as outputs arrive.
Runs on the event loop; touches the engine only through `EngineLoop` (thread-safe add/abort)
and read-only attributes (tokenizer, limits, clock).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pacer.core.admission import AdmissionController
from pacer.engine import Engine, RequestOutput
from pacer.metrics import ClassRules, RequestLogWriter, ServingMetrics, make_log_record
from pacer.request import ContextLengthError, SamplingParams
from pacer.server import errors
from pacer.server.engine_loop import EngineLoop, Route
from pacer.server.errors import APIError, bad_request
from pacer.server.logprobs import TokenText
from pacer.server.protocol import ParsedRequest

__all__ = ["Service", "ServiceOptions", "Job", "RequestContext"]

log = logging.getLogger("pacer.server")
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "min_tokens",
                    "ignore_eos", "max_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty",
                    "logprobs")


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    served_model_names: tuple[str, ...]
    max_waiting: int | None = None
    metrics_prefix: str = "pacer"
    request_log: str | None = None
    class_rules: ClassRules = field(default_factory=ClassRules)


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
    status: int = 200          # what the client got: 200, 429 (displaced), 499 (went away), 500
    started: bool = False


@dataclass(slots=True)
class Job:
    """One HTTP request: one engine request per prompt and choice (choice index
    `prompt * n + j`), all feeding one queue of `(index, RequestOutput)` items or `APIError`s."""

    api_id: str
    parsed: ParsedRequest
    created: int
    request_ids: list[str]
    contexts: list[RequestContext]
    queue: asyncio.Queue[Any]
    finished: set[int] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return len(self.finished) == len(self.request_ids)


class Service:
    def __init__(self, engine: Engine, options: ServiceOptions) -> None:
        self.engine = engine
        self.options = options
        self.model_name = options.served_model_names[0]
        self.loop = EngineLoop(engine)
        self.admission = AdmissionController(options.max_waiting)
        self.metrics = ServingMetrics(self.model_name, options.metrics_prefix)
        self.request_log = RequestLogWriter(options.request_log) if options.request_log else None
        self.draining = False
        self.token_text = TokenText(engine.tokenizer)   # logprobs' token strings
        self._log_start = engine.clock.now()
        self._clock_to_unix = time.time() - engine.clock.now()
        self._contexts: dict[str, RequestContext] = {}
        self._all_finished = asyncio.Event()   # set whenever _contexts empties
        self.loop.listeners.append(self._on_output)
        engine.stats_listeners.append(self.metrics.on_step)
        self.loop.failure_listeners.append(self._on_failure)

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
        if self.metrics.on_step in self.engine.stats_listeners:
            self.engine.stats_listeners.remove(self.metrics.on_step)
        if self.request_log is not None:
            self.request_log.close()

    # ------------------------------------------------------------------ submitting

    def submit(self, parsed: ParsedRequest, is_agent: bool = False) -> Job:
        """Validate, classify, admit and queue; raises APIError (4xx/5xx) instead."""
        if self.draining:
            self.metrics.on_refused("draining")
            raise errors.unavailable("the server is shutting down")
        if not self.loop.alive:
            raise errors.unavailable("the engine is not running")
        if parsed.model not in self.options.served_model_names:
            raise APIError(404, f"The model `{parsed.model}` does not exist", "invalid_request_error",
                           "model", "model_not_found")
        prompts = self._prompt_ids(parsed)
        prefix = "chatcmpl" if parsed.endpoint == "chat" else "cmpl"
        api_id = f"{prefix}-{uuid.uuid4().hex}"
        job = Job(api_id, parsed, int(time.time()), [], [], asyncio.Queue())
        specs = []
        for p, ids in enumerate(prompts):
            params = self._params(parsed, len(ids))
            rclass = self.options.class_rules.classify(len(ids), parsed.max_tokens,
                                                       is_agent or parsed.has_tools)
            for j in range(parsed.n):
                i = p * parsed.n + j
                choice_params = params.for_sample(j)
                ctx = RequestContext(api_id, i, parsed.endpoint, self.model_name, parsed.stream, parsed.tenant,
                                     rclass, parsed.priority, params.max_tokens)
                specs.append((f"{api_id}-{i}", ids, choice_params, ctx))
        self._admit(job, [s[0] for s in specs])
        try:
            for rid, ids, params, ctx in specs:
                route = Route(job.queue, ctx.index, ctx)
                self.loop.add(rid, ids, params, priority=parsed.priority, tenant=parsed.tenant, route=route)
                self._contexts[rid] = ctx
                job.request_ids.append(rid)
                job.contexts.append(ctx)
        except (ValueError, TypeError) as e:
            self._undo(job, [s[0] for s in specs])
            raise _engine_error(e, parsed) from None
        except RuntimeError as e:
            self._undo(job, [s[0] for s in specs])
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
                return [list(tok.apply_chat_template(parsed.messages, add_generation_prompt=True))]
            return [self.engine.tokenize_prompt(p) for p in parsed.prompts]
        except APIError:
            raise
        except (ValueError, TypeError) as e:
            raise bad_request("messages" if parsed.messages is not None else "prompt", str(e)) from None
        except Exception as e:   # template errors (jinja) and the like are the client's input
            raise bad_request("messages", f"cannot apply the chat template: {e}") from None

    def _params(self, parsed: ParsedRequest, num_prompt_tokens: int) -> SamplingParams:
        param = "messages" if parsed.endpoint == "chat" else "prompt"
        max_tokens = parsed.max_tokens
        if max_tokens is None:   # chat: whatever room the context leaves (at least 1, or the check refuses)
            max_tokens = 16 if parsed.endpoint == "completions" else max(
                1, self.engine.max_context_tokens - num_prompt_tokens)
        try:
            self.engine.check_fits(num_prompt_tokens, max_tokens, param)
        except ContextLengthError as e:
            self.metrics.on_refused(e.code)
            self.admission.refuse(e.code)
            raise bad_request(e.field, str(e), e.code) from None
        try:
            return SamplingParams(max_tokens=max_tokens, **parsed.sampling)
        except (ValueError, TypeError) as e:
            raise _engine_error(e, parsed) from None

    def _admit(self, job: Job, request_ids: list[str]) -> None:
        now = self.engine.clock.now()
        admitted: list[str] = []
        for rid in request_ids:
            decision = self.admission.try_admit(rid, job.parsed.priority, now)
            if not decision.admitted:
                for a in admitted:
                    self.admission.release(a)
                self.metrics.on_refused(decision.reason or "queue_full")
                raise errors.queue_full(decision.retry_after_s)
            admitted.append(rid)
            if decision.displaced_id is not None:
                self._displace(decision.displaced_id, now)

    def _displace(self, request_id: str, now: float) -> None:
        self.metrics.on_refused("displaced")
        ctx = self._contexts.get(request_id)
        route = self.loop.route(request_id)
        if ctx is not None:
            ctx.status = 429
        if route is not None:
            route.queue.put_nowait(errors.displaced(self.admission.retry_after(now)))
        self.loop.abort(request_id)

    def _undo(self, job: Job, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.admission.release(rid)
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
        self._contexts.pop(out.request_id, None)
        if not self._contexts:
            self._all_finished.set()
        reason = out.finish_reason or "abort"
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
                max_tokens=ctx.max_tokens, finish_reason=reason, status=ctx.status,
                **{"class": ctx.request_class},
            ))

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


def _engine_error(e: Exception, parsed: ParsedRequest) -> APIError:
    """Map an engine/SamplingParams validation error to a 400 naming its field."""
    msg = str(e)
    if isinstance(e, ContextLengthError):
        return bad_request("messages" if parsed.endpoint == "chat" else "prompt", msg, e.code)
    first = msg.split(" ", 1)[0]
    param = first if first in _SAMPLING_FIELDS else None
    return bad_request(param, msg)
