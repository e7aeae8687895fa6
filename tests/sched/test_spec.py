"""Speculative decoding in the scheduler: drafts under the budget, rollback of rejected drafts,
exact outputs, the adaptive policy's fade-out, metrics. On the fake executor (tests/fakes.py),
which checks every step's KV against the requests' own tokens."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pacer.config.speculative import parse_speculative_config
from pacer.request import Request, SamplingParams
from pacer.sched.spec import DraftCandidate, SpecDecoder
from pacer.sched.step_cost import FixedCostModel, StepShape
from tests.fakes import EOS, make_engine, next_token, reference_output, run

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def copy_model(seq: list[int]) -> int:
    """Mostly repeats the token 6 back (n-gram drafts often hold), sometimes not (they fail)."""
    t = seq[-6]
    return (t + 1) % 1000 if next_token(seq, 1000) % 5 == 0 else t


def add_requests(eng, n: int, params: SamplingParams, shared_prefix: int = 0) -> dict[str, list[int]]:
    prompts = {f"r{i}": [1000 - 1 - j for j in range(shared_prefix)] + [i * 10 + j for j in range(1, 12)]
               for i in range(n)}
    prompts = {rid: [t % 1000 for t in p] for rid, p in prompts.items()}
    for rid, p in prompts.items():
        eng.add_request(p, params, request_id=rid)
    return prompts


def free_after(eng) -> int:
    return eng.kv.pool.num_free_blocks + eng.kv.num_evictable_blocks


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), method=st.sampled_from(["ngram", "suffix"]),
       policy=st.sampled_from(["static", "adaptive"]), mode=st.sampled_from(["recompute", "swap"]),
       caching=st.booleans(), budget=st.integers(6, 24), num_blocks=st.integers(14, 30),
       scheduling=st.sampled_from(["fcfs", "priority", "slo"]), chunked=st.booleans())
def test_rollback_keeps_every_kv_invariant(seed, method, policy, mode, caching, budget, num_blocks, scheduling,
                                           chunked):
    """Random acceptances: after every step the block pool, prefix cache and ref counts are
    consistent (run() checks), the fake executor finds each request's KV equal to its own
    tokens (so no rejected draft's KV survives and no cached block holds one), and at the
    end every block is free or evictable."""
    rng = random.Random(seed)
    spec = {**NGRAM, "method": method}
    eng, ex = make_engine(num_blocks=num_blocks, block_size=4, max_len=64, speculative_config=spec,
                          speculative_policy=policy, preemption_mode=mode, num_cpu_blocks=32,
                          enable_prefix_caching=caching, max_num_batched_tokens=budget if chunked else 64,
                          scheduling_policy=scheduling, enable_chunked_prefill=chunked,
                          model=copy_model, accept=lambda rid, drafts: rng.randint(0, len(drafts)))
    params = SamplingParams(max_tokens=rng.randint(5, 30), temperature=0, ignore_eos=True)
    prompts = add_requests(eng, rng.randint(1, 5), params, shared_prefix=8)
    finals = run(eng, ex)
    assert set(finals) == set(prompts)
    assert all(len(o.token_ids) == params.max_tokens for o in finals.values())
    assert any(sr.draft_token_ids for out in ex.steps for sr in out.scheduled), "nothing was drafted"
    assert free_after(eng) == eng.kv.num_blocks
    st_ = eng.scheduler.spec.stats
    assert st_.num_accepted_tokens <= st_.num_draft_tokens and sum(st_.accepted_per_pos) == st_.num_accepted_tokens


def test_greedy_outputs_are_exact_under_chunking_and_preemption():
    for mode in ("recompute", "swap"):
        for policy in ("static", "adaptive"):
            eng, ex = make_engine(num_blocks=24, model=copy_model, speculative_config=NGRAM, speculative_policy=policy,
                                  preemption_mode=mode, num_cpu_blocks=64, max_num_batched_tokens=16)
            params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
            prompts = add_requests(eng, 5, params)
            finals = run(eng, ex)
            for rid, p in prompts.items():
                assert finals[rid].token_ids == reference_output(p, params, copy_model), (mode, policy, rid)
            assert eng.scheduler.num_preemptions > 0
            assert eng.scheduler.spec.stats.num_accepted_tokens > 0


def test_stop_tokens_and_min_tokens_inside_accepted_drafts():
    """EOS inside a run of accepted drafts ends the request there (the tokens after it are
    dropped, with their KV); min_tokens holds; max_tokens is never exceeded."""
    def eos_model(seq: list[int]) -> int:
        return seq[-4]
    eng, ex = make_engine(num_blocks=64, model=eos_model, speculative_config=NGRAM, speculative_policy="static")
    cases = {"a": ([3, EOS, 5, 9, 3, EOS, 5, 9], SamplingParams(max_tokens=30, temperature=0)),
             "b": ([3, EOS, 5, 9, 3, EOS, 5, 9], SamplingParams(max_tokens=30, temperature=0, min_tokens=6)),
             "c": ([1, 2, 3, 4, 1, 2, 3, 4], SamplingParams(max_tokens=7, temperature=0))}
    for rid, (p, params) in cases.items():
        eng.add_request(p, params, request_id=rid)
    finals = run(eng, ex)
    for rid, (p, params) in cases.items():
        assert finals[rid].token_ids == reference_output(p, params, eos_model), rid
    assert len(finals["c"].token_ids) == 7 and finals["c"].finish_reason == "length"
    assert finals["a"].token_ids[-1] == EOS and len(finals["a"].token_ids) < 6
    assert free_after(eng) == eng.kv.num_blocks


def test_drafts_come_out_of_the_budget_and_itl_counts_emissions():
    eng, ex = make_engine(num_blocks=64, model=copy_model, speculative_config=NGRAM, speculative_policy="static",
                          max_num_batched_tokens=8)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    add_requests(eng, 3, params)
    finals = run(eng, ex)
    assert max(out.num_scheduled_tokens for out in ex.steps) == 8   # drafts filled the budget, never past it
    emitting_steps = {rid: 0 for rid in finals}
    for out in ex.steps:
        for sr in out.scheduled:
            if sr.sample:
                emitting_steps[sr.request_id] += 1
    for rid, o in finals.items():
        m = o.metrics
        assert len(m.token_times) == 40 and len(m.itl) == emitting_steps[rid] - 1 < 39
        assert m.tpot is not None and abs(m.tpot - (m.token_times[-1] - m.first_token_time) / 39) < 1e-12


def test_adaptive_drafts_at_batch_one_and_fades_as_the_batch_grows():
    """1 ms per step + 0.1 ms per token: at acceptance 0.5 a draft pays while 0.5 * 1 ms >
    B * 0.1 ms * 0.5, i.e. below ~10 decodes; static drafts k regardless."""
    cfg = parse_speculative_config(NGRAM)
    assert cfg is not None
    def plan(policy: str, batch: int) -> int:
        spec = SpecDecoder(cfg, policy, FixedCostModel(1e-3, 1e-4))
        shape, cands = StepShape(), []
        for i in range(batch):
            req = Request(f"r{i}", list(range(100)), SamplingParams(max_tokens=50), arrival_time=0.0)
            shape = shape.with_decode(100)
            cands.append(DraftCandidate(req, 99, [1, 2, 3, 4]))
        return sum(spec.choose(cands, shape, batch, 10_000).values())
    assert plan("adaptive", 1) >= 1 and plan("adaptive", 4) >= 1
    assert plan("adaptive", 16) == 0 and plan("adaptive", 64) == 0
    assert plan("static", 64) == 4 * 64


def test_adaptive_follows_the_acceptance_rate():
    cfg = parse_speculative_config(NGRAM)
    assert cfg is not None
    spec = SpecDecoder(cfg, "adaptive", FixedCostModel(1e-3, 1e-4))
    for _ in range(10):
        spec.accepted("good", 4, 4)
        spec.accepted("bad", 4, 0)
    assert spec.acceptance_rate("good") > 0.9 and spec.acceptance_rate("bad") < 0.05
    reqs = {rid: Request(rid, list(range(50)), SamplingParams(max_tokens=50), arrival_time=0.0) for rid in ("good", "bad")}
    shape = StepShape().with_decode(50).with_decode(50)
    chosen = spec.choose([DraftCandidate(r, 49, [1, 2, 3, 4]) for r in reqs.values()], shape, 2, 100)
    assert chosen.get("good") == 4 and "bad" not in chosen
    low = spec.acceptance_rate("bad")
    for _ in range(60):   # steps without drafts let the estimate drift back, so it is tried again
        if "bad" in spec.choose([DraftCandidate(reqs["bad"], 49, [1, 2])], StepShape().with_decode(50), 1, 100):
            break
    else:
        raise AssertionError("a request that stopped drafting is never tried again")
    assert spec.acceptance_rate("bad") > low


def test_penalties_and_structured_requests_are_not_drafted():
    eng, ex = make_engine(num_blocks=64, model=copy_model, speculative_config=NGRAM, speculative_policy="static")
    add_requests(eng, 1, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, presence_penalty=0.5))
    run(eng, ex)
    assert not any(sr.draft_token_ids for out in ex.steps for sr in out.scheduled)


def test_kv_events_never_store_a_block_holding_unverified_drafts():
    """Every stored block's tokens, chained from its parent, are a prefix of a request's final
    tokens: no block with a rejected draft ever reaches the prefix cache or its events."""
    from pacer.kv.events import BlockStoredEvent

    rng = random.Random(3)
    eng, ex = make_engine(num_blocks=40, block_size=4, max_len=64, speculative_config=NGRAM,
                          speculative_policy="static", max_num_batched_tokens=12, model=copy_model,
                          accept=lambda rid, drafts: rng.randint(0, len(drafts)))
    stored: list[BlockStoredEvent] = []
    eng.add_kv_event_sink(lambda now, events: stored.extend(e for e in events if isinstance(e, BlockStoredEvent)))
    prompts = add_requests(eng, 4, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True), shared_prefix=8)
    finals = run(eng, ex)
    sequences = [prompts[rid] + finals[rid].token_ids for rid in prompts]
    prefixes: dict[int, list[int]] = {}
    for ev in stored:
        prefix = list(prefixes[ev.parent_block_hash]) if ev.parent_block_hash is not None else []
        for i, h in enumerate(ev.block_hashes):
            prefix += list(ev.token_ids[i * ev.block_size:(i + 1) * ev.block_size])
            prefixes[h] = list(prefix)
            assert any(seq[:len(prefix)] == prefix for seq in sequences), "a stored block holds tokens no request has"
    assert len(prefixes) > 10 and eng.scheduler.spec.stats.num_draft_tokens > eng.scheduler.spec.stats.num_accepted_tokens
