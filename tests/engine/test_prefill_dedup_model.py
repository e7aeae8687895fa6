"""Exact prefill dedup on the real model: a burst sharing a long prefix computes it once and
decodes exactly what it decodes without dedup; the snapshot counts it."""

from __future__ import annotations

from pacer.request import SamplingParams
from tests.conftest import make

SHARED = "The archive kept every letter the harbour master wrote about the boats that came in. " * 6


def test_a_shared_prefix_burst_is_computed_once_with_identical_outputs(base):
    prompts = [SHARED + f"Question {i}: which boat came in on day {i}?" for i in range(4)]
    ids = [base.tokenizer.encode(p) for p in prompts]
    params = SamplingParams(max_tokens=4, temperature=0.0)
    runs = {}
    for dedup in (False, True):
        engine = make(base, num_kv_blocks=128, prefill_dedup=dedup)
        for i, p in enumerate(ids):
            engine.add_request(p, params, request_id=f"r{i}")
        outs = {o.request_id: o for o in engine.run_until_done()}
        runs[dedup] = ({k: o.token_ids for k, o in outs.items()}, sum(o.metrics.prefill_tokens for o in outs.values()),
                       engine.snapshot().prefill_dedup)
    (off, computed_off, _), (on, computed_on, stats) = runs[False], runs[True]
    assert on == off
    shared_blocks = min(len(a) for a in ids) // 16   # the shared prefix, in whole blocks (block size 16)
    assert computed_off - computed_on >= 3 * (shared_blocks - 2) * 16
    assert stats["deferred_requests"] == 3 and stats["shared_tokens"] > 0
