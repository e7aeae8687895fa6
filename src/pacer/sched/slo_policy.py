"""The `slo` scheduling policy: order by slack, budget by ITL, hopeless handling. Pure Python.

Each request carries its targets (`Request.slo`, resolved by the engine from its class and
its own). With a `StepCostModel` the policy predicts a request's remaining prefill time and:

- **orders** waiting and partially prefilled requests (together: a newcomer due sooner takes
  the step's prefill share before a long prompt already started) by when their first token is
  due, the TTFT deadline (earliest due first, EDF: static between re-keys). A request without
  a TTFT target but with an e2e one is due at its e2e deadline less its predicted decode; one
  without targets comes last (aging still bounds its wait); a preempted request that already
  streamed tokens is due at its next token's deadline. Its latest start, the deadline minus
  its predicted remaining prefill (the prefix the cache holds for it not counted), is what
  judges it hopeless. Not least slack first (the order before): on the AVX2 machine past
  saturation an agent prompt (1,045 tokens, due 3 s after arrival) had less slack than a chat
  arriving 0.4 s later (due in 1 s), so the chat was put behind its whole prefill and refused
  at admission (predicted TTFT 2.41 s), where another run of the same trace served it in
  0.5 s; for the requests waiting, EDF's order meets every deadline that any order meets
  (Jackson's rule), least slack's does not.
- **deprioritises hopeless** requests: one whose latest start has passed goes behind every
  request that can still make it (the queue serves from the first feasible key), or, with
  `shed_hopeless`, is refused before it costs anything (`shed`: the scheduler finishes it as
  shed). Behind, but not idle: when the feasible queue has slack to spare (each of its
  requests could start later than the prefill ahead of it makes it start), the most overdue
  hopeless request whose prefill fits twice in that spare goes first (slack stealing, `head_index`):
  a missed chat still gets its answer soon, and no feasible request is made late by it. Without
  it, past saturation every short hopeless prompt waited behind every long feasible one, and
  chat TTFT p50 fell behind fcfs's.
- **answers short prompts in short steps**: a step that gives a prompt its first token adds
  other requests' chunks only up to FIRST_TOKEN_SHARE of that prompt's TTFT (the first-token
  limit, `chunk_fitter`; a request that could not wait one more step is exempt), and a short
  prompt with a TTFT target goes before a longer partial prefill that has twice its prefill in
  slack to spare, or none to save (`serves_before`). Past saturation on the AVX2 stand-in a
  2,048-token step ran 2.5-3 s, and five 100-token chats that shared one with a rag prompt
  waited all of it (chat TTFT p50 3.6 s against fcfs's 0.9 s).
- **refuses at admission what the queue already makes late** (`admission_margin`): a new
  request whose predicted TTFT, the time it has waited plus the prefill of every feasible
  request due before it and its own, exceeds `admission_margin` times its TTFT
  target is shed at once (HTTP 429 `slo_unattainable`), so the requests admitted can still
  meet theirs (the seeds: at a QPS spike, turn the late ones away). That prefill is priced
  by the cost model alone (a lower bound: decodes share every step) or, once the queue has
  been backlogged for a while, at the prefill rate measured over that backlog
  (pacer.sched.queue_flow), whichever is longer.
  The regime (`ttft infeasible`) is logged once per change, as the ITL one, and left only after
  REGIME_HOLD_S without a refusal (not a flip back and forth per arrival).
- **budgets each step by ITL** (`step_limit`, from `prefill_budget`; pacer.sched.slo_budget, mixed in): the most prefill tokens that keep the
  predicted step within the tightest inter-token target among the step's decodes (minus the
  time since their last token), never above `max_num_batched_tokens` and never below
  `MIN_PREFILL_TOKENS`, so prefill always progresses. A decode whose only target is TPOT may
  stretch to its remaining TPOT slack when a prefill is about to miss its TTFT. A step is
  also kept within ARRIVAL_SHARE of the tightest TTFT target configured (`arrival_ttft_s`):
  a request arriving while a long prompt prefills waits at most one step, so it keeps the
  rest of its TTFT for its own prefill (less where a typical prompt of its class needs more;
  none where too little is left to protect: `_arrival_limit`). The plan keeps a margin for prediction noise: the
  larger of BUDGET_SAFETY and the cost model's `upper_ratio()`, learned from the measured
  steps (on this CPU a mixed step ran over its prediction by 18% one time in twenty, by 33%
  one time in a hundred). Each chunk added to a step after the budget is priced with the step
  as built (`fit_chunk`): several rows cost more than one chunk of the same size.
- **stops chasing an unreachable ITL** (pacer.sched.feasibility): when the step's decodes
  alone are predicted past the limit, no prefill budget meets it. The step then takes the
  smallest prefill share whose predicted prefill rate (tokens per second of step) meets the
  queue's need: the recent arrival rate of prompt tokens plus, for every waiting or partial
  request in due order that can still make it, the tokens up to it over half the time left
  to its TTFT deadline (`drain_need`: step times are noisy, so aim early), never below MIN_PREFILL_TOKENS; the best-rate chunk when no
  share meets it. So the queue drains as fast as a step can drain it whenever that is needed,
  and otherwise the decodes get short steps (`budget_reason` "itl infeasible: ..."); a regime
  change is logged once. The same need is the floor of a feasible ITL budget: an ITL target
  never starves the queue's TTFTs (`budget_reason` "ttft drain: ..."), since a missed TTFT
  fails a request whole and a long step only stretches one gap (so such a step finishes the
  head's prompt, and adds others up to twice the tightest ITL target: one missed gap, made the
  most of, and still a gap a user reads). It is taken where it meets more queued
  TTFTs than it breaks running streams (a stream whose 99th-percentile gap absorbs the step,
  pacer.sched.itl_tail, or that already missed a target, is not broken), as many where it
  prefills more than 1 / ITL_RATE_SHARE times faster than the ITL's chunk, or where it is that
  much faster and a hopeless backlog waits that the best rate needs over BACKLOG_BURST_S to clear.
- **preempts the running request with the most slack** (`victim_key`), when KV runs out and
  when seats (`max_num_seqs`) or KV hold back a waiting request that can still meet its
  target and has PREEMPT_MARGIN_S less slack (`outranks`): under load, seats held by long
  decodes with loose targets (batch e2e, a stream whose only target was its TTFT) are what
  make short requests miss, and a recompute preemption keeps the victim's full blocks in the
  prefix cache, so its resume is cheap. Never for a step's token share.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable

from pacer.request import Request
from pacer.sched.feasibility import FEASIBLE, REGIME_HOLD_S, TTFT_INFEASIBLE, FeasibilityTracker
from pacer.sched.policy import DEFAULT_MAX_QUEUE_DELAY_S, Key, Policy, PolicyContext, WaitingQueue
from pacer.sched.queue_flow import QueueFlow
from pacer.sched.reasoning import predicted_output_tokens
from pacer.sched.slo_budget import (  # noqa: F401  (the budget's names, re-exported with the policy)
    ARRIVAL_SHARE,
    BACKLOG_RATE_SHARE,
    BUDGET_SAFETY,
    DRAIN_DEADLINE_SHARE,
    DRAIN_SAFETY,
    FIRST_TOKEN_SHARE,
    MIN_PREFILL_TOKENS,
    SloBudget,
    StepBudget,
)
from pacer.sched.step_cost import StepCostModel, StepShape

__all__ = ["SloPolicy", "StepBudget", "MIN_PREFILL_TOKENS", "BUDGET_SAFETY", "ARRIVAL_SHARE", "DRAIN_SAFETY",
           "DRAIN_DEADLINE_SHARE", "BACKLOG_RATE_SHARE", "FIRST_TOKEN_SHARE"]

PREEMPT_MARGIN_S = 1.0    # slack a victim must have beyond the waiting request's (no thrash)
STEAL_SAFETY = 2.0        # a hopeless request goes first when twice its prefill fits in the queue's spare slack
STEAL_SCAN = 64           # feasible requests the spare slack is judged over
RECOMPUTE_SLACK_SHARE = 0.25   # of a request's TTFT slack, what recomputing more of a reused segment may spend
_INF = math.inf


def planned_step(tightest_itl: float | None, tightest_ttft: float | None) -> float | None:
    """The longest step the slo policy plans while the configured targets bind: the tightest
    inter-token target, else ARRIVAL_SHARE of the tightest TTFT (the arrival limit); None without
    either. A decode's expected time per token under load (`SloPolicy.decode_step_s`)."""
    if tightest_itl is not None:
        return tightest_itl
    return None if tightest_ttft is None else ARRIVAL_SHARE * tightest_ttft


