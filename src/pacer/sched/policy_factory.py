"""The one factory of scheduling policies (pure): `make_policy(name, context)`.

Every policy, `lpm` and `slo` included, is built here from what the scheduler gives it
(`PolicyContext`: the KV manager's prefix look-up, the step cost model, the budget numbers,
the configured SLO set); each class knows what it takes (`Policy.from_context`). A module of
its own because it names every policy, and `pacer.sched.slo_policy` builds on
`pacer.sched.policy`. The choice list is `pacer.config.SCHEDULING_POLICIES`.
"""

from __future__ import annotations

from pacer.config import SCHEDULING_POLICIES
from pacer.sched.fair_policy import FairLpmPolicy, FairPolicy, FairSloPolicy
from pacer.sched.policy import LpmPolicy, Policy, PolicyContext, PrioritySchedulingPolicy, SjfPolicy
from pacer.sched.slo_policy import SloPolicy

__all__ = ["make_policy", "POLICIES"]

POLICIES: dict[str, type[Policy]] = {
    "fcfs": Policy, "priority": PrioritySchedulingPolicy, "sjf": SjfPolicy, "lpm": LpmPolicy, "slo": SloPolicy,
    "fair": FairPolicy,
}
# fairness as a layer: the policy that replaces one when a deficit bound is set
BOUNDED: dict[str, type[Policy]] = {"lpm": FairLpmPolicy, "slo": FairSloPolicy}


def make_policy(name: str, context: PolicyContext | None = None) -> Policy:
    """The policy `name`, built from `context` (None: no collaborators: `lpm` sees no cached
    prefixes, `slo` refuses for want of a cost model)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}; got {name!r}") from None
    if context is not None and context.fair is not None and context.fair.deficit_bound is not None:
        cls = BOUNDED.get(name, cls)
    return cls.from_context(context)
