"""What a workload is, for `pacer bench` and `pacer sim`: request classes, length distributions,
the requests they describe (`RequestSpec`), the built-in workloads and spec files. What to send,
not how it is generated (`pacer.workload.generator`) or when and how it is measured.

A workload is a weighted mix of `ClassSpec`s. Each class sets the new prompt tokens per turn,
the output length (mean and coefficient of variation), a prefix shared by every request of the
class (system prompt, tool definitions) and turns per session: turn k's prompt is the shared
prefix, every earlier turn with its reply, and the new text, so multi-turn and agent traffic
shares prefixes the way real traffic does. Built in: `chat`, `rag`, `agent`, `batch`, `mixed`
and `fixed` (vLLM's random dataset: every request exactly `input_len` / `output_len` tokens).

This module does no I/O except `load_workload`, which reads one YAML/JSON file.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pacer.workload.text import TokenizerLike

__all__ = [
    "LengthDist", "ClassSpec", "Workload", "ChatMessage", "RequestSpec", "RequestSource",
    "BUILTIN_WORKLOADS", "builtin_workload", "workload_from_dict", "load_workload",
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
