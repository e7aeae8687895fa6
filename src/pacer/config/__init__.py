"""Typed, validated configuration with vLLM-style names.

`EngineConfig.from_kwargs(**kw)` is how `LLM(...)`, the CLI and the server build a config:
unknown keys are an error (never silently dropped), every value is checked with a
message naming the field and the limit. Each component receives only its own part.

Parts: `pacer.config.engine` (EngineConfig, ModelConfig, StructuredOutputsConfig),
`pacer.config.scheduler`, `pacer.config.cache`; the choice lists and value checks in
`pacer.config.checks`; SLO targets (`slo`), speculative decoding (`speculative`) and the command-line
flags made from these dataclasses (`args`).
"""

from pacer.config.cache import CacheConfig, parse_memory_size
from pacer.config.checks import (
    DTYPES,
    EVICTION_POLICIES,
    KV_CACHE_DTYPES,
    PREEMPTION_MODES,
    SCHEDULING_POLICIES,
    TENANT_ISOLATION_MODES,
)
from pacer.config.engine import EngineConfig, ModelConfig, StructuredOutputsConfig, option_names
from pacer.config.scheduler import DEFAULT_MAX_NUM_BATCHED_TOKENS, SchedulerConfig

__all__ = [
    "SchedulerConfig", "CacheConfig", "ModelConfig", "StructuredOutputsConfig", "EngineConfig", "parse_memory_size",
    "SCHEDULING_POLICIES", "PREEMPTION_MODES", "EVICTION_POLICIES", "TENANT_ISOLATION_MODES", "DTYPES",
    "KV_CACHE_DTYPES", "DEFAULT_MAX_NUM_BATCHED_TOKENS", "option_names",
]
