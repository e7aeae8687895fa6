"""What an engine installs for constrained and reasoning requests: the structured-outputs
runtime (a StructuredOutputManager with its grammar workers, or the simulator's whole runtime)
and a reasoning model's think tags. The request lifecycle (`pacer.engine.engine`) only starts a
constrained request's compile; these are set up once, from the stepping thread, while no
constrained request is in flight."""

from __future__ import annotations

from typing import Any

from pacer.config import EngineConfig
from pacer.sched.reasoning import ReasoningTracker, ThinkTags
from pacer.sched.scheduler import Scheduler
from pacer.sched.structured import NullStructuredOutputs, StructuredOutputs
from pacer.structured.manager import StructuredOutputManager
from pacer.structured.runtime import StructuredRuntime, default_manager

__all__ = ["Constraints"]


class Constraints:
    """The engine's constrained-decoding side (a base of `Engine`, which sets these fields)."""

    config: EngineConfig
    scheduler: Scheduler
    tokenizer: Any | None
    vocab_size: int | None
    eos_token_ids: tuple[int, ...]
    # what install_structured_outputs was given (None: the default, made on first use); the
    # runtime it became is the scheduler's (`scheduler.structured`)
    _structured_outputs: StructuredOutputManager | StructuredOutputs | None = None

    def install_think_tags(self, tags: ThinkTags | None, gate_grammars: bool = True) -> None:
        """Where a reasoning model's thinking starts and ends (token ids): grammars start after it,
        `thinking_token_budget` forces its end (pacer.sched.reasoning); None: the model does not
        reason. Made from `reasoning_parser` and the tokenizer; the simulator installs its own
        (`gate_grammars` False: only budgeted requests think). Call while no request is in flight."""
        self.scheduler.reasoning = ReasoningTracker(tags, gate_grammars)

    @property
    def think_tags(self) -> ThinkTags | None:
        """The token ids of the reasoning parser's tags (None: no --reasoning-parser)."""
        return self.scheduler.reasoning.tags

    @property
    def structured_outputs(self) -> StructuredOutputManager | StructuredOutputs:
        """What serves constrained requests: the StructuredOutputManager (grammar workers, cache,
        masks), or the runtime installed whole (the simulator's SimStructured); the default one
        is made on first use (it starts grammar worker processes, so only a constrained request
        or a caller asking for it makes one)."""
        installed = self._structured_outputs
        if installed is None:
            installed = default_manager(self.tokenizer, self.vocab_size, self.eos_token_ids, self.config.structured)
            self.install_structured_outputs(installed)
        return installed

    def _structured_runtime(self) -> StructuredOutputs:
        """The scheduler's structured-outputs runtime, for a constrained request (made now if none was)."""
        _ = self.structured_outputs
        return self.scheduler.structured

    def install_structured_outputs(self, manager: StructuredOutputManager | StructuredOutputs | None) -> None:
        """Use `manager` (a StructuredOutputManager, e.g. with another compiler or timeout, or a
        whole runtime such as the simulator's SimStructured), closing the current one; None: a
        default one at the next use. Call from the stepping thread while no constrained
        request is in flight."""
        if manager is None:
            runtime: StructuredOutputs = NullStructuredOutputs()
        elif isinstance(manager, StructuredOutputManager):   # a manager, not yet a runtime
            runtime = StructuredRuntime(manager)
        else:
            runtime = manager
        self.scheduler.install_structured_outputs(runtime).close()
        self._structured_outputs = manager

    @property
    def num_waiting_for_grammar(self) -> int:
        """Queued requests whose grammar is still compiling (RequestStatus.WAITING_FOR_GRAMMAR)."""
        return self.scheduler.num_waiting_for_grammar

