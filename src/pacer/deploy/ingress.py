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
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve

from pacer.deploy.gate import gate_from_args, routing_facts
from pacer.deploy.ray_app import aggregate_metrics, live_stats
from pacer.deploy.relay import forward, refused
from pacer.server.api.errors import APIError

__all__ = ["PacerIngress", "routing_facts"]

# no schema or docs pages: with keys they map the API for anyone who finds the port (as one server)
app = FastAPI(title="pacer (replicas)", docs_url=None, redoc_url=None, openapi_url=None)


@serve.deployment(name="PacerIngress")
@serve.ingress(app)
class PacerIngress:
    def __init__(self, replicas: Any, serve_args: dict[str, Any]) -> None:
        from pacer.model.loader import default_model_path
        from pacer.model.tokenizer import Tokenizer

        self.replicas = replicas.options(stream=True)
        self.gate = gate_from_args(serve_args, Tokenizer.load(serve_args.get("model") or default_model_path()))

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
        try:   # --metrics-api-key, as on one server
            self.gate.authenticate("/metrics", request.headers)
        except APIError as e:
            return refused(e)
        text = aggregate_metrics(dict(live_stats()))
        text += ("# HELP pacer_ingress_requests_waiting Requests forwarded whose response has not started.\n"
                 "# TYPE pacer_ingress_requests_waiting gauge\n"
                 f"pacer_ingress_requests_waiting {self.gate.num_waiting}\n"
                 "# HELP pacer_ingress_refused_total Requests refused at the ingress (queue_full).\n"
                 "# TYPE pacer_ingress_refused_total counter\n"
                 f"pacer_ingress_refused_total {self.gate.num_refused}\n")
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def _forward(self, request: Request, generate: bool = False) -> Response:
        return await forward(self.gate, request, self.replicas.handle.remote, generate)
