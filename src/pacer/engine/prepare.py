"""One `prepare` of a request, before it is queued (on the caller's thread): the prompt tokenized
once, the arguments checked once, fitted once against max_model_len and the KV cache, and its SLO
class and targets resolved once. The offline API (`LLM.generate`) and the server call it through
`Engine.prepare`; `Engine.add_request` queues what it returns. Errors are `pacer.errors`
`FieldError`s naming the field at fault, so an API maps them by type.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pacer.config.engine import REASONING_PARSERS
from pacer.config.slo import ClassRules, Slo, SloSet, canonical_class, slo_from_request
from pacer.engine.segment_spans import check_segment_reuse, check_segments
from pacer.errors import FieldTypeError, FieldValueError
from pacer.kv.retention import parse_retention_hint
from pacer.request import SamplingParams, check_context_length
from pacer.sched.reasoning import ThinkTags

__all__ = ["PreparedRequest", "PrepareContext", "prepare", "tokenize_prompt", "check_reasoning", "think_tags"]

log = logging.getLogger("pacer.engine")


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request that passed every check: what `Engine.add_request` queues."""

    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    tenant: str = "default"
    request_class: str = "chat"
    slo: Slo = Slo()                # its class's targets with its own on top
    cache_salt: str | None = None
    prompt_text: str | None = None  # the prompt as text, when it came as text
    session: str | None = None      # agent session and its kv_retention hint (`check_session`)
    retention_ttl: float | None = None
    retention_release: bool = False
    segments: tuple[tuple[int, int], ...] = ()   # prompt spans (start, length) for segment reuse (`check_segments`)
    segment_reuse: str | None = None   # the request's own: None (the engine's mode) | "off" (`check_segment_reuse`)

    @property
    def num_tokens(self) -> int:
        """The most tokens it may hold: prompt plus max_tokens (what a key's token limits charge)."""
        return len(self.prompt_token_ids) + self.params.max_tokens


@dataclass(frozen=True, slots=True)
class PrepareContext:
    """What preparing needs of the engine (its tokenizer and limits, its SLO configuration)."""

    tokenizer: Any | None
    vocab_size: int | None
    max_model_len: int
    kv_capacity_tokens: int
    class_rules: ClassRules
    slo_set: SloSet
    allow_tighter_slo: bool
    segment_reuse: str = "off"   # the engine's mode (CacheConfig.segment_reuse)


def tokenize_prompt(prompt: str | Sequence[int], tokenizer: Any | None, vocab_size: int | None,
                    field: str = "prompt") -> list[int]:
    """The prompt's token ids: text through `tokenizer`, or ids checked against the vocabulary."""
    if isinstance(prompt, str):
        if not prompt:
            raise FieldValueError(field, f"{field} must not be empty")
        if tokenizer is None:
            raise FieldValueError(field, f"{field}: this model has no tokenizer; pass token ids")
        ids: list[int] = tokenizer.encode(prompt)
    else:
        ids = list(prompt)
        # set(map(type)) / min / max run in C: the per-token check was ~10% of a simulation
        if set(map(type, ids)) - {int} and any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
            raise FieldTypeError(field, f"{field} token ids must be integers")
        if vocab_size is not None and ids and (min(ids) < 0 or max(ids) >= vocab_size):
            raise FieldValueError(field, f"{field} token ids must be in [0, {vocab_size})")
    if not ids:
        raise FieldValueError(field, f"{field} must not be empty (0 tokens)")
    return ids


def prepare(ctx: PrepareContext, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
            priority: int = 0, tenant: str = "default", request_class: str | None = None,
            slo: Slo | Mapping[str, Any] | None = None, cache_salt: str | None = None,
            field: str = "prompt", segments: Sequence[Sequence[int]] | None = None,
            segment_reuse: str | None = None) -> PreparedRequest:
    """Check and resolve one request. `request_class` (chat | rag | agent | batch, or any name)
    picks its class's targets (unset: `ctx.class_rules` classifies by lengths); `slo` adds the
    request's own targets on top (default: `params.slo`); `field` names the prompt in errors
    (`messages` for a chat request); `segments`: reusable prompt spans, none if `segment_reuse` is "off"."""
    params = _check_args(params, priority, tenant, cache_salt)
    reuse = check_segment_reuse(segment_reuse, ctx.segment_reuse)
    ids = tokenize_prompt(prompt, ctx.tokenizer, ctx.vocab_size, field)
    spans = check_segments(segments, len(ids)) if reuse != "off" else ()
    if params.truncate_prompt_tokens is not None:   # vLLM's: keep the prompt's last k tokens
        keep = ctx.max_model_len if params.truncate_prompt_tokens == -1 else params.truncate_prompt_tokens
        if len(ids) > keep:
            spans = tuple((s - len(ids) + keep, n) for s, n in spans if s >= len(ids) - keep)
            ids, prompt = ids[-keep:], list(ids[-keep:])
    params = _resolve_token_fields(params, ctx.tokenizer, ctx.vocab_size)
    check_context_length(len(ids), params.max_tokens, ctx.max_model_len, ctx.kv_capacity_tokens, field)
    rclass = _resolve_class(ctx.class_rules, len(ids), params.max_tokens, request_class)
    own = params.slo if slo is None else slo
    own_slo = own if isinstance(own, Slo) else slo_from_request(own)
    targets = ctx.slo_set.for_class(rclass).merged(own_slo, ctx.allow_tighter_slo)
    return PreparedRequest(ids, params, priority, tenant, rclass, targets, cache_salt,
                           prompt if isinstance(prompt, str) else None, segments=spans, segment_reuse=reuse)


