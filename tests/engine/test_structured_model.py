"""Structured outputs through the real engine (SmolLM2-135M): constrained outputs match their
constraint, an unconstrained greedy request's tokens do not change when constrained ones
share its batch, a request waits for its grammar in the scheduler (WAITING_FOR_GRAMMAR) holding
no slot and no KV while the others run, and a bad or timed-out grammar fails its own request
only."""

from __future__ import annotations

import json
import re

import jsonschema

from pacer.engine import Engine
from pacer.request import RequestStatus, SamplingParams, StructuredOutputsParams
from pacer.structured.manager import StructuredOutputManager
from tests.conftest import make

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["x", "y"]}}}}


def run(engine: Engine, prompts, params):
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    finals = {o.request_id: o for o in engine.run_until_done()}
    engine.kv.check_invariants()
    return [finals[i] for i in ids]


def test_constrained_neighbours_leave_greedy_tokens_unchanged(base):
    engine = make(base, num_kv_blocks=256)
    plain = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    alone = run(engine, ["The history of Rome"], [plain])[0]
    constrained = [SamplingParams(max_tokens=60, temperature=1.0, seed=i, structured_outputs=StructuredOutputsParams(
        json=SCHEMA)) for i in range(3)] + [SamplingParams(max_tokens=12, structured_outputs=StructuredOutputsParams(
            regex=r"[0-9]{2}:[0-9]{2}"))]
    outs = run(engine, ["The history of Rome", "A user:", "A user:", "A user:", "The time is"], [plain, *constrained])
    assert outs[0].token_ids == alone.token_ids
    for o in outs[1:4]:
        assert o.finish_reason == "stop"
        jsonschema.validate(json.loads(o.text), SCHEMA)
    assert re.fullmatch(r"[0-9]{2}:[0-9]{2}", outs[4].text)
    stats = engine.snapshot().structured
    assert stats["compilations"] == 2 and stats["cache_hits"] == 2 and stats["mask_rows"] > 0
    engine.install_structured_outputs(None)


def test_waiting_for_grammar_holds_no_slot_and_no_kv_and_fails_alone(base):
    engine = make(base, num_kv_blocks=64)
    manager = StructuredOutputManager(engine.tokenizer, engine.vocab_size, engine.eos_token_ids, timeout=60,
                                      num_workers=1, compiler="tests.structured.slow_compiler:compile_spec")
    engine.install_structured_outputs(manager)
    manager.request(StructuredOutputsParams(choice=["warm"])).result(60)   # worker started (a loaded machine
    manager.timeout = 1.5   # may take seconds to start it: the short timeout is for the slow grammar only)
    free = engine.kv.pool.num_free_blocks
    slow = engine.add_request("Hi", SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(
        json={"title": "slow", "type": "object"})))
    other = engine.add_request("Count: 1, 2,", SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    tokens_while_compiling = 0
    slow_out = other_out = None
    while slow_out is None:
        for o in engine.step():
            if o.request_id == slow:
                slow_out = o
            elif o.request_id == other:
                tokens_while_compiling += len(o.new_token_ids)
                other_out = o if o.finished else None
        if slow_out is None:   # queued ahead of `other` in the scheduler, but never admitted
            snap = engine.snapshot()
            assert snap.num_waiting_for_grammar == 1 and engine.num_waiting_for_grammar == 1
            assert engine.scheduler.requests[slow].status is RequestStatus.WAITING_FOR_GRAMMAR
            assert slow not in engine.kv.block_tables and snap.num_running <= 1   # no seat, no KV blocks
    assert slow_out.finish_reason == "error" and "did not compile" in slow_out.error
    assert tokens_while_compiling >= 2, "the other request kept generating while the grammar compiled"
    rest = engine.run_until_done()   # `other` may have finished while the grammar compiled (a fast CPU)
    finished = [o for o in rest if o.request_id == other] or [other_out]
    assert [o.finish_reason for o in finished if o is not None] == ["length"] and len(rest) <= 1
    engine.kv.check_invariants()
    assert engine.kv.num_available_blocks() == 64 and free == 64
    engine.install_structured_outputs(None)


def test_abort_while_waiting_for_grammar(base):
    engine = make(base, num_kv_blocks=64)
    manager = StructuredOutputManager(engine.tokenizer, engine.vocab_size, engine.eos_token_ids, timeout=30,
                                      num_workers=1, compiler="tests.structured.slow_compiler:compile_spec")
    engine.install_structured_outputs(manager)
    rid = engine.add_request("Hi", SamplingParams(structured_outputs=StructuredOutputsParams(
        json={"title": "slow", "type": "object"})))
    engine.step()
    assert engine.num_waiting_for_grammar == 1
    engine.abort_request(rid)
    outs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [(rid, "abort")]
    assert not engine.has_unfinished_requests()
    engine.install_structured_outputs(None)   # kills the worker still spinning on the slow schema


def test_structural_tag_offline(base):
    """StructuredOutputsParams(structural_tag=...): free text until the trigger, then the tagged
    call by its schema; the prompt's calls are get_time ones, so the model's own would be too."""
    schema = {"type": "object", "additionalProperties": False, "required": ["city"],
              "properties": {"city": {"type": "string", "maxLength": 12}}}
    tag = {"triggers": ["<function="], "structures": [
        {"begin": "<function=get_weather>", "schema": schema, "end": "</function>"}]}
    prompt = ('<function=get_time>{"zone": "UTC"}</function>\n<function=get_time>{"zone": "CET"}</function>\n'
              '<function=get_time>{"zone": "PST"}</function>\n')
    engine = make(base, num_kv_blocks=256)
    out = run(engine, [prompt], [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True,
                                                structured_outputs=StructuredOutputsParams(structural_tag=tag))])[0]
    engine.install_structured_outputs(None)
    call = re.match(r"<function=get_weather>(.*?)</function>", out.text, re.S)
    assert call is not None, out.text
    jsonschema.validate(json.loads(call.group(1)), schema)
