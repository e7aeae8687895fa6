"""The host offload tier on the real model (SmolLM2-135M): with a device tier too small for
the conversations, turns hit blocks promoted back from the host, and greedy outputs equal
those with the tier off (same KV dtype)."""

from __future__ import annotations

import pytest

from pacer.engine import Engine
from pacer.request import SamplingParams
from tests.conftest import make
from tests.engine.test_prefix_cache_model import QUESTIONS, chat_ids, generate

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_promoted_prefixes_give_the_outputs_of_recompute(base: Engine, kv_cache_dtype: str) -> None:
    prompts = [chat_ids(base, q, system=f"Shop {i} of {name}: you answer questions about it. Be brief.")
               for i, (q, name) in enumerate(zip(QUESTIONS, ["Anna", "Ben", "Cleo"]))]
    assert all(36 <= len(p) <= 56 for p in prompts)      # each fills most of the 8 x 8-token device tier
    kw = dict(num_kv_blocks=8, block_size=8, kv_cache_dtype=kv_cache_dtype)
    off, on = make(base, **kw), make(base, kv_offloading_size=1.0, num_cpu_blocks=64, **kw)
    want, got = {}, {}
    for engine, out in ((off, want), (on, got)):
        for rnd in range(2):                     # each prompt alone: round 2 finds round 1's blocks evicted
            for i, p in enumerate(prompts):
                out[(rnd, i)] = generate(engine, [p], PARAMS)[0]
    tiers = on.snapshot().tiers
    assert tiers["host"]["demotions"] > 0 and tiers["host"]["promotions"] > 0
    assert tiers["host"]["hit_tokens"] > 0 and tiers["host"]["bytes_to_device"] > 0
    assert sum(got[(1, i)].num_cached_tokens for i in range(3)) > sum(want[(1, i)].num_cached_tokens for i in range(3))
    for key, o in want.items():
        assert got[key].token_ids == o.token_ids, key
    on.kv.check_invariants()
