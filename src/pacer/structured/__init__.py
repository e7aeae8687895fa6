"""Structured outputs (constrained decoding with llguidance): grammars compiled on worker
processes with a timeout and cached by content (worker, manager), requests waiting for their
grammar outside the scheduler (gate), each step's masks computed while the forward runs
(masks), the engine's hooks (runtime) and the /metrics collector (metrics). Importing this
package imports neither torch nor llguidance."""

from pacer.request import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
