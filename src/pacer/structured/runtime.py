"""What the engine does for structured outputs, in one object: the manager (compiles,
cache, matchers, masks) and the compiles the engine waits on (their requests wait in the
scheduler as WAITING_FOR_GRAMMAR). The engine calls it at five points: add (any thread),
drain (finished compiles: bind), before execute (start the step's masks), after update
(advance the matchers), finish (release). The simulator's `pacer.sim.structured.SimStructured`
implements the same methods on its virtual clock.
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future
from typing import Any

from pacer.config import StructuredOutputsConfig
from pacer.request import FinishReason, Request, StructuredOutputsParams
from pacer.sched.contract import SchedulerOutput
from pacer.structured.gate import GrammarWaits
from pacer.structured.manager import StructuredOutputManager

__all__ = ["StructuredRuntime", "default_manager"]

log = logging.getLogger("pacer.structured")


class StructuredRuntime:
    def __init__(self, manager: StructuredOutputManager) -> None:
        self.manager = manager
        self.waits = GrammarWaits(manager.ready)

    def request(self, params: StructuredOutputsParams) -> Future[Any]:
        """Start (or find) the compile of `params`; any thread."""
        future = self.manager.request(params)
        self.manager.ready.set()   # wake an engine idling on its compiles: the request is in its inbox
        return future

    def wake(self) -> None:
        self.manager.ready.set()

    def wait(self, timeout: float) -> None:
        """The engine is idle but for compiles: block until one finishes (or `timeout`)."""
        self.waits.wait(timeout)

    def bind(self, request_id: str, compiled: Any) -> None:
        self.manager.bind(request_id, compiled)

    def stats(self) -> dict[str, float]:
        return self.manager.stats.as_dict()

    def with_masks(self, out: SchedulerOutput) -> SchedulerOutput:
        """`out` carrying the masks of its constrained sampling requests, now being computed
        (they run while the executor prepares and runs the forward)."""
        if not self.manager.num_constrained:
            return out
        masks = self.manager.start_masks(sr.request_id for sr in out.scheduled if sr.sample)
        return out if masks is None else dataclasses.replace(out, token_masks=masks)

    def advance(self, updated: list[tuple[Request, int]]) -> list[tuple[Request, FinishReason]]:
        """Feed each constrained request its new tokens; returns those to finish: STOP when
        the grammar is complete, ERROR when a token left it (an executor without masks)."""
        if not self.manager.num_constrained:
            return []
        finish = []
        for req, num_new in updated:
            if req.is_finished or not num_new:
                continue
            try:
                done = any(self.manager.accept(req.request_id, t) for t in req.output_token_ids[-num_new:])
            except ValueError:
                log.exception("request %s left its grammar; finishing it with an error", req.request_id)
                finish.append((req, FinishReason.ERROR))
                continue
            if done:
                finish.append((req, FinishReason.STOP))
        return finish

    def release(self, request_id: str) -> None:
        self.manager.release(request_id)
        self.waits.discard(request_id)

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
