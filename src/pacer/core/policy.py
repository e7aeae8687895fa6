"""Ordering policies: each is a key function over requests. Smaller key = served first.

The scheduler uses one key for everything: the waiting queue's order, the running
requests' order within a step, and the preemption victim (the running request with the
largest key). Policies never schedule; they only order.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pacer.config import SCHEDULING_POLICIES
from pacer.request import Request

__all__ = ["Policy", "make_policy", "WaitingQueue"]

Key = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    key: Callable[[Request], Key]
    preempts_for_waiting: bool  # may a better waiting request preempt a running one?

    def outranks(self, a: Request, b: Request) -> bool:
        """Whether `a` is strictly more important than `b` (for preemption by a waiting request)."""
        return self.preempts_for_waiting and a.priority < b.priority


def _fcfs_key(r: Request) -> Key:
    return (r.arrival_time, r.arrival_seq)


def _priority_key(r: Request) -> Key:
    return (r.priority, r.arrival_time, r.arrival_seq)


def _sjf_key(r: Request) -> Key:
    # Shortest (prompt + max output) first: sorted batching for throughput; can starve long jobs.
    return (r.num_prompt_tokens + r.sampling_params.max_tokens, r.arrival_time, r.arrival_seq)


_POLICIES = {
    "fcfs": Policy("fcfs", _fcfs_key, preempts_for_waiting=False),
    "priority": Policy("priority", _priority_key, preempts_for_waiting=True),
    "sjf": Policy("sjf", _sjf_key, preempts_for_waiting=False),
}


def make_policy(name: str) -> Policy:
    try:
        return _POLICIES[name]
    except KeyError:
        raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}; got {name!r}") from None


class WaitingQueue:
    """Requests kept sorted by the policy key (a preempted request returns to its place)."""

    def __init__(self, policy: Policy) -> None:
        self._key = policy.key
        self._items: list[tuple[Key, Request]] = []

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Request]:
        return (r for _, r in self._items)

    def add(self, req: Request) -> None:
        insort(self._items, (self._key(req), req), key=lambda item: item[0])

    def peek(self) -> Request:
        return self._items[0][1]

    def pop(self) -> Request:
        return self._items.pop(0)[1]

    def remove(self, req: Request) -> bool:
        for i, (_, r) in enumerate(self._items):
            if r is req:
                del self._items[i]
                return True
        return False
