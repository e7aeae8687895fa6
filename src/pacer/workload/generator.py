"""Workloads for `pacer bench` and `pacer sim`: request classes, length distributions and the
deterministic generator of `RequestSpec`s (what to send, not how or when it is measured).

A workload is a weighted mix of `ClassSpec`s. Each class sets the new prompt tokens per turn,
the output length (mean and coefficient of variation), a prefix shared by every request of the
class (system prompt, tool definitions) and turns per session: turn k's prompt is the shared
prefix, every earlier turn with its reply, and the new text, so multi-turn and agent traffic
shares prefixes the way real traffic does. Built in: `chat`, `rag`, `agent`, `batch`, `mixed`
and `fixed` (vLLM's random dataset: every request exactly `input_len` / `output_len` tokens).

Same seed, same workload, same tokenizer -> the same requests, token for token. This module
touches only the tokenizer it is given (see `pacer.workload.text`); it never does I/O except
`load_workload`, which reads one YAML/JSON file.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pacer.workload.arrivals import ArrivalProcess, ClosedLoop, arrival_times
from pacer.workload.text import Segment, TextSource, TokenizerLike

__all__ = [
    "LengthDist", "ClassSpec", "Workload", "ChatMessage", "RequestSpec", "RequestSource", "WorkloadGenerator",
    "BUILTIN_WORKLOADS", "builtin_workload", "load_workload", "iter_requests", "generate_requests",
]


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Token counts with a mean and coefficient of variation (std / mean), drawn from a gamma
    distribution (cv 0: always the mean), rounded and clipped to [min, max]."""

    mean: float
    cv: float = 0.0
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.mean, int | float) or self.mean < 0:
            raise ValueError(f"length mean must be a number >= 0, got {self.mean!r}")
        if not isinstance(self.cv, int | float) or self.cv < 0:
            raise ValueError(f"length cv must be a number >= 0, got {self.cv!r}")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"length max ({self.max}) must be >= min ({self.min})")

    def sample(self, rng: random.Random) -> int:
        if self.cv == 0 or self.mean == 0:
            value = self.mean
        else:
            shape = 1.0 / (self.cv * self.cv)
            value = rng.gammavariate(shape, self.mean / shape)
        n = max(self.min, int(round(value)))
        return n if self.max is None else min(n, self.max)

    @classmethod
    def parse(cls, value: object, name: str) -> LengthDist:
        """From `128`, `{"mean": 128, "cv": 0.5, "min": 1, "max": 4096}` or a LengthDist."""
        if isinstance(value, LengthDist):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return cls(float(value))
        if isinstance(value, Mapping):
            unknown = set(value) - {"mean", "cv", "min", "max"}
            if unknown or "mean" not in value:
                raise ValueError(f"{name}: expected keys mean, cv, min, max (mean required); got {sorted(value)}")
            return cls(float(value["mean"]), float(value.get("cv", 0.0)), int(value.get("min", 1)),
                       None if value.get("max") is None else int(value["max"]))
        raise TypeError(f"{name}: expected a number or a mapping with mean/cv, got {value!r}")


@dataclass(frozen=True, slots=True)
class ClassSpec:
    """One traffic class. `prompt_len` counts the new tokens of each turn (user message, document,
    tool output); the full prompt adds `shared_prefix_len` and the session's history."""

    name: str
    prompt_len: LengthDist
    output_len: LengthDist
    weight: float = 1.0
    shared_prefix_len: int = 0
    turns: LengthDist = LengthDist(1)
    concurrent_sessions: int = 8   # open sessions a new turn is drawn from
    tenant: str = "default"
    priority: int = 0
    ignore_eos: bool = True        # force exactly output_len tokens, as benchmarks need

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"class name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.weight, int | float) or self.weight <= 0:
            raise ValueError(f"class {self.name!r}: weight must be > 0, got {self.weight!r}")
        if self.shared_prefix_len < 0:
            raise ValueError(f"class {self.name!r}: shared_prefix_len must be >= 0, got {self.shared_prefix_len}")
        if self.concurrent_sessions < 1:
            raise ValueError(f"class {self.name!r}: concurrent_sessions must be >= 1")


class RequestSource(Protocol):
    """A workload that makes its own requests instead of drawing them from its classes (the
    `tool-reuse` workload, `pacer.workload.tool_reuse`): an endless, deterministic stream."""

    def requests(self, seed: int, tokenizer: TokenizerLike | None,
                 max_model_len: int | None) -> Iterator[RequestSpec]: ...


