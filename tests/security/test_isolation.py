"""Finding 2: keys isolate the prefix cache. `pacer serve --api-keys` as a real process builds
its engine isolated per tenant, so one tenant's `cached_tokens` says nothing about another's
prompts; an operator who asks for `--tenant-isolation shared` gets it, and a warning saying
what it reveals."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.conftest import MODEL
from tests.server.test_serve_cli import ServerProcess

KEYS = {"keys": [{"name": "victim", "key": "victim-key", "tenant": "victim"},
                 {"name": "prober", "key": "prober-key", "tenant": "prober"}]}
PROMPT = " ".join(f"word{i}" for i in range(48))   # several 16-token blocks


def _cached_tokens(base: str, key: str) -> int:
    with openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120) as c:
        r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0)
    return r.usage.prompt_tokens_details.cached_tokens


@pytest.mark.parametrize("flags, isolated", [((), True), (("--tenant-isolation", "shared"), False)],
                         ids=["keys-alone", "shared-chosen"])
def test_keys_isolate_the_cache_unless_shared_is_chosen(tmp_path, flags, isolated):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(KEYS))
    srv = ServerProcess("--api-keys", str(keys), "--num-kv-blocks", "128", *flags)
    try:
        base = srv.url()
        assert _cached_tokens(base, "victim-key") == 0
        probed = _cached_tokens(base, "prober-key")
        again = _cached_tokens(base, "victim-key")
    finally:
        srv.proc.kill()
        srv.proc.wait(30)
    log = "".join(srv.lines)
    assert again >= 32                                  # the victim's own prefix is cached
    if isolated:
        assert probed == 0, "the prober saw the victim's prefix"
        assert "tenant isolation 'isolated'" in log
    else:
        assert probed >= 32
        assert "WARNING: --tenant-isolation shared with API keys" in log
