"""A fake executor for core tests: no tensors, but it checks the KV bookkeeping; and the
helpers that build an engine over it, drive it to completion and predict its outputs.

It keeps a map slot -> (token, position) as a real KV cache would hold keys, verifies that
every step's cached context is exactly the request's own earlier tokens (and that a new
request with penalties brings its whole token history), and "samples" a token that is a
deterministic function of the request's whole sequence, like a greedy model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pacer.clock import VirtualClock
from pacer.config import EngineConfig
from pacer.engine import Engine, RequestOutput
from pacer.kv.block_pool import kept_blocks
from pacer.request import Request, SamplingParams
from pacer.sched.contract import ModelOutput, RequestResult, ScheduledRequest, SchedulerOutput
from pacer.sched.scheduler import Scheduler
from pacer.sched.step_cost import FixedCostModel

EOS = 7


def next_token(tokens: list[int], vocab: int) -> int:
    h = 1469598103
    for t in tokens:
        h = (h ^ t) * 1099511628211 % (1 << 61)
    return h % vocab


class FakeExecutor:
    """Drafted tokens (speculation) are verified as a greedy model would: accepted while each
    equals the model's next token. `accept(request_id, drafts) -> n`, when given, overrides
    how many are accepted (the outputs then follow the accepted drafts), to drive rollback."""

    def __init__(self, block_size: int, vocab: int = 1000,
                 accept: Callable[[str, list[int]], int] | None = None,
                 model: Callable[[list[int]], int] | None = None) -> None:
        self.block_size = block_size
        self.vocab = vocab
        self.accept = accept
        self.model = model or (lambda seq: next_token(seq, vocab))
        self.kv_block_bytes: int | None = None
        self.scheduler: Scheduler | None = None   # god view, for checking only
        self.slots: dict[int, tuple[int, int]] = {}
        self.tables: dict[str, list[int]] = {}
        self.steps: list[SchedulerOutput] = []
        self.cpu: dict[int, list[tuple[int, int] | None]] = {}   # swap tier: cpu slot -> block contents
        # segment reuse: with `check_tenants`, the tenant whose request computed each slot's KV, and
        # every read of KV must be of the reader's own tenant (tenant_isolation="isolated")
        self.check_tenants = False
        self.writers: dict[int, str] = {}
        self.cpu_writers: dict[int, list[str | None]] = {}
        self.num_filled = 0   # tokens filled from stored segments

    def _copy_segments(self, copies: list[Any]) -> None:
        """A stored segment's KV moved to new positions: each (token, position) shifted by the
        copy's delta, as RoPE re-rotation moves a key (a slot never written stays unwritten)."""
        for c in copies:
            moved = [(self.slots.get(s), self.writers.get(s)) for s in c.src_slots]
            for dst, (content, writer) in zip(c.dst_slots, moved):
                if content is None:
                    self.slots.pop(dst, None)
                else:
                    self.slots[dst] = (content[0], content[1] + c.position_delta)
                if writer is not None:
                    self.writers[dst] = writer

    def _swap(self, out: SchedulerOutput) -> None:
        bs = self.block_size
        for dev, slot in out.swap_out:
            self.cpu[slot] = [self.slots.get(dev * bs + i) for i in range(bs)]
            self.cpu_writers[slot] = [self.writers.get(dev * bs + i) for i in range(bs)]
        self._copy_segments(out.segment_saves)   # after swap-outs, before swap-ins (the executor's order)
        for slot, dev in out.swap_in:
            for i, writer in enumerate(self.cpu_writers.get(slot, ())):
                if writer is not None:
                    self.writers[dev * bs + i] = writer
            for i, content in enumerate(self.cpu[slot]):   # a copy: the host tier may promote it again
                if content is None:
                    self.slots.pop(dev * bs + i, None)
                else:
                    self.slots[dev * bs + i] = content
        self._copy_segments(out.segment_fills)
        self.num_filled += sum(c.num_tokens for c in out.segment_fills)

    @staticmethod
    def _check_history(sr: ScheduledRequest, req: Request) -> None:
        """A new request with penalties carries its whole token history; others carry none."""
        assert sr.sampling_params is not None
        if sr.sampling_params.has_penalties:
            assert sr.prompt_token_ids == req.prompt_token_ids, sr.request_id
            assert sr.output_token_ids == req.output_token_ids, sr.request_id
        else:
            assert sr.prompt_token_ids is None and sr.output_token_ids is None, sr.request_id

    def _slot(self, table: list[int], p: int) -> int:
        return table[p // self.block_size] * self.block_size + p % self.block_size

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        assert self.scheduler is not None
        self.steps.append(out)
        self._swap(out)
        for rid in (*out.finished_ids, *out.preempted_ids):
            self.tables.pop(rid, None)
        sampled: dict[str, int] = {}
        for sr in out.scheduled:
            req = self.scheduler.requests[sr.request_id]
            if sr.is_new:
                self.tables[sr.request_id] = list(sr.block_ids)
                self._check_history(sr, req)
            else:
                self.tables[sr.request_id].extend(sr.block_ids)
            table = self.tables[sr.request_id]
            seq = req.prompt_token_ids + req.output_token_ids
            for p in range(sr.start_position):
                got = self.slots.get(self._slot(table, p))
                assert got == (seq[p], p), f"{sr.request_id}: stale KV at position {p}: {got} != {(seq[p], p)}"
                if self.check_tenants:
                    writer = self.writers.get(self._slot(table, p))
                    assert writer == req.tenant, f"{sr.request_id} of {req.tenant} read KV of {writer} at {p}"
            for i, t in enumerate(sr.token_ids):
                p = sr.start_position + i
                assert t == seq[p], f"{sr.request_id}: token at {p} is {t}, expected {seq[p]}"
                self.slots[self._slot(table, p)] = (t, p)
                self.writers[self._slot(table, p)] = req.tenant
            end = sr.start_position + sr.num_tokens
            drafts = list(sr.draft_token_ids)
            assert len(table) * self.block_size >= end + len(drafts), f"{sr.request_id}: no KV slot for a draft"
            for i, t in enumerate(drafts):
                self.slots[self._slot(table, end + i)] = (t, end + i)
            if sr.sample:
                assert end == len(seq)
                sampled[sr.request_id] = self._verify(sr.request_id, seq[:end], drafts, table) if drafts \
                    else [self.model(seq[:end])]
        return ModelOutput({rid: RequestResult(tuple(toks)) for rid, toks in sampled.items()})

    def _verify(self, rid: str, seq: list[int], drafts: list[int], table: list[int]) -> list[int]:
        if self.accept is not None:
            n = max(0, min(len(drafts), self.accept(rid, drafts)))
        else:
            n = 0
            while n < len(drafts) and drafts[n] == self.model(seq + drafts[:n]):
                n += 1
        out = drafts[:n] + [self.model(seq + drafts[:n])]
        del table[kept_blocks(len(seq) + n, self.block_size):]   # the scheduler frees the same blocks
        return out


def make_engine(*, num_blocks: int = 64, block_size: int = 4, max_len: int = 256, clock: VirtualClock | None = None,
                cost_model: Any = None, accept: Callable[[str, list[int]], int] | None = None,
                model: Callable[[list[int]], int] | None = None, **kw: object) -> tuple[Engine, FakeExecutor]:
    """An engine over the fake executor; `kw` are engine (scheduler / cache) settings. The slo
    policy and adaptive speculation get `cost_model` (default: 1 ms per step + 0.1 ms per token);
    `accept` and `model` go to the FakeExecutor."""
    cfg = EngineConfig.from_kwargs(num_kv_blocks=num_blocks, block_size=block_size, max_model_len=max_len, **kw)
    sc = cfg.scheduler
    if cost_model is None and (sc.scheduling_policy == "slo" or (
            sc.speculative_config is not None and sc.speculative_policy == "adaptive")):
        cost_model = FixedCostModel(1e-3, 1e-4)
    ex = FakeExecutor(block_size, accept=accept, model=model)
    eng = Engine(cfg, ex, tokenizer=None, num_kv_blocks=num_blocks, model_max_len=max_len,
                 eos_token_ids=(EOS,), clock=clock or VirtualClock(), vocab_size=1000, cost_model=cost_model)
    ex.scheduler = eng.scheduler
    return eng, ex


def reference_output(prompt: list[int], params: SamplingParams,
                     model: Callable[[list[int]], int] | None = None) -> list[int]:
    """What the fake "model" (default: `next_token`) generates for `prompt` when nothing interferes."""
    seq = list(prompt)
    out: list[int] = []
    while True:
        t = model(seq) if model is not None else next_token(seq, 1000)
        seq.append(t)
        out.append(t)
        if len(out) >= params.max_tokens:
            return out
        if len(out) >= params.min_tokens and not params.ignore_eos and t == EOS:
            return out


def run(eng: Engine, ex: FakeExecutor, max_steps: int = 10_000) -> dict[str, RequestOutput]:
    """Step until every request has finished, checking the budgets and the scheduler's
    invariants after each step; returns the final output of each request."""
    finals = {}
    steps = 0
    sched = eng.scheduler
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                finals[o.request_id] = o
        out = ex.steps[-1] if ex.steps else None
        if out is not None:
            assert out.num_scheduled_tokens <= sched.max_num_batched_tokens
            assert len(out.scheduled) <= sched.config.max_num_seqs
        assert sched.num_running <= sched.config.max_num_seqs
        sched.check_invariants()
        if isinstance(eng.clock, VirtualClock):
            eng.clock.advance(0.01)
        steps += 1
        assert steps < max_steps, "no progress: a request waits forever"
    return finals


def run_preempting_workload(**kw: object) -> tuple[Engine, dict[str, list[int]], SamplingParams, dict[str, RequestOutput]]:
    """Four 8-token prompts x 20 tokens on 12 blocks of 4: the KV runs out and requests are
    preempted by recompute. Returns the engine, prompts, params and final outputs."""
    eng, ex = make_engine(num_blocks=12, block_size=4, max_len=48, **kw)
    p = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    prompts = {f"r{i}": [i * 10 + j for j in range(1, 9)] for i in range(4)}
    for rid, pr in prompts.items():
        eng.add_request(pr, p, request_id=rid)
    finals = run(eng, ex)
    assert eng.scheduler.num_preemptions > 0, "the workload was meant to preempt"
    return eng, prompts, p, finals


@dataclass
class Arrival:
    step: int                        # the engine step at which it is added
    request_id: str
    prompt: list[int]
    params: SamplingParams
    abort_after: int | None = None   # steps after arriving; None: never aborted
    add_kwargs: dict[str, Any] = field(default_factory=dict)   # priority=, tenant=


def drive_arrivals(eng: Engine, arrivals: list[Arrival], check_step: Callable[[], None],
                   max_steps: int) -> dict[str, RequestOutput]:
    """Add requests at their steps and abort them when due, stepping until all have finished;
    `check_step` runs after every step. Every output must equal the fake model's reference
    (an aborted one, a prefix of it). Returns the final outputs."""
    pending = sorted(arrivals, key=lambda a: a.step)
    expected: dict[str, list[int]] = {}
    aborts: dict[str, int] = {}
    finals: dict[str, RequestOutput] = {}
    step = 0
    while pending or eng.has_unfinished_requests():
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            kw = dict(a.add_kwargs)
            if "segments" in kw:   # segments travel in a prepared request
                prepared = eng.prepare(a.prompt, a.params, tenant=kw.pop("tenant", "default"), segments=kw.pop("segments"),
                                       slo=kw.pop("slo", None))
                eng.add_request(prepared, request_id=a.request_id, **kw)
            else:
                eng.add_request(a.prompt, a.params, request_id=a.request_id, **kw)
            expected[a.request_id] = reference_output(a.prompt, a.params)
            if a.abort_after is not None:
                aborts[a.request_id] = step + a.abort_after
        for rid, at in list(aborts.items()):
            if at == step:
                eng.abort_request(rid)
                del aborts[rid]
        for o in eng.step():
            if o.finished:
                finals[o.request_id] = o
        check_step()
        eng.scheduler.check_invariants()
        assert isinstance(eng.clock, VirtualClock)
        eng.clock.advance(0.01)
        step += 1
        assert step < max_steps, "no progress"
    assert set(finals) == set(expected)
    for rid, out in finals.items():
        want = expected[rid] if out.finish_reason != "abort" else expected[rid][: len(out.token_ids)]
        assert out.token_ids == want, rid
    return finals
