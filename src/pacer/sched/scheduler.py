"""Iteration-level scheduler: who runs this step, with how many tokens. Pure Python.

One token rule: a request's `num_computed_tokens` catches up with its `num_tokens` under
the step's token budget. A prefill chunk, a decode token and recompute after preemption
are all "schedule min(remaining, budget) tokens".

With chunked prefill (default) a step is: running decodes first, then running partial
prefills, then new requests from the waiting queue, while the budget admits them. Without
it (classic), a step either prefills whole waiting prompts or decodes the running ones.

When KV blocks run out the request with the largest policy key (lowest priority, latest
arrival) is preempted by recompute: it frees its blocks (leaving its computed ones in the
prefix cache, where its resume may hit them) and goes back to the waiting queue at its
place. With preemption_mode="swap" its blocks go to the KV manager's CPU tier instead and
come back on resume (recompute when the tier is full). A waiting request the policy says
`outranks` the worst running one preempts it when max_num_seqs or KV is what holds it back
(even one already picked for this step: its share of the budget is handed back).

The scheduler names no policy: it calls the policy's hooks (pacer.sched.policy), each a no-op
by default. Before a step the policy may `shed` waiting requests (finished as shed); once the
decodes are in it may cap the rest of the step (`step_limit`) and serve newcomers ahead of
the partial prefills (`serves_before`). The `slo` policy (pacer.sched.slo_policy) uses all
three. Every policy ages: see `WaitingQueue`.

Structured outputs go through the scheduler too (pacer.sched.structured): a WAITING_FOR_GRAMMAR
request keeps its place in the queue but is never admitted (no seat, no KV, never a victim)
and blocks no one behind it; `schedule()` makes it ready when its compile finishes (or
finishes it with the compile's error) and starts the step's masks; `update_from_output()`
advances the matchers. A reasoning model's grammar starts after its thinking, and a spent
`thinking_token_budget` forces the end of thinking (pacer.sched.reasoning).
"""

from __future__ import annotations

from pacer.clock import Clock
from pacer.config import SchedulerConfig
from pacer.kv.manager import KVCacheManager
from pacer.request import FinishReason, Request, RequestStatus, check_context_length
from pacer.sched.contract import ModelOutput, SchedulerOutput
from pacer.sched.dedup import InflightPrefills
from pacer.sched.fair_policy import ledger_from
from pacer.sched.policy import PolicyContext, RunningOrder, WaitingQueue
from pacer.sched.policy_factory import make_policy
from pacer.sched.preemption import allocate_or_preempt, make_room_for
from pacer.sched.reasoning import ReasoningTracker
from pacer.sched.segments import SegmentPlanner
from pacer.sched.spec import SpecDecoder
from pacer.sched.step_cost import StepCostModel
from pacer.sched.step_plan import Budget, StepPlan
from pacer.sched.step_results import apply_results, drop_output_tail
from pacer.sched.step_rows import SamplingIds, build_rows
from pacer.sched.structured import GrammarCompile, NullStructuredOutputs, StructuredOutputs

