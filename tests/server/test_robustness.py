"""The server under abuse: an abort storm, clients that vanish, overload with a small
--max-waiting, and a request that makes the executor fail."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pacer.request import SamplingParams
from tests.server.conftest import MODEL, FaultyExecutor, GatedExecutor, serve, wait_for, wrapped_engine


def _state(served):
    return httpx.get(served.base_url + "/debug/state").json()


def _idle(served):
    s = _state(served)
    e, srv = s["engine"], s["server"]
    return (e["num_running"] == 0 and e["num_waiting"] == 0 and e["num_available_blocks"] == e["num_blocks"]
            and srv["num_in_flight"] == 0 and srv["num_admission_waiting"] == 0)


def _waiting(served):
    return _state(served)["server"]["num_admission_waiting"]


def _metric(served, name, **labels):
    text = httpx.get(served.base_url + "/metrics").text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture(scope="module")
def served(llm):
    with serve(llm.engine) as s:
        yield s


def test_abort_storm_frees_everything(served):
    rng = random.Random(0)
    aborts_before = _metric(served, "pacer_request_success_total", finished_reason="abort")

    async def one(client, i, plan):
        body = {"model": MODEL, "prompt": f"Story {i}: once upon a time", "max_tokens": 24,
                "temperature": 0, "ignore_eos": True, "stream": True}
        if plan < 0:   # cancelled before (or while) the response starts
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(rng.uniform(0.0, 0.5)):
                    async with client.stream("POST", "/v1/completions", json=body) as r:
                        async for _ in r.aiter_lines():
                            pass
                    raise TimeoutError   # finished before the deadline: counts as a late cancel
            return
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: {")
                if seen > plan:
                    break   # leaving the block closes the connection mid-stream

    async def storm():
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=served.base_url, limits=limits, timeout=120) as client:
            plans = [rng.randint(-1, 6) for _ in range(200)]
            await asyncio.gather(*(one(client, i, p) for i, p in enumerate(plans)))

    asyncio.run(storm())
    wait_for(lambda: _idle(served), 60, "the engine to be idle with every block free")
    served.service.engine.scheduler.check_invariants()
    assert _metric(served, "pacer_num_requests_running") == 0
    assert _metric(served, "pacer_num_requests_waiting") == 0
    assert _metric(served, "pacer_request_success_total", finished_reason="abort") - aborts_before >= 150
    r = httpx.post(served.v1 + "/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


DISCONNECT_MAX_TOKENS = 4000


@pytest.mark.parametrize("n", [1, 3])
def test_non_streaming_client_disconnect_aborts(served, n):
    # the evidence is the abort itself: n aborted requests (not finished by length), far fewer
    # tokens generated than asked for, and every block free again
    aborts_before = _metric(served, "pacer_request_success_total", finished_reason="abort")
    lengths_before = _metric(served, "pacer_request_success_total", finished_reason="length")
    tokens_before = _metric(served, "pacer_generation_tokens_total")

    async def go():
        async with httpx.AsyncClient(base_url=served.base_url, timeout=120) as client:
            task = asyncio.create_task(client.post("/v1/completions", json={
                "model": MODEL, "prompt": "Tell me a long story", "max_tokens": DISCONNECT_MAX_TOKENS,
                "ignore_eos": True, "n": n}))
            await asyncio.to_thread(wait_for, lambda: _state(served)["engine"]["num_running"] == n, 30,
                                    "the request's choices to run")
            await asyncio.to_thread(wait_for, lambda: _metric(served, "pacer_generation_tokens_total")
                                    >= tokens_before + n, 30, "the choices to generate")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    wait_for(lambda: _idle(served), 30, "the abandoned request (all its choices) to be aborted")
    assert _metric(served, "pacer_request_success_total", finished_reason="abort") - aborts_before == n
    assert _metric(served, "pacer_request_success_total", finished_reason="length") == lengths_before
    generated = _metric(served, "pacer_generation_tokens_total") - tokens_before
    assert n <= generated < n * DISCONNECT_MAX_TOKENS // 10, generated
    state = _state(served)["engine"]
    assert state["num_available_blocks"] == state["num_blocks"]


@pytest.fixture
def gated(llm):
    engine = wrapped_engine(llm, GatedExecutor)
    gate = engine.executor
    try:
        with serve(engine, "--max-waiting", "4", "--scheduling-policy", "priority") as s:
            yield s, gate
            gate.open()
    finally:
        gate.open()


def test_overload_sheds_low_priority_first(gated):
    served, gate = gated

    def body(priority, i):
        return {"model": MODEL, "prompt": f"Request {i} says", "max_tokens": 3, "temperature": 0,
                "priority": priority}

    async def go():
        async with httpx.AsyncClient(base_url=served.base_url, timeout=120) as client:
            gate.close()
            low = []
            for i in range(4):   # one at a time, so that their arrival order is known
                low.append(asyncio.create_task(client.post("/v1/completions", json=body(10, i))))
                await asyncio.to_thread(wait_for, lambda n=i + 1: _waiting(served) == n, 30, f"{i + 1} waiting")
            refused = [await client.post("/v1/completions", json=body(10, 10 + i)) for i in range(3)]
            high = [asyncio.create_task(client.post("/v1/completions", json=body(0, 20 + i))) for i in range(2)]
            await asyncio.to_thread(wait_for, lambda: sum(t.done() for t in low) == 2, 30, "two displaced")
            health = await client.get("/health")
            gate.open()
            return refused, await asyncio.gather(*low), await asyncio.gather(*high), health

    refused, low, high, health = asyncio.run(go())
    assert health.status_code == 200
    for r in refused:
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "queue_full" and r.json()["error"]["type"] == "rate_limit_error"
    assert [r.status_code for r in low] == [200, 200, 429, 429]   # the latest low-priority arrivals shed
    assert all(r.json()["error"]["code"] == "displaced" for r in low[2:])
    assert [r.status_code for r in high] == [200, 200]
    for r in low[:2] + high:   # nothing admitted is lost
        assert r.json()["usage"]["completion_tokens"] == 3
    assert _metric(served, "pacer_request_refused_total", reason="queue_full") == 3
    assert _metric(served, "pacer_request_refused_total", reason="displaced") == 2
    wait_for(lambda: _idle(served), 30, "idle after the spike")


def test_executor_failure_fails_only_that_request(llm):
    engine = llm.engine
    tok = engine.tokenizer
    poison = tok.encode(" Zzyzx")[-1]
    prompts = ["The capital of France is", "1, 2, 3, 4,", "Roses are red,"]
    assert not any(poison in tok.encode(p) for p in prompts)
    refs = [o.text for o in llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0))]
    engine = wrapped_engine(llm, lambda inner: FaultyExecutor(inner, poison))
    faulty = engine.executor
    with serve(engine) as served:
        async def go():
            async with httpx.AsyncClient(base_url=served.v1, timeout=120) as client:
                good = [client.post("/completions", json={"model": MODEL, "prompt": p, "max_tokens": 8,
                                                          "temperature": 0}) for p in prompts]
                bad = client.post("/completions", json={"model": MODEL, "prompt": "Say Zzyzx", "max_tokens": 8})
                bad_stream = client.post("/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": "Zzyzx"}], "stream": True})
                return await asyncio.gather(bad, bad_stream, *good)

        bad, bad_stream, *good = asyncio.run(go())
        assert faulty.num_failures >= 2
        for r in (bad, bad_stream):
            assert r.status_code == 500
            assert r.json()["error"]["type"] == "server_error"
        assert [r.json()["choices"][0]["text"] for r in good] == refs
        assert httpx.get(served.base_url + "/health").status_code == 200
        wait_for(lambda: _idle(served), 30, "idle after the failure")
        assert _metric(served, "pacer_request_success_total", finished_reason="error") == 2
        # a failed request's KV is never adopted by the prefix cache (it may be garbage)
        cached = _state(served)["engine"]["num_cached_blocks"]
        long_prompt = " ".join(f"word{i}" for i in range(60)) + " Zzyzx"
        r = httpx.post(served.v1 + "/completions", json={"model": MODEL, "prompt": long_prompt, "max_tokens": 2},
                       timeout=60)
        assert r.status_code == 500
        wait_for(lambda: _idle(served), 30, "idle after the failure")
        assert _state(served)["engine"]["num_cached_blocks"] == cached
