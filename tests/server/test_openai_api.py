"""The official `openai` client against `pacer serve`: texts equal the offline engine's greedy
outputs, sync and async, streaming and not; usage, errors, /metrics and the request log."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pacer.telemetry.request_log import REQUEST_LOG_FIELDS, read_request_log
from tests.server.conftest import GREEDY, MODEL, serve, wait_for

PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "def fibonacci(n):", "Roses are red,"]
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]]
MANY = [f"Write the number {i} in words:" for i in range(16)] + [f"Item {i}: a" for i in range(16)]


@pytest.fixture(scope="module")
def refs(llm):
    """Offline greedy outputs, computed before the server takes the engine."""
    texts = [o.text for o in llm.generate(PROMPTS + MANY, GREEDY)]
    chats = [o.text for o in llm.chat(CHATS, GREEDY)]
    return {"completion": dict(zip(PROMPTS + MANY, texts)), "chat": chats}


@pytest.fixture(scope="module")
def served(llm, refs, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("server") / "requests.jsonl"
    with serve(llm.engine, "--request-log", str(log_path)) as s:
        s.log_path = log_path
        yield s


def test_completions_sync(client, refs):
    for prompt in PROMPTS[:2]:
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
        assert r.choices[0].text == refs["completion"][prompt]
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens >= 1
        # the reference run computed this prompt: every full block but the one holding its last token is a hit
        assert r.usage.prompt_tokens_details.cached_tokens == 16 * ((r.usage.prompt_tokens - 1) // 16)
        stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stream=True)
        chunks = list(stream)
        assert "".join(c.choices[0].text for c in chunks) == refs["completion"][prompt]
        assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_stop_string_never_streamed(client):
    kwargs = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0,
              "stop": ["\n\nThe", "zzz"]}
    r = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, **kwargs))
    assert r.choices[0].finish_reason == "stop" and "\n\nThe" not in r.choices[0].text
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_batched_prompts_keep_order(client, refs):
    r = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=16, temperature=0)
    assert [c.index for c in r.choices] == list(range(len(PROMPTS)))
    assert [c.text for c in r.choices] == [refs["completion"][p] for p in PROMPTS]


def test_chat_sync(client, refs):
    for messages, want in zip(CHATS, refs["chat"]):
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
        assert r.choices[0].message.content == want
        assert r.choices[0].message.role == "assistant"
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=16,
                                                      temperature=0, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
        assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == want


def test_async_streams_with_usage(served, refs):
    async def main():
        async with openai.AsyncOpenAI(base_url=served.v1, api_key="none", max_retries=0) as c:
            stream = await c.chat.completions.create(model=MODEL, messages=CHATS[0], max_tokens=16, temperature=0,
                                                     stream=True, stream_options={"include_usage": True})
            chunks = [ch async for ch in stream]
            r = await c.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=16, temperature=0)
            return chunks, r

    chunks, r = asyncio.run(main())
    assert r.choices[0].text == refs["completion"][PROMPTS[2]]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == refs["chat"][0]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(ch.usage is None for ch in chunks[:-1])
    usage = chunks[-1].usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # the same chat was computed before: its prompt blocks come from the prefix cache (block size
    # 16; the block holding the last prompt token is always computed)
    assert usage.prompt_tokens > 16
    assert usage.prompt_tokens_details.cached_tokens == 16 * ((usage.prompt_tokens - 1) // 16)


def test_32_concurrent_streams_match_offline(served, refs):
    async def one(c, prompt):
        stream = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stream=True)
        return "".join([ch.choices[0].text async for ch in stream])

    async def main():
        async with openai.AsyncOpenAI(base_url=served.v1, api_key="none", max_retries=0) as c:
            return await asyncio.gather(*(one(c, p) for p in MANY))

    texts = asyncio.run(main())
    assert texts == [refs["completion"][p] for p in MANY]


BAD_INPUTS = [
    # (endpoint, body, status, type, param, code)
    ("completions", b"{not json", 400, "invalid_request_error", None, None),
    ("completions", b"[1, 2]", 400, "invalid_request_error", None, None),
    ("completions", {"prompt": "hi"}, 400, "invalid_request_error", "model", None),
    ("completions", {"model": MODEL}, 400, "invalid_request_error", "prompt", None),
    ("completions", {"model": MODEL, "prompt": ""}, 400, "invalid_request_error", "prompt", None),
    ("completions", {"model": MODEL, "prompt": 5}, 400, "invalid_request_error", "prompt", None),
    ("completions", {"model": "nope", "prompt": "hi"}, 404, "invalid_request_error", "model", "model_not_found"),
    ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": "5"}, 400, "invalid_request_error",
     "max_tokens", None),
    ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "invalid_request_error",
     "max_tokens", None),
    ("completions", {"model": MODEL, "prompt": "hi", "temperature": -1}, 400, "invalid_request_error",
     "temperature", None),
    ("completions", {"model": MODEL, "prompt": "hi", "temperature": True}, 400, "invalid_request_error",
     "temperature", None),
    ("completions", {"model": MODEL, "prompt": "hi", "top_p": 0}, 400, "invalid_request_error", "top_p", None),
    ("completions", {"model": MODEL, "prompt": "hi", "n": 9}, 400, "invalid_request_error", "n", None),
    ("completions", {"model": MODEL, "prompt": "hi", "stop": [1]}, 400, "invalid_request_error", "stop", None),
    ("completions", {"model": MODEL, "prompt": "hi", "seed": 1.5}, 400, "invalid_request_error", "seed", None),
    ("completions", {"model": MODEL, "prompt": "hi", "priority": "high"}, 400, "invalid_request_error",
     "priority", None),
    ("completions", {"model": MODEL, "prompt": "hi", "logprobs": 21}, 400, "invalid_request_error",
     "logprobs", None),
    ("completions", {"model": MODEL, "prompt": "hi", "stream": "yes"}, 400, "invalid_request_error",
     "stream", None),
    ("completions", {"model": MODEL, "prompt": "hi", "stream_options": {"include_usage": True}}, 400,
     "invalid_request_error", "stream_options", None),
    ("completions", {"model": MODEL, "prompt": [10**9]}, 400, "invalid_request_error", "prompt", None),
    ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": 10**6}, 400, "invalid_request_error",
     "prompt", "context_length_exceeded"),
    ("chat/completions", {"model": MODEL}, 400, "invalid_request_error", "messages", None),
    ("chat/completions", {"model": MODEL, "messages": []}, 400, "invalid_request_error", "messages", None),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400,
     "invalid_request_error", "messages[0].role", None),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": 3}]}, 400,
     "invalid_request_error", "messages[0].content", None),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x " * 9000}]}, 400,
     "invalid_request_error", "messages", "context_length_exceeded"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                          "max_completion_tokens": -1}, 400, "invalid_request_error", "max_completion_tokens", None),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "user": ""}, 400,
     "invalid_request_error", "user", None),
]


@pytest.mark.parametrize("endpoint,body,status,type_,param,code", BAD_INPUTS)
def test_bad_inputs(served, endpoint, body, status, type_, param, code):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{served.v1}/{endpoint}", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["param"], err["code"]) == (type_, param, code), err
    assert err["message"]


def test_models_and_health(served, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(served.base_url + "/health").status_code == 200


def _samples(text):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _total(samples, name, **labels):
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == want for k, want in labels.items()))


def test_metrics_parse_and_move(served, client):
    before = _samples(httpx.get(served.base_url + "/metrics").text)
    r = client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=5, temperature=0)
    httpx.post(f"{served.v1}/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 10**6})
    after = _samples(httpx.get(served.base_url + "/metrics").text)
    n_out = r.usage.completion_tokens

    def moved(name, **labels):
        return _total(after, name, **labels) - _total(before, name, **labels)

    assert moved("pacer_generation_tokens_total") == n_out
    assert moved("pacer_prompt_tokens_total") == r.usage.prompt_tokens
    assert moved("pacer_request_success_total", finished_reason=r.choices[0].finish_reason) == 1
    assert moved("pacer_time_to_first_token_seconds_count", **{"class": "chat"}) == 1
    assert moved("pacer_e2e_request_latency_seconds_count") == 1
    assert moved("pacer_inter_token_latency_seconds_count") == n_out - 1
    assert moved("pacer_request_refused_total", reason="context_length_exceeded") == 1
    assert moved("pacer_prefix_cache_queries_total") >= r.usage.prompt_tokens
    # one StepStats per step feeds the step histogram: a step per output token, each token scheduled once
    assert moved("pacer_iteration_tokens_total_count") >= n_out
    assert moved("pacer_iteration_tokens_total_sum") >= n_out
    for gauge in ("pacer_num_requests_running", "pacer_num_requests_waiting", "pacer_kv_cache_usage_perc"):
        assert any(n == gauge for n, _ in after), gauge


def test_request_log_lines(served, client):
    r = client.chat.completions.create(model=MODEL, messages=CHATS[1], max_tokens=4, temperature=0,
                                       user="tenant-a", extra_body={"priority": 3})

    def mine():
        return [rec for rec in read_request_log(served.log_path) if rec["api_id"] == r.id]

    rec = wait_for(mine, 10, "the request-log line")[0]
    assert tuple(rec) == REQUEST_LOG_FIELDS
    assert (rec["tenant"], rec["priority"], rec["class"], rec["endpoint"]) == ("tenant-a", 3, "chat", "chat")
    assert rec["output_tokens"] == r.usage.completion_tokens and rec["prompt_tokens"] == r.usage.prompt_tokens
    assert rec["finish_reason"] == r.choices[0].finish_reason and rec["status"] == 200
    assert 0 <= rec["timestamp"] <= rec["first_token_at"] <= rec["finished_at"]
    assert rec["ttft"] > 0 and rec["e2e"] >= rec["ttft"]
    r = httpx.post(f"{served.v1}/completions", headers={"X-Pacer-Agent": "1"},
                   json={"model": MODEL, "prompt": "Call a tool", "max_tokens": 2})
    api_id = r.json()["id"]
    rec = wait_for(lambda: [x for x in read_request_log(served.log_path) if x["api_id"] == api_id], 10, "log")[0]
    assert rec["class"] == "agent" and rec["tenant"] == "default"
