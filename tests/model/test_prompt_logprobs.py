"""Prompt logprobs (vLLM's `prompt_logprobs`, what lm-eval's loglikelihood reads) against HF
transformers float32 on the same weights: under chunked prefill, a prefix another tenant
cached, recompute preemption, and an int8 KV cache (looser: its error is the quantisation's)."""

from __future__ import annotations

import pytest
import torch

from pacer import SamplingParams
from pacer.model.hf_reference import hf_llama_from_checkpoint
from pacer.model.loader import load_checkpoint
from tests.conftest import make
from tests.model.logit_capture import hf_log_softmax

TEXT = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single "
        "step, and every step after it is easier than the first.")


@pytest.fixture(scope="module")
def reference():
    ckpt = load_checkpoint(None)
    prompt = ckpt.tokenizer.encode(TEXT)
    other = prompt[:40] + ckpt.tokenizer.encode(" Then the story turned another way entirely.")
    hf32 = hf_llama_from_checkpoint(ckpt)
    seqs = [prompt, other]
    lsm = hf_log_softmax(hf32, [s + [0] for s in seqs])   # position p scores token p + 1
    expected = [[lsm_i[p, s[p + 1]].item() for p in range(len(s) - 1)] for s, lsm_i in zip(seqs, lsm)]
    return seqs, expected, lsm


def _scores(out) -> list[float]:
    lps = out.prompt_logprobs
    assert lps[0] is None and len(lps) == len(out.prompt_token_ids)
    return [lp[t] for t, lp in zip(out.prompt_token_ids[1:], lps[1:])]


def _max_err(got: list[float], want: list[float]) -> float:
    assert len(got) == len(want)
    return max(abs(a - b) for a, b in zip(got, want))


def test_prompt_logprobs_match_hf_float32_under_chunking_cache_and_preemption(base, reference):
    seqs, expected, lsm = reference
    # 16-token chunks; a 24-block KV (16-token blocks) for three ~45-token requests forces preemption
    engine = make(base, max_num_batched_tokens=16, enable_prefix_caching=True, num_kv_blocks=9,
                  preemption_mode="recompute")
    engine.add_request(seqs[0], SamplingParams(max_tokens=1, temperature=0), tenant="other")
    while engine.has_unfinished_requests():   # the prompt's blocks cached by another tenant
        engine.step()
    control = engine.add_request(seqs[0], SamplingParams(max_tokens=1, temperature=0), tenant="me")
    assert next(o for o in engine.run_until_done() if o.request_id == control).num_cached_tokens > 0
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, prompt_logprobs=3)
    ids = [engine.add_request(s, params, tenant="me") for s in (seqs[0], seqs[1], seqs[0])]
    finals = {o.request_id: o for o in engine.run_until_done()}
    outs = [finals[i] for i in ids]
    assert engine.scheduler.num_preemptions > 0
    for out, want, table in zip(outs, [expected[0], expected[1], expected[0]], [lsm[0], lsm[1], lsm[0]]):
        assert out.num_cached_tokens == 0          # recomputed, never read off the cache
        assert _max_err(_scores(out), want) < 1e-4
        for p, entry in enumerate(out.prompt_logprobs[1:]):   # the prompt token, then the top 3
            top = torch.topk(table[p], 3).indices.tolist()
            assert set(top) <= set(entry) and len(entry) in (3, 4)


def test_prompt_logprobs_with_int8_kv_stay_close(base, reference):
    seqs, expected, _ = reference
    engine = make(base, kv_cache_dtype="int8", max_num_batched_tokens=16)
    rid = engine.add_request(seqs[0], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    out = next(o for o in engine.run_until_done() if o.request_id == rid)
    assert all(len(e) == 1 for e in out.prompt_logprobs[1:])
    errs = [abs(a - b) for a, b in zip(_scores(out), expected[0])]
    print(f"int8 KV prompt logprobs vs HF float32: mean |d| {sum(errs) / len(errs):.3f}, max {max(errs):.3f}")
    # measured: mean 0.113, max 0.997 (the quantisation's error; a wrong position would be off by several nats)
    assert sum(errs) / len(errs) < 0.25 and max(errs) < 2.0
