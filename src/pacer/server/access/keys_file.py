"""`--api-keys FILE` (YAML or JSON): named keys, stored in clear or as their SHA-256, each
bound to a tenant (or a gateway), a priority range, rate limits, a concurrency cap, the
tightest SLO targets and the request classes it may declare. Every error names the key and
the field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pacer.config.slo import REQUEST_CLASSES, SLO_KEYS, canonical_class
from pacer.server.access.keys import APIKey, KeyRing, hash_key
from pacer.server.access.rate_limit import KeyLimits

__all__ = ["KeysFile", "load_keys_file"]

_KEY_FIELDS = {"name", "key", "key_sha256", "tenant", "gateway", "allowed_tenants", "priority",
               "requests_per_minute", "tokens_per_minute", "max_concurrent", "burst_requests", "burst_tokens",
               "tightest_slo", "allowed_classes", "max_kv_retention_s"}


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
    unknown_targets = set(slo) - set(SLO_KEYS)
    if unknown_targets:
        raise ValueError(f"{where}: tightest_slo names {sorted(unknown_targets)}; known: {', '.join(SLO_KEYS)}")
    return APIKey(name, _digest(entry, where), tenant or None, gateway,
                  None if allowed is None else frozenset(allowed), _priority_range(entry.get("priority"), where),
                  limits, {str(k): float(v) for k, v in slo.items()}, _classes(entry.get("allowed_classes"), where),
                  max_kv_retention_s=_opt_positive(entry, "max_kv_retention_s", where))


def _classes(value: Any, where: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    names = [canonical_class(v) if isinstance(v, str) else v for v in value] if isinstance(value, list) else None
    if names is None or not all(n in REQUEST_CLASSES for n in names):
        raise ValueError(f"{where}: allowed_classes must be a list of request classes ({', '.join(REQUEST_CLASSES)}), "
                         f"got {value!r}")
    return frozenset(names)


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
