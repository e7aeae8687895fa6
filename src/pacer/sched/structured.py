"""The structured-outputs runtime as the scheduler sees it: one protocol, and the null one. Pure.

A constrained request (`SamplingParams.structured_outputs`) waits in the scheduler's queue as
WAITING_FOR_GRAMMAR while its grammar compiles; the scheduler owns what happens per step, as
vLLM's scheduler owns the grammar bitmask:

- `schedule()` takes the finished compiles first (`take_compiled`): a compiled grammar makes
  its request ready (its matcher is bound), a failed one finishes it with FinishReason.ERROR
  and the compile's message (`Scheduler.take_grammar_failures`, reported as shed requests are);
  at the end it starts the step's masks (`masks`) into `SchedulerOutput.token_masks`;
- `update_from_output()` advances each constrained request's matcher by its new tokens
  (`advance`): STOP when the grammar is complete, ERROR when a token left it;
- a finished request's matcher and pending compile are dropped (`release`).

The engine calls the rest: `request` when a constrained request is added (any thread), `wake`
and `wait` around its idle loop, `stats` for reports, `close` when replaced. Implemented by
`pacer.structured.runtime.StructuredRuntime` (llguidance, worker processes, wall clock) and
`pacer.sim.structured.SimStructured` (priced compiles on the virtual clock); an engine uses
`NullStructuredOutputs` until its first constrained request (the real runtime starts worker
processes, so it is made on first use).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pacer.request import FinishReason, StructuredOutputsParams
from pacer.sched.contract import TokenMasks

__all__ = ["StructuredOutputs", "CompileOutcome", "GrammarCompile", "NullStructuredOutputs"]

GrammarCompile = Any   # opaque to the scheduler: what `request` returned, handed back to `add_pending`


@dataclass(frozen=True, slots=True)
class CompileOutcome:
    """A finished compile: its request may run (error None: the matcher is bound), or fails."""

    request_id: str
    error: str | None = None   # the compile's message (invalid, unsupported, past the timeout)


class StructuredOutputs(Protocol):
    """Grammars, matchers and masks for one engine. Engine thread only, but for `request` and
    `wake`, which any thread may call."""

    def request(self, params: StructuredOutputsParams, tenant: str = "default") -> GrammarCompile:
        """Start (or join, or find cached) the compile of `params` for `tenant` (whose compiles
        in flight may be capped); any thread."""
        ...

    def add_pending(self, request_id: str, compile: GrammarCompile) -> None:
        """The queued request `request_id` waits for `compile` (from `request`)."""
        ...

    def has_pending(self) -> bool:
        """Whether some queued request still waits for its compile."""
        ...

    def take_compiled(self) -> list[CompileOutcome]:
        """The compiles finished since the last call, in arrival order; the matcher of each
        success is bound to its request."""
        ...

    def masks(self, sampling_ids: Iterable[str]) -> TokenMasks | None:
        """Start the step's masks for the constrained requests among `sampling_ids` (those that
        sample this step); None when none is constrained, so other steps pay nothing."""
        ...

    def advance(self, request_id: str, token_ids: Sequence[int]) -> FinishReason | None:
        """Feed a request's matcher the tokens it just kept: STOP when the grammar is complete,
        ERROR when a token left it (an executor without masks), None to go on (or unconstrained)."""
        ...

    def release(self, request_id: str) -> None:
        """The request finished: drop its matcher and any compile it waited for."""
        ...

    def wait(self, timeout: float) -> None:
        """The engine is idle but for compiles: block until one finishes (or `timeout` seconds)."""
        ...

    def wake(self) -> None:
        """End a `wait` early (an arrival or an abort); any thread."""
        ...

    def stats(self) -> dict[str, float]:
        """Monotonic counters for /metrics and reports (compilations, cache hits, mask time...)."""
        ...

    def close(self) -> None:
        """Stop what the runtime runs (worker processes, the mask thread)."""
        ...


class NullStructuredOutputs:
    """No runtime yet: nothing pending, no masks, no matchers, no counters."""

    def request(self, params: StructuredOutputsParams, tenant: str = "default") -> GrammarCompile:
        raise ValueError("structured_outputs needs a structured-outputs runtime "
                         "(Engine.install_structured_outputs); none is installed")

    def add_pending(self, request_id: str, compile: GrammarCompile) -> None:
        raise ValueError(f"request {request_id!r} has structured_outputs but no structured-outputs runtime "
                         "is installed (Engine.install_structured_outputs)")

    def has_pending(self) -> bool:
        return False

    def take_compiled(self) -> list[CompileOutcome]:
        return []

    def masks(self, sampling_ids: Iterable[str]) -> TokenMasks | None:
        return None

    def advance(self, request_id: str, token_ids: Sequence[int]) -> FinishReason | None:
        return None

    def release(self, request_id: str) -> None:
        pass

    def wait(self, timeout: float) -> None:
        pass

    def wake(self) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass
