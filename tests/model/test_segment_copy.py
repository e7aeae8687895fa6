"""Segment reuse on the real default model: a stored segment filled into another request at another
position holds, at layer 0 (where K and V depend only on the token and its position), exactly what
full prefill computes there (K re-rotated by RoPE, V as stored), in float32 and int8 KV; with the
whole segment recomputed (`segment_recompute=1.0`) the outputs equal full prefill's."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pacer.engine import Engine
from pacer.model.kv_quant import dequantize
from pacer.request import SamplingParams
from pacer.workload.text import TextSource
from tests.conftest import make

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def _prompts(base: Engine) -> tuple[list[int], list[int], list[int]]:
    import random

    rng = random.Random(3)
    src = TextSource(base.tokenizer)
    seg = list(src.segment(40, rng).token_ids)
    return seg, list(src.segment(21, rng).token_ids), list(src.segment(34, rng).token_ids)


def _layer0(eng: Engine, prompt: list[int], segments: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Run `prompt` to its first token and read its layer-0 K and V rows (as stored) while it runs."""
    rid = eng.add_request(eng.prepare(prompt, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                                      segments=segments))
    while not any(o.request_id == rid and o.new_token_ids for o in eng.step()):
        pass
    table, bs = eng.kv.block_table(rid), eng.kv.block_size
    slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(len(prompt))])
    k, v = eng.executor.kv_caches[0]
    rows = k.view(-1, *k.shape[2:])[slots].clone(), v.view(-1, *v.shape[2:])[slots].clone()
    metrics = eng.scheduler.requests[rid].metrics
    eng.abort_request(rid)
    eng.step()
    return rows[0], rows[1], metrics


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_a_filled_segment_holds_full_prefills_layer0_kv(base: Engine, kv_cache_dtype: str) -> None:
    seg, hist_a, hist_b = _prompts(base)
    tail = [base.tokenizer.encode(" Summarize.")[0]] * 3
    first, second = hist_a + seg + tail, hist_b + seg + tail
    reuse = make(base, segment_reuse="approximate", segment_recompute=0.1, kv_cache_dtype=kv_cache_dtype)
    _layer0(reuse, first, [(len(hist_a), len(seg))])                     # computes and stores the segment
    k, v, m = _layer0(reuse, second, [(len(hist_b), len(seg))])          # fills it 13 positions later
    assert m.segment_reused_tokens == len(seg) - 4 and m.segment_recomputed_tokens == 4
    full = make(base, kv_cache_dtype=kv_cache_dtype)
    k_ref, v_ref, _ = _layer0(full, second, [])
    filled = slice(len(hist_b) + 4, len(hist_b) + len(seg))
    fmt = reuse.executor.kv_format
    got, want = dequantize(fmt, k[filled], torch.float32), dequantize(fmt, k_ref[filled], torch.float32)
    scale = want.abs().amax().item()
    tol = 1e-5 * scale if kv_cache_dtype == "auto" else 2.5 * scale / 127   # int8: requantized after rotation
    assert (got - want).abs().max().item() <= tol
    assert torch.equal(v[filled], v_ref[filled])                          # V carries no position
    # the stored copy (K at the first request's positions) is far from it: the rotation did the work
    entry = next(reuse.kv.segments.iter_entries())
    bs = reuse.kv.block_size
    slots = torch.tensor([entry.block_ids[i // bs] * bs + i % bs for i in range(4, len(seg))])
    stored = dequantize(fmt, reuse.executor.kv_caches[0][0].view(-1, *k.shape[1:])[slots], torch.float32)
    assert (stored - want).abs().max().item() > 20 * tol


def test_recomputing_the_whole_segment_equals_full_prefill(base: Engine) -> None:
    seg, hist_a, hist_b = _prompts(base)
    tail = base.tokenizer.encode(" What does it say?")
    prompts = [hist_a + seg + tail, hist_b + seg + tail]
    spans = [[(len(hist_a), len(seg))], [(len(hist_b), len(seg))]]
    outs = {}
    for name, kw in (("full", {}), ("r1", {"segment_reuse": "approximate", "segment_recompute": 1.0}),
                     ("r0", {"segment_reuse": "approximate", "segment_recompute": 0.0})):
        eng = make(base, **kw)
        got = []
        for p, sp in zip(prompts, spans):
            rid = eng.add_request(eng.prepare(p, GREEDY, segments=sp))
            final = None
            while final is None:
                final = next((o for o in eng.step() if o.request_id == rid and o.finished), None)
            got.append((list(final.token_ids), final.metrics.segment_reused_tokens))
        outs[name] = got
    assert outs["r1"] == outs["full"]                        # nothing reused: exactly full prefill
    assert [n for _, n in outs["r1"]] == [0, 0]
    assert [n for _, n in outs["r0"]] == [0, len(seg)]       # the second request reused all of it


def test_a_segment_promoted_from_the_host_tier_fills_as_the_stored_one(base: Engine) -> None:
    """The store is emptied into the host tier (`reset_prefix_cache` demotes what it drops); the
    same request then promotes the segment back and fills from it: the same tokens reused and the
    same greedy output as the fill straight from the store (the KV moved by exact copies)."""
    seg, hist_a, hist_b = _prompts(base)
    tail = base.tokenizer.encode(" What does it say?")
    eng = make(base, segment_reuse="approximate", segment_recompute=0.1, kv_offloading_size=0.05)

    def run(prompt: list[int], start: int) -> tuple[list[int], int]:
        rid = eng.add_request(eng.prepare(prompt, GREEDY, segments=[(start, len(seg))]))
        final = None
        while final is None:
            final = next((o for o in eng.step() if o.request_id == rid and o.finished), None)
        return list(final.token_ids), final.metrics.segment_reused_tokens

    run(hist_a + seg + tail, len(hist_a))                    # computes and stores the segment
    from_store = run(hist_b + seg + tail, len(hist_b))
    eng.kv.reset_prefix_cache()
    assert len(eng.kv.segments) == 0
    from_host = run(hist_b + seg + tail, len(hist_b))
    stats = eng.kv.segments.stats
    assert stats.demoted == 1 and stats.promoted == 1 and stats.stored == 1
    assert from_store[1] == len(seg) - 4 and from_host == from_store
