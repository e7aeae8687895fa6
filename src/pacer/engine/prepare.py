"""What the engine checks of a request before it queues it (on the caller's thread): the
prompt's token ids, the arguments' types and values, and the request's SLO class and targets.
Plain functions over plain values: `Engine.add_request` calls them; errors name the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pacer.config.slo import ClassRules, Slo, SloSet, canonical_class, slo_from_request
from pacer.request import SamplingParams

__all__ = ["tokenize_prompt", "check_request_args", "resolve_slo"]


def tokenize_prompt(prompt: str | Sequence[int], tokenizer: Any | None, vocab_size: int | None) -> list[int]:
    """The prompt's token ids: text through `tokenizer`, or ids checked against the vocabulary."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt must not be empty")
        if tokenizer is None:
            raise ValueError("prompt: this model has no tokenizer; pass token ids")
        ids: list[int] = tokenizer.encode(prompt)
    else:
        ids = list(prompt)
        # set(map(type)) / min / max run in C: the per-token check was ~10% of a simulation
        if set(map(type, ids)) - {int} and any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
            raise TypeError("prompt token ids must be integers")
        if vocab_size is not None and ids and (min(ids) < 0 or max(ids) >= vocab_size):
            raise ValueError(f"prompt token ids must be in [0, {vocab_size})")
    if not ids:
        raise ValueError("prompt must not be empty (0 tokens)")
    return ids


def check_request_args(params: SamplingParams | None, priority: int, tenant: str,
                       cache_salt: str | None) -> SamplingParams:
    """Raises TypeError / ValueError naming the bad argument; returns the params (default ones for None)."""
    params = params or SamplingParams()
    if not isinstance(params, SamplingParams):
        raise TypeError(f"sampling_params must be SamplingParams, got {type(params).__name__}")
    if params.n != 1:
        raise ValueError(f"n must be 1 for Engine.add_request (one sequence per request), got n={params.n}; "
                         f"LLM.generate and the server expand n > 1 into n requests")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an integer, got {priority!r}")
    if not isinstance(tenant, str) or not tenant:
        raise ValueError(f"tenant must be a non-empty string, got {tenant!r}")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise ValueError(f"cache_salt must be a non-empty string, got {cache_salt!r}")
    return params


def resolve_slo(rules: ClassRules, slos: SloSet, allow_tighter: bool, num_prompt_tokens: int, max_tokens: int,
                request_class: str | None, slo: Slo | Mapping[str, Any] | None) -> tuple[str, Slo]:
    """(class, targets): the class (given, or classified by `rules` from the lengths) and its
    targets from `slos` with the request's own on top."""
    if request_class is None:
        rclass = rules.classify(num_prompt_tokens, max_tokens, False)
    elif isinstance(request_class, str) and request_class:
        rclass = canonical_class(request_class)
    else:
        raise ValueError(f"request_class must be a non-empty string, got {request_class!r}")
    own = slo if isinstance(slo, Slo) else slo_from_request(slo)
    return rclass, slos.for_class(rclass).merged(own, allow_tighter)
