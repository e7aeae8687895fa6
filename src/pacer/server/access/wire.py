"""Key rings as plain data, for `pacer serve --replicas N`: the driver resolves the keys
(`--api-key`, `--api-keys FILE`, `PACER_API_KEY` / `VLLM_API_KEY`, `--metrics-api-key`) and
hands the ingress and every replica this form, which holds each key's SHA-256 digest and its
bounds, never the key itself: a Ray deployment's config is visible to anyone who can read the
cluster's state. `keys_required` travels with the rings, so a process that gets an empty ring
when keys were asked for refuses to start instead of serving everyone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pacer.server.access.keys import Access, APIKey, KeyRing
from pacer.server.access.rate_limit import KeyLimits

__all__ = ["access_to_wire", "access_from_wire", "without_limits"]


def access_to_wire(access: Access, tenant_weights: dict[str, float] | None = None) -> dict[str, Any]:
    """`access` as JSON-able data: digests in hex, no key in clear."""
    return {"api_keys": [_key_to_wire(k) for k in access.api_keys.keys],
            "metrics_keys": [_key_to_wire(k) for k in access.metrics_keys.keys],
            "binds_tenants": access.binds_tenants, "tenant_header": access.tenant_header,
            "tenant_weights": dict(tenant_weights or {}), "keys_required": access.api_keys.enabled,
            "metrics_key_required": access.metrics_keys.enabled}


def access_from_wire(wire: dict[str, Any], where: str = "this replica") -> tuple[Access, dict[str, float]]:
    """The Access (and the keys file's tenant weights) `access_to_wire` described. Raises
    RuntimeError when keys were required but none arrived: never start open by mistake."""
    api = KeyRing(_key_from_wire(k) for k in wire.get("api_keys") or ())
    metrics = KeyRing(_key_from_wire(k) for k in wire.get("metrics_keys") or ())
    if wire.get("keys_required") and not api.enabled:
        raise RuntimeError(f"{where}: API keys were required but its key ring is empty; refusing to start open")
    if wire.get("metrics_key_required") and not metrics.enabled:
        raise RuntimeError(f"{where}: --metrics-api-key was given but no metrics key arrived; refusing to start")
    access = Access(api, metrics, bool(wire.get("binds_tenants")), str(wire.get("tenant_header") or ""))
    return access, {str(t): float(w) for t, w in (wire.get("tenant_weights") or {}).items()}


def without_limits(wire: dict[str, Any]) -> dict[str, Any]:
    """The same rings with no per-key rate or concurrency limits: what the replicas get when
    the ingress enforces the limits once for the whole deployment."""
    empty = dataclasses.asdict(KeyLimits())
    return {**wire, "api_keys": [{**k, "limits": empty} for k in wire.get("api_keys") or ()]}


def _key_to_wire(key: APIKey) -> dict[str, Any]:
    return {"name": key.name, "digest": key.digest.hex(), "tenant": key.tenant, "gateway": key.gateway,
            "allowed_tenants": None if key.allowed_tenants is None else sorted(key.allowed_tenants),
            "priority_range": None if key.priority_range is None else list(key.priority_range),
            "limits": dataclasses.asdict(key.limits), "tightest_slo": dict(key.tightest_slo),
            "allowed_classes": sorted(key.allowed_classes), "trusted": key.trusted}


def _key_from_wire(d: dict[str, Any]) -> APIKey:
    digest = bytes.fromhex(d["digest"])
    if len(digest) != 32:
        raise ValueError(f"API key {d.get('name')!r}: a SHA-256 digest has 32 bytes, got {len(digest)}")
    allowed, prange = d.get("allowed_tenants"), d.get("priority_range")
    return APIKey(d["name"], digest, d.get("tenant"), bool(d.get("gateway")),
                  None if allowed is None else frozenset(allowed),
                  None if prange is None else (int(prange[0]), int(prange[1])),
                  KeyLimits(**(d.get("limits") or {})), dict(d.get("tightest_slo") or {}),
                  frozenset(d.get("allowed_classes") or ()), bool(d.get("trusted")))
