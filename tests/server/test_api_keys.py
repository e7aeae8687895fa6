"""API keys over real HTTP with the official openai client: 401 / 403 / 429, the tenant and the
priority coming from the key, the request log naming the key, request limits, and a two-tenant
flood in which the quiet tenant's requests all succeed."""

from __future__ import annotations

import asyncio
import hashlib
import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pacer.telemetry.request_log import read_request_log
from tests.server.conftest import MODEL, GatedExecutor, serve, wait_for, wrapped_engine

METRICS_KEY = "metrics-secret"
KEYS = {"keys": [
    {"name": "acme-prod", "key_sha256": hashlib.sha256(b"acme-secret").hexdigest(), "tenant": "acme",
     "priority": [2, 8]},
    {"name": "globex", "key": "globex-secret", "tenant": "globex", "max_concurrent": 2},
    {"name": "metered", "key": "metered-secret", "tenant": "lim", "requests_per_minute": 2},
    {"name": "tokens", "key": "tokens-secret", "tenant": "tok", "tokens_per_minute": 12, "burst_tokens": 120},
    {"name": "router", "key": "router-secret", "gateway": True},
    {"name": "flooder", "key": "flood-secret", "tenant": "loud"},
    {"name": "quiet", "key": "quiet-secret", "tenant": "quiet"},
]}


@pytest.fixture(scope="module")
def gated(llm, tmp_path_factory):
    engine = wrapped_engine(llm, GatedExecutor, tenant_isolation="isolated")   # what keys imply
    gate = engine.executor
    tmp = tmp_path_factory.mktemp("keys")
    keys, log = tmp / "keys.json", tmp / "requests.jsonl"
    keys.write_text(json.dumps(KEYS))
    try:
        with serve(engine, "--api-keys", str(keys), "--metrics-api-key", METRICS_KEY, "--max-waiting", "4",
                   "--request-log", str(log), "--max-stop-strings", "2") as s:
            s.log_path = log
            yield s, gate
            gate.open()
    finally:
        gate.open()


def _client(served, key, cls=openai.OpenAI):
    return cls(base_url=served.v1, api_key=key, max_retries=0, timeout=120)


def _state(served):
    r = httpx.get(served.base_url + "/debug/state", headers={"Authorization": f"Bearer {METRICS_KEY}"})
    r.raise_for_status()
    return r.json()["server"]


