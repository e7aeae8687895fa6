"""FastAPI app: /v1/completions, /v1/chat/completions (JSON or SSE), /v1/models, /health,
/metrics, /debug/state. OpenAI-shaped errors; a client that goes away has its requests
aborted at the next engine step.

A streamed response starts (status 200, headers) with the request's first engine event, so
a request shed from the queue or failed before its first token still gets a real 429/500.
With `n` > 1 every choice is its own engine request; streamed chunks carry their choice's
`index`, usage counts each prompt once and every choice's completion tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pacer.config.slo import Slo, slo_from_request
from pacer.engine import RequestOutput
from pacer.server.access.auth import STATE_KEY, AuthMiddleware, apply_key
from pacer.server.api import errors
from pacer.server.api.errors import APIError
from pacer.server.api.gateway import add_router_endpoints, tenant_from_headers
from pacer.server.api.limits import read_body
from pacer.server.api.logprobs import TokenText, chat_logprobs, completion_logprobs
from pacer.server.api.protocol import ParsedRequest, parse_chat, parse_completion
from pacer.server.service import Job, Service
from pacer.server.tools.stream import ToolDeltaStream, tool_message

__all__ = ["create_app"]

log = logging.getLogger("pacer.server")


def create_app(service: Service) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start()
        yield
        await service.shutdown()

    app = FastAPI(title="pacer", lifespan=lifespan)
    app.state.service = service
    app.add_middleware(AuthMiddleware, api_keys=service.options.access.api_keys,
                       metrics_keys=service.options.access.metrics_keys)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s", request.url.path)
        return JSONResponse(errors.internal(f"internal error: {exc}").body(), status_code=500)

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
        if service.loop.alive and not service.draining:
            return Response(status_code=200)
        return JSONResponse(errors.unavailable("engine not running or draining").body(), status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        service.update_gauges()
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/debug/state")
    async def debug_state() -> dict[str, Any]:
        return service.debug_state()

    add_router_endpoints(app, service.engine.tokenizer, service.engine.max_model_len, service.engine.vocab_size)
    return app


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
    raw = await read_body(request, options.limits.max_body_bytes)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise errors.bad_request(None, f"the request body is not valid JSON: {e}") from None
    options.limits.check(body)
    key = getattr(request.state, STATE_KEY, None)
    parsed = parse(body)
    if key is None:   # an open server: llm-d's fairness id names the tenant when the body does not
        parsed = tenant_from_headers(parsed, request.headers)
    parsed = apply_key(key, parsed, body, request.headers, options.access.tenant_header)
    agent_header = options.class_rules.agent_header
    job = service.submit(parsed, is_agent=bool(agent_header) and agent_header in request.headers,
                         declared_class=request.headers.get(CLASS_HEADER),
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
    outs = [finals[i] for i in range(len(finals))]
    parsed = job.parsed
    k = parsed.sampling.get("logprobs")
    texts = service.token_text
    if parsed.endpoint == "chat":
        choices = []
        for i, o in enumerate(outs):
            message: dict[str, Any] = {"role": "assistant", "content": o.text}
            finish = o.finish_reason
            if job.tool_parser is not None:
                message, finish = tool_message(job.tool_parser, o.text, finish)
            choices.append({"index": i, "message": message, "finish_reason": finish, "stop_reason": o.stop_reason,
                            "logprobs": None if k is None else chat_logprobs(o.token_ids, o.logprobs or [], k, texts)})
        obj = "chat.completion"
    else:
        choices = [{"index": i, "text": o.text,
                    "logprobs": None if k is None else completion_logprobs(o.token_ids, o.logprobs or [], texts)[0],
                    "finish_reason": o.finish_reason, "stop_reason": o.stop_reason} for i, o in enumerate(outs)]
        obj = "text_completion"
    return {"id": job.api_id, "object": obj, "created": job.created, "model": parsed.model,
            "choices": choices, "usage": _usage(outs, parsed.n)}


def _usage(outs: list[RequestOutput], n: int) -> dict[str, Any]:
    """Outputs in choice order; a prompt counts once however many choices it has (as OpenAI)."""
    firsts = outs[::n]
    prompt = sum(len(o.prompt_token_ids) for o in firsts)
    completion = sum(len(o.token_ids) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in firsts)}}


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class _Chunks:
    """SSE chunks of one streamed job, shaped like OpenAI's (chat: role first, finish_reason last),
    from the engine's deltas: each output's new text, tokens and logprobs (the engine holds text
    back while it could still start a stop string, so nothing sent is ever taken back)."""

    def __init__(self, job: Job, texts: TokenText) -> None:
        self.chat = job.parsed.endpoint == "chat"
        self.n = job.parsed.n
        self.k: int | None = job.parsed.sampling.get("logprobs")
        self.texts = texts
        self.text_offsets: dict[int, int] = {}   # completions' text_offset runs on across chunks
        self.base = {"id": job.api_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                     "created": job.created, "model": job.parsed.model}
        self.extra = {"usage": None} if job.parsed.include_usage else {}
        self.tool_parser = job.tool_parser
        self.tool_streams: dict[int, ToolDeltaStream] = {}

    def _choice(self, choice: dict[str, Any]) -> str:
        return _sse({**self.base, "choices": [choice], **self.extra})

    def opening(self, num_choices: int) -> list[str]:
        if not self.chat:
            return []
        return [self._choice({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}) for i in range(num_choices)]

    def _new_logprobs(self, index: int, out: RequestOutput) -> dict[str, Any] | None:
        """The logprobs of the output's new tokens (sent as they come, with or without text)."""
        if self.k is None or not out.new_logprobs:
            return None
        ids, entries = out.new_token_ids, out.new_logprobs
        if self.chat:
            return chat_logprobs(ids, entries, self.k, self.texts)
        obj, self.text_offsets[index] = completion_logprobs(ids, entries, self.texts, self.text_offsets.get(index, 0))
        return obj

    def for_output(self, index: int, out: RequestOutput) -> list[str]:
        finish = {"finish_reason": out.finish_reason, "stop_reason": out.stop_reason} if out.finished else {
            "finish_reason": None}
        text = out.new_text
        logprobs = self._new_logprobs(index, out)
        if not self.chat:
            if not text and logprobs is None and not out.finished:
                return []
            return [self._choice({"index": index, "text": text, "logprobs": logprobs, **finish})]
        chunks = []
        if self.tool_parser is not None:
            return self._tool_chunks(index, out, logprobs)
        if text or logprobs is not None:
            chunks.append(self._choice({"index": index, "delta": {"content": text}, "logprobs": logprobs,
                                        "finish_reason": None}))
        if out.finished:
            chunks.append(self._choice({"index": index, "delta": {}, "logprobs": None, **finish}))
        return chunks

    def _tool_chunks(self, index: int, out: RequestOutput, logprobs: dict[str, Any] | None) -> list[str]:
        """Deltas of a choice whose tool calls are parsed: content, then each call's id and
        name, then its argument fragments (pacer.server.tools.stream)."""
        stream = self.tool_streams.setdefault(index, ToolDeltaStream(self.tool_parser))
        deltas = stream.update(out.new_text, out.finished)
        chunks = [self._choice({"index": index, "delta": d, "logprobs": None, "finish_reason": None})
                  for d in deltas]
        if logprobs is not None:
            chunks.append(self._choice({"index": index, "delta": {}, "logprobs": logprobs, "finish_reason": None}))
        if out.finished:
            finish = {"finish_reason": stream.finish_reason(out.finish_reason), "stop_reason": out.stop_reason}
            chunks.append(self._choice({"index": index, "delta": {}, "logprobs": None, **finish}))
        return chunks

    def usage(self, outs: list[RequestOutput]) -> str:
        return _sse({**self.base, "choices": [], "usage": _usage(outs, self.n)})


async def _stream(service: Service, job: Job, first: Any, watcher: asyncio.Task[None]) -> AsyncIterator[str]:
    chunks = _Chunks(job, service.token_text)
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
                    yield _sse(e.body())
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
        yield "data: [DONE]\n\n"
    finally:
        watcher.cancel()
        if not job.done:
            service.cancel(job, 499)
