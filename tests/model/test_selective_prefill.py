"""The selection study's reference forward (`pacer.model.selective_prefill`) on the default model's
float32 weights: with every token computed it scores a prompt as the engine does (prompt logprobs,
which tests/model/test_prompt_logprobs.py holds to HF float32); a span after a context equals the
whole run; inactive tokens that are handed their exact KV change nothing; a stored segment moved to
another position deviates from full prefill only from layer 1 on (CacheBlend's premise), and the
tokens computed are exactly those marked active."""

from __future__ import annotations

import random

import pytest
import torch

from pacer import SamplingParams
from pacer.model.segment_copy import rotate_keys, rotation
from pacer.model.selective_prefill import deviation, selective_forward
from pacer.workload.text import TextSource
from tests.conftest import make


@pytest.fixture(scope="module")
def parts(base):
    rng = random.Random(7)
    src = TextSource(base.tokenizer)
    a, b, seg, q = (list(src.segment(n, rng).token_ids) for n in (23, 37, 30, 12))
    return base.executor.model, a, b, seg, q


def _all(n: int) -> torch.Tensor:
    return torch.ones(n, dtype=torch.bool)


def _run(model, ids, start=0, past=None, active=None, reuse=None, logits_from=0, num_layers=None):
    return selective_forward(model, torch.tensor(ids), torch.arange(start, start + len(ids)), past,
                             None if past is None else torch.arange(start),
                             _all(len(ids)) if active is None else active, reuse, logits_from, num_layers)


def test_full_forward_scores_a_prompt_as_the_engine_does(base, parts):
    model, a, _, seg, q = parts
    prompt = a + seg + q
    eng = make(base)
    rid = eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1))
    out = next(o for o in eng.run_until_done() if o.request_id == rid)
    lp = _run(model, prompt).logprobs
    want = [out.prompt_logprobs[p + 1][prompt[p + 1]] for p in range(len(prompt) - 1)]
    got = [lp[p, prompt[p + 1]].item() for p in range(len(prompt) - 1)]
    assert max(abs(x - y) for x, y in zip(got, want)) < 1e-4


def test_span_after_context_and_exact_reuse_equal_the_whole_run(parts):
    model, a, _, seg, q = parts
    whole = _run(model, a + seg + q)
    ctx = _run(model, a, logits_from=None)
    span = _run(model, seg + q, len(a), ctx.kv)
    assert torch.allclose(span.logprobs, whole.logprobs[len(a):], atol=1e-4)
    exact = [(k[len(a):], v[len(a):]) for k, v in whole.kv]
    active = _all(len(seg) + len(q))
    active[3:len(seg)] = False            # segment tokens 3.. take their exact KV instead of being computed
    part = _run(model, seg + q, len(a), ctx.kv, active, exact)
    assert part.logprobs.shape[0] == 3 + len(q)   # only active rows are computed
    assert torch.allclose(part.logprobs[3:], whole.logprobs[len(a) + len(seg):], atol=1e-4)


def test_a_moved_segment_deviates_from_layer_one_and_recomputing_it_all_is_exact(parts):
    model, a, b, seg, q = parts
    stored = _run(model, b + seg, logits_from=None).kv            # seg computed after b, at position len(b)
    cos, sin = rotation(torch.full((len(seg),), len(a) - len(b)), model.inv_freq)
    pad = torch.zeros(len(q), *stored[0][0].shape[1:])
    reuse = [(torch.cat([rotate_keys(k[len(b):], cos, sin), pad]), torch.cat([v[len(b):], pad])) for k, v in stored]
    ctx = _run(model, a, logits_from=None)
    truth = _run(model, seg, len(a), ctx.kv, num_layers=2).kv
    seg_reuse = [(k[:len(seg)], v[:len(seg)]) for k, v in reuse[:2]]
    dev0, dev1 = deviation(truth[0], seg_reuse[0]), deviation(truth[1], seg_reuse[1])
    scale = truth[1][0].pow(2).sum((1, 2)).mean()
    assert dev0.max() < 1e-8 * scale     # layer 0: K and V depend on the token and its position only
    assert dev1.mean() > 1e-4 * scale    # layer 1 on: the context differs
    active = _all(len(seg) + len(q))
    active[:len(seg)] = False
    whole = _run(model, a + seg + q).logprobs[len(a) + len(seg):]
    reused = _run(model, seg + q, len(a), ctx.kv, active, reuse).logprobs
    kl = (whole.exp() * (whole - reused)).sum(-1).mean()
    assert kl > 1e-4                     # reuse without recompute is approximate
    active[:len(seg)] = True
    again = _run(model, seg + q, len(a), ctx.kv, active, reuse).logprobs[len(seg):]
    assert torch.allclose(again, whole, atol=1e-4)