__all__ = ["Scheduler"]


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, clock: Clock,
                 cost_model: StepCostModel | None = None, structured: StructuredOutputs | None = None) -> None:
        if config.max_num_batched_tokens is None or config.max_model_len is None:
            raise ValueError("Scheduler needs a resolved SchedulerConfig (call config.resolved(model_max_len))")
        self.config = config
        self.max_num_batched_tokens: int = config.max_num_batched_tokens
        self.max_model_len: int = config.max_model_len
        self.kv = kv
        self.clock = clock
        cap = config.long_prefill_token_threshold
        self._prefill_cap: int = cap if cap is not None and config.enable_chunked_prefill else self.max_num_batched_tokens
        self.policy = make_policy(config.scheduling_policy, PolicyContext(
            max_num_batched_tokens=self.max_num_batched_tokens, prefill_chunk=self._prefill_cap,
            cached_prefix_tokens=kv.cached_prefix_tokens, cost_model=cost_model, slo_set=config.slo_set(),
            shed_hopeless=config.shed_hopeless, admission_margin=config.slo_admission_margin,
            fair=config.fair_settings()))
        # service per tenant (pacer.sched.fair_share): the fair policies' own ledger, else one kept for reports
        own = self.policy.service_ledger()
        self.ledger = own if own is not None else ledger_from(config.fair_settings())
        self._charge_ledger = own is None
        self.structured: StructuredOutputs = NullStructuredOutputs() if structured is None else structured
        self.dedup = InflightPrefills(kv.block_size, kv.cache_owner, kv.cache_owners, kv.exact_tokens) \
            if config.prefill_dedup and kv.prefix_caching else None
        self.segments = SegmentPlanner(kv, kv.segments.recompute, self.policy, clock)   # segment reuse
        self.reasoning = ReasoningTracker()   # the engine installs the model's think tags (--reasoning-parser)
        delay = config.max_queue_delay if config.max_queue_delay is not None else self.policy.default_max_queue_delay
        self.waiting = WaitingQueue(self.policy, delay)
        self._shed_since_step: list[str] = []
        self._grammar_failures: list[tuple[str, str]] = []
        self.running: list[Request] = []
        self._running_order = RunningOrder()
        self.requests: dict[str, Request] = {}
        self._stop_floor: dict[str, int] = {}   # request id -> its first_possible_stop (stop_on is skipped below it)
        self._finished_since_step: list[str] = []
        self._step_id = 0
        self.num_preemptions = 0
        self.num_swap_preemptions = 0   # of num_preemptions, those by swap (the rest recompute)
        spec = config.speculative()
        self.spec = None if spec is None else SpecDecoder(spec, config.speculative_policy, cost_model)

    def install_structured_outputs(self, structured: StructuredOutputs) -> StructuredOutputs:
        """Serve constrained requests with `structured` from now on; returns the runtime it
        replaces (the caller closes it). Refused while requests wait for the current one's grammars."""
        if self.num_waiting_for_grammar:
            raise RuntimeError("requests are waiting for grammars of the current structured-outputs runtime")
        replaced, self.structured = self.structured, structured
        return replaced

    # ------------------------------------------------------------------ admission / exit

    def add_request(self, req: Request, ready: bool = True) -> None:
        """Queue a validated request. Raises ContextLengthError if it can never fit. `ready=False`:
        WAITING_FOR_GRAMMAR until `mark_ready`, queued and counted but never admitted."""
        if req.request_id in self.requests:
            raise ValueError(f"request_id {req.request_id!r} is already in use")
        check_context_length(req.num_prompt_tokens, req.sampling_params.max_tokens, self.max_model_len,
                             self.kv.capacity_tokens)
        self.requests[req.request_id] = req
        self._stop_floor[req.request_id] = req.first_possible_stop(self.max_model_len)
        self.reasoning.add(req)
        req.status = RequestStatus.WAITING if ready else RequestStatus.WAITING_FOR_GRAMMAR
        self.waiting.add(req, ready)

    def add_waiting_for_grammar(self, req: Request, compile: GrammarCompile) -> None:
        """Queue a constrained request as WAITING_FOR_GRAMMAR until `compile` (from
        `structured.request`) finishes: `schedule()` then makes it ready or fails it."""
        self.add_request(req, ready=False)
        self.structured.add_pending(req.request_id, compile)

    def mark_ready(self, request_id: str) -> Request | None:
        """A WAITING_FOR_GRAMMAR request may now be scheduled (None: unknown or finished)."""
        req = self.requests.get(request_id)
        return req if req is not None and self.waiting.mark_ready(req) else None

    def abort_request(self, request_id: str) -> Request | None:
        req = self.requests.get(request_id)
        if req is None or req.is_finished:
            return None
        self.finish_request(req, FinishReason.ABORT)
        return req

    def finish_request(self, req: Request, reason: FinishReason) -> None:
        if req.is_finished:
            return
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
            self._finished_since_step.append(req.request_id)
        else:
            self.waiting.remove(req)
        req.finish_reason = reason   # before free: a finished session turn opens a retention window
        self.kv.free(req)
        if self.spec is not None:
            self.spec.finish(req)
        if req.sampling_params.structured_outputs is not None:
            self.structured.release(req.request_id)
        self.reasoning.release(req.request_id)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.metrics.finish_time = self.clock.now()
        del self.requests[req.request_id]
        self._stop_floor.pop(req.request_id, None)

    @property
    def num_waiting(self) -> int:   # those waiting for their grammar included
        return len(self.waiting)

    @property
    def num_waiting_for_grammar(self) -> int:
        return self.waiting.num_not_ready

    @property
    def num_running(self) -> int:
        return len(self.running)

    def tenant_report(self) -> dict[str, dict[str, float]]:
        """Service, share, weight and deficit per tenant (`ServiceLedger.report`), deficits against
        the tenants waiting now."""
        return self.ledger.report({r.tenant for r in self.waiting})

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    # ------------------------------------------------------------------ scheduling

    def schedule(self) -> SchedulerOutput:
        now = self.clock.now()
        if self.structured.has_pending():
            self._take_compiled()
        self.waiting.refresh(now)
        self._shed(self.policy.shed(self.waiting, now))
        step = StepPlan(Budget(self.max_num_batched_tokens, self.config.max_num_seqs))
        if self.dedup is not None:
            self.dedup.begin_step(self.running, self.requests.__contains__)
        if self.config.enable_chunked_prefill:
            ordered = self._running_order.sorted(self.running, self.policy.sort_key())   # by remaining: one (most), or more
            decodes = [r for r in ordered if len(r.prompt_token_ids) + len(r.output_token_ids) - r.num_computed_tokens == 1]
            partial = [] if len(decodes) == len(ordered) else [
                r for r in ordered if len(r.prompt_token_ids) + len(r.output_token_ids) - r.num_computed_tokens > 1]
            self._schedule_decodes(step, decodes)
            limit = self.policy.step_limit(step, decodes, partial, self.waiting, now)
            if limit is not None:
                step.limit(limit)
            if partial:   # newcomers the policy serves before the partial prefills take the share first
                self._schedule_waiting(step, chunked=True, ahead_of=partial[0])
            self._schedule_running(step, partial)
            self._schedule_waiting(step, chunked=True)
        else:
            self._schedule_waiting(step, chunked=False)
            if not step.num_tokens:
                self._schedule_running(step, sorted(self.running, key=self.policy.sort_key()))
        if self.spec is not None:
            self._plan_drafts(step, self.spec)
        return self._build_output(step)

    def _plan_drafts(self, step: StepPlan, spec: SpecDecoder) -> None:
        """Drafts for this step's decodes, out of what the budget has left (never preempting)."""
        for rid, drafts in spec.plan(step.num_tokens, self.requests, step.budget.tokens_left).items():
            if self.reasoning.forced_token(rid) is not None:
                continue   # its next token is forced (the end of its thinking): nothing to verify
            blocks = self.kv.allocate_slots(self.requests[rid], 1 + len(drafts))   # None: no room, no drafts
            if blocks is not None:
                step.new_blocks[rid].extend(blocks)
                step.drafts[rid] = drafts
                step.num_tokens[rid] += len(drafts)
                step.budget.tokens_left -= len(drafts)

    def _take_compiled(self) -> None:
        """Grammar readiness: a request whose compile finished may now be scheduled; one whose
        compile failed is finished with FinishReason.ERROR (`take_grammar_failures`)."""
        for done in self.structured.take_compiled():
            req = self.requests.get(done.request_id)
            if req is None:
                self.structured.release(done.request_id)   # finished while it compiled
            elif done.error is None:
                self.waiting.mark_ready(req)
            else:
                self.finish_request(req, FinishReason.ERROR)
                self._grammar_failures.append((req.request_id, done.error))

    def _shed(self, requests: list[Request]) -> None:
        for req in requests:
            req.metrics.shed = True
            self.finish_request(req, FinishReason.ABORT)
            self._shed_since_step.append(req.request_id)

    def take_shed(self) -> list[str]:
        """Ids of requests the policy shed since the last call (finished: the engine reports them)."""
        shed, self._shed_since_step = self._shed_since_step, []
        return shed

    def take_grammar_failures(self) -> list[tuple[str, str]]:
        """(id, the compile's message) of each request whose grammar failed to compile since the
        last call (finished with FinishReason.ERROR: the engine reports them)."""
        failed, self._grammar_failures = self._grammar_failures, []
        return failed

    def _schedule_decodes(self, step: StepPlan, decodes: list[Request]) -> None:
        """`_schedule_running` for running requests with one token left (most rows of most steps,
        chunked): until a preemption each takes one token and one seat (n is 1, unless the policy
        caps it), so the run of those with room in their blocks goes to the KV manager and the plan
        in one call each, and the first that needs a block through `_schedule_running`."""
        if self.policy.overrides("prefill_cap") or self._prefill_cap < 1:
            self._schedule_running(step, decodes)
            return
        budget, i, n = step.budget, 0, len(decodes)
        while i < n and not step.preempted:   # every one RUNNING and not in the plan yet
            stop = min(n, i + min(budget.tokens_left, budget.seqs_left))
            if stop <= i:
                return
            j = self.kv.allocate_decodes(decodes, i, stop)
            step.add_decodes(decodes, i, j)
            if j < stop:   # it needs a block (else the budget is spent, or every decode is in)
                self._schedule_running(step, decodes[j:j + 1])
            i = j + 1
        if i < n:   # after a preemption: one by one, as `_schedule_running` takes them
            self._schedule_running(step, decodes[i:])

    def _schedule_running(self, step: StepPlan, candidates: list[Request]) -> None:
        chunked = self.config.enable_chunked_prefill
        budget, num_tokens, running, allocate, cap = (step.budget, step.num_tokens, RequestStatus.RUNNING,
                                                      self.kv.allocate_slots, self._prefill_cap)
        prefill_cap = self.policy.prefill_cap if self.policy.overrides("prefill_cap") else None   # else `cap`
        for req in candidates:
            if req.status is not running or req.request_id in num_tokens:
                continue  # preempted earlier in this step
            if budget.tokens_left <= 0 or budget.seqs_left <= 0:
                return
            n = len(req.prompt_token_ids) + len(req.output_token_ids) - req.num_computed_tokens
            if chunked:
                n = min(n, budget.tokens_left, cap if prefill_cap is None else prefill_cap(req, cap))
                if n > 1 and step.chunk_fit is not None:
                    n = step.fit(req, n, req.num_computed_tokens)
                if n <= 0:
                    return
            elif n > budget.tokens_left:
                continue
            blocks, n = self.segments.fill_or_stop(req, req.num_computed_tokens, n, None) if req.segments else (None, n)
            if blocks is None:   # else preempt for it (a failed allocation changed nothing)
                blocks = allocate(req, n)
            if blocks is None:
                blocks = allocate_or_preempt(self, step, req, n)
            if blocks is not None:
                step.add(req, n, blocks, is_new=False)

    def _schedule_waiting(self, step: StepPlan, chunked: bool, ahead_of: Request | None = None) -> None:
        while self.waiting.num_ready:
            req = self.waiting.peek()
            if ahead_of is not None and not self.policy.serves_before(req, ahead_of):
                return
            budget = step.budget
            if len(self.running) >= self.config.max_num_seqs or budget.seqs_left <= 0 or budget.tokens_left <= 0:
                if (budget.tokens_left > 0 or self.policy.preempts_for_budget) and make_room_for(self, step, req):
                    continue
                return
            # new, or resuming after recompute preemption: look up its cached prefix (no refs yet)
            # prompt logprobs are computed, never read off cached KV (maybe another tenant's);
            # once the first token is out they are all in, and a resume may hit the cache again
            wants_prompt = req.sampling_params.prompt_logprobs is not None and req.num_output_tokens == 0
            hit = self.kv.lookup_prefix(req) if req.num_computed_tokens == 0 and not wants_prompt else None
            computed = req.num_computed_tokens if hit is None else hit.num_tokens
            if hit is not None and self.dedup is not None and self.dedup.should_defer(req, computed):
                self.waiting.defer(req)   # another request is computing its next block: read it next step
                continue
            n = req.num_tokens - computed
            if not chunked and n > step.budget.tokens_left:
                return
            n = step.fit(req, min(n, step.budget.tokens_left, self.policy.prefill_cap(req, self._prefill_cap)), computed)
            if n <= 0:
                return
            blocks, n = self.segments.fill_or_stop(req, computed, n, hit) if req.segments else (None, n)
            if blocks is None:
                blocks = self.kv.allocate_slots(req, n, hit)   # commits the hit with the blocks, or changes nothing
            if blocks is None:
                if make_room_for(self, step, req):
                    continue
                return
            req.num_computed_tokens = max(req.num_computed_tokens, computed)   # a fill advanced it already
            if self.dedup is not None:
                self.dedup.admitted(req, computed)
            if hit is not None and req.metrics.preemptions == 0 and req.num_output_tokens == 0:
                req.num_cached_tokens = req.metrics.cached_tokens = computed
                req.metrics.cached_tokens_host = len(hit.promoted) * self.kv.block_size   # of them, promoted
            self.waiting.take(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = self.clock.now()
                req.metrics.tenant_service_at_admission = self.ledger.normalized(req.tenant)
            step.add(req, n, self.kv.block_table(req.request_id).copy(), is_new=True)

    def _build_output(self, step: StepPlan) -> SchedulerOutput:
        account = self.policy.account if self.policy.overrides("account") else None   # no-op hooks skipped
        scheduled, num_prefill, num_decode = build_rows(step, account, self.ledger if self._charge_ledger else None)
        finished, self._finished_since_step = self._finished_since_step, []
        swap_out, swap_in = self.kv.take_swap_ops()
        saves, fills = self.segments.take_copies()
        # the masks are computed while the executor prepares and runs the forward; a grammar
        # starts once its request's thinking ended, and a spent thinking budget forces the end tag
        masks = None
        if scheduled:   # the ids are listed only if a runtime asks (most steps constrain nothing)
            sampling = SamplingIds(scheduled)
            masks = self.reasoning.masks(sampling, self.structured.masks(self.reasoning.not_thinking(sampling)))
        out = SchedulerOutput(
            step_id=self._step_id, scheduled=scheduled, num_prefill_tokens=num_prefill,
            num_decode_tokens=num_decode, preempted_ids=step.preempted, finished_ids=finished,
            swap_out=swap_out, swap_in=swap_in, token_masks=masks, token_budget=step.token_budget,
            budget_reason=step.budget_reason, segment_saves=saves, segment_fills=fills,
        )
        self._step_id += 1
        return out

    # ------------------------------------------------------------------ results

    def update_from_output(self, output: SchedulerOutput, result: ModelOutput) -> list[tuple[Request, int]]:
        """The step's results into its requests (pacer.sched.step_results.apply_results): the
        requests that received tokens, finished ones included, each with how many it kept.
        Requests the executor failed must be finished before this is called."""
        return apply_results(self, output, result)

    def drop_output_tail(self, req: Request, num_tokens: int) -> None:
        """Drop the newest `num_tokens` outputs of a request about to finish (a stop string
        ended it inside a multi-token step), and the KV claim past them."""
        drop_output_tail(req, num_tokens)

    def check_invariants(self) -> None:
        self.kv.check_invariants()
        if len(self.running) > self.config.max_num_seqs:
            raise AssertionError(f"{len(self.running)} running > max_num_seqs={self.config.max_num_seqs}")
        for r in self.running:
            if r.status is not RequestStatus.RUNNING:
                raise AssertionError(f"{r} in running with status {r.status}")
        held = set(self.kv.block_tables)
        live = {r.request_id for r in self.running}
        if not held <= live:
            raise AssertionError(f"blocks held by requests not running: {held - live}")
