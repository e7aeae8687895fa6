"""What routers read from a replica, over real HTTP with the official client: /tokenize,
/detokenize, /version, vllm:cache_config_info, cache_salt with vLLM's meaning, llm-d's
fairness header as the tenant, and the KV event stream of a served engine."""

from __future__ import annotations

import json

import httpx
import openai

from pacer.deploy.kv_index import BlockIndex, from_wire
from pacer.kv.events import chain_hashes
from pacer.telemetry.kv_events import KVEventSubscriber
from tests.server.conftest import MODEL, serve, wait_for

PROMPT = ("The committee reviewed the quarterly figures in detail and asked each department to explain "
          "its spending, its hiring plans and the risks it saw for the coming year. ") * 3


def test_tokenize_detokenize_version(llm):
    with serve(llm.engine) as served:
        r = httpx.post(served.base_url + "/tokenize", json={"model": MODEL, "prompt": "Hello world"})
        body = r.json()
        assert r.status_code == 200 and body["tokens"] == llm.tokenizer.encode("Hello world")
        assert body["count"] == len(body["tokens"]) and body["max_model_len"] == llm.engine.max_model_len
        chat = httpx.post(served.base_url + "/tokenize",
                          json={"messages": [{"role": "user", "content": "Hi"}]}).json()
        assert chat["tokens"] == llm.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
        d = httpx.post(served.base_url + "/detokenize", json={"tokens": body["tokens"]})
        assert d.status_code == 200 and d.json()["prompt"] == "Hello world"
        bad = httpx.post(served.base_url + "/detokenize", json={"tokens": [1, -2]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
        missing = httpx.post(served.base_url + "/tokenize", json={"model": MODEL})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"
        assert httpx.get(served.base_url + "/version").json()["version"]


def test_cache_config_info_under_vllm_names(llm):
    with serve(llm.engine, "--metrics-prefix", "vllm") as served:
        text = httpx.get(served.base_url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
    assert f'num_gpu_blocks="{llm.engine.kv.num_blocks}"' in line and 'block_size="16"' in line
    assert line.endswith(" 1.0")


def test_cache_salt_shares_blocks_only_with_the_same_salt(llm):
    with serve(llm.engine) as served:
        client = openai.OpenAI(base_url=served.v1, api_key="x")

        def cached(salt: str | None, suffix: str) -> int:
            extra = {} if salt is None else {"cache_salt": salt}
            r = client.completions.create(model=MODEL, prompt=PROMPT + suffix, max_tokens=1, temperature=0,
                                          extra_body=extra)
            return r.usage.prompt_tokens_details.cached_tokens

        cached("salt-1", " One")
        assert cached("salt-1", " Two") > 0        # same salt: shared
        assert cached("salt-2", " Three") == 0     # another salt: nothing
        assert cached(None, " Four") == 0          # unsalted: nothing of the salted copies
        bad = httpx.post(served.v1 + "/completions", json={"model": MODEL, "prompt": "x", "cache_salt": 3})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"


def test_fairness_header_is_the_tenant_when_none_is_given(llm, tmp_path):
    log = tmp_path / "requests.jsonl"
    with serve(llm.engine, "--request-log", str(log)) as served:
        client = openai.OpenAI(base_url=served.v1, api_key="x",
                               default_headers={"x-llm-d-inference-fairness-id": "team-blue"})
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=1, user="alice")
        wait_for(lambda: log.exists() and len(log.read_text().splitlines()) == 2, what="two request-log lines")
    tenants = [json.loads(x)["tenant"] for x in log.read_text().splitlines()]
    assert tenants == ["team-blue", "alice"]


def test_served_engine_publishes_kv_events_a_subscriber_mirrors(llm):
    config = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:0",
                         "replay_endpoint": "tcp://*:0", "topic": "kv"})
    with serve(llm.engine, "--kv-events-config", config) as served:
        pub = served.service.kv_publisher
        sub = KVEventSubscriber(pub.endpoint, pub.replay_endpoint, topic="kv")
        try:
            index = BlockIndex(strict=True)
            for _, batch in sub.replay(0):   # everything so far, blocks cached before start included
                index.apply("r", from_wire(batch))
            client = openai.OpenAI(base_url=served.v1, api_key="x")
            r = client.completions.create(model=MODEL, prompt=PROMPT + " Five", max_tokens=2, temperature=0)
            ids = llm.tokenizer.encode(PROMPT + " Five")
            want = set(chain_hashes(None, ids, 16, ""))   # what a router computes from the prompt

            def mirrored() -> bool:
                for _, batch in sub.poll(50):
                    index.apply("r", from_wire(batch))
                return want <= index.blocks("r")

            wait_for(mirrored, 30, "the prompt's blocks in the event stream")
            assert r.usage.prompt_tokens > 64 and len(want) == r.usage.prompt_tokens // 16
            cached = {h for node in llm.engine.kv.cache.iter_nodes() for h in node.hashes}
            assert want <= cached
        finally:
            sub.close()
    assert not llm.engine._kv_sinks.sinks   # detached at shutdown: the session's engine is shared
