"""Typed, validated configuration with vLLM-style names.

`EngineConfig.from_kwargs(**kw)` is how `LLM(...)`, the CLI and the server build a config:
unknown keys are an error (never silently dropped), every value is checked with a
message naming the field and the limit. Each component receives only its own part.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pacer.config.slo import SloSet
    from pacer.config.speculative import SpeculativeConfig

__all__ = [
    "SchedulerConfig", "CacheConfig", "ModelConfig", "StructuredOutputsConfig", "EngineConfig", "parse_memory_size",
    "SCHEDULING_POLICIES", "PREEMPTION_MODES", "EVICTION_POLICIES", "TENANT_ISOLATION_MODES", "DTYPES",
    "KV_CACHE_DTYPES",
]

# Every choice list, spelled once: validation here, the CLI, the core and the model runner read these.
SCHEDULING_POLICIES = ("fcfs", "priority", "sjf", "lpm", "slo")
KV_CACHE_DTYPES = ("auto", "int8", "fp8", "fp8_e4m3", "fp8_e5m2")
PREEMPTION_MODES = ("recompute", "swap")
EVICTION_POLICIES = ("lru", "weighted-lru", "ttl")
TENANT_ISOLATION_MODES = ("shared", "isolated", "partitioned")
DTYPES = ("float32", "bfloat16", "float16")   # model dtypes; "auto" picks one per device
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=256, metadata={"help": "Most requests running at once."})
    max_num_batched_tokens: int | None = field(
        default=None,
        metadata={"help": "Token budget of one step (prefill chunks + decode tokens). "
                          f"Default {DEFAULT_MAX_NUM_BATCHED_TOKENS} with chunked prefill, "
                          "max_model_len without."},
    )
    max_model_len: int | None = field(
        default=None, metadata={"help": "Longest prompt+output; default: the model's context length."}
    )
    enable_chunked_prefill: bool = field(
        default=True,
        metadata={"help": "Split long prompts across steps and mix them with decodes (decode-first). "
                          "Off: prompts are prefilled whole, in prefill-only steps."},
    )
    scheduling_policy: str = field(
        default="fcfs",
        metadata={"help": "Waiting-queue order: fcfs | priority | sjf | lpm (longest cached prefix first) | "
                          "slo (least slack first, step budget by the tightest ITL target, preempt the most slack)."}
    )
    max_queue_delay: float | None = field(
        default=None,
        metadata={"help": "Aging: a request waiting longer than this many seconds is served in arrival order "
                          "ahead of the rest, under any policy. Default: off for fcfs and priority, 30 for "
                          "sjf, lpm and slo; 'inf' turns it off."})
    slo: tuple[str, ...] = field(
        default=(),
        metadata={"help": "Latency targets per class, the syntax of `pacer bench --slo`: ttft=300ms,itl=50ms "
                          "(default), rag:ttft=2s, batch:e2e=60s (repeatable). Read by the slo policy, "
                          "/metrics attainment counters and reports."})
    shed_hopeless: bool = field(
        default=False,
        metadata={"help": "slo policy: refuse (HTTP 429 slo_unattainable) a waiting request that can no longer "
                          "meet its TTFT, before it is scheduled, instead of serving it late."})
    allow_tighter_slo: bool = field(
        default=True,
        metadata={"help": "Whether a request's own targets (body `slo`, x-llm-d-slo-* headers) may be tighter "
                          "than its class's (off: they are clamped to the class's)."})
    preemption_mode: str = field(default="recompute", metadata={"help": "recompute | swap."})
    long_prefill_token_threshold: int | None = field(
        default=None,
        metadata={"help": "With chunked prefill: most prompt tokens one request may take in a step, so a "
                          "long prompt leaves budget for short newcomers (vLLM's name; default: no cap)."},
    )
    speculative_config: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Speculative decoding, vLLM's JSON: {\"method\": \"ngram\" | \"suffix\", "
                          "\"num_speculative_tokens\": k, \"prompt_lookup_min\": 5, \"prompt_lookup_max\": 5}. "
                          "Drafts are tokens under the step's budget, verified in the same forward."})
    speculative_policy: str = field(
        default="adaptive",
        metadata={"help": "adaptive (per request and step, 0..k drafts from its acceptance rate and the step's "
                          "marginal token cost: speculation fades as the batch grows) | static (always k: vLLM's)."})

    def validate(self) -> None:
        _positive_int("max_num_seqs", self.max_num_seqs)
        if self.max_num_batched_tokens is not None:
            _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.max_model_len is not None:
            _positive_int("max_model_len", self.max_model_len)
        if self.long_prefill_token_threshold is not None:
            _positive_int("long_prefill_token_threshold", self.long_prefill_token_threshold)
        _choice("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        if self.max_queue_delay is not None and (isinstance(self.max_queue_delay, bool) or not isinstance(
                self.max_queue_delay, int | float) or not self.max_queue_delay > 0):
            raise ValueError(f"max_queue_delay must be > 0 seconds (or inf for off), got {self.max_queue_delay!r}")
        if isinstance(self.slo, str):
            self.slo = (self.slo,)
        self.slo = tuple(self.slo)
        self.slo_set()   # raises ValueError naming the bad key, duration or class
        _choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        from pacer.config.speculative import SPECULATIVE_POLICIES, parse_speculative_config

        parse_speculative_config(self.speculative_config)   # raises naming speculative_config.<key>
        _choice("speculative_policy", self.speculative_policy, SPECULATIVE_POLICIES)
        if not isinstance(self.enable_chunked_prefill, bool):
            raise TypeError(f"enable_chunked_prefill must be a bool, got {self.enable_chunked_prefill!r}")

    def speculative(self) -> SpeculativeConfig | None:
        """The parsed speculative_config (None: speculation off)."""
        from pacer.config.speculative import parse_speculative_config

        return parse_speculative_config(self.speculative_config)

    def slo_set(self) -> SloSet:
        from pacer.config.slo import parse_slo

        return parse_slo(self.slo)

    def resolved(self, model_max_len: int) -> SchedulerConfig:
        """A copy with defaults filled in from the model; checks cross-field limits."""
        max_len = self.max_model_len or model_max_len
        if max_len > model_max_len:
            raise ValueError(
                f"max_model_len={max_len} exceeds the model's context length {model_max_len}"
            )
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = DEFAULT_MAX_NUM_BATCHED_TOKENS if self.enable_chunked_prefill else max_len
            if not self.enable_chunked_prefill:
                budget = max(budget, DEFAULT_MAX_NUM_BATCHED_TOKENS)
        if not self.enable_chunked_prefill and budget < max_len:
            raise ValueError(
                f"max_num_batched_tokens={budget} is smaller than max_model_len={max_len}; without "
                "chunked prefill a whole prompt must fit one step (raise it, lower max_model_len, "
                "or enable chunked prefill)"
            )
        if budget < self.max_num_seqs and self.enable_chunked_prefill:
            budget = max(budget, 1)
        spec = self.speculative()
        if spec is not None:
            spec.check_budget(budget, max_len)
        return dataclasses.replace(self, max_model_len=max_len, max_num_batched_tokens=budget)


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

    def validate(self) -> None:
        _positive_int("block_size", self.block_size)
        if self.num_cpu_blocks is not None:
            _non_negative_int("num_cpu_blocks", self.num_cpu_blocks)
        _choice("eviction_policy", self.eviction_policy, EVICTION_POLICIES)
        _choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        if not isinstance(self.calculate_kv_scales, bool):
            raise TypeError(f"calculate_kv_scales must be a bool, got {self.calculate_kv_scales!r}")
        _choice("tenant_isolation", self.tenant_isolation, TENANT_ISOLATION_MODES)
        if not isinstance(self.enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        if self.cache_ttl is not None:
            if isinstance(self.cache_ttl, bool) or not isinstance(self.cache_ttl, int | float) or self.cache_ttl <= 0:
                raise ValueError(f"cache_ttl must be > 0 seconds, got {self.cache_ttl!r}")
        self._validate_tenants()
        if self.num_kv_blocks is not None:
            _positive_int("num_kv_blocks", self.num_kv_blocks)
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
        if not isinstance(self.swap_space, int | float) or self.swap_space < 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {self.swap_space!r}")

    def _validate_tenants(self) -> None:
        for name, value in (("tenant_weights", self.tenant_weights), ("tenant_quotas", self.tenant_quotas)):
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"{name} must be a dict of tenant -> number, got {value!r}")
        for tenant, w in (self.tenant_weights or {}).items():
            if isinstance(w, bool) or not isinstance(w, int | float) or w <= 0:
                raise ValueError(f"tenant_weights[{tenant!r}] must be a number > 0, got {w!r}")
        for tenant, q in (self.tenant_quotas or {}).items():
            _non_negative_int(f"tenant_quotas[{tenant!r}]", q)
        if self.tenant_weights and self.eviction_policy != "weighted-lru":
            raise ValueError("tenant_weights apply only with eviction_policy='weighted-lru'")
        if self.tenant_quotas and self.tenant_isolation != "partitioned":
            raise ValueError("tenant_quotas apply only with tenant_isolation='partitioned'")

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


@dataclass(slots=True)
class ModelConfig:
    model: str | None = field(default=None, metadata={"help": "HF directory or .gguf file; default SmolLM2-135M-Instruct."})
    dtype: str = field(default="auto", metadata={"help": "float32 | bfloat16 | float16 | auto (float32 on CPU)."})
    device: str = field(default="cpu", metadata={"help": "cpu | cuda | cuda:N."})
    seed: int = field(default=0, metadata={"help": "Seed of the engine's sampler for unseeded requests."})
    num_threads: int | None = field(default=None, metadata={"help": "torch intra-op threads (CPU)."})
    attention_backend: str = field(
        default="auto",
        metadata={"help": "auto | cpp | torch: the C++ kernels (paged decode and prefill attention, fused "
                          "rope + KV write, silu_and_mul, add + RMSNorm; compiled on first use) or the torch "
                          "reference path."},
    )
    linear_backend: str = field(
        default="auto",
        metadata={"help": "auto | onednn | torch: projections through oneDNN with weights packed once "
                          "(auto on CPU when torch has it) or plain F.linear."},
    )

    def validate(self) -> None:
        _choice("dtype", self.dtype, ("auto", *DTYPES))
        if not (self.device == "cpu" or re.fullmatch(r"cuda(:\d+)?", self.device)):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.num_threads is not None:
            _positive_int("num_threads", self.num_threads)
        _choice("attention_backend", self.attention_backend, ("auto", "cpp", "torch"))
        _choice("linear_backend", self.linear_backend, ("auto", "onednn", "torch"))


@dataclass(slots=True)
class StructuredOutputsConfig:
    structured_outputs_timeout: float = field(
        default=5.0,
        metadata={"help": "Seconds a grammar (JSON schema, regex, choice, Lark) may take to compile on the "
                          "grammar worker; past it that request alone fails with a 400 and the worker is killed."},
    )
    structured_outputs_workers: int = field(
        default=2, metadata={"help": "Grammar worker processes (compiles run in parallel, off the step loop)."}
    )

    def validate(self) -> None:
        t = self.structured_outputs_timeout
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < float("inf"):
            raise ValueError(f"structured_outputs_timeout must be a number of seconds > 0, got {t!r}")
        _positive_int("structured_outputs_workers", self.structured_outputs_workers)


_PARTS = (("model", ModelConfig), ("scheduler", SchedulerConfig), ("cache", CacheConfig),
          ("structured", StructuredOutputsConfig))


@dataclass(slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    structured: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Build from flat vLLM-style keyword arguments; unknown names raise TypeError."""
        parts: dict[str, dict[str, Any]] = {part: {} for part, _ in _PARTS}
        owners = {f.name: part for part, klass in _PARTS for f in dataclasses.fields(klass)}
        for key, value in kwargs.items():
            if key not in owners:
                raise TypeError(f"unknown engine option {key!r}; known options: {', '.join(sorted(owners))}")
            parts[owners[key]][key] = value
        cfg = cls(ModelConfig(**parts["model"]), SchedulerConfig(**parts["scheduler"]), CacheConfig(**parts["cache"]),
                  StructuredOutputsConfig(**parts["structured"]))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        self.model.validate()
        self.scheduler.validate()
        self.cache.validate()
        self.structured.validate()


def option_names() -> list[str]:
    return [f.name for _, klass in _PARTS for f in dataclasses.fields(klass)]


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


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _non_negative_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
