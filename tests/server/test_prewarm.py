"""`pacer serve --prewarm FILE`: prefixes computed and pinned at start-up, so the first
request of any tenant already hits them."""

from __future__ import annotations

import contextlib
import json

import openai
import pytest

from pacer.server.cli import load_prewarm_file
from tests.server.conftest import MODEL, serve

SYSTEM = ("You are a meticulous assistant for a travel agency. Answer briefly, cite the policy section, "
          "and never invent prices. Policy sections: refunds, changes, baggage, lounges, upgrades. ") * 3


@contextlib.contextmanager
def unpinned(engine):
    """The session's engine is shared: leave no pinned blocks behind for later tests."""
    try:
        yield
    finally:
        assert engine.kv.unpin() == 1


def test_prewarm_file_formats(tmp_path, llm):
    tok = llm.tokenizer
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps("plain text") + "\n" + json.dumps([1, 2, 3]) + "\n"
                 + json.dumps({"prompt": "p"}) + "\n"
                 + json.dumps({"messages": [{"role": "system", "content": "sys"}]}) + "\n")
    items = load_prewarm_file(str(f), tok)
    assert items[:3] == ["plain text", [1, 2, 3], "p"]
    assert items[3] == tok.apply_chat_template([{"role": "system", "content": "sys"}], add_generation_prompt=False)
    g = tmp_path / "list.json"
    g.write_text(json.dumps(["a", "b"]))
    assert load_prewarm_file(str(g), tok) == ["a", "b"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"nope": 1}) + "\n")
    with pytest.raises(ValueError, match="item 0 must be text"):
        load_prewarm_file(str(bad), tok)


def test_first_request_hits_prewarmed_system_prompt(tmp_path, llm):
    f = tmp_path / "prewarm.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "system", "content": SYSTEM}]}) + "\n")
    with serve(llm.engine, "--prewarm", str(f)) as served, unpinned(llm.engine):
        client = openai.OpenAI(base_url=served.v1, api_key="x")
        r = client.chat.completions.create(
            model=MODEL, max_tokens=4, temperature=0, user="tenant-a",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Can I change my flight?"}])
        sys_ids = llm.tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}],
                                                    add_generation_prompt=False)
        assert r.usage.prompt_tokens_details.cached_tokens == len(sys_ids) // 16 * 16 > 0
