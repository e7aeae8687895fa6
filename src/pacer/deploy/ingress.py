"""The ingress of `pacer serve --replicas N`: one OpenAI-compatible front door for N replicas.

Before any work it enforces what one server enforces (`pacer.deploy.gate`): the key, the
body's limits, the tenant and class the key allows, `--max-waiting` (once, for the whole
deployment: a request counts as waiting until its response starts) and the key's rate and
concurrency limits (once, here; the replicas get the keys without limits). Only then does it
read what routing needs: the prompt's token ids (the model's own tokenizer and chat template,
as the replicas compute them, in a thread), the key's tenant (on an open deployment the
body's `tenant`, `user` or llm-d's fairness header), `cache_salt` and the request class.
Everything else, validation and errors included, is the replica's own single-engine server,
which checks the key again. The keys arrive as digests (`pacer.server.access.wire`).
"""

# no `from __future__ import annotations`: Ray Serve rewrites the route signatures and FastAPI
# must see `Request` itself, not the string "Request"
import argparse
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve

from pacer.deploy.gate import Gate, Ticket, relayed_headers, routing_facts
from pacer.deploy.ray_app import aggregate_metrics, live_stats
from pacer.server.api import errors
from pacer.server.api.errors import APIError

__all__ = ["PacerIngress", "routing_facts"]

# no schema or docs pages: with keys they map the API for anyone who finds the port (as one server)
app = FastAPI(title="pacer (replicas)", docs_url=None, redoc_url=None, openapi_url=None)


# helpers before the class: Ray Serve pickles the deployment class when it is decorated
async def _relay(gen: Any, gate: Gate, ticket: Ticket) -> AsyncIterator[bytes]:
    usage: dict[str, int] = {}
    try:
        async for item in gen:
            if "body" in item:
                yield item["body"]
            usage.update(item.get("output_tokens") or {})
    except Exception as exc:   # the replica died mid-stream: an error event, then the end
        body = errors.unavailable(f"the replica serving this request failed: {type(exc).__name__}").body()
        yield f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()
    finally:
        gate.finish(ticket, usage)
        gen.cancel()


def _refused(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


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
        from pacer.server.access.wire import access_from_wire
        from pacer.server.api.limits import RequestLimits
        from pacer.server.cli import security_choices

        args = argparse.Namespace(**serve_args)
        access, _ = access_from_wire(args.access_wire, "the ingress")   # refuses to start open by mistake
        self.replicas = replicas.options(stream=True)
        rules = ClassRules(args.long_context_threshold, args.batch_max_tokens, args.agent_header.lower())
        isolation = security_choices(args, access).tenant_isolation or "shared"
        self.gate = Gate(access, RequestLimits.from_args(args), Tokenizer.load(args.model or default_model_path()),
                         rules, isolation, args.max_waiting)

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
    async def metrics(self, request: Request) -> Response:
        try:
            self.gate.authenticate("/metrics", request.headers)
        except APIError as e:
            return _refused(e)
        text = aggregate_metrics(dict(live_stats()))
        text += ("# HELP pacer_ingress_requests_waiting Requests forwarded whose response has not started.\n"
                 "# TYPE pacer_ingress_requests_waiting gauge\n"
                 f"pacer_ingress_requests_waiting {self.gate.num_waiting}\n"
                 "# HELP pacer_ingress_refused_total Requests refused at the ingress (queue_full).\n"
                 "# TYPE pacer_ingress_refused_total counter\n"
                 f"pacer_ingress_refused_total {self.gate.num_refused}\n")
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def _forward(self, request: Request, generate: bool = False) -> Response:
        try:
            ticket = await self.gate.admit(request, generate)
        except APIError as e:   # refused before any work, and before any replica is named
            return _refused(e)
        gen = self.replicas.handle.remote(ticket.route, ticket.forwarded)
        try:
            start = await gen.__anext__()
        except Exception as exc:   # the replica died or is unreachable: a clear 503, never a hang
            self.gate.finish(ticket)
            gen.cancel()
            return _unavailable(exc)
        headers = relayed_headers(start["status"], start["headers"])
        if "text/event-stream" not in headers.get("content-type", ""):
            usage: dict[str, int] = {}
            chunks: list[bytes] = []
            try:
                async for item in gen:
                    if "body" in item:
                        chunks.append(item["body"])
                    usage.update(item.get("output_tokens") or {})
            except Exception as exc:
                return _unavailable(exc)
            finally:
                self.gate.finish(ticket, usage)
            return Response(b"".join(chunks), status_code=start["status"], headers=headers)
        self.gate.started(ticket)
        return StreamingResponse(_relay(gen, self.gate, ticket), status_code=start["status"], headers=headers)
