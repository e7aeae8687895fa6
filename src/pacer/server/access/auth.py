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
so the time taken does not depend on how much of a key matched. `/health` is always open;
`/metrics` and `/debug/*` are open unless `--metrics-api-key` is given, then they need that
key (and only it). Missing or wrong keys get 401 in OpenAI's error shape.

Priorities outside a key's range are **clamped** into it (not refused): SDKs cannot always
omit a field, and a clamp never lets a key run more important than it is allowed to.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pacer.server.access.rate_limit import KeyLimits
from pacer.server.api.errors import APIError, error_body
from pacer.server.api.protocol import ParsedRequest

__all__ = ["Access", "APIKey", "KeyRing", "KeysFile", "load_keys_file", "AuthMiddleware", "apply_key", "bound_slo_targets",
           "hash_key", "TENANT_HEADER", "STATE_KEY"]

TENANT_HEADER = "x-llm-d-inference-fairness-id"   # llm-d's fairness id: the tenant a gateway names
STATE_KEY = "pacer_api_key"                       # where the middleware leaves the caller's APIKey
_KEY_FIELDS = {"name", "key", "key_sha256", "tenant", "gateway", "allowed_tenants", "priority",
               "requests_per_minute", "tokens_per_minute", "max_concurrent", "burst_requests", "burst_tokens",
               "tightest_slo"}

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class APIKey:
    """One accepted key. `tenant` None: a trusted key (plain --api-key) that may name any tenant."""

    name: str
    digest: bytes = field(repr=False)
    tenant: str | None = None
    gateway: bool = False
    allowed_tenants: frozenset[str] | None = None    # gateway: tenants it may name (None: any)
    priority_range: tuple[int, int] | None = None    # (most important, least important) allowed
    limits: KeyLimits = field(default_factory=KeyLimits)
    tightest_slo: Mapping[str, float] = field(default_factory=dict)

    @property
    def has_limits(self) -> bool:
        lim = self.limits
        return any(v is not None for v in (lim.requests_per_minute, lim.tokens_per_minute, lim.max_concurrent))


