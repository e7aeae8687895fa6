"""What `pacer diagnose` reads everything into: one `Record` per finished request, or, for a
live Prometheus endpoint, histogram aggregates (`pacer.diagnose.prometheus`).

A `Source` says what its records can tell: whether they carry queue wait (else "prefill" is
all of TTFT, and said so), classes (else they are classified by the server's rules),
absolute times (for interference and rate evidence) and measured preemption loss (else it
is estimated from the gaps, and said so). Times are seconds; absolute times are seconds
from the source's start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Record", "Source", "merge"]


@dataclass(frozen=True, slots=True)
class Record:
    """One finished request. None: the source does not have that value."""

    request_class: str
    prompt_tokens: int
    output_tokens: int
    ttft: float
    e2e: float
    arrival: float | None = None          # seconds from the source's start
    queue_wait: float | None = None
    tpot: float | None = None
    itl_mean: float | None = None
    itl_max: float | None = None
    itl: tuple[float, ...] | None = None  # every gap, where the source keeps them (run files)
    cached_tokens: int = 0
    preemptions: int | None = None
    preempted_time: float | None = None   # measured preemption loss (pacer's request log, runs)
    preempted_time_ttft: float | None = None
    max_tokens: int | None = None

    @property
    def scheduled_at(self) -> float | None:
        if self.arrival is None or self.queue_wait is None:
            return None
        return self.arrival + self.queue_wait

    @property
    def first_token_at(self) -> float | None:
        return None if self.arrival is None else self.arrival + self.ttft

    @property
    def finished_at(self) -> float | None:
        return None if self.arrival is None else self.arrival + self.e2e

    @property
    def uncached_prompt_tokens(self) -> int:
        return max(1, self.prompt_tokens - self.cached_tokens)


@dataclass(slots=True)
class Source:
    """Records from one or more inputs, with what they can and cannot say."""

    name: str
    kind: str                                   # request_log | run | table | prometheus
    records: list[Record] = field(default_factory=list)
    has_classes: bool = True
    num_skipped: int = 0                        # unfinished / failed requests left out
    engine_args: dict[str, Any] = field(default_factory=dict)   # today's settings, where the source says
    notes: list[str] = field(default_factory=list)

    @property
    def has_queue_wait(self) -> bool:
        return bool(self.records) and all(r.queue_wait is not None for r in self.records)

    @property
    def has_times(self) -> bool:
        return bool(self.records) and all(r.arrival is not None for r in self.records)

    def classes(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.records:
            seen.setdefault(r.request_class, None)
        return list(seen)

    def of_class(self, name: str) -> list[Record]:
        return [r for r in self.records if r.request_class == name]


def merge(sources: Sequence[Source]) -> Source:
    """Several inputs as one source (their records keep their own times)."""
    if len(sources) == 1:
        return sources[0]
    out = Source(" + ".join(s.name for s in sources), "+".join(dict.fromkeys(s.kind for s in sources)))
    for s in sources:
        out.records.extend(s.records)
        out.num_skipped += s.num_skipped
        out.engine_args = out.engine_args or s.engine_args
        out.notes.extend(n for n in s.notes if n not in out.notes)
    out.has_classes = all(s.has_classes for s in sources)
    return out
