"""Arrival processes for `pacer bench` and `pacer sim`: when each request is sent.

Open loop: `Poisson(rate)` and `Gamma(rate, burstiness)` give inter-arrival gaps (burstiness 1
is Poisson, < 1 burstier, > 1 more regular; the mean rate is `rate` either way); a rate of
`inf` sends everything at time 0. Closed loop: `ClosedLoop(concurrency)` has no times; the
runner keeps `concurrency` requests in flight. Pure standard library, deterministic under a
seed: every RNG is an instance, never module state.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["ArrivalProcess", "Poisson", "Gamma", "ClosedLoop", "make_arrivals", "arrival_times"]


@dataclass(frozen=True, slots=True)
class Gamma:
    """Gamma-distributed gaps with mean 1/rate and shape `burstiness` (CV = 1/sqrt(burstiness))."""

    rate: float
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.rate, int | float) or not self.rate > 0:
            raise ValueError(f"request_rate must be > 0 (or inf), got {self.rate!r}")
        if not isinstance(self.burstiness, int | float) or not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness!r}")

    @property
    def is_closed_loop(self) -> bool:
        return False

    def next_gap(self, rng: random.Random) -> float:
        if math.isinf(self.rate):
            return 0.0
        return rng.gammavariate(self.burstiness, 1.0 / (self.rate * self.burstiness))

    def describe(self) -> str:
        if math.isinf(self.rate):
            return "all at once"
        kind = "poisson" if self.burstiness == 1.0 else f"gamma(burstiness={self.burstiness:g})"
        return f"{kind} @ {self.rate:g} req/s"


def Poisson(rate: float) -> Gamma:  # noqa: N802 - reads as a distribution name
    """Exponential gaps at `rate` requests per second."""
    return Gamma(rate, 1.0)


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """`concurrency` clients, each sending its next request when the previous one finishes."""

    concurrency: int

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {self.concurrency!r}")

    @property
    def is_closed_loop(self) -> bool:
        return True

    def describe(self) -> str:
        return f"closed loop, concurrency {self.concurrency}"


ArrivalProcess = Gamma | ClosedLoop


def make_arrivals(request_rate: float | None = None, burstiness: float = 1.0,
                  concurrency: int | None = None) -> ArrivalProcess:
    """The process the CLI flags describe: `--concurrency` alone is closed loop; with
    `--request-rate` too, it caps in-flight requests of an open-loop run (see the runner)."""
    if request_rate is None:
        if concurrency is None:
            raise ValueError("give --request-rate (open loop) or --concurrency (closed loop)")
        return ClosedLoop(concurrency)
    return Gamma(float(request_rate), float(burstiness))


def arrival_times(process: Gamma, seed: int, num_requests: int | None = None,
                  duration: float | None = None, start: float = 0.0) -> Iterator[float]:
    """Send times in seconds from the run's start, the first at `start`, stopping after
    `num_requests` times or past `duration` (whichever comes first; neither: endless)."""
    if num_requests is not None and num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if duration is not None and duration <= 0:
        raise ValueError(f"duration must be > 0 s, got {duration}")
    rng = random.Random(f"{seed}:arrivals")
    t = start
    n = 0
    while num_requests is None or n < num_requests:
        if duration is not None and t > duration:
            return
        yield t
        n += 1
        t += process.next_gap(rng)
