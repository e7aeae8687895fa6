"""The prefix router's memory of where each prefix lives: its home replicas and the recent
traffic each replica's homed prefixes bring (the share bound's measure).

A prefix is named by its first block (`head`). Its recent traffic (its decisions among the
last `window` of all decisions) is split evenly over its homes; a replica's traffic is the sum
over the prefixes homed there. The figure moves the moment a prefix moves or gains a home, so a
rebalance never waits for old decisions to age out of the window (no overshoot, no ping-pong).
A prefix whose decisions all left the window is forgotten.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque

__all__ = ["PrefixHomes"]


class PrefixHomes:
    def __init__(self) -> None:
        self.window: deque[int] = deque()               # heads of the recent decisions, oldest first
        self.freq: Counter[int] = Counter()             # head -> its decisions in the window
        self.traffic: defaultdict[str, float] = defaultdict(float)   # replica -> its homed prefixes' share
        self._homes: dict[int, tuple[str, ...]] = {}

    def size(self) -> int:
        return len(self.window)

    def homes(self, head: int) -> tuple[str, ...]:
        return self._homes.get(head, ())

    def per_home(self, head: int) -> float:
        """The traffic `head` brings each of its homes."""
        homes = self._homes.get(head)
        return self.freq[head] / len(homes) if homes else 0.0

    def busiest(self, replica: str) -> int | None:
        """The prefix bringing `replica` the most traffic."""
        mine = [(self.per_home(h), h) for h, homes in self._homes.items() if replica in homes]
        return max(mine)[1] if mine else None

    def set_homes(self, head: int, homes: tuple[str, ...]) -> None:
        self._spread(head, -1.0)
        self._homes[head] = homes
        self._spread(head, 1.0)

    def record(self, head: int, max_size: int) -> None:
        """One more decision for `head`; the window keeps the last `max_size`."""
        self.window.append(head)
        self._add(head, 1)
        while len(self.window) > max_size:
            old = self.window.popleft()
            self._add(old, -1)
            if not self.freq[old]:
                del self.freq[old]
                self._homes.pop(old, None)

    def _add(self, head: int, n: int) -> None:
        self.freq[head] += n
        homes = self._homes.get(head, ())
        for r in homes:
            self.traffic[r] += n / len(homes)

    def _spread(self, head: int, sign: float) -> None:
        for r in self._homes.get(head, ()):
            self.traffic[r] += sign * self.per_home(head)
