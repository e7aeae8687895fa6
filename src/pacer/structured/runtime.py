"""The real structured-outputs runtime: `pacer.sched.structured.StructuredOutputs` over a
`StructuredOutputManager` (grammar compiles on worker processes, the cache, matchers, masks)
and the compiles the scheduler waits on (`GrammarWaits`; their requests wait in the scheduler
as WAITING_FOR_GRAMMAR). The scheduler takes the finished compiles and starts each step's masks
in `schedule()`, advances the matchers in `update_from_output()` and releases a finished
request; the engine calls `request` (any thread), `wait` / `wake` and `stats`. The simulator's
`pacer.sim.structured.SimStructured` implements the same protocol on its virtual clock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from pacer.config import StructuredOutputsConfig
from pacer.request import FinishReason, StructuredOutputsParams
from pacer.sched.structured import CompileOutcome
from pacer.structured.gate import GrammarWaits
from pacer.structured.manager import CompiledGrammar, StructuredOutputManager

__all__ = ["StructuredRuntime", "default_manager"]

log = logging.getLogger("pacer.structured")


class StructuredRuntime:
    def __init__(self, manager: StructuredOutputManager) -> None:
        self.manager = manager
        self._waits = GrammarWaits(manager.ready)

    def request(self, params: StructuredOutputsParams, tenant: str = "default") -> Future[CompiledGrammar]:
        """Start (or find) the compile of `params` for `tenant`; any thread."""
        future = self.manager.request(params, tenant)
        self.manager.ready.set()   # wake an engine idling on its compiles: the request is in its inbox
        return future

    def add_pending(self, request_id: str, compile: Future[CompiledGrammar]) -> None:
        self._waits.add(request_id, compile)

    def has_pending(self) -> bool:
        return len(self._waits) > 0

    def take_compiled(self) -> list[CompileOutcome]:
        """The finished compiles, each success's matcher bound to its request."""
        done = []
        for rid, compiled, error in self._waits.take_done():
            if error is None:
                self.manager.bind(rid, compiled)
                done.append(CompileOutcome(rid))
            else:
                done.append(CompileOutcome(rid, str(error)))
        return done

    def masks(self, sampling_ids: Iterable[str]) -> Any:
        """The step's masks (pacer.structured.masks.TokenMasks), now being computed: they run
        while the executor prepares and runs the forward; None without constrained rows."""
        if not self.manager.num_constrained:
            return None
        return self.manager.start_masks(sampling_ids)

    def advance(self, request_id: str, token_ids: Sequence[int]) -> FinishReason | None:
        """STOP when the grammar is complete, ERROR when a token left it (an executor without masks)."""
        if not self.manager.is_constrained(request_id):
            return None
        try:
            done = any(self.manager.accept(request_id, t) for t in token_ids)
        except ValueError:
            log.exception("request %s left its grammar; finishing it with an error", request_id)
            return FinishReason.ERROR
        return FinishReason.STOP if done else None

    def release(self, request_id: str) -> None:
        self.manager.release(request_id)
        pending = self._waits.discard(request_id)
        if pending is not None and not pending.done():
            self.manager.drop(pending)   # an orphan: cancelled once no request waits on it

    def wait(self, timeout: float) -> None:
        """The engine is idle but for compiles: block until one finishes (or `timeout`)."""
        self._waits.wait(timeout)

    def wake(self) -> None:
        self.manager.ready.set()

    def stats(self) -> dict[str, float]:
        return self.manager.stats.as_dict()

    def close(self) -> None:
        self.manager.close()


def default_manager(tokenizer: Any | None, vocab_size: int | None, eos_token_ids: tuple[int, ...],
                    config: StructuredOutputsConfig) -> StructuredOutputManager:
    """The manager an engine makes on its first constrained request (its config's timeout and workers)."""
    if tokenizer is None:
        raise ValueError("structured_outputs needs a model with a tokenizer")
    return StructuredOutputManager(tokenizer, vocab_size or tokenizer.vocab_size, eos_token_ids,
                                   timeout=config.structured_outputs_timeout,
                                   num_workers=config.structured_outputs_workers)
