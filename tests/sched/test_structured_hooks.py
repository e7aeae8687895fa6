"""The scheduler drives structured outputs through the declared protocol
(pacer.sched.structured.StructuredOutputs), here a fake runtime with scripted compiles and
grammars over the fake executor: a finished compile makes its request ready, a failed one
finishes it with the compile's message (reported by the engine), the step's masks reach the
SchedulerOutput, the matcher's advance finishes a request (STOP when its grammar completes,
ERROR when a token left it), and a finished request is released."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from pacer.request import FinishReason, Request, RequestStatus, SamplingParams, StructuredOutputsParams
from pacer.sched.structured import CompileOutcome, NullStructuredOutputs, StructuredOutputs
from pacer.sim.structured import SimStructured
from pacer.structured.runtime import StructuredRuntime
from tests.fakes import make_engine, run

GRAMMAR = StructuredOutputsParams(regex="[a-z]+")


class FakeMasks:
    def __init__(self, request_ids: Sequence[str]) -> None:
        self.rows: Mapping[str, int] = {rid: i for i, rid in enumerate(request_ids)}

    def apply(self, logits: Any, request_ids: Sequence[str]) -> Any:
        return logits


class FakeStructured:
    """Compiles end when the test says so; a request's grammar completes after `complete_after`
    tokens, or is left by its `leave_at`-th token."""

    def __init__(self) -> None:
        self.pending: dict[str, str] = {}          # request id -> its compile's key
        self.done: dict[str, str | None] = {}      # compile key -> error (None: compiled)
        self.bound: dict[str, int] = {}            # request id -> tokens its matcher accepted
        self.complete_after: dict[str, int] = {}
        self.leave_at: dict[str, int] = {}
        self.released: list[str] = []
        self.mask_calls: list[list[str]] = []
        self.num_requests = 0

    def finish_compile(self, key: str, error: str | None = None) -> None:
        self.done[key] = error

    # the protocol
    def request(self, params: StructuredOutputsParams, tenant: str = "default") -> str:
        self.num_requests += 1
        return params.cache_key()

    def add_pending(self, request_id: str, compile: str) -> None:
        self.pending[request_id] = compile

    def has_pending(self) -> bool:
        return bool(self.pending)

    def take_compiled(self) -> list[CompileOutcome]:
        out = []
        for rid, key in list(self.pending.items()):
            if key in self.done:
                del self.pending[rid]
                if self.done[key] is None:
                    self.bound[rid] = 0
                out.append(CompileOutcome(rid, self.done[key]))
        return out

    def masks(self, sampling_ids: Iterable[str]) -> FakeMasks | None:
        rows = [rid for rid in sampling_ids if rid in self.bound]
        self.mask_calls.append(rows)
        return FakeMasks(rows) if rows else None

    def advance(self, request_id: str, token_ids: Sequence[int]) -> FinishReason | None:
        if request_id not in self.bound:
            return None
        for _ in token_ids:
            self.bound[request_id] += 1
            if self.bound[request_id] == self.leave_at.get(request_id):
                return FinishReason.ERROR
            if self.bound[request_id] == self.complete_after.get(request_id):
                return FinishReason.STOP
        return None

    def release(self, request_id: str) -> None:
        self.released.append(request_id)
        self.bound.pop(request_id, None)
        self.pending.pop(request_id, None)

    def wait(self, timeout: float) -> None:
        pass

    def wake(self) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {"requests": float(self.num_requests)}

    def close(self) -> None:
        pass


def _engine(**kw: Any):
    eng, ex = make_engine(num_blocks=64, block_size=4, **kw)
    fake = FakeStructured()
    runtime: StructuredOutputs = fake   # it implements the protocol
    eng.install_structured_outputs(runtime)
    return eng, ex, fake


def _params(max_tokens: int = 8, structured: StructuredOutputsParams | None = GRAMMAR) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, structured_outputs=structured)


def test_a_finished_compile_makes_its_request_ready_and_its_masks_reach_the_step():
    eng, ex, fake = _engine()
    eng.add_request(list(range(1, 9)), _params(), request_id="g")
    eng.add_request(list(range(20, 28)), _params(structured=None), request_id="plain")
    for _ in range(3):   # the compile runs: g waits, holding nothing, while plain runs
        eng.step()
        assert eng.scheduler.requests["g"].status is RequestStatus.WAITING_FOR_GRAMMAR
        assert "g" not in eng.kv.block_tables
    assert all(s.token_masks is None for s in ex.steps)
    assert all(sr.request_id == "plain" for s in ex.steps for sr in s.scheduled)
    fake.finish_compile(GRAMMAR.cache_key())
    eng.step()
    assert eng.scheduler.requests["g"].status is RequestStatus.RUNNING
    out = ex.steps[-1]
    assert [sr.request_id for sr in out.scheduled] == ["plain", "g"]
    assert out.token_masks is not None and dict(out.token_masks.rows) == {"g": 0}
    finals = run(eng, ex)
    assert finals["g"].finish_reason == "length" and len(finals["g"].token_ids) == 8
    assert fake.bound == {} and fake.released == ["g"]   # released when it finished
    assert eng.snapshot().structured == {"requests": 1.0}


def test_a_failed_compile_finishes_its_request_with_the_message_and_no_one_else():
    eng, ex, fake = _engine()
    eng.add_request(list(range(1, 9)), _params(), request_id="bad")
    eng.add_request(list(range(20, 28)), _params(max_tokens=4, structured=None), request_id="plain")
    eng.step()
    fake.finish_compile(GRAMMAR.cache_key(), error="structured_outputs.regex is not a valid regex")
    outs = eng.step()
    failed = [o for o in outs if o.request_id == "bad"]
    assert len(failed) == 1 and failed[0].finished and failed[0].finish_reason == "error"
    assert failed[0].error == "structured_outputs.regex is not a valid regex" and failed[0].token_ids == []
    assert "bad" not in eng.scheduler.requests and eng.num_waiting_for_grammar == 0
    assert eng.scheduler.take_grammar_failures() == []   # reported once, by that step
    assert fake.released == ["bad"]
    finals = run(eng, ex)
    assert finals["plain"].finish_reason == "length"
    assert all(sr.request_id != "bad" for s in ex.steps for sr in s.scheduled)
    assert eng.kv.num_available_blocks() == 64


@pytest.mark.parametrize(("script", "reason", "num_tokens"), [
    ({"complete_after": 3}, "stop", 3),    # the grammar completes: STOP, before max_tokens
    ({"leave_at": 2}, "error", 2),          # a token left the grammar: ERROR
])
def test_the_matcher_advance_finishes_a_request(script, reason, num_tokens):
    eng, ex, fake = _engine()
    for name, n in script.items():
        getattr(fake, name)["g"] = n
    eng.add_request(list(range(1, 9)), _params(max_tokens=10), request_id="g")
    fake.finish_compile(GRAMMAR.cache_key())
    finals = run(eng, ex)
    assert finals["g"].finish_reason == reason and len(finals["g"].token_ids) == num_tokens
    assert fake.released == ["g"] and eng.kv.num_available_blocks() == 64


def test_an_abort_while_compiling_releases_it_and_its_late_compile_is_ignored():
    eng, ex, fake = _engine()
    eng.add_request(list(range(1, 9)), _params(), request_id="g")
    eng.step()
    eng.abort_request("g")
    outs = eng.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [("g", "abort")]
    assert fake.released == ["g"] and not fake.has_pending()
    fake.add_pending("gone", GRAMMAR.cache_key())   # a compile the scheduler no longer knows of
    fake.finish_compile(GRAMMAR.cache_key())
    eng.scheduler.schedule()
    assert fake.released == ["g", "gone"] and "gone" not in fake.bound
    assert not eng.has_unfinished_requests()


def test_without_a_runtime_nothing_is_pending_and_a_constrained_request_is_refused():
    eng, _ = make_engine(num_blocks=16, block_size=4)
    sched = eng.scheduler
    assert isinstance(sched.structured, NullStructuredOutputs) and eng.snapshot().structured == {}
    req = Request("g", [1, 2, 3], _params(), 0.0)
    with pytest.raises(ValueError, match="no structured-outputs runtime"):
        sched.add_waiting_for_grammar(req, object())
    assert sched.schedule().token_masks is None


def test_a_runtime_is_not_replaced_while_requests_wait_for_its_grammars():
    eng, _, fake = _engine()
    eng.add_request(list(range(1, 9)), _params(), request_id="g")
    eng.step()
    with pytest.raises(RuntimeError, match="waiting for grammars"):
        eng.install_structured_outputs(None)
    assert eng.scheduler.structured is fake


def test_the_real_simulated_and_null_runtimes_implement_every_method_of_the_protocol():
    methods = {name for name in vars(StructuredOutputs) if not name.startswith("_")}
    assert {"request", "take_compiled", "has_pending", "masks", "advance", "release", "wait", "wake", "stats",
            "close"} <= methods
    for cls in (StructuredRuntime, SimStructured, NullStructuredOutputs, FakeStructured):
        missing = {m for m in methods if not callable(getattr(cls, m, None))}
        assert not missing, f"{cls.__name__} lacks {sorted(missing)}"
