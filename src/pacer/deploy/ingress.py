"""The ingress of `pacer serve --replicas N`: one OpenAI-compatible front door for N replicas.

It reads only what routing and admission need: the prompt's token ids (the model's own
tokenizer and chat template, as the replicas compute them), the tenant (`tenant`, `user`,
or llm-d's fairness header), `cache_salt`, and the request class. `--max-waiting` is
enforced here, once for the whole deployment: a request counts as waiting until its
response starts (a stream's first token; a non-streamed answer's completion). Everything
else, validation and errors included, is the replica's own single-engine server.
"""

# no `from __future__ import annotations`: Ray Serve rewrites the route signatures and FastAPI
# must see `Request` itself, not the string "Request"
import argparse
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve

from pacer.deploy.ray_app import aggregate_metrics, live_stats
from pacer.deploy.routers import request_namespace
from pacer.server.api import errors
from pacer.server.api.gateway import FAIRNESS_HEADER

__all__ = ["PacerIngress", "routing_facts"]

app = FastAPI(title="pacer (replicas)")
_GENERATE = ("/v1/completions", "/v1/chat/completions")


def routing_facts(body: Any, headers: Any, tokenizer: Any) -> tuple[list[int], str, str | None]:
    """(token ids, tenant, cache_salt) as the replica will see them; ([], ...) when the body
    is not something the replica will accept (it answers the 400 itself)."""
    if not isinstance(body, dict):
        return [], "default", None
    tenant = next((v for v in (body.get("tenant"), body.get("user")) if isinstance(v, str) and v), None)
    tenant = tenant or headers.get(FAIRNESS_HEADER) or "default"
    salt = body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None
    ids: list[int] = []
    try:
        if isinstance(body.get("messages"), list) and tokenizer is not None:
            ids = list(tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True))
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
                prompt = prompt[0]
            if isinstance(prompt, str) and tokenizer is not None:
                ids = tokenizer.encode(prompt)
            elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                ids = list(prompt)
    except Exception:   # a bad template or prompt: the replica reports it
        ids = []
    return ids, tenant, salt


# helpers before the class: Ray Serve pickles the deployment class when it is decorated
async def _relay(gen: Any) -> AsyncIterator[bytes]:
    try:
        async for item in gen:
            yield item["body"]
    except Exception as exc:   # the replica died mid-stream: an error event, then the end
        body = errors.unavailable(f"the replica serving this request failed: {type(exc).__name__}").body()
        yield f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()
    finally:
        gen.cancel()


def _unavailable(exc: BaseException) -> JSONResponse:
    e = errors.unavailable(f"no replica could serve this request ({type(exc).__name__}: {exc})"[:500])
    return JSONResponse(e.body(), status_code=e.status)


@serve.deployment(name="PacerIngress")
@serve.ingress(app)
class PacerIngress:
    def __init__(self, replicas: Any, serve_args: dict[str, Any]) -> None:
        from pacer.config.slo import ClassRules
        from pacer.model.loader import default_model_path
        from pacer.model.tokenizer import Tokenizer

        args = argparse.Namespace(**serve_args)
        self.replicas = replicas.options(stream=True)
        self.tokenizer = Tokenizer.load(args.model or default_model_path())
        self.max_waiting: int | None = args.max_waiting
        self.rules = ClassRules(args.long_context_threshold, args.batch_max_tokens, args.agent_header.lower())
        self.isolation = args.tenant_isolation or "shared"
        self.num_waiting = 0
        self.num_refused = 0
        self._ids = itertools.count()

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self._forward(request, generate=True)

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request) -> Response:
        return await self._forward(request, generate=True)

    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> Response:
        return await self._forward(request)

    @app.post("/detokenize")
    async def detokenize(self, request: Request) -> Response:
        return await self._forward(request)

    @app.get("/v1/models")
    async def models(self, request: Request) -> Response:
        return await self._forward(request)

    @app.get("/version")
    async def version(self, request: Request) -> Response:
        return await self._forward(request)

    @app.get("/health")
    async def health(self, request: Request) -> Response:
        return await self._forward(request)

    @app.get("/metrics")
    async def metrics(self) -> Response:
        text = aggregate_metrics(dict(live_stats()))
        text += ("# HELP pacer_ingress_requests_waiting Requests forwarded whose response has not started.\n"
                 "# TYPE pacer_ingress_requests_waiting gauge\n"
                 f"pacer_ingress_requests_waiting {self.num_waiting}\n"
                 "# HELP pacer_ingress_refused_total Requests refused at the ingress (queue_full).\n"
                 "# TYPE pacer_ingress_refused_total counter\n"
                 f"pacer_ingress_refused_total {self.num_refused}\n")
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    def _route(self, raw: bytes, request: Request) -> dict[str, Any]:
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        ids, tenant, salt = routing_facts(body, request.headers, self.tokenizer)
        max_tokens = body.get("max_tokens") if isinstance(body, dict) else None
        is_agent = bool(self.rules.agent_header) and self.rules.agent_header in request.headers
        rclass = self.rules.classify(len(ids), max_tokens if isinstance(max_tokens, int) else None,
                                     is_agent or bool(isinstance(body, dict) and body.get("tools")))
        return {"request_id": f"ingress-{next(self._ids)}", "token_ids": ids, "tenant": tenant,
                "owner": request_namespace(tenant, salt, self.isolation), "request_class": rclass}

    async def _forward(self, request: Request, generate: bool = False) -> Response:
        raw = await request.body()
        forwarded = {"method": request.method, "path": request.url.path, "query": request.url.query,
                     "headers": list(request.headers.items()), "body": raw}
        route: Any = self._route(raw, request) if generate else None
        if generate and self.max_waiting is not None and self.num_waiting >= self.max_waiting:
            self.num_refused += 1
            e = errors.queue_full(1)
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
        self.num_waiting += generate
        gen = self.replicas.handle.remote(route, forwarded)
        try:
            start = await gen.__anext__()
        except Exception as exc:   # the replica died or is unreachable: a clear 503, never a hang
            self.num_waiting -= generate
            gen.cancel()
            return _unavailable(exc)
        headers = {k: v for k, v in start["headers"] if k.lower() != "content-length"}
        if "text/event-stream" not in headers.get("content-type", ""):
            try:
                body = b"".join([item["body"] async for item in gen])
            except Exception as exc:
                return _unavailable(exc)
            finally:
                self.num_waiting -= generate
            return Response(body, status_code=start["status"], headers=headers)
        self.num_waiting -= generate
        return StreamingResponse(_relay(gen), status_code=start["status"], headers=headers)