def _check_args(params: SamplingParams | None, priority: int, tenant: str, cache_salt: str | None) -> SamplingParams:
    """Raises FieldTypeError / FieldValueError naming the bad argument; returns the params
    (default ones for None)."""
    params = params or SamplingParams()
    if not isinstance(params, SamplingParams):
        raise FieldTypeError("sampling_params", f"sampling_params must be SamplingParams, got {type(params).__name__}")
    if params.n != 1:
        raise FieldValueError("n", f"n must be 1 for Engine.add_request (one sequence per request), got "
                                   f"n={params.n}; LLM.generate and the server expand n > 1 into n requests")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise FieldTypeError("priority", f"priority must be an integer, got {priority!r}")
    if not isinstance(tenant, str) or not tenant:
        raise FieldValueError("tenant", f"tenant must be a non-empty string, got {tenant!r}")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise FieldValueError("cache_salt", f"cache_salt must be a non-empty string, got {cache_salt!r}")
    return params


MAX_SESSION_ID_LEN = 256


def check_session(session: str | None, kv_retention: Mapping[str, Any] | None,
                  max_ttl: float) -> tuple[float | None, bool]:
    """An agent session id and its `kv_retention` hint -> (ttl seconds or None, release);
    raises a FieldValueError naming the field and the limit."""
    if session is not None and (not isinstance(session, str) or not session or len(session) > MAX_SESSION_ID_LEN):
        raise FieldValueError("session", f"session must be a non-empty string of at most {MAX_SESSION_ID_LEN} "
                                         f"characters, got {session!r:.80}")
    try:
        ttl, release = parse_retention_hint(kv_retention, max_ttl)
    except ValueError as e:
        raise FieldValueError("kv_retention", str(e)) from None
    if kv_retention is not None and session is None:
        raise FieldValueError("kv_retention", "kv_retention needs a session (x-session-id header or session field)")
    return ttl, release


def _resolve_class(rules: ClassRules, num_prompt_tokens: int, max_tokens: int, request_class: str | None) -> str:
    """The class given, or the one `rules` classifies the lengths into."""
    if request_class is None:
        return rules.classify(num_prompt_tokens, max_tokens, False)
    if isinstance(request_class, str) and request_class:
        return canonical_class(request_class)
    raise FieldValueError("request_class", f"request_class must be a non-empty string, got {request_class!r}")


def _resolve_token_fields(params: SamplingParams, tokenizer: Any, vocab_size: int | None) -> SamplingParams:
    """Checks `allowed_token_ids` and `logit_bias` ids against the vocabulary, and tokenizes
    `bad_words` (each with and without a leading space, as vLLM) into `bad_words_token_ids`."""
    if vocab_size is not None:
        for name, ids in (("allowed_token_ids", params.allowed_token_ids or ()),
                          ("logit_bias", [t for t, _ in params.logit_bias_pairs])):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise FieldValueError(name, f"{name} token ids must be < the vocabulary size {vocab_size}, got {bad[0]}")
    if not params.bad_words or params.bad_words_token_ids:
        return params
    if tokenizer is None:
        raise FieldValueError("bad_words", "bad_words needs the model's tokenizer")
    words: list[tuple[int, ...]] = []
    for word in params.bad_words:
        for variant in (word, " " + word.lstrip()):
            ids = tuple(tokenizer.encode(variant))
            if ids and ids not in words:
                words.append(ids)
    return dataclasses.replace(params, bad_words_token_ids=tuple(words))


def check_reasoning(params: SamplingParams, knows_tags: bool) -> None:
    """`thinking_token_budget` needs to know where thinking ends: the engine's reasoning tags."""
    if params.thinking_token_budget is not None and not knows_tags:
        raise FieldValueError("thinking_token_budget", "thinking_token_budget needs a reasoning model: start the "
                                                       "server with --reasoning-parser (qwen3 or deepseek_r1)")


def think_tags(reasoning_parser: str, tokenizer: Any | None) -> ThinkTags:
    """The token ids of `reasoning_parser`'s start and end tags in this model's vocabulary."""
    start, end, _ = REASONING_PARSERS[reasoning_parser]
    if tokenizer is None:
        raise ValueError(f"reasoning_parser={reasoning_parser!r} needs the model's tokenizer")
    ids = [tuple(tokenizer.hf.encode(tag, add_special_tokens=False)) for tag in (start, end)]
    if any(len(t) != 1 for t in ids):
        log.warning("reasoning tags %s / %s are not single tokens in this vocabulary (%s)", start, end, ids)
    return ThinkTags(ids[0], ids[1])
