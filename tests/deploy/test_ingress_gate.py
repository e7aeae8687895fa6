"""Finding 4 of issue 27, without Ray: the replicas' ingress enforces what one server enforces.

The keys are resolved as `pacer serve --replicas N` resolves them in the driver
(`deployment_args`: the key only in the driver's environment) and reach the ingress and the
replicas as digests. The ingress's real request path (`pacer.deploy.relay.forward` over the
gate) runs in a real FastAPI app over HTTP; its replica is a real ASGI app driven through the
same bridge the Ray replicas use, which counts what reaches it. The real tokenizer is wrapped
to count its calls, so "before any work" is observed, not assumed. The Ray deployment itself
is tests/deploy/test_ray_serve.py (slow)."""

from __future__ import annotations

import argparse
import hashlib
import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from pacer.cli.serve import add_args as add_serve_args
from pacer.deploy.gate import REPLICA_HEADER, gate_from_args
from pacer.deploy.launch import deployment_args
from pacer.deploy.ray_app import asgi_call
from pacer.deploy.relay import forward, refused
from pacer.server.access.wire import access_from_wire
from pacer.server.api.errors import APIError
from pacer.server.cli import build_access

KEY = "driver-only-secret"
METRICS_KEY = "metrics-secret"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4}
KEYS_YAML = """
keys:
  - name: acme
    key: acme-secret
    tenant: acme
    max_concurrent: 1
    requests_per_minute: 2
  - name: router
    key_sha256: {router_sha}
    gateway: true
    allowed_tenants: [initech]
"""


class CountingTokenizer:
    """The real tokenizer, counting the calls the ingress makes."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    def encode(self, text):
        self.calls += 1
        return self.inner.encode(text)

    def apply_chat_template(self, messages, **kwargs):
        self.calls += 1
        return self.inner.apply_chat_template(messages, **kwargs)


@pytest.fixture(scope="module")
def tokenizer():
    from pacer.model.loader import default_model_path
    from pacer.model.tokenizer import Tokenizer

    return Tokenizer.load(default_model_path())


def replica_app(seen: list[dict], status: int = 200) -> FastAPI:
    """A replica: records the request it got and answers `status`."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def answer(request: Request, path: str):
        seen.append({"path": "/" + path, "authorization": request.headers.get("authorization"),
                     "body": await request.body()})
        if status != 200:
            return JSONResponse({"error": {"message": "bad", "type": "invalid_request_error", "param": "x",
                                           "code": None}}, status_code=status)
        return {"object": "chat.completion", "choices": []}

    return app


class ReplicaStream:
    """A replica handle's stream over the ASGI bridge the Ray replicas use (with their header),
    then the output tokens the replica reports."""

    def __init__(self, app: FastAPI, forwarded: dict, output_tokens: dict[str, int]):
        self._items = self._run(app, forwarded, output_tokens)

    async def _run(self, app, forwarded, output_tokens):
        async for item in asgi_call(app, forwarded, extra_headers=[(REPLICA_HEADER, "0")]):
            yield item
        if output_tokens:
            yield {"output_tokens": output_tokens}

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self._items.__anext__()

    def cancel(self) -> None:
        pass


def _serve_args(monkeypatch, *flags: str) -> tuple[dict, dict]:
    """(ingress, replica) serve args as the driver makes them, the key only in its environment."""
    monkeypatch.setenv("PACER_API_KEY", KEY)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    return deployment_args(parser.parse_args(["--replicas", "2", *flags]))


def ingress(ingress_args: dict, tokenizer, replica: FastAPI, output_tokens: dict | None = None):
    """(a client of the ingress's request path, its gate, the counting tokenizer)."""
    counting = CountingTokenizer(tokenizer)
    gate = gate_from_args(ingress_args, counting)
    app = FastAPI()

    def send(route, forwarded):
        return ReplicaStream(replica, forwarded, output_tokens or {})

    for path, generate in (("/v1/chat/completions", True), ("/v1/completions", True), ("/tokenize", False)):
        async def route(request: Request, generate: bool = generate):
            return await forward(gate, request, send, generate)
        app.add_api_route(path, route, methods=["POST"])

    @app.get("/metrics")
    async def metrics(request: Request):
        try:
            gate.authenticate("/metrics", request.headers)
        except APIError as e:
            return refused(e)
        return {"ok": True}

    return TestClient(app), gate, counting


