"""Latency targets (SLOs), the `--slo` spec syntax, and the one request-class vocabulary. Pure Python.

One definition shared by `pacer serve`, `pacer bench`, `pacer sim`, `pacer tune` and the
scheduler's `slo` policy:

- `Slo`: targets in seconds on ttft, itl, tpot, e2e (None: no target). A `tpot` target
  stands for the inter-token target when no `itl` is given (`Slo.itl_target`).
- `parse_slo(["ttft=300ms,itl=50ms", "rag:ttft=2s", "batch:e2e=60s"])` -> `SloSet`: an
  unscoped spec sets the default, a `class:` prefix one class's own targets.
- `slo_from_request({"ttft_ms": .., "tpot_ms": .., "itl_ms": .., "e2e_ms": ..})`: a request's
  own targets (the HTTP body's `slo` object, llm-d's `x-llm-d-slo-*-ms` headers).
- `REQUEST_CLASSES` and `ClassRules.classify`: chat | rag | agent | batch. `long_context`
  (the server's old name) is an alias of `rag`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "Slo", "SloSet", "parse_slo", "parse_duration", "slo_from_request", "REQUEST_CLASSES", "CLASS_ALIASES",
    "canonical_class", "ClassRules", "SLO_KEYS", "percentile",
]

REQUEST_CLASSES = ("chat", "rag", "agent", "batch")
CLASS_ALIASES = {"long_context": "rag"}
SLO_KEYS = ("ttft", "itl", "tpot", "e2e")
_REQUEST_KEYS = {f"{k}_ms": k for k in SLO_KEYS}


def canonical_class(name: str) -> str:
    """The vocabulary's name for `name` (aliases resolved; other names pass through)."""
    return CLASS_ALIASES.get(name, name)


_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


def parse_duration(text: str, name: str = "duration") -> float:
    """'300ms', '0.3s', '50us' or a bare number of seconds -> seconds (> 0)."""
    m = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|us|µs|s)?\s*", text)
    if not m:
        raise ValueError(f"{name}: expected a duration such as 300ms, 0.3s or 50us, got {text!r}")
    value = float(m.group(1)) * _UNITS[m.group(2) or ""]
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name}: a duration must be > 0, got {text!r}")
    return value


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class _Outcome(Protocol):
    """What `Slo.met_by` reads: a bench `RequestRecord` or an engine `RequestMetrics`."""

    @property
    def ttft(self) -> float | None: ...
    @property
    def tpot(self) -> float | None: ...
    @property
    def e2e(self) -> float | None: ...
    @property
    def itl(self) -> list[float]: ...


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency targets in seconds; None: no target on that metric."""

    ttft: float | None = None
    itl: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def __post_init__(self) -> None:
        for key in SLO_KEYS:
            v = getattr(self, key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 or not math.isfinite(v):
                raise ValueError(f"slo {key} must be a duration > 0 seconds, got {v!r}")

    def is_empty(self) -> bool:
        return all(getattr(self, k) is None for k in SLO_KEYS)

    @property
    def itl_target(self) -> float | None:
        """The inter-token target the scheduler keeps: `itl`, else `tpot`."""
        return self.itl if self.itl is not None else self.tpot

    def met_by(self, r: _Outcome, ok: bool | None = None) -> bool:
        """Whether `r` met every target (ITL on the 99th percentile of its own gaps).
        `ok` defaults to `r.ok` when it has one (a failed request meets nothing)."""
        if ok is None:
            ok = bool(getattr(r, "ok", True))
        if not ok:
            return False
        itl = r.itl
        checks = ((self.ttft, r.ttft), (self.tpot, r.tpot), (self.e2e, r.e2e),
                  (self.itl, percentile(itl, 99) if itl else None))
        return all(limit is None or (value is not None and value <= limit) for limit, value in checks)

    def merged(self, own: Slo, allow_tighter: bool = True) -> Slo:
        """This (class) SLO with a request's `own` targets on top; `allow_tighter=False`
        keeps each own target no tighter than the class's."""
        values = []
        for key in SLO_KEYS:
            base, mine = getattr(self, key), getattr(own, key)
            if mine is not None and base is not None and not allow_tighter:
                mine = max(mine, base)
            values.append(mine if mine is not None else base)
        return Slo(*values)

    def as_dict(self) -> dict[str, float | None]:
        return {k: getattr(self, k) for k in SLO_KEYS}

    def describe(self) -> str:
        parts = [f"{k}={v * 1000:g}ms" for k in SLO_KEYS if (v := getattr(self, k)) is not None]
        return ",".join(parts) or "none"


