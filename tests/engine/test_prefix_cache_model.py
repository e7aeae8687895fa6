"""Prefix cache and swap on the real model (SmolLM2-135M): greedy outputs do not depend on
cache hits or on swap vs recompute preemption; prewarmed system prompts are hit."""

from __future__ import annotations

from typing import Any

from pacer.engine import Engine
from pacer.request import SamplingParams
from tests.conftest import llm_over, make

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
SYSTEM = ("You are a careful assistant for a hardware store. Answer briefly, name the aisle, and "
          "never invent prices. Tools, paint and garden supplies are on the ground floor.")
QUESTIONS = ["Where are the hammers?", "Do you sell blue paint?", "What is a good shovel for clay soil?"]


def chat_ids(base: Engine, question: str, system: str = SYSTEM) -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return list(base.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def generate(engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> dict[int, Any]:
    ids = {engine.add_request(p, params): i for i, p in enumerate(prompts)}
    return {ids[o.request_id]: o for o in engine.run_until_done()}


def test_greedy_outputs_identical_with_cache_on_and_off(base: Engine) -> None:
    prompts = [chat_ids(base, q) for q in QUESTIONS]
    off = make(base, enable_prefix_caching=False, num_kv_blocks=256)
    on = make(base, num_kv_blocks=256, block_size=16)
    want = generate(off, prompts)
    generate(on, prompts[:1])                              # caches the system prompt
    got = generate(on, prompts)
    assert all(got[i].num_cached_tokens >= 32 for i in range(len(prompts)))
    assert got[0].num_cached_tokens >= len(prompts[0]) - 16   # the whole first prompt but its tail
    for i in range(len(prompts)):
        assert got[i].token_ids == want[i].token_ids, QUESTIONS[i]
    # next turn of a conversation: hits the previous prompt *and* answer
    turn2 = prompts[0] + got[0].token_ids + base.tokenizer.encode("And the nails?")
    assert generate(on, [turn2])[0].num_cached_tokens >= len(prompts[0]) + len(got[0].token_ids) - 16
    assert generate(on, [turn2])[0].token_ids == generate(off, [turn2])[0].token_ids


def test_swap_and_recompute_preemption_give_identical_outputs(base: Engine) -> None:
    prompts = [chat_ids(base, q, system="Be brief.") for q in QUESTIONS]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    kw = dict(num_kv_blocks=10, block_size=8, enable_prefix_caching=False)
    swap = make(base, preemption_mode="swap", num_cpu_blocks=64, **kw)
    recompute = make(base, preemption_mode="recompute", **kw)
    got_swap = generate(swap, prompts, params)
    got_recompute = generate(recompute, prompts, params)
    stats = swap.snapshot()
    assert stats.num_swap_preemptions > 0 and stats.swap_in_bytes > 0
    assert recompute.snapshot().num_recompute_preemptions > 0
    for i in range(len(prompts)):
        assert got_swap[i].token_ids == got_recompute[i].token_ids


def test_llm_prewarm_pins_a_public_system_prompt_for_isolated_tenants(base: Engine) -> None:
    llm = llm_over(base, num_kv_blocks=256, tenant_isolation="isolated")   # reuse the loaded model
    cached = llm.prewarm([[{"role": "system", "content": SYSTEM}]])
    assert cached[0] >= 32
    outs = llm.chat([[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS],
                    GREEDY, tenant=["alice", "bob", "carol"])
    assert all(o.num_cached_tokens == cached[0] for o in outs)
    # a tenant's own conversation stays private
    private = llm.generate(outs[0].prompt_token_ids, GREEDY, tenant="bob")[0]
    assert private.num_cached_tokens == cached[0]