class KeyRing:
    """The accepted keys of one route group; empty: the routes are open."""

    def __init__(self, keys: Iterable[APIKey] = ()) -> None:
        self.keys = tuple(keys)
        names = [k.name for k in self.keys]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"API key names must be unique; repeated: {', '.join(sorted(dup))}")
        digests = [k.digest for k in self.keys]
        if len(set(digests)) != len(digests):
            raise ValueError("the same API key is listed twice")

    @classmethod
    def from_plain(cls, keys: Iterable[str], name: str = "api-key") -> KeyRing:
        keys = [k for k in keys if k]
        return cls(APIKey(name if len(keys) == 1 else f"{name}-{i}", hash_key(k)) for i, k in enumerate(keys))

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def authenticate(self, authorization: str | None) -> APIKey | None:
        """The key named by an `Authorization: Bearer ...` header value, or None."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        digest = hash_key(token.strip())
        found = None
        for key in self.keys:   # no early exit: every key is compared
            if hmac.compare_digest(digest, key.digest):
                found = key
        return found


@dataclass(frozen=True, slots=True)
class Access:
    """The server's key setup: `api_keys` guard /v1/*, `metrics_keys` guard /metrics and
    /debug/*; `binds_tenants` (an --api-keys file is loaded): the tenant comes from the key."""

    api_keys: KeyRing = field(default_factory=KeyRing)
    metrics_keys: KeyRing = field(default_factory=KeyRing)
    binds_tenants: bool = False
    tenant_header: str = TENANT_HEADER


# ---------------------------------------------------------------- the keys file


@dataclass(frozen=True, slots=True)
class KeysFile:
    keys: tuple[APIKey, ...]
    tenant_weights: dict[str, float]


def load_keys_file(path: str | Path) -> KeysFile:
    """Read `--api-keys FILE`: `{"keys": [...], "tenant_weights": {...}}` (or just the list)."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    where = f"--api-keys {p}"
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:
        raise ValueError(f"{where}: cannot parse the file: {e}") from None
    if isinstance(data, list):
        data = {"keys": data}
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list) or not data["keys"]:
        raise ValueError(f"{where}: expected a non-empty 'keys' list")
    unknown = set(data) - {"keys", "tenant_weights"}
    if unknown:
        raise ValueError(f"{where}: unknown top-level fields {sorted(unknown)} (keys, tenant_weights)")
    weights = data.get("tenant_weights") or {}
    if not isinstance(weights, dict) or not all(_is_number(w) and w > 0 for w in weights.values()):
        raise ValueError(f"{where}: tenant_weights must map tenant -> number > 0, got {weights!r}")
    keys = tuple(_parse_key(entry, f"{where}: keys[{i}]") for i, entry in enumerate(data["keys"]))
    KeyRing(keys)   # names and keys unique
    return KeysFile(keys, {str(t): float(w) for t, w in weights.items()})


def _parse_key(entry: Any, where: str) -> APIKey:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: each key must be a mapping")
    unknown = set(entry) - _KEY_FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}; allowed: {sorted(_KEY_FIELDS)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: 'name' is required (it is what logs show instead of the key)")
    where = f"{where} ({name})"
    gateway = entry.get("gateway", False)
    if not isinstance(gateway, bool):
        raise ValueError(f"{where}: gateway must be true or false")
    tenant = entry.get("tenant")
    if tenant is None and not gateway:
        raise ValueError(f"{where}: 'tenant' is required (unless gateway: true)")
    if tenant is not None and (not isinstance(tenant, str) or not tenant):
        raise ValueError(f"{where}: tenant must be a non-empty string")
    allowed = entry.get("allowed_tenants")
    if allowed is not None and (not gateway or not isinstance(allowed, list)
                                or not all(isinstance(t, str) and t for t in allowed)):
        raise ValueError(f"{where}: allowed_tenants must be a list of tenant names, on a gateway key")
    limits = KeyLimits(**{f: _opt_positive(entry, f, where) for f in
                          ("requests_per_minute", "tokens_per_minute", "burst_requests", "burst_tokens")},
                       max_concurrent=_opt_positive(entry, "max_concurrent", where, integer=True))
    slo = entry.get("tightest_slo") or {}
    if not isinstance(slo, dict) or not all(_is_number(v) and v > 0 for v in slo.values()):
        raise ValueError(f"{where}: tightest_slo must map target name -> seconds > 0, got {slo!r}")
    return APIKey(name, _digest(entry, where), tenant or None, gateway,
                  None if allowed is None else frozenset(allowed), _priority_range(entry.get("priority"), where),
                  limits, {str(k): float(v) for k, v in slo.items()})


def _digest(entry: dict[str, Any], where: str) -> bytes:
    key, hashed = entry.get("key"), entry.get("key_sha256")
    if (key is None) == (hashed is None):
        raise ValueError(f"{where}: give exactly one of 'key' (the key itself) or 'key_sha256' (its hex SHA-256)")
    if key is not None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}: key must be a non-empty string")
        return hash_key(key)
    text = str(hashed).lower().removeprefix("sha256:")
    try:
        digest = bytes.fromhex(text)
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise ValueError(f"{where}: key_sha256 must be 64 hex digits (e.g. `printf %s KEY | sha256sum`)")
    return digest


def _priority_range(value: Any, where: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if _is_int(value):
        return (value, value)
    if isinstance(value, list) and len(value) == 2 and all(_is_int(v) for v in value) and value[0] <= value[1]:
        return (value[0], value[1])
    raise ValueError(f"{where}: priority must be an integer or [low, high] with low <= high (lower = more "
                     f"important), got {value!r}")


def _opt_positive(entry: dict[str, Any], name: str, where: str, integer: bool = False) -> Any:
    v = entry.get(name)
    if v is None:
        return None
    if not (_is_int(v) if integer else _is_number(v)) or v <= 0:
        raise ValueError(f"{where}: {name} must be {'an integer' if integer else 'a number'} > 0, got {v!r}")
    return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# ---------------------------------------------------------------- per request


def apply_key(key: APIKey | None, parsed: ParsedRequest, body: Mapping[str, Any],
              headers: Mapping[str, str], tenant_header: str = TENANT_HEADER) -> ParsedRequest:
    """The request as the key allows it: its tenant (403 if the request names another) and its
    priority clamped into the key's range. With any key `user` never selects the tenant; with
    no key (an open server) the request keeps the tenant it named (`tenant`, else `user`)."""
    if key is None:
        return parsed
    asked = body.get("tenant") if isinstance(body.get("tenant"), str) else None
    named = headers.get(tenant_header) or asked
    if key.tenant is not None and not key.gateway:
        if asked is not None and asked != key.tenant:
            raise forbidden(f"this API key ({key.name}) is bound to another tenant; it may not act as "
                            f"tenant {asked!r}")
        tenant = key.tenant
    elif named:   # a gateway (or a trusted plain key) names the tenant on its client's behalf
        if key.allowed_tenants is not None and named not in key.allowed_tenants:
            raise forbidden(f"this gateway key ({key.name}) may not act as tenant {named!r}")
        tenant = named
    else:
        tenant = key.tenant or "default"
    return dataclasses.replace(parsed, tenant=tenant, priority=clamp_priority(key, parsed.priority))


def clamp_priority(key: APIKey, priority: int) -> int:
    if key.priority_range is None:
        return priority
    low, high = key.priority_range
    return min(max(priority, low), high)


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
    """Checks `Authorization: Bearer` on `/v1/*` (`api_keys`) and `/metrics`, `/debug/*`
    (`metrics_keys`); an empty ring leaves its routes open. Pure ASGI, so streaming responses
    and disconnect detection pass through untouched. The caller's APIKey lands in
    `scope["state"][STATE_KEY]` (read it as `request.state.pacer_api_key`)."""

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
        if path.startswith("/v1/") or path in ("/tokenize", "/detokenize"):
            return self.api_keys
        if path == "/metrics" or path.startswith("/debug"):
            return self.metrics_keys
        return None


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return bytes(v).decode("latin-1")
    return None


async def _send_401(send: Callable[[Any], Awaitable[None]]) -> None:
    body = json.dumps(error_body("Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                                 "invalid_request_error", None, "invalid_api_key")).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})
