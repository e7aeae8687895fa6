"""Penalties and logprobs through the real engine (SmolLM2-135M): logprobs are the log_softmax
of the model's own logits; penalties and seeds give the same tokens with and without
preemption (recompute and swap), since a resumed request brings its token history."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from pacer.engine import Engine
from pacer.model.sampler import Sampler, SamplerOutput, SamplingRow
from pacer.request import SamplingParams
from tests.conftest import make
from tests.server.conftest import FaultyExecutor

PROMPTS = ["1, 1, 1, 1, 1, 1, 1, 1,", "the the the the the the", "Once upon a time, there was a",
           "List three prime numbers:"]
PENALISED = [
    SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, frequency_penalty=1.0, logprobs=3),
    SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, repetition_penalty=1.4, presence_penalty=0.5),
    SamplingParams(max_tokens=16, temperature=0.9, seed=11, ignore_eos=True, frequency_penalty=0.7, logprobs=2),
    SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
]


def generate(engine: Engine, prompts: list[str], params: list[SamplingParams]) -> list[Any]:
    ids = {engine.add_request(p, sp): i for i, (p, sp) in enumerate(zip(prompts, params))}
    outs = {ids[o.request_id]: o for o in engine.run_until_done()}
    return [outs[i] for i in range(len(prompts))]


def test_penalties_seeds_and_logprobs_survive_preemption(base: Engine) -> None:
    ample = generate(make(base, num_kv_blocks=256, block_size=8), PROMPTS, PENALISED)
    for mode, extra in (("recompute", {}), ("swap", {"num_cpu_blocks": 64})):
        tight = make(base, num_kv_blocks=9, block_size=8, enable_prefix_caching=mode == "swap",
                     preemption_mode=mode, **extra)
        got = generate(tight, PROMPTS, PENALISED)
        assert got[2].metrics.preemptions > 0, "the KV budget was meant to preempt a penalised request"
        for a, b in zip(ample, got):
            assert b.token_ids == a.token_ids, mode
            assert (a.logprobs is None) == (b.logprobs is None)
            for ea, eb in zip(a.logprobs or [], b.logprobs or []):
                assert list(ea) == list(eb)
                assert all(math.isclose(ea[t], eb[t], abs_tol=1e-3) for t in ea)
    assert len(ample[0].logprobs) == 16 and ample[1].logprobs is None


def test_neutral_values_leave_greedy_output_unchanged(base: Engine) -> None:
    engine = make(base, num_kv_blocks=256)
    plain = generate(engine, PROMPTS[:2], [SamplingParams(max_tokens=12, temperature=0)] * 2)
    neutral = SamplingParams(max_tokens=12, temperature=0, presence_penalty=0.0, frequency_penalty=0.0,
                             repetition_penalty=1.0, logprobs=4)
    assert not neutral.has_penalties
    got = generate(engine, PROMPTS[:2], [neutral] * 2)
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
    for o in got:   # greedy: the sampled token is the most likely one
        assert [max(e, key=e.__getitem__) for e in o.logprobs] == o.token_ids
    penalised = generate(engine, PROMPTS[:2], [replace(neutral, frequency_penalty=1.5)] * 2)
    repeats = [len(o.token_ids) - len(set(o.token_ids)) for o in (*plain, *penalised)]
    assert repeats[2] < repeats[0] and repeats[3] <= repeats[1], repeats


class _CapturingSampler(Sampler):
    """Records the logits and rows of every sample call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, list[SamplingRow], SamplerOutput]] = []

    def sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
        out = super().sample(logits, rows)
        self.calls.append((logits.clone(), rows, out))
        return out


def test_logprobs_are_log_softmax_of_the_model_logits(base: Engine) -> None:
    engine = make(base, num_kv_blocks=256, max_num_batched_tokens=16)   # chunked: mixed steps
    sampler = engine.executor.sampler = _CapturingSampler()
    outs = generate(engine, PROMPTS, PENALISED)
    want: dict[str, list[dict[int, float]]] = {}
    for logits, rows, result in sampler.calls:
        ref = torch.log_softmax(logits, dim=-1)
        for i, row in enumerate(rows):
            if row.params.logprobs is None:
                continue
            tok = result.token_ids[i]
            top = ref[i].topk(row.params.logprobs)
            entry = {tok: ref[i, tok].item(), **dict(zip(top.indices.tolist(), top.values.tolist()))}
            want.setdefault(f"{row.params.seed}-{row.params.logprobs}", []).append(entry)
    for o, params in zip(outs, PENALISED):
        if params.logprobs is None:
            assert o.logprobs is None
            continue
        assert o.logprobs == want[f"{params.seed}-{params.logprobs}"]
        assert len(o.logprobs) == len(o.token_ids)
        assert [next(iter(e)) for e in o.logprobs] == o.token_ids


def test_a_failed_step_retries_penalised_requests_with_their_history(base: Engine) -> None:
    params = [PENALISED[0], PENALISED[1], SamplingParams(max_tokens=4, temperature=0)]
    want = generate(make(base, num_kv_blocks=256), PROMPTS[:2], params[:2])
    poison = base.tokenizer.encode(" Zzyzx")[-1]
    engine = make(base, lambda inner: FaultyExecutor(inner, poison), num_kv_blocks=256)
    faulty = engine.executor
    got = generate(engine, [*PROMPTS[:2], "Say Zzyzx"], params)
    assert faulty.num_failures >= 2 and got[2].finish_reason == "error"   # the step, then the poisoned one alone
    assert [o.token_ids for o in got[:2]] == [o.token_ids for o in want]
    assert [list(e) for e in got[0].logprobs] == [list(e) for e in want[0].logprobs]
