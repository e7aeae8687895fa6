"""Sampling parameters, as vLLM's `SamplingParams` (and `StructuredOutputsParams`): plain
Python, validated on construction (errors name the field and the limit). `pacer.request`
re-exports them beside the `Request` they belong to.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pacer.errors import FieldTypeError, FieldValueError
from pacer.structural_tag import normalize_structural_tag

if TYPE_CHECKING:
    from pacer.config.slo import Slo

__all__ = ["SamplingParams", "StructuredOutputsParams", "MAX_LOGPROBS", "sample_seed"]

MAX_LOGPROBS = 20   # most top logprobs per token a request may ask for (vLLM's default max_logprobs)
_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """Constrain a request's output, as vLLM's `StructuredOutputsParams`: exactly one of
    `json` (a JSON schema, as a dict or its JSON text), `regex`, `choice` (a list of strings),
    `grammar` (Lark / llguidance EBNF), `json_object=True` (any JSON object) or `structural_tag`
    (free text until a trigger, then a tagged JSON value per schema: pacer.structural_tag; a
    dict or its JSON text, kept in the `{"structures", "triggers"}` form).

    `disable_any_whitespace` (vLLM's name) keeps JSON compact (no whitespace outside strings);
    pacer defaults it to True so a bounded schema has a bounded output (set False for
    flexible whitespace). Validation of the types is here; whether the schema, regex or
    grammar compiles is decided by the grammar worker (pacer.structured), after which a bad
    one fails its request alone. `kind` names the field that was set."""

    json: dict[str, object] | str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = True
    structural_tag: dict[str, object] | str | None = None

    def __post_init__(self) -> None:
        if self.choice is not None:
            if isinstance(self.choice, str) or not isinstance(self.choice, list | tuple):
                raise FieldTypeError("structured_outputs.choice",
                                     f"structured_outputs.choice must be a list of strings, got {self.choice!r}")
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [k for k in _STRUCTURED_KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise FieldValueError("structured_outputs", "structured_outputs needs exactly one of json, regex, "
                                  f"choice, grammar, json_object, structural_tag; got {', '.join(given) or 'none'}")
        if self.structural_tag is not None:
            self._normalize_structural_tag()
        if isinstance(self.json, str):
            try:
                object.__setattr__(self, "json", json.loads(self.json))
            except json.JSONDecodeError as e:
                raise FieldValueError("structured_outputs.json",
                                      f"structured_outputs.json is not valid JSON: {e}") from None
        if self.json is not None and not isinstance(self.json, dict | bool):
            raise FieldTypeError("structured_outputs.json", "structured_outputs.json must be a JSON schema object, "
                                 f"got {type(self.json).__name__}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise FieldTypeError(f"structured_outputs.{name}",
                                     f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise FieldValueError("structured_outputs.choice", "structured_outputs.choice must be a non-empty "
                                  f"list of non-empty strings, got {list(self.choice)!r}")
        if self.json_object not in (None, True, False):
            raise FieldTypeError("structured_outputs.json_object",
                                 f"structured_outputs.json_object must be a boolean, got {self.json_object!r}")
        if not isinstance(self.disable_any_whitespace, bool):
            raise FieldTypeError("structured_outputs.disable_any_whitespace",
                                 "structured_outputs.disable_any_whitespace must be a boolean")

    def _normalize_structural_tag(self) -> None:
        tag = self.structural_tag
        if isinstance(tag, str):
            try:
                tag = json.loads(tag)
            except json.JSONDecodeError as e:
                raise FieldValueError("structured_outputs.structural_tag",
                                      f"structured_outputs.structural_tag is not valid JSON: {e}") from None
        object.__setattr__(self, "structural_tag", normalize_structural_tag(tag, "structured_outputs.structural_tag"))

    @property
    def kind(self) -> str:
        return next(k for k in _STRUCTURED_KINDS if getattr(self, k) not in (None, False))

    def spec(self) -> dict[str, object]:
        """Plain JSON data naming the constraint: what the grammar worker compiles and the key
        its cache is keyed by."""
        kind = self.kind
        value: object = True if kind == "json_object" else getattr(self, kind)
        if kind == "choice":
            value = list(value)  # type: ignore[call-overload]
        return {"kind": kind, "value": value, "compact": self.disable_any_whitespace}

    def cache_key(self) -> str:
        return json.dumps(self.spec(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one request's output (names and defaults follow vLLM / OpenAI).

    Penalties follow vLLM: `presence_penalty` and `frequency_penalty` (OpenAI's definitions,
    in [-2, 2]) subtract `presence * [count > 0] + frequency * count` from the logit of each
    token by its count among the generated tokens; `repetition_penalty` (> 0, 1 is off)
    divides the positive logits and multiplies the negative ones of every token seen in the
    prompt or the output. `logprobs=k` returns, per generated token, the logprob of the sampled
    token and of the k most likely ones (0 <= k <= MAX_LOGPROBS), from the model's raw logits.
    `prompt_logprobs=k` (vLLM's) returns the same for every prompt token (the first, which has no
    context, gets None): a request asking for it skips the prefix cache, so every prompt position
    is computed for it (see docs/usage/grading.md).
    vLLM's / OpenAI's: `min_p` (in [0, 1]: drop tokens below min_p x the top token's probability,
    after temperature), `logit_bias` ({token_id: bias in [-100, 100]} added to the logits),
    `allowed_token_ids` (sample only these), `bad_words` (strings never generated: a word's last
    token is banned when the output ends with the tokens before it, with and without a leading
    space; the engine tokenizes them into `bad_words_token_ids`), `truncate_prompt_tokens` (keep
    the prompt's last k tokens; -1: as many as max_model_len allows), `thinking_token_budget`
    (>= 0: after that many thinking tokens the end of thinking is forced; needs the engine's
    `reasoning_parser`, see pacer.sched.reasoning).
    `n` samples per prompt are n engine requests (`LLM.generate` and the server expand them;
    see `for_sample`); `Engine.add_request` takes one sequence. `slo` (pacer's): the request's
    own latency targets, a `Slo` or the HTTP body's {"ttft_ms": .., "itl_ms": .., "tpot_ms": ..,
    "e2e_ms": ..}, on top of its class's `--slo` targets (what the `slo` policy schedules by).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    n: int = 1
    structured_outputs: StructuredOutputsParams | None = None
    slo: Slo | None = None
    prompt_logprobs: int | None = None
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] | dict[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    truncate_prompt_tokens: int | None = None
    thinking_token_budget: int | None = None

    def __post_init__(self) -> None:
        self._check_slo()
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        _check_int("max_tokens", self.max_tokens, low=1)
        _check_int("n", self.n, low=1)
        _check_int("top_k", self.top_k, low=0)
        _check_int("min_tokens", self.min_tokens, low=0)
        if self.min_tokens > self.max_tokens:
            raise FieldValueError("min_tokens", f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens}, "
                                                f"max_tokens={self.max_tokens}")
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise FieldValueError("temperature", f"temperature must be >= 0, got {self.temperature}")
        _check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise FieldValueError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            _check_int("seed", self.seed, low=None)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise FieldValueError("stop", f"stop must be a list of non-empty strings, got {self.stop!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_number(name, value)
            if not -2.0 <= value <= 2.0:
                raise FieldValueError(name, f"{name} must be in [-2, 2], got {value}")
        _check_number("repetition_penalty", self.repetition_penalty)
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise FieldValueError("repetition_penalty",
                                  f"repetition_penalty must be > 0 (1 is off), got {self.repetition_penalty}")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, low=0)
            if self.logprobs > MAX_LOGPROBS:
                raise FieldValueError("logprobs", f"logprobs must be <= {MAX_LOGPROBS}, got {self.logprobs}")
        self._check_vllm_fields()
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise FieldTypeError("structured_outputs",
                                 "structured_outputs must be StructuredOutputsParams, got "
                            f"{type(self.structured_outputs).__name__}")

    def _check_vllm_fields(self) -> None:
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, low=0)
            if self.prompt_logprobs > MAX_LOGPROBS:
                raise FieldValueError("prompt_logprobs",
                                      f"prompt_logprobs must be <= {MAX_LOGPROBS}, got {self.prompt_logprobs}")
        _check_number("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise FieldValueError("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        if self.logit_bias is not None:
            items = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
            pairs = []
            for tok, bias in items:
                _check_int("logit_bias", tok, low=0)
                _check_number("logit_bias", bias)
                if not -100.0 <= bias <= 100.0:
                    raise FieldValueError("logit_bias", f"logit_bias values must be in [-100, 100], got {bias} "
                                                        f"for token {tok}")
                pairs.append((int(tok), float(bias)))
            object.__setattr__(self, "logit_bias", tuple(sorted(pairs)) or None)
        if self.allowed_token_ids is not None:
            ids = tuple(self.allowed_token_ids)
            if not ids:
                raise FieldValueError("allowed_token_ids", "allowed_token_ids must be a non-empty list of token ids")
            for t in ids:
                _check_int("allowed_token_ids", t, low=0)
            object.__setattr__(self, "allowed_token_ids", ids)
        bad = (self.bad_words,) if isinstance(self.bad_words, str) else tuple(self.bad_words)
        if not all(isinstance(w, str) and w for w in bad):
            raise FieldValueError("bad_words", f"bad_words must be a list of non-empty strings, got {self.bad_words!r}")
        object.__setattr__(self, "bad_words", bad)
        object.__setattr__(self, "bad_words_token_ids", tuple(tuple(int(t) for t in w) for w in self.bad_words_token_ids))
        if self.thinking_token_budget is not None:
            _check_int("thinking_token_budget", self.thinking_token_budget, low=0)
        if self.truncate_prompt_tokens is not None:
            _check_int("truncate_prompt_tokens", self.truncate_prompt_tokens, low=-1)
            if self.truncate_prompt_tokens == 0:
                raise FieldValueError("truncate_prompt_tokens",
                                      "truncate_prompt_tokens must be >= 1 (or -1: max_model_len), got 0")

    def _check_slo(self) -> None:
        if self.slo is None:   # before the import: most requests carry no targets of their own
            return
        from pacer.config.slo import Slo, slo_from_request

        if isinstance(self.slo, Slo):
            return
        if not isinstance(self.slo, dict):
            raise FieldTypeError("slo",
                                 f"slo must be a Slo or a dict such as {{'ttft_ms': 300}}, got {type(self.slo).__name__}")
        object.__setattr__(self, "slo", slo_from_request(self.slo, "slo"))

    def for_sample(self, index: int) -> SamplingParams:
        """The params of sample `index` of `n`: one sequence, and when seeded, the seed
        `sample_seed(seed, index)`, so sample 0 equals the n=1 answer and the others differ."""
        seed = self.seed if self.seed is None else sample_seed(self.seed, index)
        return dataclasses.replace(self, n=1, seed=seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """`logit_bias` as (token id, bias) pairs (it is stored so once checked)."""
        bias = self.logit_bias
        if not bias:
            return ()
        return tuple(bias.items()) if isinstance(bias, dict) else tuple(bias)

    @property
    def needs_history(self) -> bool:
        """Whether the executor mirrors the request's tokens (penalties, multi-token bad words)."""
        return self.has_penalties or any(len(w) > 1 for w in self.bad_words_token_ids)

    @property
    def has_token_filters(self) -> bool:
        """Whether sampling edits logits by token before penalties (vLLM's logits processors)."""
        return bool(self.logit_bias or self.allowed_token_ids or self.bad_words_token_ids)

    @property
    def has_penalties(self) -> bool:
        """Whether sampling needs the request's token history (prompt and output)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample `index` of a seeded request with n > 1: sample 0 keeps the seed, the
    others get distinct seeds derived from (seed, index), so the whole answer is reproducible."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _check_int(name: str, value: object, low: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldTypeError(name, f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if low is not None and value < low:
        raise FieldValueError(name, f"{name} must be >= {low}, got {value}")


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldTypeError(name, f"{name} must be a number, got {type(value).__name__} {value!r}")