@dataclass(frozen=True, slots=True)
class Workload:
    """A weighted mix of classes; with `source`, its requests come from the source and the
    classes only describe them (the report's class table)."""

    name: str
    classes: tuple[ClassSpec, ...]
    source: RequestSource | None = None

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError(f"workload {self.name!r} has no classes")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"workload {self.name!r}: class names must be unique, got {names}")

    def with_lengths(self, prompt_mean: float | None = None, prompt_cv: float | None = None,
                     output_mean: float | None = None, output_cv: float | None = None) -> Workload:
        """A copy with every class's prompt/output length mean or CV replaced (CLI overrides)."""
        def fix(d: LengthDist, mean: float | None, cv: float | None) -> LengthDist:
            return dataclasses.replace(d, mean=d.mean if mean is None else mean, cv=d.cv if cv is None else cv)

        classes = tuple(dataclasses.replace(c, prompt_len=fix(c.prompt_len, prompt_mean, prompt_cv),
                                            output_len=fix(c.output_len, output_mean, output_cv))
                        for c in self.classes)
        return Workload(self.name, classes, self.source)


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat message; `tool_call_id` on an assistant message is the id of the tool call it
    makes (a `search` function), on a tool message the id of the call it answers."""

    role: str
    content: str
    tool_call_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_call_id is not None and self.role == "assistant":
            out["tool_calls"] = [{"id": self.tool_call_id, "type": "function",
                                  "function": {"name": "search", "arguments": "{}"}}]
        elif self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send. `prompt` (completions) and `messages` (chat) carry the same text;
    `prompt_token_ids` are its exact tokens under the generator's tokenizer. `arrival_time` is
    seconds from the run's start, None in a closed loop (sent when a client is free).
    `segments`: spans (start, length) of `prompt_token_ids` whose KV may be reused after another
    prefix (segment reuse; over HTTP the chat messages with role tool carry them)."""

    request_id: str
    request_class: str
    prompt: str
    prompt_token_ids: tuple[int, ...]
    output_tokens: int
    messages: tuple[ChatMessage, ...] = ()
    arrival_time: float | None = None
    session: str | None = None
    turn: int = 0
    tenant: str = "default"
    priority: int = 0
    ignore_eos: bool = True
    segments: tuple[tuple[int, int], ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def with_arrival(self, t: float | None) -> RequestSpec:
        return dataclasses.replace(self, arrival_time=t)


def _cls(name: str, prompt: LengthDist, output: LengthDist, **kw: Any) -> ClassSpec:
    return ClassSpec(name=name, prompt_len=prompt, output_len=output, **kw)


_CHAT = _cls("chat", LengthDist(96, 0.6), LengthDist(128, 0.6), shared_prefix_len=64,
             turns=LengthDist(3, 0.5))
_RAG = _cls("rag", LengthDist(1500, 0.3, min=256), LengthDist(64, 0.5), shared_prefix_len=32)
_AGENT = _cls("agent", LengthDist(160, 0.8), LengthDist(48, 0.5), shared_prefix_len=1024,
              turns=LengthDist(6, 0.3))
_BATCH = _cls("batch", LengthDist(256, 0.5), LengthDist(512, 0.3), priority=1)

BUILTIN_WORKLOADS: dict[str, Workload] = {
    "chat": Workload("chat", (_CHAT,)),
    "rag": Workload("rag", (_RAG,)),
    "agent": Workload("agent", (_AGENT,)),
    "batch": Workload("batch", (_BATCH,)),
    "mixed": Workload("mixed", (dataclasses.replace(_CHAT, weight=0.6), dataclasses.replace(_RAG, weight=0.2),
                                dataclasses.replace(_AGENT, weight=0.1), dataclasses.replace(_BATCH, weight=0.1))),
    # fair share: a heavy tenant (10x the rate, a long shared prefix) beside light ones without
    "tenants": Workload("tenants", (
        _cls("heavy", LengthDist(256, 0.5), LengthDist(64, 0.5), weight=10.0, shared_prefix_len=1024,
             tenant="heavy"),
        _cls("light-a", LengthDist(512, 0.5), LengthDist(64, 0.5), tenant="light-a"),
        _cls("light-b", LengthDist(512, 0.5), LengthDist(64, 0.5), tenant="light-b"))),
    "two-tenants": Workload("two-tenants", (
        _cls("heavy", LengthDist(512, 0.5), LengthDist(64, 0.5), weight=10.0, tenant="heavy"),
        _cls("light", LengthDist(512, 0.5), LengthDist(64, 0.5), tenant="light"))),
}


def builtin_workload(name: str, input_len: int | None = None, output_len: int | None = None) -> Workload:
    """A built-in workload by name; `fixed` takes `input_len` / `output_len` (default 1024 / 128)."""
    if name == "fixed":
        return Workload("fixed", (_cls("fixed", LengthDist(input_len or 1024), LengthDist(output_len or 128)),))
    if input_len is not None or output_len is not None:
        raise ValueError(f"--input-len/--output-len apply to the 'fixed' workload, not {name!r}")
    try:
        return BUILTIN_WORKLOADS[name]
    except KeyError:
        known = ", ".join([*BUILTIN_WORKLOADS, "fixed"])
        raise ValueError(f"unknown workload {name!r}; built in: {known}, or a .yaml/.json spec file") from None


_CLASS_KEYS = {f.name for f in dataclasses.fields(ClassSpec)} | {"base"}


def workload_from_dict(data: Mapping[str, Any], name: str = "custom") -> Workload:
    """`{"name": ..., "classes": [{"name": "chat", "base": "chat", "weight": 3, "prompt_len":
    {"mean": 200, "cv": 1.5}, "output_len": 128, ...}]}`; `base` starts from a built-in class."""
    unknown = set(data) - {"name", "classes"}
    if unknown or not isinstance(data.get("classes"), list):
        raise ValueError(f"workload spec needs a 'classes' list (and optional 'name'); unknown keys {sorted(unknown)}")
    builtin_classes = {c.name: c for c in BUILTIN_WORKLOADS["mixed"].classes}
    classes: list[ClassSpec] = []
    for i, raw in enumerate(data["classes"]):
        if not isinstance(raw, Mapping):
            raise TypeError(f"classes[{i}] must be a mapping, got {raw!r}")
        bad = set(raw) - _CLASS_KEYS
        if bad:
            raise ValueError(f"classes[{i}]: unknown keys {sorted(bad)}; known: {sorted(_CLASS_KEYS)}")
        kw = {k: v for k, v in raw.items() if k != "base"}
        for key in ("prompt_len", "output_len", "turns"):
            if key in kw:
                kw[key] = LengthDist.parse(kw[key], f"classes[{i}].{key}")
        base_name = raw.get("base")
        if base_name is not None:
            if base_name not in builtin_classes:
                raise ValueError(f"classes[{i}].base must be one of {sorted(builtin_classes)}, got {base_name!r}")
            base = dataclasses.replace(builtin_classes[base_name], weight=1.0)
            classes.append(dataclasses.replace(base, **kw))
        else:
            if "prompt_len" not in kw or "output_len" not in kw or "name" not in kw:
                raise ValueError(f"classes[{i}]: name, prompt_len and output_len are required without 'base'")
            classes.append(ClassSpec(**kw))
    return Workload(str(data.get("name", name)), tuple(classes))


def load_workload(spec: str) -> Workload:
    """A built-in name, or a path to a YAML/JSON workload spec (see `workload_from_dict`)."""
    path = Path(spec)
    if path.suffix.lower() not in (".yaml", ".yml", ".json"):
        return builtin_workload(spec)
    text = path.read_text()
    if path.suffix.lower() == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if not isinstance(data, Mapping):
        raise ValueError(f"{spec}: a workload spec must be a mapping with a 'classes' list")
    return workload_from_dict(data, name=path.stem)


@dataclass(slots=True)
class _Session:
    session_id: str
    num_turns: int
    history: list[tuple[str, Segment]] = field(default_factory=list)
    turn: int = 0


class WorkloadGenerator:
    """An endless, deterministic stream of `RequestSpec`s (arrival_time None) for a workload.

    Each class draws from its own RNG streams, so adding a class to a mix does not change the
    lengths another class draws for its n-th request. Prompts never exceed `max_model_len`
    together with their output: a session that would outgrow it ends and a new one starts.
    """

    def __init__(self, workload: Workload, seed: int = 0, tokenizer: TokenizerLike | None = None,
                 max_model_len: int | None = None) -> None:
        self.workload = workload
        self.seed = seed
        self.max_model_len = max_model_len
        self.text = TextSource(tokenizer)
        self._choose = random.Random(f"{seed}:class")
        self._weights = [c.weight for c in workload.classes]
        self._rngs = {c.name: random.Random(f"{seed}:{c.name}") for c in workload.classes}
        self._prefix = {c.name: self.text.segment(c.shared_prefix_len, random.Random(f"{seed}:{c.name}:prefix"))
                        for c in workload.classes}
        self._sessions: dict[str, list[_Session]] = {c.name: [] for c in workload.classes}
        self._ids = itertools.count()
        self._session_ids = itertools.count()
        for c in workload.classes:
            need = c.shared_prefix_len + 1 + c.output_len.min
            if max_model_len is not None and need > max_model_len:
                raise ValueError(f"class {c.name!r}: shared_prefix_len {c.shared_prefix_len} leaves no room "
                                 f"under max_model_len={max_model_len}")

    def __iter__(self) -> Iterator[RequestSpec]:
        return self

    def __next__(self) -> RequestSpec:
        cls = self._choose.choices(self.workload.classes, weights=self._weights)[0]
        return self._next_of(cls)

    def _session_for(self, cls: ClassSpec, rng: random.Random) -> _Session:
        open_sessions = self._sessions[cls.name]
        if len(open_sessions) < cls.concurrent_sessions:
            s = _Session(f"{cls.name}-{next(self._session_ids)}", max(1, cls.turns.sample(rng)))
            open_sessions.append(s)
            return s
        return open_sessions[rng.randrange(len(open_sessions))]

    def _next_of(self, cls: ClassSpec) -> RequestSpec:
        rng = self._rngs[cls.name]
        session = self._session_for(cls, rng)
        new_len = cls.prompt_len.sample(rng)
        out_len = cls.output_len.sample(rng)
        prefix = self._prefix[cls.name]
        history_len = sum(len(seg) for _, seg in session.history)
        if self.max_model_len is not None:
            room = self.max_model_len - len(prefix) - history_len - out_len
            if room < 1 and session.history:
                self._sessions[cls.name].remove(session)   # the conversation outgrew the context
                return self._next_of(cls)
            new_len = max(1, min(new_len, room))
            out_len = min(out_len, self.max_model_len - len(prefix) - history_len - new_len)
        user = self.text.segment(new_len, rng)
        spec = self._spec(cls, session, prefix, user, out_len)
        session.turn += 1
        if session.turn >= session.num_turns:
            self._sessions[cls.name].remove(session)
        else:
            session.history += [("user", user), ("assistant", self.text.segment(out_len, rng))]
        return spec

    def _spec(self, cls: ClassSpec, session: _Session, prefix: Segment, user: Segment,
              out_len: int) -> RequestSpec:
        parts = [prefix, *(seg for _, seg in session.history), user]
        messages = [ChatMessage("system", prefix.text.strip())] if len(prefix) else []
        messages += [ChatMessage(role, seg.text.strip()) for role, seg in session.history]
        messages.append(ChatMessage("user", user.text.strip()))
        return RequestSpec(
            request_id=f"req-{next(self._ids)}", request_class=cls.name,
            prompt="".join(p.text for p in parts),
            prompt_token_ids=tuple(t for p in parts for t in p.token_ids),
            output_tokens=max(1, out_len), messages=tuple(messages),
            session=session.session_id if session.num_turns > 1 else None, turn=session.turn,
            tenant=cls.tenant, priority=cls.priority, ignore_eos=cls.ignore_eos,
        )


def iter_requests(workload: Workload, arrivals: ArrivalProcess, *, seed: int = 0,
                  num_requests: int | None = None, duration: float | None = None,
                  tokenizer: TokenizerLike | None = None,
                  max_model_len: int | None = None) -> Iterator[RequestSpec]:
    """Requests with their send times (open loop) or arrival_time None (closed loop), lazily.

    Open loop stops after `num_requests` or past `duration`; closed loop stops after
    `num_requests` or never (the runner stops sending once `duration` has passed)."""
    gen: Iterator[RequestSpec] = (workload.source.requests(seed, tokenizer, max_model_len)
                                  if workload.source is not None else
                                  WorkloadGenerator(workload, seed, tokenizer, max_model_len))
    if isinstance(arrivals, ClosedLoop):
        specs: Iterator[RequestSpec] = iter(gen)
        if num_requests is not None:
            specs = itertools.islice(specs, num_requests)
        yield from specs
        return
    for t, spec in zip(arrival_times(arrivals, seed, num_requests, duration), gen):
        yield spec.with_arrival(t)


def generate_requests(workload: Workload, arrivals: ArrivalProcess, *, seed: int = 0,
                      num_requests: int | None = None, duration: float | None = None,
                      tokenizer: TokenizerLike | None = None,
                      max_model_len: int | None = None) -> list[RequestSpec]:
    """`iter_requests` as a list; needs `num_requests`, or `duration` with an open-loop process."""
    if num_requests is None and (duration is None or arrivals.is_closed_loop):
        raise ValueError("give num_requests (or duration with a request rate): the list would be endless")
    return list(iter_requests(workload, arrivals, seed=seed, num_requests=num_requests, duration=duration,
                              tokenizer=tokenizer, max_model_len=max_model_len))
