"""API keys and the rings that accept them: `APIKey` (what one key may do), `KeyRing`
(compare a bearer token against every stored digest in constant time), `Access` (the
server's rings). The keys file is read by `pacer.server.access.keys_file`; what a key allows
per request is `pacer.server.access.auth`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pacer.server.access.rate_limit import KeyLimits

__all__ = ["APIKey", "KeyRing", "Access", "hash_key", "TENANT_HEADER"]

TENANT_HEADER = "x-llm-d-inference-fairness-id"   # llm-d's fairness id: the tenant a gateway names


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class APIKey:
    """One accepted key. `trusted` (a plain --api-key): it may name any tenant and none of the
    file keys' bounds apply; a file key (`trusted` False) is bound by them (module docstring)."""

    name: str
    digest: bytes = field(repr=False)
    tenant: str | None = None
    gateway: bool = False
    allowed_tenants: frozenset[str] | None = None    # gateway: tenants it may name (None: any)
    priority_range: tuple[int, int] | None = None    # (most important, least important) allowed
    limits: KeyLimits = field(default_factory=KeyLimits)
    tightest_slo: Mapping[str, float] = field(default_factory=dict)
    allowed_classes: frozenset[str] = frozenset()    # classes it may declare in x-pacer-class
    max_kv_retention_s: float | None = None          # longest kv_retention.ttl_s hint its requests may ask
    trusted: bool = False

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
        return cls(APIKey(name if len(keys) == 1 else f"{name}-{i}", hash_key(k), trusted=True)
                   for i, k in enumerate(keys))

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
    """The server's key setup: `api_keys` guard every route but the open ones, `metrics_keys`
    (when set) /metrics and /debug/*; `binds_tenants` (an --api-keys file is loaded): the
    tenant comes from the key."""

    api_keys: KeyRing = field(default_factory=KeyRing)
    metrics_keys: KeyRing = field(default_factory=KeyRing)
    binds_tenants: bool = False
    tenant_header: str = TENANT_HEADER
