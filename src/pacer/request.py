"""Requests and sampling parameters: plain Python, shared by the core, engine and simulator.

A `Request` is the scheduler's unit of work. Its one piece of progress state is
`num_computed_tokens`, which catches up with `num_tokens` (prompt + generated) under each
step's token budget: prefill chunks, decode tokens and recompute after preemption all
follow that one rule.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pacer.core.slo import Slo

__all__ = ["SamplingParams", "StructuredOutputsParams", "Request", "RequestStatus", "RequestMetrics", "Latencies", "FinishReason",
           "MAX_LOGPROBS", "sample_seed"]

MAX_LOGPROBS = 20   # most top logprobs per token a request may ask for (vLLM's default max_logprobs)
_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """Constrain a request's output, as vLLM's `StructuredOutputsParams`: exactly one of
    `json` (a JSON schema, as a dict or its JSON text), `regex`, `choice` (a list of strings),
    `grammar` (Lark / llguidance EBNF) or `json_object=True` (any JSON object).

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

    def __post_init__(self) -> None:
        if self.choice is not None:
            if isinstance(self.choice, str) or not isinstance(self.choice, list | tuple):
                raise TypeError(f"structured_outputs.choice must be a list of strings, got {self.choice!r}")
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [k for k in _STRUCTURED_KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs needs exactly one of json, regex, choice, grammar, json_object; "
                             f"got {', '.join(given) or 'none'}")
        if isinstance(self.json, str):
            try:
                object.__setattr__(self, "json", json.loads(self.json))
            except json.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
        if self.json is not None and not isinstance(self.json, dict | bool):
            raise TypeError(f"structured_outputs.json must be a JSON schema object, got {type(self.json).__name__}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError(f"structured_outputs.choice must be a non-empty list of non-empty strings, "
                             f"got {list(self.choice)!r}")
        if self.json_object not in (None, True, False):
            raise TypeError(f"structured_outputs.json_object must be a boolean, got {self.json_object!r}")
        if not isinstance(self.disable_any_whitespace, bool):
            raise TypeError("structured_outputs.disable_any_whitespace must be a boolean")

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
    `n` samples per prompt are n engine requests (`LLM.generate` and the server expand them;
    see `for_sample`); `Engine.add_request` takes one sequence.
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

    def __post_init__(self) -> None:
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
            raise ValueError(
                f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens}, max_tokens={self.max_tokens}"
            )
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        _check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            _check_int("seed", self.seed, low=None)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_number(name, value)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        _check_number("repetition_penalty", self.repetition_penalty)
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be > 0 (1 is off), got {self.repetition_penalty}")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, low=0)
            if self.logprobs > MAX_LOGPROBS:
                raise ValueError(f"logprobs must be <= {MAX_LOGPROBS}, got {self.logprobs}")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise TypeError("structured_outputs must be StructuredOutputsParams, got "
                            f"{type(self.structured_outputs).__name__}")

    def for_sample(self, index: int) -> SamplingParams:
        """The params of sample `index` of `n`: one sequence, and when seeded, the seed
        `sample_seed(seed, index)`, so sample 0 equals the n=1 answer and the others differ."""
        seed = self.seed if self.seed is None else sample_seed(self.seed, index)
        return dataclasses.replace(self, n=1, seed=seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

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
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"

    @property
    def finished(self) -> bool:
        return self is RequestStatus.FINISHED


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class Latencies:
    """Derived latencies over a request's timestamps, shared by `RequestMetrics` and the
    benchmark's `RequestRecord`. TPOT divides the decode time by the output tokens after the
    first, counted by `_tpot_tokens` (a benchmark counts the server's usage, not its chunks)."""

    __slots__ = ()
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    token_times: list[float]

    def _tpot_tokens(self) -> int:
        return len(self.token_times)

    @property
    def queue_wait(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive emissions: tokens stamped at the same time came out of one
        step (accepted drafts) and are one emission, so a multi-token step is one gap (TPOT
        stays per token)."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:]) if b != a]

    @property
    def tpot(self) -> float | None:
        n = self._tpot_tokens()
        if n < 2 or self.first_token_time is None or not self.token_times:
            return None
        return (self.token_times[-1] - self.first_token_time) / (n - 1)

    @property
    def e2e(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclass(slots=True)
class RequestMetrics(Latencies):
    """Per-request timestamps (clock seconds) and counts; derived latencies from `Latencies`."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    prefill_tokens: int = 0  # tokens actually computed (prefill + recompute), excludes cache hits
    # preemption loss: seconds from each preemption until the request has its KV back (recomputed
    # or swapped in) at the end of a step; of which before the first token (inside TTFT)
    preempted_time: float = 0.0
    preempted_time_ttft: float = 0.0
    preempted_at: float | None = None   # an open preemption: when it began
    resume_tokens: int = 0              # computed tokens to regain before it closes

    def on_preempted(self, now: float, num_computed_tokens: int) -> None:
        """A preemption begins (a second one before the first closed extends it)."""
        if self.preempted_at is None:
            self.preempted_at = now
        self.resume_tokens = max(self.resume_tokens, num_computed_tokens)

    def on_step_end(self, now: float, num_computed_tokens: int) -> None:
        """After a step that ran the request: close an open preemption once its KV is back."""
        if self.preempted_at is None or num_computed_tokens < self.resume_tokens:
            return
        lost = now - self.preempted_at
        self.preempted_time += lost
        if self.first_token_time is None:
            self.preempted_time_ttft += lost
        self.preempted_at, self.resume_tokens = None, 0
    ttft_deadline: float | None = None       # arrival + the TTFT target (clock seconds), when it has one
    slack_at_admission: float | None = None  # slo policy: latest start - now when first queued, s
    deprioritized: bool = False   # slo policy: went behind feasible requests once it could not meet TTFT
    shed: bool = False            # refused as hopeless (shed_hopeless) before it was scheduled

    def as_dict(self) -> dict[str, object]:
        return {
            "arrival_time": self.arrival_time,
            "first_scheduled_time": self.first_scheduled_time,
            "first_token_time": self.first_token_time,
            "finish_time": self.finish_time,
            "queue_wait": self.queue_wait,
            "ttft": self.ttft,
            "itl": self.itl,
            "tpot": self.tpot,
            "e2e": self.e2e,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": len(self.token_times),
            "cached_tokens": self.cached_tokens,
            "prefill_tokens": self.prefill_tokens,
            "preemptions": self.preemptions,
            "preempted_time": self.preempted_time,
            "preempted_time_ttft": self.preempted_time_ttft,
            "ttft_deadline": self.ttft_deadline,
            "slack_at_admission": self.slack_at_admission,
            "deprioritized": self.deprioritized,
            "shed": self.shed,
        }


class Request:
    """One generation request as the scheduler sees it."""

    __slots__ = (
        "request_id", "prompt_token_ids", "sampling_params", "priority", "tenant", "arrival_seq",
        "output_token_ids", "num_computed_tokens", "status", "finish_reason", "metrics",
        "eos_token_ids", "stop_reason", "num_cached_tokens", "request_class", "slo", "policy_state", "cache_salt",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        arrival_time: float,
        priority: int = 0,
        tenant: str = "default",
        arrival_seq: int = 0,
        eos_token_ids: tuple[int, ...] = (),
        request_class: str = "default",
        slo: Slo | None = None,
        cache_salt: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.priority = priority
        self.tenant = tenant
        self.arrival_seq = arrival_seq  # tie-breaker among equal arrival times
        self.eos_token_ids = eos_token_ids
        self.cache_salt = cache_salt  # vLLM's: cached blocks are shared only with the same salt
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first schedule
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None
        self.metrics = RequestMetrics(arrival_time=arrival_time, prompt_tokens=len(self.prompt_token_ids))
        self.request_class = request_class
        self.slo = None if slo is None or slo.is_empty() else slo   # resolved targets (class + own)
        self.policy_state: Any = None   # a policy's per-request cache (the slo policy's predictions)
        if self.slo is not None and self.slo.ttft is not None:
            self.metrics.ttft_deadline = arrival_time + self.slo.ttft

    @property
    def arrival_time(self) -> float:
        return self.metrics.arrival_time

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def max_total_tokens(self) -> int:
        """Prompt plus the most tokens it may generate: the KV it can ever need."""
        return len(self.prompt_token_ids) + self.sampling_params.max_tokens

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens not yet in the KV cache (the one token rule)."""
        return self.num_tokens - self.num_computed_tokens

    def penalty_history(self) -> tuple[list[int] | None, list[int] | None]:
        """Copies of the prompt and of the tokens generated so far when the params use
        penalties (an executor seeing the request anew mirrors them), else (None, None)."""
        if not self.sampling_params.has_penalties:
            return None, None
        return list(self.prompt_token_ids), list(self.output_token_ids)

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt:end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, prio={self.priority}, status={self.status.value}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )
