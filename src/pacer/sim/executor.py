"""SimExecutor: runs one SchedulerOutput on simulated hardware. No tensors.

It implements the same `execute(SchedulerOutput)` contract as `ModelExecutor`: it samples a
token for every row that asks for one (a fixed, non-EOS id; output lengths come from the
requests' `max_tokens` with `ignore_eos`), and moves the `VirtualClock` forward by the cost
model's step time, so the engine stamps token times at the end of the simulated step.
Each step's cost breakdown is kept by step id (`costs`) for the utilisation summary and the
Chrome trace, beside the engine's own `StepStats` of the same step.

Speculation: a row with d drafts is priced as a chunk of 1 + d tokens (the cost model's
`batch_features` counts them, every position through the LM head), and each draft is accepted
with probability `acceptance_rate` (the per-token rate measured on the real engine, which
`pacer bench` reports; speculative_config's `acceptance_rate` sets it), in order until the
first rejection, from a seeded generator.

Structured outputs: a step whose SchedulerOutput carries token masks (the scheduler's
structured runtime, real or `pacer.sim.structured.SimStructured`) computes them while the
forward runs, so it takes max(step, rows x mask_row_s) plus rows x apply_row_s for its
constrained sampling rows (`StructuredCost`); steps without them pay nothing.

Step-time noise (`step_noise`, pacer.sim.noise): each step's time is multiplied by a seeded
slowdown of mean 1 averaged over the step, as a shared machine scatters the real engine's steps
around the fitted model; none by default.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from pacer.clock import VirtualClock
from pacer.perf.cost_model import CostModel, StepCost, batch_features
from pacer.sched.contract import ModelOutput, RequestResult, SchedulerOutput
from pacer.sim.noise import StepNoise
from pacer.sim.structured import DEFAULT_STRUCTURED_COST, StructuredCost

__all__ = ["SimExecutor", "DEFAULT_ACCEPTANCE_RATE"]

# per-token acceptance of n-gram drafts measured on the default model (benchmarks/spec_decode.py,
# the 32-request mixed workload); speculative_config's acceptance_rate overrides it
DEFAULT_ACCEPTANCE_RATE = 0.6


class SimExecutor:
    def __init__(self, cost_model: CostModel, clock: VirtualClock, sample_token_id: int = 0,
                 keep_records: bool = True, kv_block_bytes: int | None = None,
                 acceptance_rate: float | None = None, seed: int = 0,
                 structured_cost: StructuredCost = DEFAULT_STRUCTURED_COST, step_noise: StepNoise | None = None) -> None:
        self.cost_model = cost_model
        self.kv_block_bytes = kv_block_bytes   # read by the engine to size the swap tier (swap_space GiB)
        self.clock = clock
        self.sample_token_id = sample_token_id
        self.keep_records = keep_records
        self.costs: dict[int, StepCost] = {}   # step id -> its cost (keep_records)
        self.busy_s = 0.0
        self.num_steps = 0
        self.acceptance_rate = DEFAULT_ACCEPTANCE_RATE if acceptance_rate is None else acceptance_rate
        self._rng = random.Random(seed)
        self.structured_cost = structured_cost
        self.step_noise = step_noise
        self.mask_rows = 0             # constrained rows masked, in all
        self.mask_compute_s = 0.0      # modelled mask thread time
        self.mask_wait_s = 0.0         # of it, beyond the steps' own time (what steps waited)

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        if not out.scheduled:
            return ModelOutput(forward_s=0.0)
        cost = self.cost_model.step_cost(batch_features(out))
        if self.step_noise is not None:
            cost = _scaled(cost, self.step_noise.factor(self.clock.now(), cost.time_s))
        if out.token_masks is not None:
            cost = self._with_masks(cost, out)
        self.clock.advance(cost.time_s)
        self.busy_s += cost.time_s
        self.num_steps += 1
        if self.keep_records:
            self.costs[out.step_id] = cost
        tok = self.sample_token_id
        plain = RequestResult((tok,))   # one frozen result for every row without drafts
        results = {sr.request_id: RequestResult((*self._accepted(sr.draft_token_ids), tok)) if sr.draft_token_ids
                   else plain for sr in out.scheduled if sr.sample}
        return ModelOutput(results, forward_s=cost.time_s)

    def _with_masks(self, cost: StepCost, out: SchedulerOutput) -> StepCost:
        assert out.token_masks is not None
        rows = sum(1 for sr in out.scheduled if sr.sample and sr.request_id in out.token_masks.rows)
        wait, apply = self.structured_cost.mask_extra(rows, cost.time_s)
        self.mask_rows += rows
        self.mask_compute_s += rows * self.structured_cost.mask_row_s
        self.mask_wait_s += wait
        if not wait + apply:
            return cost
        time_s = cost.time_s + wait + apply
        scale = cost.time_s / time_s
        return dataclasses.replace(cost, time_s=time_s, overhead_s=cost.overhead_s + wait + apply,
                                   compute_util=cost.compute_util * scale,
                                   bandwidth_util=cost.bandwidth_util * scale)

    def _accepted(self, drafts: Sequence[int]) -> Sequence[int]:
        n = 0
        while n < len(drafts) and self._rng.random() < self.acceptance_rate:
            n += 1
        return drafts[:n]


def _scaled(cost: StepCost, factor: float) -> StepCost:
    """The step `factor` times as long (its parts and overhead alike), its utilisation as much lower."""
    if factor == 1.0:
        return cost
    return dataclasses.replace(cost, time_s=cost.time_s * factor, linear_s=cost.linear_s * factor,
                               attention_s=cost.attention_s * factor, comm_s=cost.comm_s * factor,
                               overhead_s=cost.overhead_s * factor, compute_util=cost.compute_util / factor,
                               bandwidth_util=cost.bandwidth_util / factor)
