"""Preemption: taking a running request's KV back, when KV runs out for the running ones or a
waiting request outranks the worst running one. Pure Python.

The victim is the running request the policy ranks worst (`victim_key`: fcfs the latest arrival,
slo the most slack). `preempt` undoes its share of the step being planned and either swaps its KV
to the CPU tier (`preemption_mode="swap"`, when the tier takes it: it resumes where it was) or
frees it (recompute: its full blocks stay in the prefix cache, so the resume may hit them), and
queues it again by its own key.
"""

from __future__ import annotations

from typing import Any, Protocol

from pacer.request import Request, RequestStatus
from pacer.sched.step_plan import StepPlan

__all__ = ["allocate_or_preempt", "make_room_for", "preempt"]


class Scheduler(Protocol):
    """What preemption reads and changes of the scheduler (pacer.sched.scheduler.Scheduler)."""

    kv: Any
    policy: Any
    waiting: Any
    segments: Any
    clock: Any
    config: Any
    running: list[Request]
    num_preemptions: int
    num_swap_preemptions: int


def allocate_or_preempt(sched: Scheduler, step: StepPlan, req: Request, n: int) -> list[int] | None:
    """Allocate for a running request, preempting the worst running ones as needed (None: it
    was the worst, and is preempted itself)."""
    while True:
        blocks: list[int] | None = sched.kv.allocate_slots(req, n)
        if blocks is not None:
            return blocks
        victim = max(sched.running, key=sched.policy.victim_key)
        preempt(sched, step, victim)
        if victim is req:
            return None


def make_room_for(sched: Scheduler, step: StepPlan, head: Request) -> bool:
    """Preempt the worst running request if waiting `head` outranks it (a priority policy).
    Returns whether anything was preempted (so the caller may retry)."""
    if not sched.running:
        return False
    worst = max(sched.running, key=sched.policy.victim_key)
    if not sched.policy.outranks(head, worst):
        return False
    if sched.waiting.is_aged(worst) and (worst.arrival_time, worst.arrival_seq) < (head.arrival_time, head.arrival_seq):
        return False   # aging serves it ahead of `head`: preempting it would only bring it back
    preempt(sched, step, worst)
    return True


def preempt(sched: Scheduler, step: StepPlan, req: Request) -> None:
    sched.segments.cancel(req)   # a fill planned this step: dropped, its tokens not computed
    step.undo(req)
    sched.running.remove(req)
    req.metrics.on_preempted(sched.clock.now(), req.num_computed_tokens)
    if sched.config.preemption_mode == "swap" and sched.kv.swap_out(req):
        sched.num_swap_preemptions += 1   # keeps num_computed_tokens: its KV waits on the CPU tier
    else:
        sched.kv.free(req)                # caches its full blocks, so the resume may hit them
        req.num_computed_tokens = 0
    req.status = RequestStatus.PREEMPTED
    req.metrics.preemptions += 1
    sched.num_preemptions += 1
    sched.waiting.add(req)
    step.preempted.append(req.request_id)
