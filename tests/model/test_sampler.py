"""The sampler on synthetic logits: penalties against a per-token reference (vLLM/OpenAI
semantics), raw logprobs, and rows that ask for neither left exactly as they were."""

from __future__ import annotations

import math

import pytest
import torch

from pacer.model.sampler import Sampler, SamplingRow, TokenHistory
from pacer.request import SamplingParams

V = 40


def reference_penalties(logits: list[float], prompt: list[int], output: list[int], p: SamplingParams) -> list[float]:
    out = list(logits)
    for t in set(prompt) | set(output):
        out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    for t in set(output):
        out[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return out


def test_penalties_match_the_reference_row_by_row():
    torch.manual_seed(0)
    logits = torch.randn(4, V) * 3
    prompt, output = [1, 2, 3, 3, 5], [5, 7, 7, 7, 9]
    cases = [SamplingParams(temperature=0, frequency_penalty=0.5),
             SamplingParams(temperature=0, presence_penalty=-1.0, repetition_penalty=1.3),
             SamplingParams(temperature=0),                                    # no penalties: untouched
             SamplingParams(temperature=0, repetition_penalty=0.7, frequency_penalty=-0.2, presence_penalty=2)]
    rows = [SamplingRow(p, len(output), TokenHistory(prompt, output) if p.has_penalties else None) for p in cases]
    got = Sampler._apply_penalties(logits, rows, [i for i, r in enumerate(rows) if r.history is not None])
    for i, p in enumerate(cases):
        want = reference_penalties(logits[i].tolist(), prompt, output, p)
        assert got[i].tolist() == pytest.approx(want, rel=1e-6, abs=1e-6), p
    assert torch.equal(got[2], logits[2])


def test_history_counts_only_new_tokens_of_later_chunks():
    h = TokenHistory([1, 2, 3], [4])
    h.observe(2, [3, 4])          # recompute chunk inside the known tokens: nothing new
    h.observe(4, [9])             # a decode token: a new output
    h.observe(5, [9])
    counts, seen = h.tensors(V, torch.device("cpu"))
    assert {i: int(c) for i, c in enumerate(counts.tolist()) if c} == {4: 1, 9: 2}
    assert set(torch.nonzero(seen).flatten().tolist()) == {1, 2, 3, 4, 9}
    h.observe(6, [4])             # applied lazily at the next use
    assert int(h.tensors(V, torch.device("cpu"))[0][4]) == 2
    with pytest.raises(ValueError, match="starts at 9"):
        h.observe(9, [1])


def test_greedy_penalties_steer_away_from_repeats():
    logits = torch.zeros(1, V)
    logits[0, 7] = 2.0
    logits[0, 8] = 1.5
    plain = Sampler().sample(logits, [SamplingRow(SamplingParams(temperature=0), 0)])
    penalised = Sampler().sample(logits, [SamplingRow(SamplingParams(temperature=0, frequency_penalty=0.3), 2,
                                                      TokenHistory([1], [7, 7]))])
    assert plain.token_ids == [7] and penalised.token_ids == [8]


def test_logprobs_are_raw_and_only_for_rows_that_ask():
    torch.manual_seed(1)
    logits = torch.randn(3, V) * 2
    rows = [SamplingRow(SamplingParams(temperature=0, logprobs=5, repetition_penalty=2.0), 1, TokenHistory([0], [1])),
            SamplingRow(SamplingParams(temperature=0.8, seed=3), 0),
            SamplingRow(SamplingParams(temperature=1.0, seed=4, logprobs=0), 0)]
    out = Sampler().sample(logits, rows)
    assert set(out.logprobs) == {0, 2}
    raw = torch.log_softmax(logits, dim=-1)
    for row, k in ((0, 5), (2, 0)):
        entry = out.logprobs[row]
        tok = out.token_ids[row]
        assert next(iter(entry)) == tok                       # the sampled token first
        assert entry[tok] == pytest.approx(raw[row, tok].item(), abs=1e-6)
        top = list(entry.items())[1:] if len(entry) > k else sorted(entry.items(), key=lambda kv: -kv[1])
        want_ids = raw[row].topk(k).indices.tolist() if k else []
        assert [t for t, _ in top] == want_ids
        assert sum(math.exp(lp) for lp in entry.values()) <= 1 + 1e-6


def test_rows_without_options_sample_exactly_as_before():
    torch.manual_seed(2)
    logits = torch.randn(5, V)
    plain = [SamplingRow(SamplingParams(temperature=0), 0), SamplingRow(SamplingParams(temperature=0.7, seed=9), 3)]
    mixed = [*plain, SamplingRow(SamplingParams(temperature=0, presence_penalty=2, logprobs=3), 1,
                                 TokenHistory([1], [int(logits[2].argmax())]))]
    a = Sampler().sample(logits[:2], plain)
    b = Sampler().sample(logits[:3], mixed)
    assert b.token_ids[:2] == a.token_ids and a.logprobs == {}
    assert a.token_ids[0] == int(logits[0].argmax())
    assert b.token_ids[2] != int(logits[2].argmax())           # presence penalty moved the greedy choice
