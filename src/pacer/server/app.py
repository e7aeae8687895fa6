"""FastAPI app: /v1/completions, /v1/chat/completions (JSON or SSE), /v1/models, /health,
/metrics, /debug/state, and vLLM's /tokenize, /detokenize, /version. OpenAI-shaped errors;
an unexpected exception is logged with an id and the client gets the id, never its text.
A client that goes away has its requests aborted at the next engine step.

Every body is bounded before work: its size, then its JSON (in a thread: nesting depth,
integer digits), then its counts (`pacer.server.api.limits`). With keys required, the
schema and docs pages are off and every route but `/health` (and `/metrics` without
`--metrics-api-key`) needs a key (`pacer.server.access.auth`).

A streamed response starts (status 200, headers) with the request's first engine event, so
a request shed from the queue or failed before its first token still gets a real 429/500.
With `n` > 1 every choice is its own engine request; streamed chunks carry their choice's
`index`, usage counts each prompt once and every choice's completion tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pacer.config.slo import Slo, slo_from_request
from pacer.engine import RequestOutput
from pacer.server.access.auth import STATE_KEY, AuthMiddleware, apply_key, declared_class
from pacer.server.api import errors
from pacer.server.api.errors import APIError
from pacer.server.api.gateway import add_router_endpoints, detokenize_body, tenant_from_headers, tokenize_body
from pacer.server.api.limits import read_body
from pacer.server.api.protocol import ParsedRequest, parse_chat, parse_completion
from pacer.server.job import Job
from pacer.server.responses import Chunks, completion_body, sse
from pacer.server.service import Service

__all__ = ["create_app"]

log = logging.getLogger("pacer.server")


def create_app(service: Service) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start()
        yield
        await service.shutdown()

    access = service.options.access
    # with keys, no schema or docs pages (they map the API for anyone who finds the port)
    docs: dict[str, Any] = {"docs_url": None, "redoc_url": None, "openapi_url": None} if access.api_keys.enabled else {}
    app = FastAPI(title="pacer", lifespan=lifespan, **docs)
    app.state.service = service
    app.add_middleware(AuthMiddleware, api_keys=access.api_keys, metrics_keys=access.metrics_keys)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        error_id = errors.log_error(f"unhandled error in {request.url.path}", exc)
        return JSONResponse(errors.internal("internal error", error_id).body(), status_code=500)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(service, request, parse_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(service, request, parse_chat)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        created = int(time.time())
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "pacer",
             "max_model_len": service.engine.max_model_len}
            for name in service.options.served_model_names]}

    @app.get("/health")
    async def health() -> Response:
        return _health(service)

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        service.update_gauges()
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/debug/state")
    async def debug_state() -> dict[str, Any]:
        return service.debug_state()

    _add_tokenizer_routes(app, service)
    add_router_endpoints(app)
    return app


def _health(service: Service) -> Response:
    """200 while the engine loop runs and steps (the watchdog's view), else 503 saying why."""
    if service.loop.healthy and not service.draining:
        return Response(status_code=200)
    if service.loop.alive and not service.draining:
        message = (f"engine stalled: work pending and no step finished for {service.loop.stalled_for():.0f} s "
                   f"(--engine-iteration-timeout {service.loop.stall_timeout:g})")
    else:
        message = "engine not running or draining"
    return JSONResponse(errors.unavailable(message).body(), status_code=503)


def _add_tokenizer_routes(app: FastAPI, service: Service) -> None:
    """vLLM's /tokenize and /detokenize: bounded bodies, charged to the caller's key, the
    tokenizer run in a thread."""
    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await _read_json(service, request)
        key = getattr(request.state, STATE_KEY, None)
        engine = service.engine
        with service.charged_tokenize(key) as charge:
            result = await asyncio.to_thread(tokenize_body, engine.tokenizer, body, engine.max_model_len)
            charge(result["count"])
        return result

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await _read_json(service, request)
        key = getattr(request.state, STATE_KEY, None)
        with service.charged_tokenize(key) as charge:
            result = await asyncio.to_thread(detokenize_body, service.engine.tokenizer, body,
                                             service.engine.vocab_size)
            charge(len(body.get("tokens") or ()))
        return result


SESSION_HEADER = "x-session-id"   # names the agent session a turn continues (its KV retained between turns)
CLASS_HEADER = "x-pacer-class"   # a client-declared request class (chat | rag | agent | batch)
_LLM_D_HEADERS = {"x-llm-d-slo-ttft-ms": "ttft_ms", "x-llm-d-slo-tpot-ms": "tpot_ms"}


def _llm_d_slo(headers: Any) -> Slo:
    """llm-d's per-request targets (milliseconds), which the body's `slo` overrides key by key."""
    values: dict[str, float] = {}
    for header, key in _LLM_D_HEADERS.items():
        raw = headers.get(header)
        if raw is None:
            continue
        try:
            values[key] = float(raw)
        except ValueError:
            raise errors.bad_request(header, f"{header} must be a number of milliseconds, got {raw!r}") from None
    try:
        return slo_from_request(values, "x-llm-d-slo")
    except ValueError as e:
        raise errors.bad_request(None, str(e)) from None


async def _generate(service: Service, request: Request,
                    parse: Callable[[Any], ParsedRequest]) -> Response:
    options = service.options
    body = await _read_json(service, request)
    key = getattr(request.state, STATE_KEY, None)
    parsed = parse(body)
    if key is None:   # an open server: llm-d's fairness id names the tenant when the body does not
        parsed = tenant_from_headers(parsed, request.headers)
    if parsed.session is None and SESSION_HEADER in request.headers:   # agent sessions (pacer.kv.retention)
        parsed = dataclasses.replace(parsed, session=request.headers[SESSION_HEADER])
    parsed = apply_key(key, parsed, body, request.headers, options.access.tenant_header,
                       shared_cache=service.shared_cache)
    agent_header = options.class_rules.agent_header
    job = await service.submit(parsed, is_agent=bool(agent_header) and agent_header in request.headers,
                               declared_class=declared_class(key, request.headers.get(CLASS_HEADER)),
                               header_slo=_llm_d_slo(request.headers), key=key)
    watcher = asyncio.create_task(_watch_disconnect(request, lambda: service.cancel(job, 499)))
    if not parsed.stream:
        try:
            return JSONResponse(await _collect(service, job))
        finally:
            watcher.cancel()
            if not job.done:   # failed, or cancelled (client gone, drain timeout)
                service.cancel(job, 499)
    try:
        first = await job.queue.get()
        _raise_if_failed(service, job, first)
    except BaseException:
        watcher.cancel()
        service.cancel(job, 499)
        raise
    return StreamingResponse(_stream(service, job, first, watcher), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _read_json(service: Service, request: Request) -> Any:
    """The body as JSON, bounded before any work: its size (413), then (in a thread) its parse,
    nesting and numbers (400), then its counts and lengths (400)."""
    limits = service.options.limits
    raw = await read_body(request, limits.max_body_bytes)
    body = await asyncio.to_thread(limits.parse_json, raw)
    limits.check(body)
    return body


async def _watch_disconnect(request: Request, on_disconnect: Callable[[], None]) -> None:
    """Wait for the client to go away (the body has been read, so the next ASGI message is
    `http.disconnect`) and abort its requests."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return


def _raise_if_failed(service: Service, job: Job, item: Any) -> None:
    """An APIError item, or an engine output that failed, ends the whole job."""
    if isinstance(item, APIError):
        service.cancel(job, item.status)
        raise item
    _, out = item
    if out.finished and out.finish_reason == "error":
        if out.error is not None:   # its constraint did not compile: the client's input
            service.cancel(job, 400)
            raise errors.bad_request(job.parsed.structured_param, out.error)
        service.cancel(job, 500)
        raise errors.internal("the engine failed while running this request")
    if out.finished and out.finish_reason == "abort":
        raise APIError(499, "request aborted", "invalid_request_error", None, "aborted")


async def _collect(service: Service, job: Job) -> dict[str, Any]:
    finals: dict[int, RequestOutput] = {}
    while len(finals) < len(job.request_ids):
        item = await job.queue.get()
        _raise_if_failed(service, job, item)
        index, out = item
        if out.finished:
            finals[index] = out
            job.finished.add(index)
    return completion_body(job, [finals[i] for i in range(len(finals))], service.token_text)


async def _stream(service: Service, job: Job, first: Any, watcher: asyncio.Task[None]) -> AsyncIterator[str]:
    chunks = Chunks(job, service.token_text)
    finals: dict[int, RequestOutput] = {}
    try:
        for c in chunks.opening(len(job.request_ids)):
            yield c
        item = first
        while True:
            try:
                _raise_if_failed(service, job, item)
            except APIError as e:
                if e.status != 499:
                    yield sse(e.body())
                    yield "data: [DONE]\n\n"
                return
            index, out = item
            for c in chunks.for_output(index, out):
                yield c
            if out.finished:
                finals[index] = out
                job.finished.add(index)
                if job.done:
                    break
            item = await job.queue.get()
        if job.parsed.include_usage:
            yield chunks.usage([finals[i] for i in sorted(finals)])
        if job.return_metrics:
            yield chunks.metrics(job, [finals[i] for i in sorted(finals)])
        yield "data: [DONE]\n\n"
    except Exception as e:   # the stream has started: end it with an error event, never the text
        error_id = errors.log_error(f"streaming {job.api_id} failed", e)
        yield sse(errors.internal("internal error while streaming", error_id).body())
        yield "data: [DONE]\n\n"
    finally:
        watcher.cancel()
        if not job.done:
            service.cancel(job, 499)
