"""The step loop: `Engine` (add_request / abort_request / step), how a request is prepared,
what each step emits (`RequestOutput`), the records the outside world reads (`StepStats`,
`EngineSnapshot`), and how an engine is built from a config (`pacer.engine.build`)."""

from pacer.engine.engine import Engine
from pacer.engine.outputs import RequestOutput
from pacer.engine.stats import EngineSnapshot, StepStats
from pacer.sched.contract import Executor

__all__ = ["Engine", "RequestOutput", "StepStats", "EngineSnapshot", "Executor"]