@dataclass(frozen=True, slots=True)
class SloSet:
    """A default SLO and per-class overrides (a class's own targets replace the default's)."""

    default: Slo = Slo()
    per_class: Mapping[str, Slo] = field(default_factory=dict)

    def for_class(self, name: str) -> Slo:
        own = self.per_class.get(canonical_class(name))
        if own is None:
            return self.default
        return self.default.merged(own)

    def is_empty(self) -> bool:
        return self.default.is_empty() and all(s.is_empty() for s in self.per_class.values())

    def tightest_ttft(self) -> float | None:
        """The smallest TTFT target of the default and every class (None: no TTFT target)."""
        ttfts = [s.ttft for s in (self.default, *(self.for_class(c) for c in self.per_class)) if s.ttft is not None]
        return min(ttfts) if ttfts else None

    def tightest_itl(self) -> float | None:
        """The smallest inter-token target (`Slo.itl_target`) of the default and every class (None: none)."""
        itls = [t for t in (s.itl_target for s in (self.default, *(self.for_class(c) for c in self.per_class)))
                if t is not None]
        return min(itls) if itls else None

    def as_dict(self) -> dict[str, Any]:
        return {"default": self.default.as_dict(), "per_class": {k: v.as_dict() for k, v in self.per_class.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SloSet:
        return cls(Slo(**d.get("default", {})), {k: Slo(**v) for k, v in d.get("per_class", {}).items()})


def parse_slo(specs: Iterable[str] | str | None, classes: Iterable[str] | None = REQUEST_CLASSES) -> SloSet:
    """`["ttft=300ms,itl=50ms", "rag:ttft=2s"]` -> SloSet; a `class:` prefix scopes one spec.
    `classes`: the class names a prefix may use (aliases allowed); None accepts any name."""
    if specs is None:
        return SloSet()
    if isinstance(specs, str):
        specs = [specs]
    known = None if classes is None else {canonical_class(c) for c in classes}
    default: dict[str, float] = {}
    per_class: dict[str, dict[str, float]] = {}
    for spec in specs:
        if not isinstance(spec, str):
            raise TypeError(f"slo: expected spec strings such as 'ttft=300ms,itl=50ms', got {spec!r}")
        scope, body = default, spec
        if ":" in spec.split("=", 1)[0]:
            raw_name, body = spec.split(":", 1)
            name = canonical_class(raw_name.strip())
            if known is not None and name not in known:
                names = ", ".join(sorted(known | {a for a, c in CLASS_ALIASES.items() if c in known}))
                raise ValueError(f"slo: unknown class {raw_name.strip()!r} in {spec!r}; known classes: {names}")
            scope = per_class.setdefault(name, {})
        for part in filter(None, (p.strip() for p in body.split(","))):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in SLO_KEYS:
                raise ValueError(f"slo: unknown key {key!r} in {part!r}; expected ttft|itl|tpot|e2e=DURATION")
            scope[key] = parse_duration(value, f"slo {key}")
    return SloSet(Slo(**default), {k: Slo(**v) for k, v in per_class.items()})


def slo_from_request(data: Mapping[str, Any] | None, field_name: str = "slo") -> Slo:
    """A request's own targets from `{"ttft_ms": 300, "tpot_ms": 50, "itl_ms": 40, "e2e_ms": ..}`."""
    if data is None:
        return Slo()
    if not isinstance(data, Mapping):
        raise TypeError(f"{field_name} must be an object such as {{\"ttft_ms\": 300}}, got {data!r}")
    values: dict[str, float] = {}
    for key, value in data.items():
        if key not in _REQUEST_KEYS:
            raise ValueError(f"{field_name}: unknown key {key!r}; known: {', '.join(_REQUEST_KEYS)}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or not math.isfinite(value):
            raise ValueError(f"{field_name}.{key} must be a number of milliseconds > 0, got {value!r}")
        values[_REQUEST_KEYS[key]] = float(value) / 1000.0
    return Slo(**values)


@dataclass(frozen=True, slots=True)
class ClassRules:
    """How a request is classified when it names no class; first matching rule wins:
    agent, rag, batch, chat. The thresholds put the bench workloads in their own classes
    (bench rag prompts are ~1,500 tokens, batch jobs ask for ~512 output tokens, chats ~128)."""

    rag_min_tokens: int = 1024          # prompt tokens above this: rag (long context)
    batch_max_tokens: int = 384         # requested max_tokens at or above this: batch
    agent_header: str = "x-pacer-agent"  # this HTTP header present (or tools given): agent

    def __post_init__(self) -> None:
        for name in ("rag_min_tokens", "batch_max_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")

    def classify(self, prompt_tokens: int, max_tokens: int | None, is_agent: bool,
                 declared: str | None = None) -> str:
        """`max_tokens`: what the client asked for (None when it left it to the server);
        `declared`: a class the client named (x-pacer-class), used when it is in the vocabulary."""
        if declared is not None:
            name = canonical_class(declared.strip().lower())
            if name not in REQUEST_CLASSES:
                raise ValueError(f"request class {declared!r} is not one of {', '.join(REQUEST_CLASSES)} "
                                 f"(aliases: {', '.join(CLASS_ALIASES)})")
            return name
        if is_agent:
            return "agent"
        if prompt_tokens > self.rag_min_tokens:
            return "rag"
        if max_tokens is not None and max_tokens >= self.batch_max_tokens:
            return "batch"
        return "chat"
