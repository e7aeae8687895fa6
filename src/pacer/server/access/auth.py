"""Who may use the server, and as whom: API keys, key-bound tenants, priority and SLO bounds.

Three ways to run (docs/usage/api-keys.md):

- no key (default, local use): every route is open; a request names its tenant with the
  `tenant` extension field (else `user`), as before.
- `--api-key KEY` (or `PACER_API_KEY` / `VLLM_API_KEY`), vLLM's flag: `/v1/*` needs
  `Authorization: Bearer KEY`. Such a key is trusted like a gateway: it may name any tenant
  (header or `tenant` field; `user` is an end-user id and never selects one).
- `--api-keys FILE` (YAML or JSON): named keys, stored in clear or as their SHA-256, each
  bound to a tenant, an allowed priority range, rate limits, a concurrency cap and the
  tightest SLO targets it may ask for. The tenant comes from the key: a request whose
  `tenant` names another gets 403; `user` keeps OpenAI's meaning (an end-user id) and never
  selects a tenant. A key with `gateway: true` may name the tenant on its clients' behalf in
  llm-d's `x-llm-d-inference-fairness-id` header (or the `tenant` field), optionally only
  from `allowed_tenants`.

Keys are compared as SHA-256 digests with `hmac.compare_digest` against every stored key,
so the time taken does not depend on how much of a key matched. Deny by default: with keys
required every route needs one except those listed open (`OPEN_PATHS`: `/health`), and
`/metrics`, which is open unless `--metrics-api-key` is given; `/metrics` and `/debug/*` then
need that key (and only it), and without it `/debug/*` needs an API key. Missing or wrong
keys get 401 in OpenAI's error shape.

Keys from the file fail closed: priorities outside a key's range are **clamped** into it
(not refused: SDKs cannot always omit a field, and a clamp never lets a key run more
important than it is allowed to); a key with no `priority` range runs no more important than
the default, 0. Its own SLO targets are raised to its `tightest_slo`, else to its class's
`--slo` targets, and are not used where neither sets a floor. `x-pacer-class` is honoured
only from the classes a key lists in `allowed_classes` (403 otherwise). A `cache_salt` under
a key is confined to the key's tenant, in a shared cache too. Plain `--api-key` keys are
trusted: none of these bounds apply, except that their own targets are no tighter than
their class's unless `--allow-tighter-slo` is given.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from pacer.config.slo import SLO_KEYS, Slo, canonical_class
from pacer.server.access.keys import TENANT_HEADER, Access, APIKey, KeyRing, hash_key
from pacer.server.access.keys_file import KeysFile, load_keys_file
from pacer.server.api.errors import APIError
from pacer.server.api.protocol import ParsedRequest

__all__ = ["Access", "APIKey", "KeyRing", "KeysFile", "load_keys_file", "AuthMiddleware", "apply_key", "bound_slo_targets",
           "bound_slo", "declared_class", "clamp_priority", "hash_key", "TENANT_HEADER", "STATE_KEY", "OPEN_PATHS",
           "DEFAULT_KEY_PRIORITY", "key_tenant", "ring_for", "unauthorized"]

STATE_KEY = "pacer_api_key"                       # where the middleware leaves the caller's APIKey
OPEN_PATHS = frozenset({"/health"})               # the routes that need no key, ever
DEFAULT_KEY_PRIORITY = 0                          # a file key without `priority` runs no more important

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


# ---------------------------------------------------------------- per request


def apply_key(key: APIKey | None, parsed: ParsedRequest, body: Mapping[str, Any],
              headers: Mapping[str, str], tenant_header: str = TENANT_HEADER,
              shared_cache: bool = False) -> ParsedRequest:
    """The request as the key allows it: its tenant (403 if the request names another), its
    priority clamped into the key's range and, in a `shared_cache`, its `cache_salt` confined
    to its tenant (an isolated cache confines it already). With any key `user` never selects
    the tenant; with no key (an open server) the request keeps the tenant it named (`tenant`,
    else `user`) and its salt keeps vLLM's meaning."""
    if key is None:
        return parsed
    tenant = key_tenant(key, body, headers, tenant_header)
    salt = parsed.cache_salt
    if salt is not None and shared_cache:   # another tenant sending the same salt must not share it
        salt = f"{len(tenant)}:{tenant}:{salt}"
    return dataclasses.replace(parsed, tenant=tenant, priority=clamp_priority(key, parsed.priority), cache_salt=salt)


def key_tenant(key: APIKey, body: Mapping[str, Any], headers: Mapping[str, str],
               tenant_header: str = TENANT_HEADER) -> str:
    """The tenant a request under `key` runs as: a bound key's own (403 if the body's `tenant`
    names another); a gateway's (or trusted key's) from `tenant_header`, else the `tenant`
    field (403 outside its `allowed_tenants`); `user` never selects one. The replicas' ingress
    routes on this too."""
    asked = body.get("tenant") if isinstance(body.get("tenant"), str) else None
    named = headers.get(tenant_header) or asked
    if key.tenant is not None and not key.gateway:
        if asked is not None and asked != key.tenant:
            raise forbidden(f"this API key ({key.name}) is bound to another tenant; it may not act as "
                            f"tenant {asked!r}")
        return key.tenant
    if named:   # a gateway (or a trusted plain key) names the tenant on its client's behalf
        if key.allowed_tenants is not None and named not in key.allowed_tenants:
            raise forbidden(f"this gateway key ({key.name}) may not act as tenant {named!r}")
        return named
    return key.tenant or "default"


