"""Per-step token budgets, tallied for reports: how often a target (not max_num_batched_tokens)
set the step's budget, how small it went, and whose targets set it.

Fed from anything with `token_budget` and `budget_reason` (the engine's `StepStats`, the
simulator's `SimStepRecord`); `pacer bench --engine inprocess` and `pacer sim` keep the tally
in their report's meta (`"budget"`), and the report table prints its `describe()` line.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from pacer.sched.feasibility import BACKLOG, ITL_INFEASIBLE, TTFT_DRAIN

__all__ = ["BudgetTally", "describe_budget"]

_OWNER = re.compile(r"^itl ([0-9.]+)ms of (\S+)")
_ARRIVAL = "arrival ttft "   # the step was kept short for requests yet to arrive


class _Step(Protocol):
    @property
    def token_budget(self) -> int: ...
    @property
    def budget_reason(self) -> str: ...


class BudgetTally:
    """Counts steps by what set their budget; keeps the budgets a target set."""

    def __init__(self) -> None:
        self.num_steps = 0
        self.num_by_target = 0      # steps whose budget an ITL target cut below max_num_batched_tokens
        self.num_at_floor = 0       # of them, at the prefill floor (the target asked for less)
        self.num_by_arrival = 0     # steps kept within a share of the tightest TTFT (for arrivals)
        self.num_infeasible = 0     # steps whose decodes alone exceeded the limit (sized by the queue's need)
        self.num_drain = 0          # steps the queue's TTFTs sized above what the ITL target allowed
        self.num_backlog = 0        # steps a hopeless backlog sized above it (prefill near its best rate)
        self.budgets: list[int] = []
        self.owners: Counter[str] = Counter()

    def add(self, step: _Step) -> None:
        self.num_steps += 1
        reason = step.budget_reason or ""
        self.num_infeasible += reason.startswith(ITL_INFEASIBLE)
        if reason.startswith(BACKLOG):
            self.num_backlog += 1
            self.budgets.append(int(step.token_budget))
            return
        if reason.startswith(TTFT_DRAIN):
            self.num_drain += 1
            self.budgets.append(int(step.token_budget))
            return
        if reason.startswith(_ARRIVAL):
            self.num_by_arrival += 1
            self.budgets.append(int(step.token_budget))
            return
        m = _OWNER.match(reason)
        if m is None:
            return
        self.num_by_target += 1
        self.num_at_floor += "(floor)" in step.budget_reason
        self.budgets.append(int(step.token_budget))
        self.owners[m.group(2)] += 1

    def extend(self, steps: Iterable[_Step]) -> BudgetTally:
        for s in steps:
            self.add(s)
        return self

    def as_dict(self) -> dict[str, Any]:
        b = self.budgets
        return {"num_steps": self.num_steps, "num_set_by_itl": self.num_by_target, "num_at_floor": self.num_at_floor,
                "num_set_by_arrival": self.num_by_arrival,
                "num_itl_infeasible": self.num_infeasible, "num_ttft_drain": self.num_drain,
                "num_backlog": self.num_backlog,
                "budget_min": min(b) if b else None, "budget_median": statistics.median(b) if b else None,
                "top_owners": dict(self.owners.most_common(3))}


def describe_budget(d: Mapping[str, Any]) -> str | None:
    """One line for a report: None when no target ever set a budget."""
    by_itl, by_arrival = (d.get("num_set_by_itl", 0), d.get("num_set_by_arrival", 0)) if d else (0, 0)
    infeasible = d.get("num_itl_infeasible", 0) if d else 0
    drain = d.get("num_ttft_drain", 0) if d else 0
    backlog = d.get("num_backlog", 0) if d else 0
    if not by_itl and not by_arrival and not drain and not backlog:
        return (f"step budget: the decodes alone exceeded the ITL target in {infeasible} of {d['num_steps']} "
                "steps (sized by the queue's prefill need)") if infeasible else None
    line = (f"step budget: an ITL target set it in {by_itl} of {d['num_steps']} steps, the tightest TTFT (for "
            f"arrivals) in {by_arrival}, the queue's TTFTs above the ITL's in {drain}, a hopeless backlog in {backlog} (median "
            f"{d['budget_median']:g} tokens, min {d['budget_min']}, {d['num_at_floor']} at the prefill floor; "
            f"{infeasible} infeasible, sized by the queue's prefill need)")
    owners = ", ".join(f"{k} ({v})" for k, v in d.get("top_owners", {}).items())
    return line + (f"; most often the target of {owners}" if owners else "")
