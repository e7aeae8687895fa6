"""What the replicas' ingress enforces before any work, with one server's own rules
(`pacer.server.access`, `pacer.server.api.limits`), in this order:

1. the key (401; `/metrics` takes `--metrics-api-key` when given, `/health` is open);
2. the body: its size (413), then in a thread its JSON (400), then its counts (400);
3. the tenant the key allows (403 when a bound key's request names another) and the
   request class it may declare (403);
4. `--max-waiting` (429 queue_full), once for the whole deployment;
5. the key's places: `max_concurrent` and `requests_per_minute` (429);
6. only then the chat template and tokenizer (in a thread), for routing, and the key's
   `tokens_per_minute` charge for the prompt (429).

Per-key limits are enforced here, once, and the replicas get the keys without limits, so a
key's limits hold for the deployment, not N times over. The one difference from a single
server: a request's output tokens are debited when the replica reports them at its end (not
reserved as `max_tokens` up front), so a key may overshoot its token rate by what its requests
in flight generate; its next requests then wait until the bucket refills.

Routing follows the tenant the key allows (never the body's `tenant`/`user` under a bound
key). A refused client never learns which replica would have served it: refusals are the
ingress's own, and a replica's error status (4xx/5xx) is relayed without `x-pacer-replica`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pacer.config.slo import ClassRules
from pacer.deploy.routers import request_namespace
from pacer.server.access.auth import declared_class, key_tenant, ring_for, unauthorized
from pacer.server.access.key_limits import KeyLimiters
from pacer.server.access.keys import Access, APIKey
from pacer.server.api import errors
from pacer.server.api.gateway import FAIRNESS_HEADER
from pacer.server.api.limits import RequestLimits, read_body

__all__ = ["Gate", "Ticket", "gate_from_args", "routing_facts", "request_session", "relayed_headers", "REPLICA_HEADER", "CLASS_HEADER",
           "CHARGED_PATHS"]

REPLICA_HEADER = "x-pacer-replica"       # which replica answered (never on a refusal)
CLASS_HEADER = "x-pacer-class"           # as pacer.server.app reads it
CHARGED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"})


def request_session(body: Any, headers: Any) -> str | None:
    """The agent session a turn continues, as a replica reads it: the body's `session`, else
    the `x-session-id` header (`pacer.server.app`). A long history routes by it."""
    session = body.get("session") if isinstance(body, dict) else None
    if isinstance(session, str) and session:
        return session
    header = headers.get("x-session-id")
    return header if isinstance(header, str) and header else None


def routing_facts(body: Any, headers: Any, tokenizer: Any,
                  tenant: str | None = None) -> tuple[list[int], str, str | None]:
    """(token ids, tenant, cache_salt) as the replica will see them; ([], ...) when the body
    is not something the replica will accept (it answers the 400 itself). `tenant`: the one
    the key allows; None (an open deployment): the body's `tenant`, else `user`, else the
    fairness header, as an open server reads it."""
    if not isinstance(body, dict):
        return [], tenant or "default", None
    if tenant is None:
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


def relayed_headers(status: int, headers: list[tuple[str, str]]) -> dict[str, str]:
    """A replica's response headers as the client gets them: no content-length (the body is
    re-framed) and, on an error status, no replica name."""
    drop = {"content-length"} | ({REPLICA_HEADER} if status >= 400 else set())
    return {k: v for k, v in headers if k.lower() not in drop}


@dataclass(slots=True)
class Ticket:
    """One admitted request: what is forwarded, how it routes, and what it holds of its key."""

    key: APIKey | None
    forwarded: dict[str, Any]
    route: dict[str, Any] | None = None
    limiter: str | None = None
    num_requests: int = 0
    waiting: bool = False
    done: bool = False


class Gate:
    """The ingress's checks and its bookkeeping (waiting requests, per-key limiters); runs on
    the ingress's event loop only."""

    def __init__(self, access: Access, limits: RequestLimits, tokenizer: Any, rules: ClassRules,
                 isolation: str, max_waiting: int | None) -> None:
        self.access = access
        self.limits = limits
        self.tokenizer = tokenizer
        self.rules = rules
        self.isolation = isolation
        self.max_waiting = max_waiting
        self.key_limits = KeyLimiters()
        self.num_waiting = 0
        self.num_refused = 0   # queue_full refusals
        self._ids = itertools.count()

    def authenticate(self, path: str, headers: Mapping[str, str]) -> APIKey | None:
        """The caller's key for `path` (None: the path is open); a 401 APIError otherwise."""
        ring = ring_for(path, self.access.api_keys, self.access.metrics_keys)
        if ring is None or not ring.enabled:
            return None
        key = ring.authenticate(headers.get("authorization"))
        if key is None:
            raise unauthorized()
        return key

    async def admit(self, request: Any, generate: bool = False) -> Ticket:
        """Check `request` (a Starlette Request) in the module docstring's order; raises an
        APIError, with nothing held, for a refusal."""
        path = request.url.path
        key = self.authenticate(path, request.headers)
        raw, body = b"", None
        if request.method == "POST":
            raw = await read_body(request, self.limits.max_body_bytes)
            body = await asyncio.to_thread(self.limits.parse_json, raw)
            self.limits.check(body)
        ticket = Ticket(key, {"method": request.method, "path": path, "query": request.url.query,
                              "headers": list(request.headers.items()), "body": raw})
        if path not in CHARGED_PATHS:
            return ticket
        fields: Mapping[str, Any] = body if isinstance(body, dict) else {}
        tenant = None if key is None else key_tenant(key, fields, request.headers, self.access.tenant_header)
        if generate:
            declared_class(key, request.headers.get(CLASS_HEADER))
            if self.max_waiting is not None and self.num_waiting >= self.max_waiting:
                self.num_refused += 1
                raise errors.queue_full(1)
        num_requests = num_sequences(fields) if generate else 1
        ticket.limiter = self.key_limits.acquire_requests(key, num_requests, time.monotonic())
        ticket.num_requests = num_requests
        if generate:
            try:
                ticket.route = await asyncio.to_thread(self._route, body, request.headers, tenant)
                num_tokens = len(ticket.route["token_ids"]) * num_requests
                self.key_limits.acquire_tokens(ticket.limiter, num_tokens, time.monotonic())
            except BaseException:
                self.key_limits.cancel(ticket.limiter, num_requests, 0, time.monotonic())
                raise
            ticket.waiting = True
            self.num_waiting += 1
        return ticket

    def _route(self, body: Any, headers: Mapping[str, str], tenant: str | None) -> dict[str, Any]:
        ids, tenant, salt = routing_facts(body, headers, self.tokenizer, tenant)
        max_tokens = body.get("max_tokens") if isinstance(body, dict) else None
        is_agent = bool(self.rules.agent_header) and self.rules.agent_header in headers
        rclass = self.rules.classify(len(ids), max_tokens if isinstance(max_tokens, int) else None,
                                     is_agent or bool(isinstance(body, dict) and body.get("tools")))
        return {"request_id": f"ingress-{next(self._ids)}", "token_ids": ids, "tenant": tenant,
                "owner": request_namespace(tenant, salt, self.isolation), "request_class": rclass,
                "session": request_session(body, headers)}

    def started(self, ticket: Ticket) -> None:
        """The response started: the request no longer counts as waiting."""
        if ticket.waiting:
            ticket.waiting = False
            self.num_waiting -= 1

    def finish(self, ticket: Ticket, output_tokens: Mapping[str, int] | None = None) -> None:
        """The response ended (or failed): release the key's places and debit the output
        tokens the replica reported, by key name. Idempotent."""
        self.started(ticket)
        if ticket.done:
            return
        ticket.done = True
        now = time.monotonic()
        for _ in range(ticket.num_requests):
            self.key_limits.release(ticket.limiter, 0, now)
        for name, num_tokens in (output_tokens or {}).items():
            self.key_limits.debit_tokens(name, int(num_tokens), now)


def gate_from_args(serve_args: dict[str, Any], tokenizer: Any) -> Gate:
    """The ingress's gate for the serve args the driver made (`pacer.deploy.launch`); raises
    RuntimeError when keys were asked for but none arrived (never start open by mistake)."""
    import argparse

    from pacer.server.access.wire import access_from_wire
    from pacer.server.cli import security_choices

    args = argparse.Namespace(**serve_args)
    access, _ = access_from_wire(args.access_wire, "the ingress")
    rules = ClassRules(args.long_context_threshold, args.batch_max_tokens, args.agent_header.lower())
    isolation = security_choices(args, access).tenant_isolation or "shared"
    return Gate(access, RequestLimits.from_args(args), tokenizer, rules, isolation, args.max_waiting)


def num_sequences(body: Mapping[str, Any]) -> int:
    """Engine requests a body makes, as a replica counts them: prompts (chat: one) times `n`."""
    n = body.get("n")
    n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    prompt = body.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return (1 if isinstance(body.get("messages"), list) else prompts) * n