def _metric(served, name, **labels):
    text = httpx.get(served.base_url + "/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _complete(client, **extra):
    return client.completions.create(model=MODEL, prompt="Hello, my name is", max_tokens=2, temperature=0, **extra)


def test_missing_or_wrong_key_is_401(gated):
    served, _ = gated
    for key in ("wrong", "acme-secret-"):
        with _client(served, key) as c, pytest.raises(openai.AuthenticationError) as e:
            _complete(c)
        assert e.value.status_code == 401
        assert e.value.body["code"] == "invalid_api_key" and e.value.body["type"] == "invalid_request_error"
    r = httpx.get(served.v1 + "/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(served.base_url + "/health").status_code == 200           # open
    assert httpx.get(served.base_url + "/metrics").status_code == 401          # its own key
    assert httpx.get(served.base_url + "/metrics", headers={"Authorization": "Bearer acme-secret"}).status_code == 401
    with _client(served, "acme-secret") as c:
        assert [m.id for m in c.models.list().data] == [MODEL]


def test_tenant_and_priority_come_from_the_key(gated):
    served, _ = gated
    with _client(served, "acme-secret") as c:
        with pytest.raises(openai.PermissionDeniedError) as e:
            _complete(c, extra_body={"tenant": "globex"})
        assert e.value.status_code == 403 and e.value.body["param"] == "tenant"
        r = _complete(c, user="end-user-7", extra_body={"priority": 0})   # clamped up to the key's 2
        assert r.usage.completion_tokens == 2
        _complete(c, extra_body={"tenant": "acme", "priority": 99})       # clamped down to 8
    with _client(served, "router-secret") as c:
        _complete(c, extra_headers={"x-llm-d-inference-fairness-id": "initech"})
    def logged():
        records = [r for r in read_request_log(served.log_path) if r["api_key_name"] in ("acme-prod", "router")]
        return records if len(records) == 3 else None

    records = wait_for(logged, 30, "three log lines")
    assert [(r["api_key_name"], r["tenant"], r["priority"]) for r in records] == [
        ("acme-prod", "acme", 2), ("acme-prod", "acme", 8), ("router", "initech", 0)]
    text = served.log_path.read_text()
    assert "secret" not in text                                            # names, never keys


def test_request_rate_limit_is_429_with_retry_after(gated):
    served, _ = gated
    with _client(served, "metered-secret") as c:
        _complete(c)
        _complete(c)
        with pytest.raises(openai.RateLimitError) as e:
            _complete(c)
    assert e.value.body["code"] == "rate_limited" and "requests_per_minute" in e.value.body["message"]
    assert 25 <= int(e.value.response.headers["retry-after"]) <= 30        # one request refills in 30 s
    assert _metric(served, "pacer_tenant_request_refused_total", tenant="lim", reason="rate_limited") == 1


def test_token_rate_limit_charges_max_tokens_and_refunds(gated):
    served, _ = gated
    with _client(served, "tokens-secret") as c:
        with pytest.raises(openai.RateLimitError) as e:      # prompt + 200 can never fit the bucket (120)
            c.completions.create(model=MODEL, prompt="Hi", max_tokens=200)
        assert e.value.body["code"] == "request_too_large" and "retry-after" not in e.value.response.headers
        # 80 max_tokens are charged, but stopping after a few refunds the rest: the next fits
        kwargs = {"model": MODEL, "prompt": "1, 2, 3,", "temperature": 0, "stop": [" 4", ","]}
        first = c.completions.create(max_tokens=80, **kwargs)
        second = c.completions.create(max_tokens=80, **kwargs)
        used = first.usage.total_tokens + second.usage.total_tokens
        assert used < 40
        # a request needing the whole bucket (120) is refused until what was used refills (0.2/s)
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(max_tokens=120 - first.usage.prompt_tokens, **kwargs)
        assert e.value.body["code"] == "rate_limited" and "tokens_per_minute" in e.value.body["message"]
        assert 1 <= int(e.value.response.headers["retry-after"]) <= used * 5 + 1


def test_request_limits_over_http(gated):
    served, _ = gated
    with _client(served, "acme-secret") as c:
        with pytest.raises(openai.BadRequestError) as e:
            _complete(c, stop=["a", "b", "c"])
        assert e.value.body["param"] == "stop" and "--max-stop-strings" in e.value.body["message"]
        with pytest.raises(openai.BadRequestError) as e:   # a salt partitions inside the key's tenant
            _complete(c, extra_body={"cache_salt": ""})
        assert e.value.body["param"] == "cache_salt"
    r = httpx.post(served.v1 + "/completions", content=b"x" * (8 * 1024 * 1024 + 1),
                   headers={"Authorization": "Bearer acme-secret", "Content-Type": "application/json"})
    assert r.status_code == 413 and "--max-request-body-bytes" in r.json()["error"]["message"]


def test_concurrency_cap(gated):
    served, gate = gated

    async def go():
        async with _client(served, "globex-secret", openai.AsyncOpenAI) as c:
            gate.close()
            running = [asyncio.create_task(c.completions.create(model=MODEL, prompt=f"Item {i}:", max_tokens=2))
                       for i in range(2)]
            await asyncio.to_thread(wait_for, lambda: _state(served)["num_admission_waiting"] == 2, 30, "2 waiting")
            refused = None
            try:
                await c.completions.create(model=MODEL, prompt="Item 3:", max_tokens=2)
            except openai.RateLimitError as e:
                refused = e
            gate.open()
            return refused, await asyncio.gather(*running)

    refused, done = asyncio.run(go())
    assert refused is not None and refused.body["code"] == "concurrency_limit" and refused.response.headers["retry-after"] == "1"
    assert [r.usage.completion_tokens for r in done] == [2, 2]


def test_two_tenant_flood_quiet_tenant_all_succeed(gated):
    """--max-waiting 4: the loud tenant fills the queue; the quiet tenant's requests still get
    their share (2 of 4 places), taken from the loud tenant's latest arrivals."""
    served, gate = gated

    async def go():
        async with _client(served, "flood-secret", openai.AsyncOpenAI) as loud, \
                _client(served, "quiet-secret", openai.AsyncOpenAI) as quiet:
            gate.close()
            waiting = []
            for i in range(4):   # one at a time, so that their arrival order is known
                waiting.append(asyncio.create_task(
                    loud.completions.create(model=MODEL, prompt=f"Loud {i} says", max_tokens=3, temperature=0)))
                await asyncio.to_thread(wait_for, lambda n=i + 1: _state(served)["num_admission_waiting"] == n,
                                        30, f"{i + 1} waiting")
            refused = []
            for i in range(4):
                try:
                    await loud.completions.create(model=MODEL, prompt=f"Loud extra {i}", max_tokens=3)
                except openai.RateLimitError as e:
                    refused.append(e)
            quiet_tasks = [asyncio.create_task(quiet.completions.create(
                model=MODEL, prompt=f"Quiet {i} says", max_tokens=3, temperature=0)) for i in range(2)]
            await asyncio.to_thread(wait_for, lambda: sum(t.done() for t in waiting) == 2, 30, "two displaced")
            gate.open()
            loud_results = await asyncio.gather(*waiting, return_exceptions=True)
            return refused, loud_results, await asyncio.gather(*quiet_tasks)

    refused, loud, quiet = asyncio.run(go())
    assert len(refused) == 4 and all(e.body["code"] == "queue_full" for e in refused)
    assert [r.usage.completion_tokens for r in quiet] == [3, 3]
    assert [r.usage.completion_tokens for r in loud[:2]] == [3, 3]          # nothing admitted is lost...
    assert all(isinstance(e, openai.RateLimitError) and e.body["code"] == "displaced" for e in loud[2:])
    assert _metric(served, "pacer_tenant_request_refused_total", tenant="loud", reason="displaced") == 2
    assert _metric(served, "pacer_tenant_request_refused_total", tenant="loud", reason="queue_full") == 4
    assert _metric(served, "pacer_tenant_request_refused_total", tenant="quiet") == 0
