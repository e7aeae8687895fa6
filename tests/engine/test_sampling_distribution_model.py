"""Sampling controls on the real model's logits (SmolLM2-135M, 49,152 tokens): the first-token
distribution of a prompt under temperature / top_k / top_p against the one they define (in
float64 over the whole vocabulary), both from the captured logits and through the engine with
seeded requests; and `min_tokens` without `ignore_eos`: EOS is not sampled before it."""

from __future__ import annotations

import pytest
import torch

from pacer.engine import Engine
from pacer.model.sampler import Sampler, SamplingRow
from pacer.request import SamplingParams
from tests.conftest import make
from tests.engine.test_sampling_model import _CapturingSampler, generate
from tests.model.test_sampling_distribution import assert_distribution, reference

PROMPT = "My favourite fruit is the"
CONTROLS = [SamplingParams(max_tokens=1, temperature=0.7, top_k=50, top_p=0.8),
            SamplingParams(max_tokens=1, temperature=1.3, top_k=8),
            SamplingParams(max_tokens=1, temperature=0.6, top_p=0.5)]


@pytest.fixture(scope="module")
def first_logits(base: Engine) -> torch.Tensor:
    engine = make(base, num_kv_blocks=64)
    sampler = engine.executor.sampler = _CapturingSampler()
    generate(engine, [PROMPT], [SamplingParams(max_tokens=1, temperature=0)])
    (logits, _, _), = sampler.calls
    return logits[0]


@pytest.mark.parametrize("params, batches", [
    (CONTROLS[0], 2),
    pytest.param(CONTROLS[0], 10, marks=pytest.mark.slow),
    pytest.param(CONTROLS[1], 10, marks=pytest.mark.slow),
    pytest.param(CONTROLS[2], 10, marks=pytest.mark.slow)], ids=["t0.7-k50-p0.8", "t0.7-k50-p0.8-5000",
                                                                 "t1.3-k8-5000", "t0.6-p0.5-5000"])
def test_first_token_distribution_of_the_real_model(first_logits, params, batches):
    want = reference(first_logits.double().tolist(), params.temperature, params.top_k, params.top_p)
    assert 2 <= sum(p > 0 for p in want) <= 50
    sampler, counts = Sampler(7), torch.zeros(first_logits.shape[-1], dtype=torch.long)
    for _ in range(batches):     # 500 rows a batch: the vocabulary is large
        rows = [SamplingRow(params, 0)] * 500
        tokens = sampler.sample(first_logits.expand(500, -1).contiguous(), rows).token_ids
        counts += torch.bincount(torch.tensor(tokens), minlength=first_logits.shape[-1])
    assert_distribution(counts.tolist(), want)


def test_seeded_requests_through_the_engine_sample_the_defined_distribution(base, first_logits):
    params = CONTROLS[0]
    want = reference(first_logits.double().tolist(), params.temperature, params.top_k, params.top_p)
    n = 160
    engine = make(base, num_kv_blocks=256)
    seeded = [SamplingParams(max_tokens=1, temperature=params.temperature, top_k=params.top_k,
                             top_p=params.top_p, seed=s) for s in range(n)]
    outs = generate(engine, [PROMPT] * n, seeded)
    counts = torch.bincount(torch.tensor([o.token_ids[0] for o in outs]), minlength=len(want)).tolist()
    assert_distribution(counts, want)
    again = generate(make(base, num_kv_blocks=256), [PROMPT] * 8, seeded[:8])
    assert [o.token_ids for o in again] == [o.token_ids for o in outs[:8]]


def test_min_tokens_without_ignore_eos_delays_eos(base: Engine) -> None:
    # greedy SmolLM2 answers this chat in 24 tokens, the last one EOS
    ids = base.tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}])
    engine = make(base, num_kv_blocks=64)
    plain = generate(engine, [ids], [SamplingParams(max_tokens=40, temperature=0)])[0]
    eos = set(base.eos_token_ids)
    assert plain.finish_reason == "stop" and plain.token_ids[-1] in eos and len(plain.token_ids) < 28
    got = generate(engine, [ids, ids], [SamplingParams(max_tokens=40, temperature=0, min_tokens=28),
                                        SamplingParams(max_tokens=40, temperature=0.8, seed=1, min_tokens=28)])
    for o in got:
        assert len(o.token_ids) >= 28, o.token_ids
        assert not eos & set(o.token_ids[:28]), o.token_ids     # EOS was not even sampled before min_tokens
        assert o.finish_reason == "stop" or len(o.token_ids) == 40
    # the greedy one is the plain answer up to where EOS was, then the next-best token
    assert got[0].token_ids[:len(plain.token_ids) - 1] == plain.token_ids[:-1]
