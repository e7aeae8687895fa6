"""The scheduler's reasoning tracker (pacer.sched.reasoning): a thinking budget forces the end
tag, one token a step (multi-token tags too); a grammar's masks and matcher start only after the
thinking ended; a prompt that already ended its thinking (enable_thinking false) is left alone;
the budget shortens the output length the length-aware policies predict."""

from __future__ import annotations

import torch

from pacer.request import Request, SamplingParams, StructuredOutputsParams
from pacer.sched.contract import ModelOutput, RequestResult
from pacer.sched.policy import SjfPolicy
from pacer.sched.reasoning import ANSWER_TOKENS_ESTIMATE, ReasoningTracker, ThinkTags, predicted_output_tokens
from tests.fakes import make_engine, run
from tests.sched.test_structured_hooks import FakeStructured

START, END = 7, 8


def _model(seq: list[int]) -> int:
    return 100 + len(seq) % 50   # never a tag


def _engine(tags: ThinkTags):
    eng, ex = make_engine(num_blocks=64, block_size=4, model=_model)
    eng.install_think_tags(tags)
    inner = ex.execute

    def execute(out):   # what the model executor's sampler does with a forced row's mask
        result = inner(out)
        forced = getattr(out.token_masks, "forced", {})
        return ModelOutput({rid: RequestResult((forced[rid],)) if rid in forced else r
                            for rid, r in result.results.items()})

    ex.execute = execute
    return eng, ex


def _params(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, **kw)


def test_the_budget_forces_the_end_tag_after_that_many_thinking_tokens():
    eng, ex = _engine(ThinkTags((START,), (8, 9)))   # a two-token end tag
    eng.add_request([1, 2, 3], _params(thinking_token_budget=3), request_id="b")
    eng.add_request([1, 2, 3], _params(), request_id="free")
    eng.add_request([1, START, 2, 8, 9, 4], _params(thinking_token_budget=0), request_id="ended")
    outs = run(eng, ex)
    free = list(outs["free"].token_ids)
    assert list(outs["b"].token_ids) == free[:3] + [8, 9] + free[5:]
    assert 8 not in free and list(outs["ended"].token_ids)[0] != 8   # its prompt already ended the thinking
    assert not eng.scheduler.reasoning._thinking


def test_a_natural_end_tag_ends_the_thinking_and_budget_zero_forces_at_once():
    tracker = ReasoningTracker(ThinkTags((START,), (END,)))
    zero = Request("z", [1, 2], _params(thinking_token_budget=0), 0.0)
    short = Request("s", [1, 2], _params(thinking_token_budget=5), 0.0)
    plain = Request("p", [1, 2], _params(), 0.0)
    for r in (zero, short, plain):
        tracker.add(r)
    assert tracker.forced_token("z") == END and tracker.forced_token("s") is None
    assert not tracker.is_thinking("p")                              # nothing to track
    assert list(tracker.advance("s", [START, 30, 31])) == []          # the opening tag is not thinking
    assert list(tracker.advance("s", [32, END, 40, 41])) == [40, 41]  # the answer, for its grammar
    assert not tracker.is_thinking("s") and list(tracker.advance("s", [42])) == [42]


def test_a_grammar_starts_after_the_thinking():
    eng, ex = _engine(ThinkTags((START,), (END,)))
    fake = FakeStructured()
    eng.install_structured_outputs(fake)
    grammar = StructuredOutputsParams(regex="[a-z]+")
    eng.add_request([1, 2, 3], _params(structured_outputs=grammar, thinking_token_budget=2), request_id="g")
    fake.finish_compile(grammar.cache_key())
    out = run(eng, ex)["g"]
    assert list(out.token_ids)[2] == END
    masked = [s for s in ex.steps if s.token_masks is not None and "g" in s.token_masks.rows]
    sampled = [s for s in ex.steps if any(sr.request_id == "g" and sr.sample for sr in s.scheduled)]
    assert len(sampled) == 10 and len(masked) == 10 - 3   # no grammar mask for the 2 thoughts and the forced tag
    assert fake.released == ["g"]


def test_forced_rows_of_an_inference_tensor():
    with torch.inference_mode():
        logits = torch.zeros(2, 5)
    from pacer.sched.reasoning import ForcedTokens

    out = ForcedTokens({"a": 3}, None).apply(logits, ["b", "a"])
    assert out[1].argmax().item() == 3 and torch.isinf(out[1]).sum() == 4 and not torch.isinf(out[0]).any()


def test_the_budget_is_part_of_the_predicted_output_length():
    long_think = SamplingParams(max_tokens=30_000, thinking_token_budget=100)
    assert predicted_output_tokens(long_think) == 101 + ANSWER_TOKENS_ESTIMATE
    assert predicted_output_tokens(SamplingParams(max_tokens=50, thinking_token_budget=100)) == 50
    a = Request("a", [1] * 10, SamplingParams(max_tokens=2000), 0.0)
    b = Request("b", [1] * 10, long_think, 1.0)
    assert SjfPolicy().key(b) < SjfPolicy().key(a)   # the budgeted request is predicted shorter


def test_a_budget_needs_a_reasoning_parser():
    import pytest

    from pacer.errors import FieldValueError

    eng, _ = make_engine()
    with pytest.raises(FieldValueError, match="--reasoning-parser") as e:
        eng.add_request([1, 2], _params(thinking_token_budget=4))
    assert e.value.field == "thinking_token_budget"
