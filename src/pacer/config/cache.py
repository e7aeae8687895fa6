"""The KV cache's part of the engine config: blocks and their budget, KV dtype, prefix caching,
eviction, tenants, and the host / disk / swap tiers (vLLM's names)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pacer.config.checks import (
    EVICTION_POLICIES,
    KV_CACHE_DTYPES,
    SEGMENT_REUSE_MODES,
    TENANT_ISOLATION_MODES,
    choice,
    non_negative_int,
    positive_int,
)

__all__ = ["CacheConfig", "parse_memory_size", "parse_segment_recompute"]


def parse_segment_recompute(value: object) -> float | str:
    """`segment_recompute`: "auto" or a fraction in [0, 1] (a number or its text)."""
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"segment_recompute must be a fraction in [0, 1] or 'auto', got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"segment_recompute must be a fraction in [0, 1] or 'auto', got {value!r}")
    return float(value)


@dataclass(slots=True)
class CacheConfig:
    block_size: int = field(default=16, metadata={"help": "Tokens per KV block."})
    num_kv_blocks: int | None = field(default=None, metadata={"help": "KV budget as a block count."})
    kv_cache_memory: int | str | None = field(
        default=None, metadata={"help": "KV budget in bytes or as '2GiB' (default 1GiB when num_kv_blocks is unset)."}
    )
    kv_cache_dtype: str = field(
        default="auto",
        metadata={"help": "KV storage: auto (the model's dtype) | int8 (a float16 scale per token and kv head) | "
                          "fp8 = fp8_e4m3 | fp8_e5m2 (one scale per layer: 1.0, or calibrated with "
                          "calculate_kv_scales). Quantised on write, dequantised in the attention kernels."})
    calculate_kv_scales: bool = field(
        default=False,
        metadata={"help": "fp8 KV: per-layer K/V scales from a warm-up pass over shipped text "
                          "(max |x| / fp8 max) instead of 1.0."})
    enable_prefix_caching: bool = field(default=True, metadata={"help": "Reuse cached prompt prefixes."})
    swap_space: float = field(default=4.0, metadata={"help": "CPU swap tier for preemption_mode=swap, GiB."})
    kv_offloading_size: float | None = field(
        default=None,
        metadata={"help": "Host KV tier, GiB (vLLM's --kv-offloading-size): blocks the prefix cache evicts are "
                          "demoted here and promoted back on a later match; swap preemption shares it "
                          "(then swap_space is unused; num_cpu_blocks, when set, sizes it in blocks)."})
    num_cpu_blocks: int | None = field(
        default=None, metadata={"help": "CPU swap tier as a block count (overrides swap_space)."})
    kv_offloading_dir: str | None = field(
        default=None,
        metadata={"help": "Disk KV tier directory (needs kv_offloading_size): blocks demoted to the host tier are "
                          "written here, and at a graceful shutdown the cached blocks of the faster tiers too; a "
                          "restarted engine reads them back (files of another model or KV dtype are refused)."})
    kv_offloading_dir_size: int | str | None = field(
        default=None,
        metadata={"help": "Byte cap of the disk KV tier, in bytes or as '2GiB': past it the least recently used "
                          "block files are deleted (default: no cap; a full disk only pauses the tier)."})
    kv_offloading_dir_key_file: str | None = field(
        default=None,
        metadata={"help": "A file holding a secret: disk KV block files carry an HMAC-SHA256 under it and files "
                          "without a valid one (planted, or another key's) are refused."})
    eviction_policy: str = field(
        default="lru",
        metadata={"help": "Prefix-cache eviction: lru | weighted-lru (per-tenant tenant_weights) | ttl "
                          "(lru, and nodes idle longer than cache_ttl are dropped; default 1800 s)."})
    tenant_isolation: str = field(
        default="shared",
        metadata={"help": "shared (one cache for all tenants) | isolated (a tenant matches only its own "
                          "and public prefixes) | partitioned (isolated + hard per-tenant tenant_quotas)."})
    tenant_weights: dict[str, float] | None = field(
        default=None,
        metadata={"help": "weighted-lru weights, e.g. 'gold=4,free=1' (default 1): a weight-w tenant's "
                          "prefixes outlive ~w-1 turnovers of weight-1 churn."})
    tenant_quotas: dict[str, int] | None = field(
        default=None,
        metadata={"help": "partitioned: most cached blocks per tenant, e.g. 'a=512,b=256,*=128' ('*': "
                          "all unlisted tenants together; default 0 = they cache nothing)."})
    cache_ttl: float | None = field(
        default=None, metadata={"help": "Drop prefix-cache nodes idle longer than this many seconds (any policy)."})
    queue_aware_eviction: bool = field(
        default=True,
        metadata={"help": "A waiting request's prefix look-up (the lpm and slo policies order the queue by it) "
                          "counts as a use of the matched blocks, so eviction keeps what the queue will read."})
    segment_reuse: str = field(
        default="off",
        metadata={"help": "Cross-request segment reuse (pacer.kv.segment_store): off | exact (prefix caching and "
                          "exact in-flight dedup only) | approximate (a prompt segment, e.g. a tool output, reuses "
                          "the stored KV of the same tokens at another position: K re-rotated, the first tokens "
                          "recomputed; not bit-identical to full prefill)."})
    segment_recompute: float | str = field(
        default="auto",
        metadata={"help": "approximate segment reuse: the floor of each reused segment recomputed from its start "
                          "with the real context (0..1), or auto (0.05); the slo policy recomputes up to 0.3 of it where "
                          "a request's TTFT slack allows (see docs/features/segment-reuse.md)."})
    session_retention: bool = field(
        default=True,
        metadata={"help": "Agent sessions: a finished turn of a named session (x-session-id) keeps its "
                          "conversation's KV as an eviction tier until its next turn, its window's end or a release."})
    session_retention_ttl: float = field(
        default=30.0, metadata={"help": "Retention window before a session's tool time is learned, seconds."})
    session_retention_max_ttl: float = field(
        default=300.0, metadata={"help": "Longest retention window (learned or kv_retention.ttl_s hint), seconds."})
    session_retention_max_blocks: int | None = field(
        default=None, metadata={"help": "Operator cap on blocks under retention windows (default: no cap)."})

    def validate(self) -> None:
        positive_int("block_size", self.block_size)
        if self.num_cpu_blocks is not None:
            non_negative_int("num_cpu_blocks", self.num_cpu_blocks)
        choice("eviction_policy", self.eviction_policy, EVICTION_POLICIES)
        choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        if not isinstance(self.calculate_kv_scales, bool):
            raise TypeError(f"calculate_kv_scales must be a bool, got {self.calculate_kv_scales!r}")
        choice("tenant_isolation", self.tenant_isolation, TENANT_ISOLATION_MODES)
        if not isinstance(self.enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        if self.cache_ttl is not None:
            if isinstance(self.cache_ttl, bool) or not isinstance(self.cache_ttl, int | float) or self.cache_ttl <= 0:
                raise ValueError(f"cache_ttl must be > 0 seconds, got {self.cache_ttl!r}")
        self._validate_tenants()
        self._validate_retention()
        self._validate_segments()
        if self.num_kv_blocks is not None:
            positive_int("num_kv_blocks", self.num_kv_blocks)
        if self.kv_cache_memory is not None:
            parse_memory_size(self.kv_cache_memory, "kv_cache_memory")
        if self.num_kv_blocks is not None and self.kv_cache_memory is not None:
            raise ValueError("give either num_kv_blocks or kv_cache_memory, not both")
        if self.kv_offloading_size is not None and (
                isinstance(self.kv_offloading_size, bool) or not isinstance(self.kv_offloading_size, int | float)
                or self.kv_offloading_size < 0):
            raise ValueError(f"kv_offloading_size must be >= 0 GiB, got {self.kv_offloading_size!r}")
        if self.kv_offloading_dir is not None and (not self.kv_offloading_size or not self.enable_prefix_caching):
            raise ValueError("kv_offloading_dir needs kv_offloading_size > 0 (the host tier) and prefix caching")
        if self.kv_offloading_dir_size is not None:
            parse_memory_size(self.kv_offloading_dir_size, "kv_offloading_dir_size")
        for name in ("kv_offloading_dir_size", "kv_offloading_dir_key_file"):
            if getattr(self, name) is not None and self.kv_offloading_dir is None:
                raise ValueError(f"{name} needs kv_offloading_dir (the disk KV tier)")
        if not isinstance(self.swap_space, int | float) or self.swap_space < 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {self.swap_space!r}")

    def _validate_segments(self) -> None:
        choice("segment_reuse", self.segment_reuse, SEGMENT_REUSE_MODES)
        self.segment_recompute = parse_segment_recompute(self.segment_recompute)
        if self.segment_reuse == "approximate" and self.tenant_isolation == "partitioned":
            raise ValueError("segment_reuse='approximate' does not support tenant_isolation='partitioned' yet "
                             "(the segment store has no per-tenant quota)")

    def _validate_retention(self) -> None:
        if not isinstance(self.session_retention, bool):
            raise TypeError(f"session_retention must be a bool, got {self.session_retention!r}")
        for name in ("session_retention_ttl", "session_retention_max_ttl"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise ValueError(f"{name} must be > 0 seconds, got {v!r}")
        if self.session_retention_max_blocks is not None:
            non_negative_int("session_retention_max_blocks", self.session_retention_max_blocks)

    def _validate_tenants(self) -> None:
        for name, value in (("tenant_weights", self.tenant_weights), ("tenant_quotas", self.tenant_quotas)):
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"{name} must be a dict of tenant -> number, got {value!r}")
        for tenant, w in (self.tenant_weights or {}).items():
            if isinstance(w, bool) or not isinstance(w, int | float) or w <= 0:
                raise ValueError(f"tenant_weights[{tenant!r}] must be a number > 0, got {w!r}")
        for tenant, q in (self.tenant_quotas or {}).items():
            non_negative_int(f"tenant_quotas[{tenant!r}]", q)
        if self.tenant_weights and self.eviction_policy != "weighted-lru":
            raise ValueError("tenant_weights apply only with eviction_policy='weighted-lru'")
        if self.tenant_quotas and self.tenant_isolation != "partitioned":
            raise ValueError("tenant_quotas apply only with tenant_isolation='partitioned'")

    def resolved_ttl(self) -> float | None:
        """Seconds an unused cached block (a prefix node, a stored segment) may stay: `cache_ttl`,
        else 30 minutes under the ttl eviction policy, else None (no expiry)."""
        if self.cache_ttl is None and self.eviction_policy == "ttl":
            return 1800.0
        return self.cache_ttl

    def resolve_num_blocks(self, bytes_per_token: int) -> int:
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        mem = parse_memory_size(self.kv_cache_memory if self.kv_cache_memory is not None else "1GiB",
                                "kv_cache_memory")
        n = mem // (bytes_per_token * self.block_size)
        if n < 1:
            raise ValueError(
                f"kv_cache_memory={self.kv_cache_memory!r} holds no block of {self.block_size} tokens "
                f"({bytes_per_token * self.block_size} bytes each)"
            )
        return int(n)


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_memory_size(value: int | float | str, name: str = "memory") -> int:
    """'2GiB', '512MiB', '1.5GB' or a byte count -> bytes."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a size such as '2GiB' or a byte count, got {value!r}")
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError(f"{name} must be > 0 bytes, got {value}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{name} must be a size such as '2GiB', '512MiB' or a byte count, got {value!r}")
    size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if size <= 0:
        raise ValueError(f"{name} must be > 0 bytes, got {value!r}")
    return size