class SloPolicy(SloBudget, Policy):
    name = "slo"
    preempts_for_waiting = True      # seats or KV, for a request with less slack (see outranks)
    preempts_for_budget = False      # never for a step's token share
    default_max_queue_delay = DEFAULT_MAX_QUEUE_DELAY_S

    def __init__(self, cost_model: StepCostModel, max_num_batched_tokens: int, prefill_chunk: int,
                 cached_prefix_tokens: Callable[[Request], int] | None = None,
                 arrival_ttft_s: float | None = None, shed_hopeless: bool = False,
                 admission_margin: float = 0.0, planned_step_s: float | None = None) -> None:
        if admission_margin < 0 or not math.isfinite(admission_margin):
            raise ValueError(f"admission_margin must be >= 0 (0: off), got {admission_margin!r}")
        self.cost_model = cost_model
        self.arrival_ttft_s = arrival_ttft_s   # tightest TTFT of the configured classes (None: no cap)
        self.cached_prefix_tokens = cached_prefix_tokens
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_chunk = max(1, prefill_chunk)
        self.shed_hopeless = shed_hopeless
        self.admission_margin = admission_margin
        self.planned_step_s = planned_step_s   # the longest step planned while targets bind (None: no cap)
        self.feasibility = FeasibilityTracker(hold_s=REGIME_HOLD_S)
        self.admission = FeasibilityTracker("ttft", hold_s=REGIME_HOLD_S)
        self._admitted_seq = -1   # arrivals up to this arrival_seq have had their admission check
        self.flow = QueueFlow()   # the measured arrival and prefill rates
        self._now = -_INF
        self._backlog = 0   # prompt tokens of the hopeless requests waiting (refresh)
        self._rate: float | None = None   # the measured prefill rate, fixed for a step (refresh)

    @classmethod
    def from_context(cls, context: PolicyContext | None) -> Policy:
        if context is None or context.cost_model is None:
            raise ValueError("scheduling_policy='slo' needs a step cost model (cost_model=...; the Engine "
                             "builds one from `pacer sim calibrate`'s fit or the simulator's profile)")
        slo_set = context.slo_set
        ttft = None if slo_set is None else slo_set.tightest_ttft()
        itl = None if slo_set is None else slo_set.tightest_itl()
        return cls(context.cost_model, context.max_num_batched_tokens, context.prefill_chunk,
                   context.cached_prefix_tokens, arrival_ttft_s=ttft, shed_hopeless=context.shed_hopeless,
                   admission_margin=context.admission_margin, planned_step_s=planned_step(itl, ttft))

    # ---------------------------------------------------------------- predictions

    def prefill_s(self, r: Request) -> float:
        """Predicted seconds to compute the request's remaining prompt, past the prefix the cache
        holds for it now (looked up, not taken; remembered per progress)."""
        done, end = r.num_computed_tokens, r.num_tokens     # a resume after recompute also redoes its output
        cached = r.policy_state
        if cached is not None and cached[:2] == (done, end):
            return float(cached[2])
        start = done
        if not done and self.cached_prefix_tokens is not None:
            start = min(self.cached_prefix_tokens(r), end - 1)
        left, total = end - start, 0.0
        while left > 0:
            n = min(left, self.prefill_chunk)
            total += self.cost_model.predict_step_s(StepShape().with_chunk(n, start, sample=n == left))
            left -= n
            start += n
        r.policy_state = (done, end, total)
        return total

    def decode_step_s(self, r: Request) -> float:
        """Per-token time a request can expect under load: a half-budget mixed step, no longer than
        the steps this policy plans (`planned_step_s`; uncapped, the AVX2 machine's 1.5 s made a
        512-token batch job with 120 s hopeless on arrival, done 21-23 s after it in the run)."""
        decode = StepShape().with_decode(r.num_tokens)
        half = max(2, self.max_num_batched_tokens // 2)
        mixed = self.cost_model.predict_step_s(decode.with_chunk(half, 0))
        if self.planned_step_s is None:
            return mixed
        return max(self.cost_model.predict_step_s(decode), min(mixed, self.planned_step_s))

    def latest_start(self, r: Request) -> float:
        """The latest time its remaining prefill may start and still meet TTFT (or e2e)."""
        if r.num_output_tokens:                # resumed after preemption: its next token's deadline
            return self.next_deadline(r) - self.prefill_s(r)
        slo = r.slo
        if slo is None:
            return _INF
        if slo.ttft is not None:
            return r.arrival_time + slo.ttft - self.prefill_s(r)
        if slo.e2e is not None:
            decode = self.decode_step_s(r) * max(0, predicted_output_tokens(r.sampling_params) - 1)
            return r.arrival_time + slo.e2e - self.prefill_s(r) - decode
        return _INF

    def next_deadline(self, r: Request) -> float:
        """When the running request next needs progress to keep its targets (slack + now)."""
        if not r.num_output_tokens:
            return self.latest_start(r)
        slo = r.slo
        if slo is None:
            return _INF
        last = r.metrics.token_times[-1] if r.metrics.token_times else r.arrival_time
        itl = slo.itl_target
        if itl is not None:
            return last + itl
        if slo.e2e is not None:
            left = max(0, predicted_output_tokens(r.sampling_params) - r.num_output_tokens)
            return r.arrival_time + slo.e2e - self.decode_step_s(r) * left
        return _INF

    def recompute_allowance(self, r: Request, now: float) -> int:
        """A share (`RECOMPUTE_SLACK_SHARE`) of the request's TTFT slack, in prompt tokens at its
        predicted prefill rate (that rate ignores the reuse, so the allowance errs low)."""
        left = r.num_tokens - r.num_computed_tokens
        if r.slo is None or r.num_output_tokens or left <= 0:
            return 0
        slack, per_token = self.latest_start(r) - now, self.prefill_s(r) / left
        if not slack > 0 or not per_token > 0 or not math.isfinite(slack):
            return 0
        return int(RECOMPUTE_SLACK_SHARE * slack / per_token)

    # ---------------------------------------------------------------- ordering

    def key(self, r: Request) -> Key:
        return (self.first_token_due(r), r.arrival_time, r.arrival_seq)

    def first_token_due(self, r: Request) -> float:
        """When its next token is due to meet its targets: its latest start plus its own predicted
        prefill (the TTFT deadline; an e2e-only request's less its predicted decode; a resume's
        next token's deadline). The queue's order, earliest first."""
        start = self.latest_start(r)
        return start + self.prefill_s(r) if math.isfinite(start) else start

    def victim_key(self, r: Request) -> Key:
        return (self.next_deadline(r), r.arrival_time, r.arrival_seq)

    def is_hopeless(self, r: Request, now: float) -> bool:
        """Never scheduled yet and cannot make its target even if served now: by the cost model
        (its latest start has passed) or, while the queue is backlogged, by its own prompt at the
        measured prefill rate (the cost model prices a step without the decodes that share it)."""
        if r.num_output_tokens:
            return False
        if self.latest_start(r) < now:
            return True
        ttft = None if r.slo is None else r.slo.ttft
        rate = self._rate   # a step's snapshot: the queue's head may not change between peek and pop
        if ttft is None or not rate:
            return False
        return r.arrival_time + ttft - (r.num_tokens - r.num_computed_tokens) / rate < now

    def shed(self, waiting: Iterable[Request], now: float) -> list[Request]:
        """The never-scheduled requests to refuse now: with `shed_hopeless`, those with a target
        that can no longer meet it; with `admission_margin`, new arrivals the queue makes late."""
        out = []
        if self.shed_hopeless:
            out = [r for r in waiting if r.slo is not None and r.metrics.first_scheduled_time is None
                   and self.is_hopeless(r, now)]
        if self.admission_margin > 0:
            out += self.refuse_late_arrivals(waiting, now, {r.request_id for r in out})
        return out

    def refuse_late_arrivals(self, waiting: Iterable[Request], now: float, skip: set[str]) -> list[Request]:
        """Arrivals since the last call (in queue order) whose predicted TTFT, waited so far plus
        the predicted prefill ahead of them (feasible requests only: hopeless ones go behind)
        and their own, exceeds `admission_margin` times their TTFT target."""
        refused: list[Request] = []
        checked, newest = self._admitted_seq, self._admitted_seq
        ahead, tokens, rate = 0.0, 0, self.flow.prefill_rate()
        for r in waiting:
            newest = max(newest, r.arrival_seq)
            if r.request_id in skip or r.num_output_tokens or (r.slo is not None and self.is_hopeless(r, now)):
                continue   # refused already, a resume, or behind every feasible request
            own = r.num_tokens - r.num_computed_tokens
            ahead += self.prefill_s(r)
            tokens += own
            ttft = None if r.slo is None else r.slo.ttft
            if r.arrival_seq <= checked or ttft is None or r.metrics.first_scheduled_time is not None:
                continue
            predicted = now - r.arrival_time + max(ahead, tokens / rate if rate else 0.0)
            if predicted > self.admission_margin * ttft:
                refused.append(r)
                ahead -= self.prefill_s(r)
                tokens -= own
                self.admission.observe(TTFT_INFEASIBLE, f"predicted ttft {predicted:.2f}s > "
                                       f"{self.admission_margin:g} x {ttft:g}s of {r.request_id}", now)
            else:
                self.admission.observe(FEASIBLE, now=now)
        self._admitted_seq = newest
        return refused

    def head_index(self, items: list[tuple[Key, Request]], now: float) -> int:
        """Earliest due among those that can still make it, an overdue resume (owed its next
        token) first; a hopeless one when nothing feasible waits, or when its prefill fits in the
        slack the feasible queue has to spare (`spare_s`): the most overdue that fits, served
        before the feasible ones without making any of them late (slack stealing)."""
        if not items:
            return 0
        i = bisect_left(items, now, key=lambda item: item[0][0])
        for j in range(i):
            if items[j][1].num_output_tokens:
                return j
        first = i   # the first feasible: past those already late by the cost model or at the
        while first < min(len(items), i + STEAL_SCAN) and self.is_hopeless(items[first][1], now):
            first += 1   # measured rate though not yet due (a bounded look)
        if first == len(items):
            return 0
        if first == 0:
            return first
        spare = self.spare_s(items, first, now)
        for j in range(first):
            if self.fits_in_spare(items[j][1], spare):
                return j
        return first

    def fits_in_spare(self, r: Request, spare: float) -> bool:
        """Whether `r` may go before requests that have `spare` seconds of slack to give
        (STEAL_SAFETY times its queued prefill fits in it)."""
        return STEAL_SAFETY * self.queued_prefill_s(r) <= spare

    def spare_s(self, items: list[tuple[Key, Request]], first: int, now: float) -> float:
        """Seconds of prefill the feasible queue (`items[first:]`, in deadline order) can let pass
        before its first request and every one after still meet its deadline (EDF's test): the
        least over the first STEAL_SCAN of due - now - the predicted prefill up to and including
        its own."""
        spare, ahead = _INF, 0.0
        for key, r in items[first:first + STEAL_SCAN]:
            if not math.isfinite(key[0]):
                break
            ahead += self.queued_prefill_s(r)
            spare = min(spare, key[0] - now - ahead)
        return spare

    def queued_prefill_s(self, r: Request) -> float:
        """A waiting request's prefill as the queue will see it: the cost model's prediction or,
        while the queue is backlogged, its tokens at the measured prefill rate, the longer."""
        rate = self._rate
        own = self.prefill_s(r)
        return max(own, (r.num_tokens - r.num_computed_tokens) / rate) if rate else own

    def serves_before(self, waiting: Request, partial: Request) -> bool:
        """By when they are due, among those that can still make it; and a shorter prompt with a TTFT target
        whose prefill fits twice in the partial one's slack (or the partial one cannot make it
        anyway): its first token then comes with a short step (the first-token limit caps the
        partial prompt's chunk after it), not after the long prompt's chunk."""
        now = self._now
        if not self.is_hopeless(waiting, now) and self.key(waiting) < self.key(partial):
            return True
        if waiting.slo is None or waiting.slo.ttft is None or waiting.num_output_tokens:
            return False
        if waiting.num_tokens - waiting.num_computed_tokens >= partial.num_tokens - partial.num_computed_tokens:
            return False
        spare = self.latest_start(partial) - now
        return spare < 0 or self.fits_in_spare(waiting, spare)

    def outranks(self, a: Request, b: Request) -> bool:
        """Whether waiting `a` may preempt running `b` (when seats or KV hold `a` back): `a` can
        still meet its target and `b` has PREEMPT_MARGIN_S more slack (its recompute included)."""
        now = self._now
        if self.is_hopeless(a, now):
            return False
        a_slack = self.latest_start(a) - now
        b_slack = self.next_deadline(b) - now
        if not math.isfinite(a_slack) or a_slack < -PREEMPT_MARGIN_S:
            return False
        return b_slack > a_slack + PREEMPT_MARGIN_S + self.prefill_s(b)

    def refresh(self, queue: WaitingQueue, now: float) -> None:
        self._now = now
        self.flow.note(queue, queue.num_ready > 0, now)
        self._rate = self.flow.prefill_rate()
        self._backlog = 0
        for r in queue:
            if r.slo is not None and self.is_hopeless(r, now):
                r.metrics.deprioritized = True
                self._backlog += r.num_tokens - r.num_computed_tokens
            elif r.metrics.slack_at_admission is None and r.slo is not None:
                ls = self.latest_start(r)
                if math.isfinite(ls):
                    r.metrics.slack_at_admission = ls - now

    def account(self, r: Request, num_prefill: int, num_cached: int, num_decode: int) -> None:
        self.flow.account_prefill(num_prefill)
