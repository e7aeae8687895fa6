"""The prefix-cache timing channel on the real engine over HTTP, keys bound to two tenants.

Under `--tenant-isolation isolated` a prompt another tenant has cached must not come back
faster than one nobody has cached: shown with an equivalence test (TOST, margin: mean latency
ratio within 0.8..1.25) over interleaved trials with fresh prompts. The same procedure on a
`shared` cache must find the difference, so the test can fail. The timing test is slow (run
by `make test-slow`); the fast test checks the same trials' cached-token counts.
"""

from __future__ import annotations

import json
import math

import pytest

from pacer.bench.timing_channel import log_ratios, run_trials
from pacer.workload.equivalence import tost_paired
from tests.conftest import llm_over
from tests.server.conftest import MODEL, serve

KEYS = {"keys": [{"name": "victim", "key": "victim-key", "tenant": "victim"},
                 {"name": "attacker", "key": "attacker-key", "tenant": "attacker"}]}
MARGIN = math.log(1.25)      # |mean log(t_cached / t_fresh)| < log 1.25
NUM_TRIALS = 30
PROMPT_LEN = 320             # 20 blocks: a hit skips nearly all of the prefill


@pytest.fixture(scope="module")
def keys_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("iso") / "keys.json"
    path.write_text(json.dumps(KEYS))
    return path


@pytest.fixture(scope="module")
def isolated_llm(base):
    return llm_over(base, kv_cache_memory="256MiB", tenant_isolation="isolated")


def _trials(engine, keys_path, num_trials, seed, prompt_len=PROMPT_LEN):
    # keys imply an isolated cache; the shared contrast has to ask for one
    with serve(engine, "--api-keys", str(keys_path), "--tenant-isolation", engine.config.cache.tenant_isolation) as s:
        return run_trials(s.base_url, MODEL, "victim-key", "attacker-key", num_trials,
                          prompt_len=prompt_len, seed=seed)


def test_isolated_cache_never_serves_another_tenants_prefix(isolated_llm, llm, keys_path):
    isolated = _trials(isolated_llm.engine, keys_path, 3, seed=1, prompt_len=64)
    shared = _trials(llm.engine, keys_path, 3, seed=2, prompt_len=64)
    assert [t.cached_tokens for t in isolated] == [0, 0, 0]
    assert all(t.cached_tokens >= 64 - 16 for t in shared)              # the contrast: a hit


@pytest.mark.slow
def test_timing_channel_closed_when_isolated_open_when_shared(isolated_llm, llm, keys_path):
    isolated = tost_paired(log_ratios(_trials(isolated_llm.engine, keys_path, NUM_TRIALS, seed=3)), MARGIN)
    shared = tost_paired(log_ratios(_trials(llm.engine, keys_path, NUM_TRIALS, seed=4)), MARGIN)
    print(f"\nisolated: {isolated.line()}\nshared:   {shared.line()}")
    assert isolated.equivalent, f"isolated: the cached prompt's latency differs: {isolated.line()}"
    assert not shared.equivalent and shared.ci_high < -MARGIN, (
        f"shared: the procedure should see the cache hit: {shared.line()}")
