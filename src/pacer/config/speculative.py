"""Speculative decoding settings with vLLM's names, parsed and checked. Pure Python.

`speculative_config={"method": "ngram" | "suffix", "num_speculative_tokens": k,
"prompt_lookup_min": .., "prompt_lookup_max": ..}` as vLLM spells it (a dict, or its JSON on
the command line: `--speculative-config JSON`). Unknown keys are an error; every message
names the key (`speculative_config.num_speculative_tokens`) and the limit. The lookup window
defaults follow vLLM: both unset -> 5..5; one set -> the other takes its value.

`speculative_policy` is pacer's: `adaptive` (per request, per step, d in 0..k from the
request's acceptance rate and the step's marginal token cost) or `static` (always k when a
draft exists: vLLM's behaviour).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SpeculativeConfig", "parse_speculative_config", "SPECULATIVE_METHODS", "SPECULATIVE_POLICIES"]

SPECULATIVE_METHODS = ("ngram", "suffix")
SPECULATIVE_POLICIES = ("adaptive", "static")
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
         "suffix_max_cached_requests", "acceptance_rate")
_DEFAULT_LOOKUP = 5


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = _DEFAULT_LOOKUP
    prompt_lookup_max: int = _DEFAULT_LOOKUP
    suffix_max_cached_requests: int = 64   # suffix: recent outputs kept per tenant (vLLM's name)
    # the simulator's acceptance model: each draft holds with this probability given that the ones
    # before it held (the per-token rate `pacer bench` reports beside vLLM's acceptance rate);
    # None: the simulator's default
    acceptance_rate: float | None = None

    @property
    def k(self) -> int:
        return self.num_speculative_tokens

    def check_budget(self, max_num_batched_tokens: int, max_model_len: int) -> None:
        """A decode with k drafts (1 + k tokens) must fit one step and the context."""
        limit = min(max_num_batched_tokens, max_model_len) - 1
        if self.k > limit:
            which = "max_num_batched_tokens" if max_num_batched_tokens <= max_model_len else "max_model_len"
            raise ValueError(
                f"speculative_config.num_speculative_tokens={self.k} is larger than the budget allows: a decode "
                f"with its drafts takes 1 + k tokens, and {which}={min(max_num_batched_tokens, max_model_len)} "
                f"leaves room for at most {limit}")


def _int_key(raw: Mapping[str, Any], key: str, low: int) -> int | None:
    v = raw.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"speculative_config.{key} must be an integer, got {type(v).__name__} {v!r}")
    if v < low:
        raise ValueError(f"speculative_config.{key} must be >= {low}, got {v}")
    return v


def parse_speculative_config(value: SpeculativeConfig | Mapping[str, Any] | str | None) -> SpeculativeConfig | None:
    """A dict (or its JSON text, or None: speculation off) -> a checked SpeculativeConfig."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"speculative_config must be a JSON object, e.g. "
                             f"'{{\"method\": \"ngram\", \"num_speculative_tokens\": 4}}': {e}") from None
    if not isinstance(value, Mapping):
        raise TypeError(f"speculative_config must be a dict (JSON object), got {type(value).__name__}")
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise ValueError(f"speculative_config: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(_KEYS)}")
    method = value.get("method")
    if method not in SPECULATIVE_METHODS:
        raise ValueError(f"speculative_config.method must be one of {', '.join(SPECULATIVE_METHODS)} "
                         f"(draft-model-free methods); got {method!r}")
    k = _int_key(value, "num_speculative_tokens", 1)
    if k is None:
        raise ValueError("speculative_config.num_speculative_tokens is required (k >= 1 drafts per step)")
    lo = _int_key(value, "prompt_lookup_min", 1)
    hi = _int_key(value, "prompt_lookup_max", 1)
    lo = lo if lo is not None else hi if hi is not None else _DEFAULT_LOOKUP
    hi = hi if hi is not None else lo
    if lo > hi:
        raise ValueError(f"speculative_config.prompt_lookup_min={lo} is larger than prompt_lookup_max={hi}")
    cached = _int_key(value, "suffix_max_cached_requests", 0)
    rate = value.get("acceptance_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1):
        raise ValueError(f"speculative_config.acceptance_rate must be a probability in [0, 1], got {rate!r}")
    return SpeculativeConfig(method, k, lo, hi, 64 if cached is None else cached,
                             None if rate is None else float(rate))
