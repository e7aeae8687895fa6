"""Bad input gets a clear error naming the field and the limit; the engine keeps serving."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from pacer import LLM, SamplingParams
from pacer.config import EngineConfig
from tests.conftest import llm_over


@pytest.fixture(scope="module")
def llm(base):
    return llm_over(base, max_model_len=256, num_kv_blocks=64)


@pytest.mark.parametrize(
    ("make", "exc", "match"),
    [
        (lambda: SamplingParams(max_tokens=0), ValueError, "max_tokens must be >= 1"),
        (lambda: SamplingParams(temperature=-0.5), ValueError, "temperature must be >= 0"),
        (lambda: SamplingParams(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
        (lambda: SamplingParams(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
        (lambda: SamplingParams(top_k=-1), ValueError, "top_k must be >= 0"),
        (lambda: SamplingParams(max_tokens="8"), TypeError, "max_tokens must be an integer"),
        (lambda: SamplingParams(stop=[""]), ValueError, "stop"),
        (lambda: SamplingParams(presence_penalty=2.5), ValueError, r"presence_penalty must be in \[-2, 2\]"),
        (lambda: SamplingParams(frequency_penalty=float("nan")), ValueError, "frequency_penalty must be in"),
        (lambda: SamplingParams(repetition_penalty=0), ValueError, "repetition_penalty must be > 0"),
        (lambda: SamplingParams(logprobs=21), ValueError, "logprobs must be <= 20"),
        (lambda: SamplingParams(logprobs=-1), ValueError, "logprobs must be >= 0"),
        (lambda: SamplingParams(logprobs=True), TypeError, "logprobs must be an integer"),
        (lambda: SamplingParams(n=0), ValueError, "n must be >= 1"),
        (lambda: EngineConfig.from_kwargs(max_num_seqs=0), ValueError, "max_num_seqs must be >= 1"),
        (lambda: EngineConfig.from_kwargs(scheduling_policy="lifo"), ValueError, "scheduling_policy"),
        (lambda: EngineConfig.from_kwargs(kv_cache_memory="lots"), ValueError, "kv_cache_memory"),
        (lambda: EngineConfig.from_kwargs(max_num_seq=4), TypeError, "unknown engine option 'max_num_seq'"),
    ],
)
def test_parameter_errors_name_the_field(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        LLM(model=str(tmp_path / "nope"))


def test_bad_requests_are_refused_and_others_keep_running(llm):
    eng = llm.engine
    good = eng.add_request("The capital of France is", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    eng.step()  # `good` is running now
    with pytest.raises(ValueError, match="prompt must not be empty"):
        eng.add_request("", SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="prompt must not be empty"):
        eng.add_request([], SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="exceeds max_model_len=256"):
        eng.add_request("hello " * 300, SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="max_model_len=256"):
        eng.add_request("hello", SamplingParams(max_tokens=300))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 49152\)"):
        eng.add_request([5, 10**6], SamplingParams(max_tokens=4))
    with pytest.raises(TypeError, match="priority must be an integer"):
        eng.add_request("hi", SamplingParams(max_tokens=4), priority="high")
    with pytest.raises(ValueError, match="n must be 1 for Engine.add_request"):
        eng.add_request("hi", SamplingParams(max_tokens=4, n=2))
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request("hi", SamplingParams(max_tokens=4), request_id=good)
    finals = {o.request_id: o for o in eng.run_until_done()}
    assert finals[good].finish_reason == "length" and len(finals[good].token_ids) == 12
    alone = llm.generate("The capital of France is", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    assert alone[0].token_ids == finals[good].token_ids


def test_generate_validates_all_prompts_before_queueing_any(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(["fine", "x " * 400], SamplingParams(max_tokens=4))
    assert not llm.engine.has_unfinished_requests()


def test_stop_strings_seeds_and_metrics(llm):
    out = llm.generate("1, 2, 3, 4,", SamplingParams(max_tokens=40, temperature=0, stop=[" 7"]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == " 7"
    assert out.text.endswith("6,") and " 7" not in out.text
    a = llm.generate(["Tell me a story."] * 2, SamplingParams(max_tokens=16, temperature=1.0, seed=7))
    b = llm.generate("Tell me a story.", SamplingParams(max_tokens=16, temperature=1.0, seed=7))[0]
    assert a[0].token_ids == a[1].token_ids == b.token_ids
    m = b.metrics
    # stamped in order by real work: the prefill lies between scheduling and the first token,
    # 15 decode steps between the first token and the finish
    assert 0 <= m.queue_wait < m.ttft < m.e2e
    assert len(m.itl) == len(b.token_ids) - 1 and all(gap > 0 for gap in m.itl)
    assert m.tpot == pytest.approx(sum(m.itl) / len(m.itl))
    assert m.prompt_tokens == len(b.prompt_token_ids)


def test_n_samples_per_prompt_in_vllm_shape(llm):
    seeded = SamplingParams(max_tokens=12, temperature=1.0, seed=11, ignore_eos=True, logprobs=0)
    outs = llm.generate(["Tell me a story.", "Name a colour."], [replace(seeded, n=3), seeded])
    assert [len(o.outputs) for o in outs] == [3, 1]
    story = outs[0].outputs
    assert [c.index for c in story] == [0, 1, 2] and story[0].text == outs[0].text
    # sample 0 keeps the seed (the n=1 answer); the others have their own seeds, so they differ
    alone = llm.generate("Tell me a story.", seeded)[0]
    assert story[0].token_ids == alone.token_ids
    assert len({tuple(c.token_ids) for c in story}) == 3
    again = llm.generate("Tell me a story.", replace(seeded, n=3))[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in story]
    for c in story:
        assert c.finish_reason == "length" and len(c.token_ids) == 12 and c.metrics.ttft is not None
        assert c.cumulative_logprob == pytest.approx(sum(lp[t] for t, lp in zip(c.token_ids, c.logprobs)))
        assert c.cumulative_logprob < 0
    greedy = llm.generate("The capital of France is", SamplingParams(max_tokens=8, temperature=0, n=2))[0]
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids
    assert outs[1].outputs[0].cumulative_logprob is not None and outs[1].other_samples is None
    with pytest.raises(TypeError, match="sampling_params must be SamplingParams"):
        llm.generate("hi", {"max_tokens": 4})


def test_priority_argument_orders_service(base):
    llm = llm_over(base, max_num_seqs=1, scheduling_policy="priority", num_kv_blocks=64)
    outs = llm.generate(["a b c", "d e f", "g h i"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                        priority=[5, 0, 3])
    order = sorted(range(3), key=lambda i: outs[i].metrics.first_token_time)
    assert order == [1, 2, 0]


def test_generate_command_prints_samples_logprobs_and_timing(capsys):
    import torch

    from pacer.cli.main import main

    threads = torch.get_num_threads()
    try:
        rc = main(["generate", "The capital of France is", "--max-tokens", "4", "--n", "2", "--logprobs", "1",
                   "--repetition-penalty", "1.1", "--num-threads", "1", "--num-kv-blocks", "32"])
    finally:
        torch.set_num_threads(threads)
    out, err = capsys.readouterr()
    assert rc == 0
    samples = out.split("--- sample ")[1:]
    assert [s.split("\n", 1)[0] for s in samples] == ["0", "1"]
    assert samples[0] == samples[1].replace("1\n", "0\n", 1)   # greedy: both samples alike
    token_lines = [ln for ln in samples[0].splitlines() if re.fullmatch(r"\s+'.*'\s+-?\d+\.\d{3}(   top: .*)?", ln)]
    assert len(token_lines) == 4                                # one line per output token
    assert err.count("output 4 tokens, finish length") == 2
    assert main(["generate", "hi", "--top-p", "0"]) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err
