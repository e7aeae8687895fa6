"""Outputs as deltas (pacer.engine.outputs): each step's output carries only what the step
added, the finished output carries everything, and a request's deltas reassemble to it exactly
(token ids, text, logprobs), stop strings, min_tokens and accepted drafts included. On the fake
executor, with a one-character-per-token tokenizer so stop strings are frequent."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pacer.clock import VirtualClock
from pacer.config import EngineConfig
from pacer.engine import Engine, RequestOutput
from pacer.request import SamplingParams
from pacer.sched.contract import ModelOutput, RequestResult, SchedulerOutput
from tests.fakes import EOS, FakeExecutor, next_token

ALPHABET = "ab c"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


class CharTokenizer:
    """Token t is the character ALPHABET[t % 4] (what IncrementalDetokenizer needs of a tokenizer)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(ALPHABET[t % len(ALPHABET)] for t in ids)

    def _is_skipped(self, token_id: int) -> bool:
        return False


class LogprobsExecutor(FakeExecutor):
    """The fake executor, with a two-entry {token: logprob} per sampled token when asked for
    (a request's sampling params come with its first step only, as to a real executor)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.asked: set[str] = set()

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        result = super().execute(out)
        self.asked |= {sr.request_id for sr in out.scheduled
                       if sr.sampling_params is not None and sr.sampling_params.logprobs is not None}
        return ModelOutput({rid: RequestResult(r.token_ids, [{t: -0.5, (t + 1) % 1000: -1.5} for t in r.token_ids])
                            if rid in self.asked else r for rid, r in result.results.items()})


def copy_model(seq: list[int]) -> int:
    """Mostly repeats the token 6 back: periodic text (stop strings recur) and n-gram drafts that hold."""
    t = seq[-6]
    return (t + 1) % 1000 if next_token(seq, 1000) % 5 == 0 else t


def make_engine(**kw: object) -> Engine:
    cfg = EngineConfig.from_kwargs(num_kv_blocks=256, block_size=4, max_model_len=512, **kw)
    ex = LogprobsExecutor(4, model=copy_model)
    eng = Engine(cfg, ex, tokenizer=CharTokenizer(), num_kv_blocks=256, model_max_len=512, eos_token_ids=(EOS,),
                 clock=VirtualClock(), vocab_size=1000)
    ex.scheduler = eng.scheduler
    return eng


def run_streams(eng: Engine) -> dict[str, list[RequestOutput]]:
    """Every output of every request, in order, until all have finished."""
    streams: dict[str, list[RequestOutput]] = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            streams.setdefault(o.request_id, []).append(o)
        eng.scheduler.check_invariants()
    return streams


def check_reassembles(outs: list[RequestOutput]) -> RequestOutput:
    """The deltas add up to the finished output; only that one carries the whole output."""
    *running, final = outs
    assert final.finished and final.whole is not None
    num_tokens = 0
    for o in running:
        assert not o.finished and o.whole is None
        num_tokens += len(o.new_token_ids)
        assert o.num_output_tokens == num_tokens
        with pytest.raises(ValueError, match="token_ids is only on the finished output"):
            _ = o.token_ids
    assert [t for o in outs for t in o.new_token_ids] == final.token_ids
    assert final.num_output_tokens == len(final.token_ids)
    assert "".join(o.new_text for o in outs) == final.text
    if final.logprobs is None:
        assert all(o.new_logprobs is None for o in outs)
    else:
        assert [e for o in outs for e in o.new_logprobs or []] == final.logprobs
        assert len(final.logprobs) == len(final.token_ids)
    return final


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), num_requests=st.integers(1, 4), max_tokens=st.integers(1, 60),
       min_tokens=st.integers(0, 12), logprobs=st.sampled_from([None, 1]), speculate=st.booleans(),
       stop=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=2))
def test_deltas_reassemble_to_the_finished_output(seed, num_requests, max_tokens, min_tokens, logprobs, speculate,
                                                   stop):
    """Whatever the stop strings (a later token may complete one that began in text an earlier
    step produced), min_tokens (a string may then lie wholly in text already there) and drafts
    (several tokens a step): the streamed text is never more than the final text, and the
    deltas reassemble to it; the final text is the decoded tokens cut where a stop string began."""
    kw = {"speculative_config": NGRAM, "speculative_policy": "static"} if speculate else {}
    eng = make_engine(**kw)
    params = SamplingParams(max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens), temperature=0.0,
                            stop=stop, logprobs=logprobs)
    for i in range(num_requests):
        eng.add_request([(seed + 7 * i + j) % 1000 for j in range(8)], params, request_id=f"r{i}")
    streams = run_streams(eng)
    assert set(streams) == {f"r{i}" for i in range(num_requests)}
    for outs in streams.values():
        final = check_reassembles(outs)
        decoded = CharTokenizer().decode(final.token_ids)
        assert decoded.startswith(final.text)
        if isinstance(final.stop_reason, str):
            assert decoded[len(final.text):].startswith(final.stop_reason)


def test_step_output_size_does_not_grow_with_the_stream():
    """A step's output holds the step's token, character and logprobs, at step 5 as at step 295;
    the prompt and metrics it carries are the request's own objects, not copies."""
    eng = make_engine()
    eng.add_request(list(range(1, 9)), SamplingParams(max_tokens=300, ignore_eos=True, logprobs=1, stop=["zz"]),
                    request_id="long")
    outs = run_streams(eng)["long"]
    assert len(outs) == 300
    *running, final = outs
    sizes = [(len(o.new_token_ids), len(o.new_text), [len(e) for e in o.new_logprobs or []]) for o in running]
    # the stop string "zz" holds back one character while it could begin; the tail comes at the end
    assert sizes[0] == (1, 0, [2]) and set(map(str, sizes[1:])) == {str((1, 1, [2]))}
    assert all(o.prompt_token_ids is final.prompt_token_ids and o.metrics is final.metrics for o in running)
    assert (len(final.new_token_ids), len(final.new_text)) == (1, 2)
    assert len(final.token_ids) == len(final.text) == len(final.logprobs or []) == 300
    check_reassembles(outs)


def test_aborted_and_offline_outputs_carry_everything():
    """An abort's output releases the text held back for stop strings and carries the whole
    output; run_until_done's finals are whole outputs too."""
    eng = make_engine()
    params = SamplingParams(max_tokens=50, ignore_eos=True, stop=["zzz"])
    eng.add_request(list(range(1, 9)), params, request_id="a")
    outs = [o for _ in range(6) for o in eng.step()]
    eng.abort_request("a")
    outs += eng.step()
    final = check_reassembles(outs)
    assert final.finish_reason == "abort" and len(final.text) == len(final.token_ids) == 6
    assert final.new_text == final.text[-2:]   # the tail a 3-character stop string could begin in
    eng.add_request(list(range(1, 9)), params, request_id="b")
    (done,) = eng.run_until_done()
    assert done.finished and len(done.token_ids) == 50 and len(done.text) == 50
