"""Fair share between tenants: service counters per tenant (VTC), pure Python.

The engine knows what each request really cost, so the counters price it exactly: computed
prefill tokens, tokens taken from the prefix cache (cheap, not free) and decode tokens, each at
its own weight (`ServiceCosts`), divided by the tenant's share (`weights`, default 1). A tenant
is *backlogged* while it has requests waiting; the deficit of a tenant is how far its
normalized service runs ahead of the least served backlogged one.

VTC's rule (Sheng et al., OSDI'24): a tenant that returns from idle has its counter lifted to
the least backlogged one's (to the largest counter when no one is backlogged), so a tenant
cannot save service up while it idles and then claim it in a burst.

The ledger is policy state: the `fair` policy orders by it, `lpm` reads it as a bound
(pacer.sched.fair_policy). The scheduler charges it once per step through the policy's
`account` hook, so the simulator keeps the same counters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ServiceCosts", "ServiceLedger", "jain_index"]


@dataclass(frozen=True, slots=True)
class ServiceCosts:
    """Cost units of one token of each kind (VTC prices output at 2x input; a cached token is a
    lookup and a copy, not a forward)."""

    prefill: float = 1.0
    cached: float = 0.1
    decode: float = 2.0

    def __post_init__(self) -> None:
        for name in ("prefill", "cached", "decode"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or math.isinf(value):
                raise ValueError(f"fair_cost_{name} must be a finite number >= 0, got {value!r}")

    def of(self, num_prefill: int, num_cached: int, num_decode: int) -> float:
        return self.prefill * num_prefill + self.cached * num_cached + self.decode * num_decode


class ServiceLedger:
    """Normalized service (cost units / weight) per tenant, with VTC's lift on return."""

    def __init__(self, costs: ServiceCosts | None = None, weights: Mapping[str, float] | None = None) -> None:
        self.costs = costs or ServiceCosts()
        for tenant, w in (weights or {}).items():
            if isinstance(w, bool) or not isinstance(w, int | float) or not w > 0 or math.isinf(w):
                raise ValueError(f"tenant_weights[{tenant!r}] must be a finite number > 0, got {w!r}")
        self.weights = dict(weights or {})
        self._normalized: dict[str, float] = {}   # service / weight, lifted on return
        self._raw: dict[str, float] = {}          # cost units actually received (never lifted)
        self._backlogged: set[str] = set()

    # ------------------------------------------------------------------ reading

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def normalized(self, tenant: str) -> float:
        """The tenant's normalized service (its counter); 0 for one never seen."""
        return self._normalized.get(tenant, 0.0)

    def service(self, tenant: str) -> float:
        """Cost units the tenant actually received (not lifted, not divided by its weight)."""
        return self._raw.get(tenant, 0.0)

    @property
    def tenants(self) -> list[str]:
        return sorted(self._normalized)

    @property
    def backlogged(self) -> frozenset[str]:
        return frozenset(self._backlogged)

    def floor(self) -> float:
        """The least backlogged tenant's counter (0 with none backlogged)."""
        return min((self._normalized[t] for t in self._backlogged), default=0.0)

    def deficit(self, tenant: str) -> float:
        """How far the tenant's counter runs ahead of the least backlogged one's (>= 0)."""
        if not self._backlogged:
            return 0.0
        return max(0.0, self.normalized(tenant) - self.floor())

    def shares(self) -> dict[str, float]:
        """Each tenant's fraction of all service received (raw cost units)."""
        total = sum(self._raw.values())
        return {t: (self._raw[t] / total if total else 0.0) for t in sorted(self._raw)}

    def report(self, waiting: Iterable[str]) -> dict[str, dict[str, float]]:
        """Per tenant: `service` (cost units received), `normalized` (the counter), `share` (of all
        service), `weight`, and `deficit`: how far its counter runs ahead of the least served
        tenant among `waiting` (0 for a tenant with nothing waiting). Reads, never lifts."""
        waiting = set(waiting) & set(self._normalized)
        floor = min((self._normalized[t] for t in waiting), default=0.0)
        shares = self.shares()
        return {t: {"service": self._raw.get(t, 0.0), "normalized": n, "share": shares.get(t, 0.0),
                    "weight": self.weight(t), "deficit": max(0.0, n - floor) if t in waiting else 0.0}
                for t, n in sorted(self._normalized.items())}

    # ------------------------------------------------------------------ writing

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Replace the tenants' shares (counters already kept stay; service from now on is divided
        by the new weights)."""
        self.weights = dict(ServiceLedger(self.costs, weights).weights)   # validated as at construction

    def set_backlogged(self, tenants: Iterable[str]) -> None:
        """The tenants with requests waiting now; those returning from idle are lifted first."""
        now = set(tenants)
        returning = now - self._backlogged
        if returning:
            staying = self._backlogged & now
            if staying:
                level = min(self._normalized[t] for t in staying)
            else:
                level = max(self._normalized.values(), default=0.0)
            for t in returning:
                self._normalized[t] = max(self._normalized.get(t, 0.0), level)
                self._raw.setdefault(t, 0.0)
        self._backlogged = now

    def charge(self, tenant: str, num_prefill: int = 0, num_cached: int = 0, num_decode: int = 0) -> float:
        """Add a request's step to its tenant; returns the cost units charged."""
        if num_prefill < 0 or num_cached < 0 or num_decode < 0:
            raise ValueError(f"token counts must be >= 0, got prefill={num_prefill}, cached={num_cached}, "
                             f"decode={num_decode}")
        c = self.costs   # costs.of and weight, inline: charged for every request of every step
        cost = c.prefill * num_prefill + c.cached * num_cached + c.decode * num_decode
        self._raw[tenant] = self._raw.get(tenant, 0.0) + cost
        self._normalized[tenant] = self._normalized.get(tenant, 0.0) + cost / self.weights.get(tenant, 1.0)
        return cost

    def charge_row(self, tenant: str, num_tokens: int, prefill: bool, num_cached: int) -> float:
        """One scheduled row: `num_tokens` computed prompt tokens (`prefill`) or decoded ones, and
        `num_cached` read from the cache. A plain decode row (every running request, every step)
        takes `charge_decode`: the same sums."""
        if prefill or num_cached:
            return self.charge(tenant, num_tokens if prefill else 0, num_cached, 0 if prefill else num_tokens)
        cost = self.costs.decode * num_tokens   # charge_decode, inline
        self._raw[tenant] = self._raw.get(tenant, 0.0) + cost
        self._normalized[tenant] = self._normalized.get(tenant, 0.0) + cost / self.weights.get(tenant, 1.0)
        return cost

    def charge_decode_rows(self, tenants: Sequence[str]) -> None:
        """`charge_decode(tenant, 1)` for each of `tenants` in turn (a step's one-token decode rows),
        the same sums in the same order: a run of one tenant's rows adds to locals, one add a row."""
        cost, raw, normalized, weights = self.costs.decode * 1, self._raw, self._normalized, self.weights
        i, n = 0, len(tenants)
        while i < n:
            tenant = tenants[i]
            total, norm, share = raw.get(tenant, 0.0), normalized.get(tenant, 0.0), cost / weights.get(tenant, 1.0)
            while i < n and tenants[i] == tenant:
                total += cost
                norm += share
                i += 1
            raw[tenant], normalized[tenant] = total, norm

    def charge_decode(self, tenant: str, num_decode: int) -> float:
        """`charge(tenant, num_decode=num_decode)`, the same sums (0 * the other costs adds
        nothing), without the checks: a running request's decode tokens, every step."""
        cost = self.costs.decode * num_decode
        self._raw[tenant] = self._raw.get(tenant, 0.0) + cost
        self._normalized[tenant] = self._normalized.get(tenant, 0.0) + cost / self.weights.get(tenant, 1.0)
        return cost


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index of `values` (1: all equal, 1/n: one takes everything)."""
    xs = [float(v) for v in values]
    if not xs or not any(xs):
        return 1.0
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))