def test_driver_ships_digests_and_a_replica_with_an_empty_ring_refuses_to_start(monkeypatch, tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_YAML.replace("{router_sha}", hashlib.sha256(b"router-secret").hexdigest()))
    ingress_args, replica_args = _serve_args(monkeypatch, "--api-keys", str(keys), "--metrics-api-key", METRICS_KEY)
    shipped = json.dumps([ingress_args, replica_args])
    for secret in (KEY, METRICS_KEY, "acme-secret", str(keys)):
        assert secret not in shipped, secret   # neither the keys nor the file's path
    access, _ = access_from_wire(replica_args["access_wire"])
    assert access.api_keys.authenticate(f"Bearer {KEY}") is not None
    assert access.api_keys.authenticate("Bearer acme-secret").tenant == "acme"
    assert access.metrics_keys.authenticate(f"Bearer {METRICS_KEY}") is not None
    # the limits are the ingress's, once: the replicas get the keys without them
    assert not any(k.has_limits for k in access.api_keys.keys)
    ingress_access, _ = access_from_wire(ingress_args["access_wire"])
    assert [k.limits.max_concurrent for k in ingress_access.api_keys.keys if k.name == "acme"] == [1]
    # a replica reads no key from its own environment, and one whose ring arrived empty stops
    monkeypatch.setenv("PACER_API_KEY", "another-key")
    access, _ = build_access(argparse.Namespace(**replica_args))
    assert access.api_keys.authenticate("Bearer another-key") is None
    emptied = {**replica_args["access_wire"], "api_keys": []}
    with pytest.raises(RuntimeError, match="key ring is empty; refusing to start open"):
        build_access(argparse.Namespace(**{**replica_args, "access_wire": emptied}))
    with pytest.raises(RuntimeError, match="refusing to start open"):
        gate_from_args({**ingress_args, "access_wire": emptied}, None)


def test_unauthenticated_and_oversized_requests_are_refused_before_any_work(monkeypatch, tokenizer):
    ingress_args, _ = _serve_args(monkeypatch, "--max-request-body-bytes", "2000")
    seen: list[dict] = []
    client, gate, counting = ingress(ingress_args, tokenizer, replica_app(seen))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
        assert REPLICA_HEADER not in r.headers and r.headers["www-authenticate"] == "Bearer"
    auth = {"Authorization": f"Bearer {KEY}"}
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    r = client.post("/v1/chat/completions", json=big, headers=auth)
    assert r.status_code == 413 and "--max-request-body-bytes" in r.json()["error"]["message"]
    deep = {**CHAT, "extra": json.loads("[" * 70 + "]" * 70)}
    r = client.post("/v1/chat/completions", json=deep, headers=auth)
    assert r.status_code == 400 and "--max-json-depth" in r.json()["error"]["message"]
    r = client.post("/tokenize", json={"prompt": "hi"})
    assert r.status_code == 401
    assert seen == [] and counting.calls == 0 and gate.num_waiting == 0   # no replica, no tokenizer
    r = client.post("/v1/chat/completions", json=CHAT, headers=auth)
    assert r.status_code == 200 and r.headers[REPLICA_HEADER] == "0"
    assert counting.calls == 1 and seen[0]["authorization"] == f"Bearer {KEY}"   # the replica checks it again
    assert gate.num_waiting == 0


def test_metrics_needs_the_metrics_key_at_the_ingress(monkeypatch, tokenizer):
    ingress_args, _ = _serve_args(monkeypatch, "--metrics-api-key", METRICS_KEY)
    client, _, _ = ingress(ingress_args, tokenizer, replica_app([]))
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}).status_code == 200
    ingress_args, _ = _serve_args(monkeypatch)   # without --metrics-api-key: open, as on one server
    client, _, _ = ingress(ingress_args, tokenizer, replica_app([]))
    assert client.get("/metrics").status_code == 200


