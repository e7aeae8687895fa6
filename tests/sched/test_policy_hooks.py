"""Policies own their hooks behind one factory: the scheduler names no policy, the factory
builds every configured policy from the scheduler's context, and a policy the scheduler has
never heard of drives ordering, shedding and step limits through the hooks alone."""

from __future__ import annotations

import ast
import pathlib

import pytest

import pacer.sched.scheduler
from pacer.config import SCHEDULING_POLICIES
from pacer.config.slo import parse_slo
from pacer.request import Request, SamplingParams
from pacer.sched.policy import Policy, PolicyContext, WaitingQueue
from pacer.sched.policy_factory import POLICIES, make_policy
from pacer.sched.slo_policy import SloPolicy
from pacer.sched.step_cost import FixedCostModel
from pacer.sched.step_plan import Budget, StepLimit, StepPlan
from tests.fakes import make_engine, run


def _policy_classes() -> set[type[Policy]]:
    found, todo = set(), [Policy]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_the_scheduler_names_no_policy():
    tree = ast.parse(pathlib.Path(pacer.sched.scheduler.__file__).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    classes = {cls.__name__ for cls in _policy_classes() if cls is not Policy} | {"Policy"}
    assert not names & classes, f"scheduler.py names policy classes: {sorted(names & classes)}"
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not strings & set(SCHEDULING_POLICIES), f"scheduler.py names policies: {sorted(strings & set(SCHEDULING_POLICIES))}"
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "pacer.sched.slo_policy" not in modules


def _ctx(**kw: object) -> PolicyContext:
    base: dict[str, object] = {"max_num_batched_tokens": 512, "prefill_chunk": 256,
                               "cost_model": FixedCostModel(1e-3, 1e-4)}
    return PolicyContext(**{**base, **kw})  # type: ignore[arg-type]


def test_the_factory_builds_every_configured_policy_from_the_context():
    assert set(POLICIES) == set(SCHEDULING_POLICIES)
    for name in SCHEDULING_POLICIES:
        assert make_policy(name, _ctx()).name == name
    cached = {"hit": 40, "miss": 0}
    lpm = make_policy("lpm", _ctx(cached_prefix_tokens=lambda r: cached[r.request_id]))
    p = SamplingParams(max_tokens=4)
    miss, hit = Request("miss", [1, 2, 3], p, 0.0, arrival_seq=0), Request("hit", [1, 2, 3], p, 0.0, arrival_seq=1)
    assert sorted([miss, hit], key=lpm.key) == [hit, miss]   # the context's look-up orders it
    slo = make_policy("slo", _ctx(slo_set=parse_slo(["chat:ttft=300ms", "batch:ttft=2s"]), shed_hopeless=True))
    assert isinstance(slo, SloPolicy)
    assert slo.arrival_ttft_s == pytest.approx(0.3) and slo.shed_hopeless and slo.prefill_chunk == 256
    assert slo.max_num_batched_tokens == 512


def test_the_slo_policy_needs_a_cost_model():
    for context in (None, _ctx(cost_model=None)):
        with pytest.raises(ValueError, match="scheduling_policy='slo' needs a step cost model"):
            make_policy("slo", context)


def test_default_hooks_shed_nothing_and_limit_nothing():
    policy = make_policy("fcfs")
    req = Request("a", [1, 2, 3], SamplingParams(max_tokens=4), 0.0)
    queue = WaitingQueue(policy)
    queue.add(req)
    assert policy.shed(queue, 0.0) == []
    assert policy.step_limit(StepPlan(Budget(16, 2)), [], [], queue, 0.0) is None
    assert not policy.serves_before(req, req)


class _CapAndShed(Policy):
    """A policy the scheduler has never heard of: sheds requests of priority 9, caps every
    chunked step at `cap` tokens, and serves a waiting request ahead of partial prefills."""

    name = "cap-and-shed"

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.asked: list[list[str]] = []

    def shed(self, waiting, now):
        return [r for r in waiting if r.priority == 9]

    def step_limit(self, step, decodes, partial, waiting, now):
        self.asked.append([r.request_id for r in decodes if r.request_id in step.num_tokens])
        taken = sum(step.num_tokens.values())
        return StepLimit(max(0, self.cap - taken), f"cap {self.cap}")

    def serves_before(self, waiting, partial):
        return True


def test_a_policy_owns_its_shedding_and_its_step_limit_through_the_hooks():
    eng, ex = make_engine(num_blocks=64, block_size=4)
    policy = _CapAndShed(cap=6)
    eng.scheduler.policy = eng.scheduler.waiting.policy = policy
    p = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    eng.add_request(list(range(1, 21)), p, request_id="long")
    eng.add_request(list(range(30, 34)), p, request_id="doomed", priority=9)
    eng.add_request(list(range(40, 44)), p, request_id="short")
    finals = run(eng, ex)
    assert finals["doomed"].finish_reason == "abort" and finals["doomed"].metrics.shed
    assert finals["doomed"].metrics.first_scheduled_time is None
    assert all(not any(sr.request_id == "doomed" for sr in s.scheduled) for s in ex.steps)
    assert finals["long"].finish_reason == finals["short"].finish_reason == "length"
    for s in ex.steps:
        assert s.num_scheduled_tokens <= 6 and s.token_budget == 6 and s.budget_reason == "cap 6"
    # `short` arrived after `long` had started its prefill, and was served ahead of it
    first = {rid: next(i for i, s in enumerate(ex.steps) if any(sr.request_id == rid for sr in s.scheduled))
             for rid in ("long", "short")}
    assert first["long"] == 0 and first["short"] == 1
    assert [] in policy.asked and any(policy.asked)   # asked with the decodes each step took


def test_shed_requests_are_finished_and_reported_once():
    eng, _ = make_engine(num_blocks=16, block_size=4)
    eng.scheduler.policy = eng.scheduler.waiting.policy = _CapAndShed(cap=64)
    eng.add_request([1, 2, 3], SamplingParams(max_tokens=2), request_id="x", priority=9)
    outs = eng.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [("x", "abort")]
    assert eng.scheduler.take_shed() == [] and not eng.has_unfinished_requests()
    assert eng.scheduler.requests == {}
