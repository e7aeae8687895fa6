"""What flows through the waiting queue, measured for the slo policy. Pure Python.

Two rates the slo policy plans with, each measured from what it sees once per step
(`note`, from the policy's `refresh`) and from what each step computed (`account_prefill`,
from the policy's `account`):

- **arrivals**: prompt tokens per second that arrived over the last ARRIVAL_WINDOW_S, part
  of the queue's prefill need (`SloPolicy.drain_need`);
- **prefill**: prompt tokens computed per second over the last RATE_WINDOW_S of the current
  backlog (steps that start with requests waiting; an empty queue ends it, since its rate
  would count idle time), which prices the wait ahead of an arrival
  (`SloPolicy.refuse_late_arrivals`).

And one size: the **typical prompt** (median of the last TYPICAL_WINDOW arrivals) with a TTFT
target at most a given one, whose own first step prices what is left of that target to wait
(the arrival limit, pacer.sched.slo_budget).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from pacer.request import Request

__all__ = ["QueueFlow", "ARRIVAL_WINDOW_S", "RATE_WINDOW_S", "RATE_MIN_SPAN_S", "TYPICAL_WINDOW"]

ARRIVAL_WINDOW_S = 30.0   # the arrival rate of prompt tokens is measured over this window
RATE_WINDOW_S = 10.0      # the prefill rate is measured over this much of the current backlog
RATE_MIN_SPAN_S = 2.0     # ... once the backlog has lasted this long
TYPICAL_WINDOW = 32       # a typical prompt is the median of this many recent arrivals


class QueueFlow:
    """The queue's arrival rate and the engine's prefill rate, in prompt tokens per second."""

    __slots__ = ("_arrivals", "_arrival_tokens", "_seen_seq", "_prefill_done", "_backlog", "_prompts")

    def __init__(self) -> None:
        self._arrivals: deque[tuple[float, int]] = deque()   # (arrival time, prompt tokens), the window's
        self._arrival_tokens = 0
        self._seen_seq = -1        # arrivals up to this arrival_seq are counted
        self._prefill_done = 0     # prompt tokens computed, sampled at each backlogged step
        self._backlog: deque[tuple[float, int]] = deque()   # (step start, prefill done by then)
        self._prompts: deque[tuple[float, int]] = deque(maxlen=TYPICAL_WINDOW)   # (TTFT target, prompt tokens)

    def note(self, queue: Iterable[Request], backlogged: bool, now: float) -> None:
        """Once per step: count the new arrivals among `queue`; sample the prefill done while
        `backlogged` (requests ready and waiting), forget it when not."""
        new = sorted((r for r in queue if r.arrival_seq > self._seen_seq and not r.num_output_tokens),
                     key=lambda r: (r.arrival_time, r.arrival_seq))
        for r in new:   # in arrival order: the window pops from the oldest
            at, tokens, seq = r.arrival_time, r.num_prompt_tokens, r.arrival_seq
            self._arrivals.append((at, tokens))
            self._arrival_tokens += tokens
            self._seen_seq = max(self._seen_seq, seq)
            if r.slo is not None and r.slo.ttft is not None:
                self._prompts.append((r.slo.ttft, tokens))
        b = self._backlog
        if not backlogged:
            b.clear()
            return
        b.append((now, self._prefill_done))
        while len(b) > 2 and b[1][0] <= now - RATE_WINDOW_S:
            b.popleft()

    def account_prefill(self, num_tokens: int) -> None:
        self._prefill_done += num_tokens

    def arrival_rate(self, now: float) -> float:
        """Prompt tokens per second that arrived over the last ARRIVAL_WINDOW_S (or since the first)."""
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] < now - ARRIVAL_WINDOW_S:
            self._arrival_tokens -= arrivals.popleft()[1]
        if not arrivals:
            return 0.0
        return self._arrival_tokens / max(now - arrivals[0][0], 1.0)

    def typical_prompt(self, ttft_s: float) -> int | None:
        """The median prompt tokens of the recent arrivals whose TTFT target is at most `ttft_s`
        (None: none seen yet)."""
        sizes = sorted(tokens for ttft, tokens in self._prompts if ttft <= ttft_s)
        return sizes[len(sizes) // 2] if sizes else None

    def prefill_rate(self) -> float | None:
        """Prompt tokens computed per second over the last RATE_WINDOW_S of the current backlog
        (None: not backlogged for RATE_MIN_SPAN_S yet, or nothing computed)."""
        b = self._backlog
        if len(b) < 2 or b[-1][0] - b[0][0] < RATE_MIN_SPAN_S or b[-1][1] <= b[0][1]:
            return None
        return (b[-1][1] - b[0][1]) / (b[-1][0] - b[0][0])
