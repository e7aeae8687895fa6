"""Every choice list, spelled once (validation, the CLI, the scheduler and the model runner read
these), and the small value checks every config part uses; each error names the field and the limit."""

from __future__ import annotations

__all__ = ["SCHEDULING_POLICIES", "KV_CACHE_DTYPES", "PREEMPTION_MODES", "EVICTION_POLICIES",
           "TENANT_ISOLATION_MODES", "SEGMENT_REUSE_MODES", "DTYPES", "positive_int", "non_negative_int", "choice"]

SCHEDULING_POLICIES = ("fcfs", "priority", "sjf", "lpm", "slo", "fair")
KV_CACHE_DTYPES = ("auto", "int8", "fp8", "fp8_e4m3", "fp8_e5m2")
PREEMPTION_MODES = ("recompute", "swap")
EVICTION_POLICIES = ("lru", "weighted-lru", "ttl")
TENANT_ISOLATION_MODES = ("shared", "isolated", "partitioned")
SEGMENT_REUSE_MODES = ("off", "exact", "approximate")
DTYPES = ("float32", "bfloat16", "float16")   # model dtypes; "auto" picks one per device


def positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def non_negative_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