def test_routes_on_the_keys_tenant_and_names_no_replica_on_a_refusal(monkeypatch, tmp_path, tokenizer):
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_YAML.replace("{router_sha}", hashlib.sha256(b"router-secret").hexdigest()))
    ingress_args, _ = _serve_args(monkeypatch, "--api-keys", str(keys))
    seen: list[dict] = []
    client, gate, _ = ingress(ingress_args, tokenizer, replica_app(seen))
    routes: list[dict] = []
    admit = gate.admit

    async def recording(request, generate=False):
        ticket = await admit(request, generate)
        routes.append(ticket.route)
        return ticket
    gate.admit = recording
    acme = {"Authorization": "Bearer acme-secret"}
    r = client.post("/v1/chat/completions", json={**CHAT, "user": "victim"}, headers=acme)
    assert r.status_code == 200 and routes[-1]["tenant"] == "acme"   # `user` never picks the route
    assert routes[-1]["owner"].startswith("acme")   # keys imply an isolated cache: the key's namespace
    r = client.post("/v1/chat/completions", json={**CHAT, "tenant": "victim"}, headers=acme)
    assert r.status_code == 403 and REPLICA_HEADER not in r.headers and len(seen) == 1
    router = {"Authorization": "Bearer router-secret"}
    r = client.post("/v1/chat/completions", json=CHAT,
                    headers={**router, "x-llm-d-inference-fairness-id": "initech"})
    assert r.status_code == 200 and routes[-1]["tenant"] == "initech"
    r = client.post("/v1/chat/completions", json=CHAT, headers={**router, "x-llm-d-inference-fairness-id": "acme"})
    assert r.status_code == 403 and REPLICA_HEADER not in r.headers and len(seen) == 2
    r = client.post("/v1/chat/completions", json=CHAT, headers={**acme, "x-pacer-class": "batch"})
    assert r.status_code == 403 and REPLICA_HEADER not in r.headers and len(seen) == 2
    # a replica's own refusal is relayed without its name
    client, _, _ = ingress(ingress_args, tokenizer, replica_app([], status=400))
    r = client.post("/v1/chat/completions", json=CHAT, headers=acme)
    assert r.status_code == 400 and r.json()["error"]["param"] == "x" and REPLICA_HEADER not in r.headers


def test_per_key_limits_hold_once_for_the_deployment(monkeypatch, tmp_path, tokenizer):
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_YAML.replace("{router_sha}", hashlib.sha256(b"router-secret").hexdigest()))
    ingress_args, _ = _serve_args(monkeypatch, "--api-keys", str(keys))
    seen: list[dict] = []
    client, gate, counting = ingress(ingress_args, tokenizer, replica_app(seen), output_tokens={"acme": 3})
    acme = {"Authorization": "Bearer acme-secret"}
    assert [client.post("/v1/chat/completions", json=CHAT, headers=acme).status_code for _ in range(2)] == [200, 200]
    r = client.post("/v1/chat/completions", json=CHAT, headers=acme)   # requests_per_minute: 2, at the ingress
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited" and "Retry-After" in r.headers
    assert REPLICA_HEADER not in r.headers and len(seen) == 2 and counting.calls == 2
    assert gate.key_limits.num_in_flight("acme") == 0   # each answer gave its place back
    r = client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200   # another key is not held by acme's limits


def test_the_route_carries_the_turns_session(monkeypatch, tokenizer):
    """The router reads a turn's agent session as a replica does (the body's `session`, else
    `x-session-id`), so a long history routes to the replica retaining it."""
    ingress_args, _ = _serve_args(monkeypatch)
    client, gate, _ = ingress(ingress_args, tokenizer, replica_app([]))
    routes: list[dict] = []
    admit = gate.admit

    async def recording(request, generate=False):
        ticket = await admit(request, generate)
        routes.append(ticket.route)
        return ticket
    gate.admit = recording
    auth = {"Authorization": f"Bearer {KEY}"}
    for body, headers, session in ((CHAT, {}, None), (CHAT, {"x-session-id": "agent-7"}, "agent-7"),
                                   ({**CHAT, "session": "agent-8"}, {"x-session-id": "agent-7"}, "agent-8")):
        r = client.post("/v1/chat/completions", json=body, headers={**auth, **headers})
        assert r.status_code == 200 and routes[-1]["session"] == session
