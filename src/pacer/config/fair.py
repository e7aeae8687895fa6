"""Fair share's settings (pure): the deficit bound, tenant weights and the cost of each token kind."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["FairSettings"]


def _finite(name: str, value: object, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or math.isinf(value) \
            or (value <= 0 if positive else value < 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class FairSettings:
    """What the fair policy and the deficit bound read (validated)."""

    deficit_bound: float | None = None          # None: no bound on lpm / slo
    weights: tuple[tuple[str, float], ...] = ()
    cost_prefill: float = 1.0
    cost_cached: float = 0.1
    cost_decode: float = 2.0

    @classmethod
    def make(cls, deficit_bound: float | None, weights: Mapping[str, float] | None, cost_prefill: float,
             cost_cached: float, cost_decode: float) -> FairSettings:
        if weights is not None and not isinstance(weights, Mapping):
            raise TypeError(f"fair_tenant_weights must be a dict of tenant -> number, got {weights!r}")
        bound = None if deficit_bound is None else _finite("fair_deficit_bound", deficit_bound, positive=True)
        return cls(bound, tuple((str(t), _finite(f"fair_tenant_weights[{t!r}]", w, positive=True))
                                for t, w in sorted((weights or {}).items())),
                   _finite("fair_cost_prefill", cost_prefill), _finite("fair_cost_cached", cost_cached),
                   _finite("fair_cost_decode", cost_decode))
