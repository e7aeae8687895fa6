"""Structured outputs (constrained decoding with llguidance): grammars compiled on worker
processes with a timeout and cached by content (worker, manager), the compiles queued
requests wait on (gate), each step's masks computed while the forward runs (masks), and the
runtime that implements `pacer.sched.structured.StructuredOutputs` over them (runtime). The
/metrics collector is pacer.telemetry.collectors. Importing this package imports
neither torch nor llguidance."""

from pacer.request import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