def clamp_priority(key: APIKey, priority: int) -> int:
    """The priority the key allows: its range; a file key without one runs no more important
    than `DEFAULT_KEY_PRIORITY` (less important is always allowed); a trusted key as asked."""
    if key.priority_range is not None:
        low, high = key.priority_range
        return min(max(priority, low), high)
    return priority if key.trusted else max(priority, DEFAULT_KEY_PRIORITY)


def declared_class(key: APIKey | None, value: str | None) -> str | None:
    """The `x-pacer-class` header as the key allows it: any class on an open server or from a
    trusted key; from a file key only a class in its `allowed_classes`, else a 403."""
    if value is None or key is None or key.trusted:
        return value
    name = canonical_class(value.strip().lower())
    if name in key.allowed_classes:
        return value
    allowed = ", ".join(sorted(key.allowed_classes)) or "none"
    raise APIError(403, f"this API key ({key.name}) may not declare request class {value!r} in x-pacer-class "
                        f"(its allowed_classes: {allowed})", "permission_error", "x-pacer-class", "class_not_allowed")


def bound_slo(key: APIKey | None, own: Slo, class_slo: Slo, trusted_floor: bool = True) -> Slo:
    """A request's own targets as the key allows them (lower = tighter). A file key's are
    raised to its `tightest_slo`, else to `class_slo` (its class's targets), and dropped where
    neither has a floor; a trusted key's are raised to `class_slo` when `trusted_floor` (the
    server's default under keys; `--allow-tighter-slo` turns it off). No key: unchanged."""
    if key is None:
        return own
    values: dict[str, float] = {}
    for name in SLO_KEYS:
        mine = getattr(own, name)
        if mine is None:
            continue
        floor = key.tightest_slo.get(name)
        if floor is None and (trusted_floor or not key.trusted):
            floor = getattr(class_slo, name)
            if floor is None and not key.trusted:
                continue   # nothing bounds it: a file key cannot ask for a target the server does not grant
        values[name] = mine if floor is None else max(mine, floor)
    return Slo(**values)


def bound_slo_targets(key: APIKey | None, targets: Mapping[str, float]) -> dict[str, float]:
    """The SLO hook: `targets` (name -> seconds, lower = tighter) as the key allows them. A
    target tighter than the key's `tightest_slo` for that name is raised to it (clamped, like
    priorities); names the key does not bound, and requests without a key, pass unchanged."""
    if key is None or not key.tightest_slo:
        return dict(targets)
    return {name: max(value, key.tightest_slo.get(name, value)) for name, value in targets.items()}


def forbidden(message: str) -> APIError:
    return APIError(403, message, "permission_error", "tenant", "tenant_not_allowed")


# ---------------------------------------------------------------- the ASGI middleware


class AuthMiddleware:
    """Checks `Authorization: Bearer` on every route, deny by default: `OPEN_PATHS` need no
    key; `/metrics` and `/debug/*` need a `metrics_keys` key when that ring is set, else
    `/metrics` is open and `/debug/*` needs an `api_keys` key; every other path (a route added
    later included) needs an `api_keys` key. An empty `api_keys` ring is an open server. Pure
    ASGI, so streaming responses and disconnect detection pass through untouched. The caller's
    APIKey lands in `scope["state"][STATE_KEY]` (read it as `request.state.pacer_api_key`)."""

    def __init__(self, app: ASGIApp, api_keys: KeyRing, metrics_keys: KeyRing) -> None:
        self.app = app
        self.api_keys = api_keys
        self.metrics_keys = metrics_keys

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] == "http":
            ring = self._ring_for(scope.get("path", ""))
            if ring is not None and ring.enabled:
                key = ring.authenticate(_header(scope, b"authorization"))
                if key is None:
                    await _send_401(send)
                    return
                scope.setdefault("state", {})[STATE_KEY] = key
        await self.app(scope, receive, send)

    def _ring_for(self, path: str) -> KeyRing | None:
        return ring_for(path, self.api_keys, self.metrics_keys)


def ring_for(path: str, api_keys: KeyRing, metrics_keys: KeyRing) -> KeyRing | None:
    """The ring whose key `path` needs (None: open): one rule for a server and the replicas'
    ingress."""
    if path in OPEN_PATHS:
        return None
    if path == "/metrics":
        return metrics_keys if metrics_keys.enabled else None
    if path == "/debug" or path.startswith("/debug/"):
        return metrics_keys if metrics_keys.enabled else api_keys
    return api_keys


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return bytes(v).decode("latin-1")
    return None


def unauthorized() -> APIError:
    """The 401 for a missing or wrong key (OpenAI's shape, `WWW-Authenticate: Bearer`)."""
    return APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'", "invalid_request_error",
                    None, "invalid_api_key", {"www-authenticate": "Bearer"})


async def _send_401(send: Callable[[Any], Awaitable[None]]) -> None:
    e = unauthorized()
    body = json.dumps(e.body()).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *[(k.encode(), v.encode()) for k, v in e.headers.items()]]})
    await send({"type": "http.response.body", "body": body})
