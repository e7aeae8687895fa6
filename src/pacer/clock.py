"""Clocks: the only source of time for the scheduler and engine.

The core never calls `time` itself; it receives a `Clock`, so the same code runs on the
wall clock (real engine) and on a virtual clock (simulator, tests).
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "WallClock", "VirtualClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale; only differences are meaningful."""
        ...

    def wait_until(self, t: float) -> None:
        """Return once `now() >= t`: the wall clock sleeps, a virtual clock jumps."""
        ...


class WallClock:
    """Monotonic wall clock (time.perf_counter)."""

    def now(self) -> float:
        return time.perf_counter()

    def wait_until(self, t: float) -> None:
        delay = t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


class VirtualClock:
    """A clock that moves only when told to; used by the simulator and tests."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"VirtualClock.advance: seconds must be >= 0, got {seconds}")
        self._now += seconds

    def wait_until(self, t: float) -> None:
        """Jump to `t` (no-op when already past it)."""
        if t > self._now:
            self._now = float(t)

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"VirtualClock.set: time cannot go back ({t} < {self._now})")
        self._now = float(t)
