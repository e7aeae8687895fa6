"""Issue 27, finding 5: a grammar cannot stall the batch. The first mask is computed with the
compile (off any step); a tenant cannot fill the compile queue; a compile whose requests all
left is cancelled (its worker killed); failures and timeouts are cached; the worker's address
space is capped. Real llguidance grammars on the real tokenizer; the engine ones on the real model."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from pacer.model.loader import default_model_path
from pacer.model.tokenizer import Tokenizer
from pacer.request import SamplingParams, StructuredOutputsParams
from pacer.structured.manager import CompileCapError, StructuredOutputError, StructuredOutputManager
from tests.conftest import make

SLOW = "tests.structured.slow_compiler:compile_spec"   # a schema titled "slow" spins its worker


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.load(default_model_path())


def _manager(tokenizer, **kw):
    kw.setdefault("num_workers", 1)
    return StructuredOutputManager(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id], **kw)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _until_running(future) -> None:
    """Wait (on the future's own state, no sleep) until a pool thread has taken the compile."""
    deadline = time.monotonic() + 60
    while not future.running() and not future.done():
        assert time.monotonic() < deadline, "the compile never started"


def test_first_mask_is_computed_with_the_compile_and_matches_the_steps(tokenizer):
    m = _manager(tokenizer)
    try:
        compiled = m.request(StructuredOutputsParams(json={"type": "object", "properties": {
            "n": {"type": "integer"}}, "required": ["n"]})).result(60)
        assert compiled.first_mask   # ready before the request could join any step
        m.bind("r", compiled)
        step_mask = m.start_masks(["r"]).bitmask()[0].numpy()
        assert np.array_equal(np.frombuffer(compiled.first_mask, dtype=np.int32)[: step_mask.size], step_mask)
    finally:
        m.close()


def test_failures_are_cached_and_fail_fast(tokenizer):
    m = _manager(tokenizer)
    try:
        bad = StructuredOutputsParams(regex="[a-")
        for _ in range(3):
            with pytest.raises(StructuredOutputError, match="regex"):
                m.request(bad).result(60)
        st = m.stats.as_dict()
        assert st["compilations"] == 1 and st["negative_hits"] == 2 and st["errors"] == 1
    finally:
        m.close()


def test_timeouts_are_cached(tokenizer):
    m = _manager(tokenizer, timeout=1.0, compiler=SLOW)
    try:
        slow = StructuredOutputsParams(json={"title": "slow", "type": "object"})
        with pytest.raises(StructuredOutputError, match="did not compile within 1 s"):
            m.request(slow).result(60)
        starts = m.all_workers[0].num_starts
        with pytest.raises(StructuredOutputError, match="did not compile within 1 s") as e:
            m.request(slow).result(0)   # answered at once: no worker spent, no second timeout
        assert e.value.timed_out and m.stats.timeouts == 1 and m.stats.negative_hits == 1
        assert m.all_workers[0].num_starts == starts
    finally:
        m.close()


def test_one_tenant_cannot_fill_the_compile_queue_and_orphans_are_cancelled(tokenizer):
    m = _manager(tokenizer, timeout=60, compiler=SLOW, max_compiles_per_tenant=1)
    try:
        m.request(StructuredOutputsParams(choice=["warm"])).result(60)   # the worker is up
        pid = m.all_workers[0].pid
        spinning = m.request(StructuredOutputsParams(json={"title": "slow", "type": "object"}), tenant="a")
        with pytest.raises(CompileCapError, match=r"tenant 'a' already has 1 grammar compiles.*limit 1") as e:
            m.request(StructuredOutputsParams(regex=r"\d+"), tenant="a")
        assert e.value.field == "structured_outputs"   # the server's 400 names the field
        other = m.request(StructuredOutputsParams(regex=r"\d+"), tenant="b")   # another tenant still gets in
        _until_running(spinning)
        m.drop(spinning)   # its only request left: the spinning compile is killed, not run to its timeout
        assert other.result(60).grammar and not _alive(pid) and m.stats.cancelled == 1
        assert m.stats.tenant_refusals == 1 and m.stats.timeouts == 0
        m.request(StructuredOutputsParams(regex=r"\d+x"), tenant="a").result(60)   # a's slot is free again
    finally:
        m.close()


def test_a_shared_compile_runs_until_its_last_request_leaves(tokenizer):
    m = _manager(tokenizer, timeout=60, compiler=SLOW)
    try:
        slow = StructuredOutputsParams(json={"title": "slow", "type": "object"})
        first, second = m.request(slow, tenant="a"), m.request(slow, tenant="b")
        assert first is second
        m.drop(first)
        assert not first.done() and m.stats.cancelled == 0   # b still waits on it
        m.drop(second)
        assert m.stats.cancelled == 1
    finally:
        m.close()


def test_worker_address_space_is_capped(tokenizer):
    m = _manager(tokenizer, memory_limit_mb=3000)
    try:
        m.request(StructuredOutputsParams(regex=r"\d+")).result(60)
        with open(f"/proc/{m.all_workers[0].pid}/limits", encoding="ascii") as f:
            line = next(row for row in f if row.startswith("Max address space"))
        assert line.split()[3] == str(3000 << 20)
    finally:
        m.close()


def test_abort_cancels_the_orphaned_compile_and_others_decode(base):
    engine = make(base, num_kv_blocks=64)
    manager = StructuredOutputManager(engine.tokenizer, engine.vocab_size, engine.eos_token_ids, timeout=60,
                                      num_workers=1, compiler=SLOW)
    engine.install_structured_outputs(manager)
    try:
        manager.request(StructuredOutputsParams(choice=["warm"])).result(60)
        pid = manager.all_workers[0].pid
        slow = engine.add_request("Hi", SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
            json={"title": "slow", "type": "object"})))
        plain = engine.add_request("Hello", SamplingParams(max_tokens=4))
        finished = set()
        while plain not in finished:   # the plain request decodes while the grammar compiles
            finished |= {o.request_id for o in engine.step() if o.finished}
        assert slow not in finished and engine.num_waiting_for_grammar == 1
        compile = engine.scheduler.structured._waits._futures[slow]
        _until_running(compile)
        engine.abort_request(slow)
        assert [(o.request_id, o.finish_reason) for o in engine.step()] == [(slow, "abort")]
        with pytest.raises(StructuredOutputError, match="cancelled"):
            compile.result(60)   # ends now, not at the 60 s timeout
        assert manager.stats.cancelled == 1 and manager.stats.timeouts == 0 and not _alive(pid)
    finally:
        engine.install_structured_outputs(None)
