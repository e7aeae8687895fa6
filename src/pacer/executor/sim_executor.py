"""SimExecutor: runs one SchedulerOutput on simulated hardware. No tensors.

It implements the same `execute(SchedulerOutput)` contract as `ModelExecutor`: it samples a
token for every row that asks for one (a fixed, non-EOS id; output lengths come from the
requests' `max_tokens` with `ignore_eos`), and moves the `VirtualClock` forward by the cost
model's step time, so the engine stamps token times at the end of the simulated step.
Per-step costs are kept for reports and the Chrome trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from pacer.clock import VirtualClock
from pacer.core.outputs import ModelOutput, SchedulerOutput
from pacer.sim.cost_model import CostModel, StepCost, batch_features

__all__ = ["SimExecutor", "SimStepRecord"]


@dataclass(frozen=True, slots=True)
class SimStepRecord:
    step_id: int
    start_s: float
    batch_size: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    cost: StepCost


class SimExecutor:
    def __init__(self, cost_model: CostModel, clock: VirtualClock, sample_token_id: int = 0,
                 keep_records: bool = True, kv_block_bytes: int | None = None) -> None:
        self.cost_model = cost_model
        self.kv_block_bytes = kv_block_bytes   # read by the engine to size the swap tier (swap_space GiB)
        self.clock = clock
        self.sample_token_id = sample_token_id
        self.keep_records = keep_records
        self.records: list[SimStepRecord] = []
        self.busy_s = 0.0
        self.num_steps = 0

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        if not out.scheduled:
            return ModelOutput(forward_s=0.0)
        cost = self.cost_model.step_cost(batch_features(out))
        start = self.clock.now()
        self.clock.advance(cost.time_s)
        self.busy_s += cost.time_s
        self.num_steps += 1
        if self.keep_records:
            self.records.append(SimStepRecord(out.step_id, start, len(out.scheduled), out.num_prefill_tokens,
                                              out.num_decode_tokens, len(out.preempted_ids), cost))
        tok = self.sample_token_id
        return ModelOutput.sampled({sr.request_id: tok for sr in out.scheduled if sr.sample}, forward_s=cost.time_s)
