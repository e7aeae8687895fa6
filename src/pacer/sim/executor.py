"""SimExecutor: runs one SchedulerOutput on simulated hardware. No tensors.

It implements the same `execute(SchedulerOutput)` contract as `ModelExecutor`: it samples a
token for every row that asks for one (a fixed, non-EOS id; output lengths come from the
requests' `max_tokens` with `ignore_eos`), and moves the `VirtualClock` forward by the cost
model's step time, so the engine stamps token times at the end of the simulated step.
Each step's cost breakdown is kept by step id (`costs`) for the utilisation summary and the
Chrome trace, beside the engine's own `StepStats` of the same step.
"""

from __future__ import annotations

from pacer.clock import VirtualClock
from pacer.core.outputs import ModelOutput, SchedulerOutput
from pacer.sim.cost_model import CostModel, StepCost, batch_features

__all__ = ["SimExecutor"]


class SimExecutor:
    def __init__(self, cost_model: CostModel, clock: VirtualClock, sample_token_id: int = 0,
                 keep_records: bool = True, kv_block_bytes: int | None = None) -> None:
        self.cost_model = cost_model
        self.kv_block_bytes = kv_block_bytes   # read by the engine to size the swap tier (swap_space GiB)
        self.clock = clock
        self.sample_token_id = sample_token_id
        self.keep_records = keep_records
        self.costs: dict[int, StepCost] = {}   # step id -> its cost (keep_records)
        self.busy_s = 0.0
        self.num_steps = 0

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        if not out.scheduled:
            return ModelOutput(forward_s=0.0)
        cost = self.cost_model.step_cost(batch_features(out))
        self.clock.advance(cost.time_s)
        self.busy_s += cost.time_s
        self.num_steps += 1
        if self.keep_records:
            self.costs[out.step_id] = cost
        tok = self.sample_token_id
        return ModelOutput.sampled({sr.request_id: tok for sr in out.scheduled if sr.sample}, forward_s=cost.time_s)
