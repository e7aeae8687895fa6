"""The `slo` policy's step budget: how many prefill tokens a step may add after its decodes.
Pure Python. `SloPolicy` (pacer.sched.slo_policy) mixes it in; it reads the policy's predictions
(`latest_start`, `is_hopeless`), cost model, feasibility trackers and the hopeless backlog.

- **By ITL** (`prefill_budget`): the most prefill tokens that keep the predicted step within the
  tightest inter-token target among the step's decodes, and within ARRIVAL_SHARE of the tightest
  TTFT configured (the arrival limit: less where a typical arrival's own first step leaves it
  less to wait, none where that leaves under ARRIVAL_WAIT_FLOOR: `_arrival_limit`), with a
  margin for prediction noise; never below MIN_PREFILL_TOKENS. A decode that missed a target it
  cannot make up counts at MISSED_GAP_SHARE x its ITL target (`_gap_target`).
- **Not below the queue's need** (`drain_need`, `_drain_tokens`; the need and the saves are
  pacer.sched.queue_need's, mixed in): the fewest tokens whose
  predicted prefill rate covers DRAIN_SAFETY x the arrivals' and the feasible deadlines' need,
  or the chunk with the best rate when none does (the rate falls past a peak: attention; an ITL
  share past it that prefills slower than the need and than that chunk gives way to it); when
  the decodes alone exceed the limit (an unreachable ITL), that share alone. The arrival limit
  (no decode's ITL binds) yields only to the need over the whole time left (a lone long prompt
  with slack to spare is chunked, not run as one step every arrival waits for); a decode's ITL
  budget yields to a drain that finishes the head's prompt and adds others up to DRAIN_GAP_SHARE
  x the tightest ITL target (one missed gap, made the most of: `_drain_step`) only where that
  meets more queued TTFTs than it breaks running streams (`_itl_stands`, `drain_saves`,
  pacer.sched.itl_tail: a stream whose p99 gap absorbs the step, or that already missed, is not
  broken), as many where it is more than 1 / ITL_RATE_SHARE times faster than the ITL's chunk,
  or where it is that much faster and hopeless requests wait that the best rate needs more than
  BACKLOG_BURST_S to clear (saturation, not a burst: throughput first).
- **Not below the backlog's rate** (`_backlog_tokens`): with hopeless requests waiting, at least
  BACKLOG_RATE_SHARE of the step's best prefill rate.
- **Chunks priced as built** (`fit_chunk`): each chunk added after the budget keeps the step
  within its time limit, and once the step answers a prompt, within FIRST_TOKEN_SHARE of that
  prompt's TTFT (`chunk_fitter`, the first-token limit).

The searches over chunk sizes these rules ask of the cost model (the most that fit a time, the
best rate, the fewest at a rate) are pacer.sched.chunk_size's, mixed in as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from pacer.request import Request
from pacer.sched.chunk_size import FIRST_TOKEN_SHARE, MIN_PREFILL_TOKENS, ChunkSizing, largest_where
from pacer.sched.feasibility import (
    BACKLOG,
    FEASIBLE,
    ITL_INFEASIBLE,
    TTFT_DRAIN,
    FeasibilityTracker,
    decodes_exceed,
)
from pacer.sched.itl_tail import absorbs, missed
from pacer.sched.policy import WaitingQueue
from pacer.sched.queue_need import DRAIN_DEADLINE_SHARE, QueueNeed
from pacer.sched.step_cost import StepCostModel, StepShape
from pacer.sched.step_plan import StepLimit, StepPlan

__all__ = ["SloBudget", "StepBudget", "MIN_PREFILL_TOKENS", "BUDGET_SAFETY", "ARRIVAL_SHARE", "DRAIN_SAFETY",
           "DRAIN_DEADLINE_SHARE", "BACKLOG_RATE_SHARE", "ITL_RATE_SHARE", "BACKLOG_BURST_S", "FIRST_TOKEN_SHARE",
           "DRAIN_GAP_SHARE", "MISSED_GAP_SHARE"]

BUDGET_SAFETY = 0.9       # plan steps to this fraction of the ITL target (prediction noise)
ARRIVAL_SHARE = 0.5       # a step lasts at most this share of the tightest configured TTFT
DRAIN_SAFETY = 1.25       # the infeasible regime's prefill rate covers the predicted need this many times
BACKLOG_RATE_SHARE = 0.95   # with a hopeless backlog, prefill runs at this share of the step's best rate
ITL_RATE_SHARE = 0.6      # a decode's ITL budget stands against a drain while it prefills at this share of the best rate
BACKLOG_BURST_S = 1.0     # ... while the hopeless backlog is at most this many seconds of that rate (a burst)
DRAIN_GAP_SHARE = 2.0     # a drain past a decode's ITL lasts at most this many ITL targets (or finishes its prompt)
MISSED_GAP_SHARE = 2.0    # a decode that missed a target it cannot make up bounds steps to this many ITL targets
ARRIVAL_WAIT_FLOOR = 0.25  # the arrival limit holds while an arrival's own first step leaves it this share of its TTFT to wait
_INF = math.inf


@dataclass(frozen=True, slots=True)
class StepBudget:
    """The token budget chosen for one step and why."""

    tokens: int
    reason: str
    time_limit: float | None = None    # the predicted step time each added chunk must keep within


class SloBudget(ChunkSizing, QueueNeed):
    """The step-budget half of `SloPolicy` (a mixin: the attributes are the policy's)."""

    cost_model: StepCostModel
    max_num_batched_tokens: int
    arrival_ttft_s: float | None
    feasibility: FeasibilityTracker
    _backlog: int
    is_hopeless: Callable[[Request, float], bool]

    def step_limit(self, step: StepPlan, decodes: list[Request], partial: list[Request], waiting: WaitingQueue,
                   now: float) -> StepLimit:
        """The ITL budget of the step's prefill (`prefill_budget`) after the decodes it took, for
        the first partial prefill or, without one, the waiting head."""
        head = partial[0] if partial else (waiting.peek() if waiting.num_ready else None)
        scheduled = [r for r in decodes if r.request_id in step.num_tokens]
        budget = self.prefill_budget(scheduled, head, step.budget.tokens_left, now,
                                     need=lambda share: self.drain_need(partial, waiting, now, share),
                                     saves=lambda slow, fast: self.drain_saves(partial, waiting, now, slow, fast),
                                     queued=lambda: self.queued_tokens(partial, waiting))
        return StepLimit(budget.tokens, budget.reason, self.chunk_fitter(budget.time_limit, now))

    def prefill_budget(self, decodes: list[Request], head: Request | None, tokens_left: int,
                       now: float, need: Callable[[float], float] | None = None,
                       saves: Callable[[float, float], int] | None = None,
                       queued: Callable[[], int] | None = None) -> StepBudget:
        """Most prefill tokens this step may add after `decodes` (already scheduled), by the rules
        the module docstring lists in order. `need`: the queue's prefill need in tokens per second
        (`drain_need`, given the share of each deadline to aim for), the floor of an ITL budget
        and the size of the infeasible regime's share (None: no floor; fcfs's budget in that
        regime). `saves`: how many queued TTFTs make it at one rate and not at another
        (`drain_saves`; None counts none), what a drain past a decode's ITL budget is weighed by
        against the streams it breaks (`_itl_stands`; why counted so, and the rules it replaced:
        docs/measurements/slo-overload.md). `queued`: the prompt tokens waiting (None: as many as
        the budget), what a drain's step can hold (`_drain_step`)."""
        if head is None or tokens_left <= 0:
            return StepBudget(tokens_left, "max_num_batched_tokens")
        bound, owner, shape, arrival, tightest = self._step_bound(decodes, self.latest_start(head) - now, now)
        if not math.isfinite(bound):
            return StepBudget(tokens_left, "max_num_batched_tokens")
        reason = (f"itl {bound * 1e3:.1f}ms of {owner}" if owner is not None
                  else f"arrival ttft {bound * 1e3:.1f}ms")
        safety = min(BUDGET_SAFETY, 1.0 / max(1.0, self.cost_model.upper_ratio()))
        limit = bound * safety
        start = head.num_computed_tokens
        over = decodes_exceed(self.cost_model, shape, tightest * safety)
        if over is not None:     # no prefill budget meets it: do not chase it, drain the queue
            return self._infeasible_budget(shape, start, tokens_left, f"decodes {over * 1e3:.1f}ms > {reason}",
                                           now, need)
        self.feasibility.observe(FEASIBLE, now=now)
        floor = min(tokens_left, MIN_PREFILL_TOKENS)
        if self.cost_model.predict_step_s(shape.with_chunk(tokens_left, start)) <= limit:
            return StepBudget(tokens_left, f"max_num_batched_tokens ({reason} allows more)", limit)
        n = self._largest_within(shape, start, floor, tokens_left, True, limit)
        if need is not None:     # the ITL budget may not starve the queue's TTFTs
            rate = need(DRAIN_DEADLINE_SHARE if owner is not None else 1.0)
            drain = self._drain_tokens(shape, start, tokens_left, rate)
            if drain > n:
                cap = None
                if owner is not None:   # past that decode's ITL: one missed gap, made the most of
                    most = tokens_left if queued is None else min(tokens_left, queued())
                    drain, cap = self._drain_step(shape, head, n, most, limit, self._tightest_target(decodes, arrival) * safety)
                    stands = (self._itl_stands(shape, head, n, drain, decodes, now, saves) if drain > n
                              else f"a drain's step within {cap * 1e3:.0f}ms holds no more")
                    if stands is not None:
                        return StepBudget(n, f"{reason} (the queue needs {rate:.0f} tok/s; {stands})", limit)
                return StepBudget(drain, f"{TTFT_DRAIN}: the queue needs {rate:.0f} tok/s, more than {reason} allows", cap)
            if drain < n and self._chunk_rate(shape, start, n) < min(DRAIN_SAFETY * rate,
                                                                     self._chunk_rate(shape, start, drain)):
                # the ITL's share runs past the rate's peak (a long chunk's attention): slower than the
                # queue needs and than the drain's chunk, which is also the shorter step
                n, reason = drain, f"{reason} (the queue needs {rate:.0f} tok/s: the drain's chunk)"
        backlog = self._backlog_tokens(shape, start, tokens_left)
        if backlog > n:
            return StepBudget(backlog, f"{BACKLOG}: {self._backlog} hopeless prompt tokens wait, more than {reason} allows")
        return StepBudget(n, reason + (" (floor)" if n == floor else ""), limit)

    def _infeasible_budget(self, shape: StepShape, start: int, tokens_left: int, detail: str, now: float,
                           need: Callable[[float], float] | None) -> StepBudget:
        """The budget when the decodes alone exceed the step's ITL limit (`detail`): the fewest
        tokens that cover the queue's need (or the backlog's rate), the whole budget without a
        known need (fcfs's)."""
        self.feasibility.observe(ITL_INFEASIBLE, detail, now)
        if need is None:
            return StepBudget(tokens_left, f"{ITL_INFEASIBLE}: {detail} (throughput)")
        rate = need(DRAIN_DEADLINE_SHARE)
        n = max(self._drain_tokens(shape, start, tokens_left, rate), self._backlog_tokens(shape, start, tokens_left))
        return StepBudget(n, f"{ITL_INFEASIBLE}: {detail} (drain: the queue needs {rate:.0f} tok/s)")

    def _backlog_tokens(self, shape: StepShape, start: int, tokens_left: int) -> int:
        """With hopeless requests waiting (a backlog no target can save, which fcfs would be
        draining at its full budget), the fewest prefill tokens whose predicted rate is
        BACKLOG_RATE_SHARE of the step's best (`_best_rate_tokens`, up to the backlog): past
        saturation the decodes' ITL may not cost the queue its throughput, only the step's fixed
        cost is spared; 0 without a backlog."""
        if not self._backlog or tokens_left <= MIN_PREFILL_TOKENS:
            return 0
        cap = min(tokens_left, max(self._backlog, MIN_PREFILL_TOKENS))
        peak = self._best_rate_tokens(shape, start, MIN_PREFILL_TOKENS, cap)
        best = self._chunk_rate(shape, start, peak)
        return self._fewest_at_rate(shape, start, MIN_PREFILL_TOKENS, peak, BACKLOG_RATE_SHARE * best)

    def _drain_tokens(self, shape: StepShape, start: int, tokens_left: int, need: float) -> int:
        """The fewest prefill tokens (at least the floor) whose predicted rate, tokens per second
        of the step they make, covers DRAIN_SAFETY x `need`; when none does, the chunk with the
        best rate (`_best_rate_tokens`), which is not the whole budget where a long chunk's
        attention costs more than the step's fixed cost it shares (a small model on a CPU: a
        2,048-token chunk ran at 0.6-0.8x a 524-token chunk's rate)."""
        floor = min(tokens_left, MIN_PREFILL_TOKENS)
        if floor >= tokens_left:
            return tokens_left
        want = DRAIN_SAFETY * need
        hi = tokens_left
        if self._chunk_rate(shape, start, hi) < want:     # the rate rises, then may fall: search below its peak
            hi = self._best_rate_tokens(shape, start, floor, tokens_left)
            if self._chunk_rate(shape, start, hi) < want:
                return hi
        return self._fewest_at_rate(shape, start, floor, hi, want)

    def _drain_step(self, shape: StepShape, head: Request, n: int, most: int, limit: float,
                    target: float) -> tuple[int, float]:
        """The prefill tokens and the time limit of a drain past a decode's ITL budget of `n`
        tokens: as many of the `most` it could take (the queued prompt tokens, up to the budget)
        as a step of at most DRAIN_GAP_SHARE x the tightest ITL `target` (planned, with its
        margin) holds, or as the step that finishes `head`'s prompt where that is longer. The
        drain is for the head: it finishes that prompt and the others wait a step. Its gap breaks
        the stream's target at any length, but a stream that missed is still read (why:
        docs/measurements/slo-overload.md)."""
        rest = min(most, max(head.num_tokens - head.num_computed_tokens, 1))
        finish = self.cost_model.predict_step_s(shape.with_chunk(rest, head.num_computed_tokens))
        cap = max(limit, DRAIN_GAP_SHARE * target, finish)
        tokens = largest_where(n, max(n, most), lambda m: self._budget_step_s(shape, head, m) <= cap)
        return tokens, cap

    def _itl_stands(self, shape: StepShape, head: Request, n: int, drain_n: int, decodes: list[Request],
                    now: float, saves: Callable[[float, float], int] | None) -> str | None:
        """Why a decode's ITL budget of `n` prefill tokens stands against a drain of `drain_n`
        (`_drain_step`), or None where the drain goes ahead. The drain's one long step costs each
        running stream that can still meet its targets (`itl_tail.missed`) but cannot take that gap
        within its 99th-percentile target (`itl_tail.absorbs`); it pays in the queued prompts
        that make their TTFT at the drain's rate and not at the ITL chunk's (`saves`, None: none
        counted). It goes ahead where it saves more than it costs, or past saturation (throughput
        first): the chunk prefills below ITL_RATE_SHARE of the best rate the step could have and
        more hopeless prompt tokens wait than that rate clears in BACKLOG_BURST_S."""
        rate = self._budget_rate(shape, head, n)
        best = self._best_budget_rate(shape, head, drain_n)
        if rate < ITL_RATE_SHARE * best and self._backlog > BACKLOG_BURST_S * best:
            return None
        drain_rate = self._budget_rate(shape, head, drain_n)
        step_s = drain_n / drain_rate / BUDGET_SAFETY
        costs = 0
        for r in decodes:
            since = now - r.metrics.token_times[-1] if r.metrics.token_times else 0.0
            costs += not missed(r, now) and not absorbs(r, since + step_s)
        saved = 0 if saves is None else saves(rate, drain_rate)
        if saved > costs or (saved == costs and rate < ITL_RATE_SHARE * best):
            return None
        return f"a drain would meet {saved} more TTFTs and break {costs} streams' ITL"

    def _budget_rate(self, shape: StepShape, head: Request, n: int) -> float:
        """Predicted prefill tokens per second of the step `shape` plus `n` prompt tokens as the
        scheduler fills them: the rest of `head`'s prompt first, what is left of `n` as the next
        prompt's first chunk (position 0), not one chunk at the head's position (whose attention
        would be priced as if the head's prompt went on)."""
        return n / self._budget_step_s(shape, head, n)

    def _budget_step_s(self, shape: StepShape, head: Request, n: int) -> float:
        """Predicted seconds of the step `shape` plus `n` prompt tokens as the scheduler fills
        them (`_budget_rate`)."""
        start = head.num_computed_tokens
        first = min(n, max(head.num_tokens - start, 0))
        return self.cost_model.predict_step_s(shape.with_chunk(first, start).with_chunk(n - first, 0))

    def _best_budget_rate(self, shape: StepShape, head: Request, tokens_left: int) -> float:
        """The best predicted prefill rate this step could have: the whole budget as the scheduler
        fills it (`_budget_rate`) or the rest of `head`'s prompt cut at its best-rate chunk."""
        start = head.num_computed_tokens
        rest = min(tokens_left, max(head.num_tokens - start, 1))
        peak = self._best_rate_tokens(shape, start, min(rest, MIN_PREFILL_TOKENS), rest)
        return max(self._budget_rate(shape, head, tokens_left), self._chunk_rate(shape, start, peak))

    def _step_bound(self, decodes: list[Request], head_slack: float,
                    now: float) -> tuple[float, str | None, StepShape, float, float]:
        """The longest step allowed, whose ITL target set it (None: the arrival limit), the
        decodes' shape, the arrival limit (`_arrival_limit`) and the tightest whole gap target
        (`_gap_target`; not what is left of it: one late step does not make a target infeasible),
        or the arrival limit where that is tighter (inf when neither binds)."""
        bound, owner, tightest = _INF, None, _INF
        shape = StepShape()
        for r in decodes:
            shape = shape.with_decode(r.num_tokens)
            target = _gap_target(r, now)
            if target is None:
                continue
            tightest = min(tightest, target)
            gap = self._allowed_gap(r, now, head_slack, target)
            if gap < bound:
                bound, owner = gap, r.request_id
        arrival = self._arrival_limit(shape)
        if arrival < bound:
            bound, owner = arrival, None
        return bound, owner, shape, arrival, min(tightest, arrival)

    def _arrival_limit(self, shape: StepShape) -> float:
        """The longest step a request arriving with the tightest configured TTFT `T` can wait out:
        ARRIVAL_SHARE x T, or less where its own first step (a typical prompt of its class,
        `QueueFlow.typical_prompt`, beside `shape`'s decodes) leaves less of BUDGET_SAFETY x T to
        wait; none (inf) where that leaves under ARRIVAL_WAIT_FLOOR x T: no step short enough to
        protect the arrival is worth its cost to the prompt being chunked (on a slow CPU a chat's
        own prefill takes most of its TTFT, and the limit chunked a batch prompt into 0.45 s
        steps at a fraction of its rate while a chat arriving mid-step missed anyway)."""
        ttft = self.arrival_ttft_s
        if ttft is None:
            return _INF
        limit = ARRIVAL_SHARE * ttft
        typical = self.flow.typical_prompt(ttft)
        if typical:
            wait = BUDGET_SAFETY * ttft - self.cost_model.predict_step_s(shape.with_chunk(typical, 0))
            if wait < ARRIVAL_WAIT_FLOOR * ttft:
                return _INF
            limit = min(limit, wait)
        return limit

    @staticmethod
    def _tightest_target(decodes: list[Request], arrival: float) -> float:
        """The tightest whole ITL target among `decodes` as configured (a stream that missed
        counted at its own, not at its looser gap target), or the `arrival` limit when that is tighter."""
        return min([arrival, *(r.slo.itl_target for r in decodes if r.slo is not None and r.slo.itl_target is not None)])

    @staticmethod
    def _allowed_gap(r: Request, now: float, head_slack: float, target: float) -> float:
        """The longest step `r` tolerates now: its gap `target` (`_gap_target`) minus the time since
        its last token; a TPOT-only decode yields up to its TPOT slack to a prefill about to miss TTFT."""
        slo = r.slo
        assert slo is not None
        times = r.metrics.token_times
        last = times[-1] if times else now
        gap = target - (now - last)
        if slo.itl is None and slo.tpot is not None and 0 <= head_slack <= 2 * slo.tpot and times:
            first = r.metrics.first_token_time or times[0]
            gap = max(gap, first + slo.tpot * len(times) - now)
        return max(gap, 0.0)


def _gap_target(r: Request, now: float) -> float | None:
    """The gap a decode's step bound keeps: its ITL target, or MISSED_GAP_SHARE x it once `r` has
    missed a target it cannot make up (`itl_tail.missed`: its TTFT, or a 99th-percentile gap
    already past its ITL target): no goodput is left to protect there, only a stream still read.
    Bound by the target, a lost chat held every step of a long prompt to ~150 ms on the AVX2
    machine, at 0.6x the prefill rate fcfs's long steps had. None without an ITL target."""
    target = None if r.slo is None else r.slo.itl_target
    if target is None:
        return None
    return MISSED_GAP_SHARE * target if missed(r, now) else target
