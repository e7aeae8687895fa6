"""What the slo policy's queue asks of a step's prefill. Pure Python. `SloBudget`
(pacer.sched.slo_budget) mixes it in; it reads the policy's `latest_start`, `first_token_due`
and `QueueFlow`.

The waiting and partially prefilled requests that can still make their TTFT, in due order,
each with the prompt tokens up to and including its own and the time to its deadline
(`_queued_deadlines`), answer two questions the step budget asks:

- **the need** (`drain_need`): prefill tokens per second the queue needs now, the recent arrival
  rate of prompt tokens plus the highest of those tokens over a share of the time left;
- **the saves** (`drain_saves`): how many of them make it at one prefill rate and not at another
  (a drain against a decode's ITL budget is counted in the requests it serves).

A hopeless request (its latest start passed) is not counted: no rate saves it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator

from pacer.request import Request
from pacer.sched.queue_flow import QueueFlow

__all__ = ["QueueNeed", "DRAIN_DEADLINE_SHARE"]

DRAIN_DEADLINE_SHARE = 0.5   # the need aims to finish each queued prompt in this share of its time left


class QueueNeed:
    """The queue-accounting half of `SloBudget` (a mixin: the attributes are the policy's)."""

    flow: QueueFlow
    latest_start: Callable[[Request], float]
    first_token_due: Callable[[Request], float]

    def drain_need(self, partial: Iterable[Request], waiting: Iterable[Request], now: float,
                   share: float = DRAIN_DEADLINE_SHARE) -> float:
        """Prefill tokens per second the queue needs now: the recent arrival rate of prompt
        tokens plus the highest, over the waiting and partial requests that can still make their
        TTFT (due order), of the tokens up to and including each over `share` of the time to
        its deadline."""
        worst = max((tokens / (share * left) for tokens, left in self._queued_deadlines(partial, waiting, now)),
                    default=0.0)
        return worst + self.flow.arrival_rate(now)

    def drain_saves(self, partial: Iterable[Request], waiting: Iterable[Request], now: float,
                    slow: float, fast: float) -> int:
        """How many of the queued prompts that can still make their TTFT (due order) make it
        if prefill runs at `fast` tokens per second from now, and not at `slow`."""
        return sum(1 for tokens, left in self._queued_deadlines(partial, waiting, now)
                   if tokens <= fast * left and tokens > slow * left)

    @staticmethod
    def queued_tokens(partial: Iterable[Request], waiting: Iterable[Request]) -> int:
        """The prompt tokens still to prefill among the partial and waiting requests, hopeless or not."""
        return sum(r.num_tokens - r.num_computed_tokens for r in itertools.chain(partial, waiting))

    def _queued_deadlines(self, partial: Iterable[Request], waiting: Iterable[Request],
                          now: float) -> Iterator[tuple[int, float]]:
        """For each waiting or partial request that can still make its TTFT, in due order: the
        prompt tokens up to and including its own, and the seconds to its deadline."""
        tokens = 0
        # both already in due order (the waiting queue's key, the scheduler's sort of partials)
        for r in heapq.merge(partial, waiting, key=self.first_token_due):
            ttft = None if r.slo is None else r.slo.ttft
            if ttft is None or r.num_output_tokens:
                continue
            left = r.arrival_time + ttft - now
            if left <= 0 or self.latest_start(r) < now:
                continue   # hopeless: it goes behind, the rate cannot save it
            tokens += r.num_tokens - r.num_computed_tokens
            yield tokens, left
