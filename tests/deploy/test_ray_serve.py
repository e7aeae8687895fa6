"""`pacer serve --replicas N` on Ray Serve: a real 2-replica deployment on 127.0.0.1 answers
the official openai client (JSON and streaming), routes a repeated prefix to the same replica
with the prefix router, aggregates /metrics with per-replica labels; bad flags fail clearly.
The deployment's API key is only in the driver's environment (set after Ray started, so no
Ray worker inherits it): the ingress refuses a request without it (issue 27, finding 4).

The deployment test is slow (Ray start-up plus two model loads, ~1-2 min here): `make test-slow`."""

import argparse
import json
import socket
import threading
import time

import httpx
import openai
import pytest

from pacer.cli.main import main
from pacer.cli.serve import add_args as add_serve_args
from pacer.deploy.ray_app import aggregate_metrics
from tests.server.conftest import MODEL, wait_for

KEY = "driver-only-key"
METRICS_KEY = "driver-metrics-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SYSTEM = ("You are the support assistant of a bicycle shop. Be brief and friendly, mention the warranty "
          "when a part breaks, and suggest a workshop visit for anything involving brakes. ") * 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_bad_replica_flags_fail_with_a_clear_message(capsys):
    assert main(["serve", "--replicas", "0"]) == 2
    assert "--replicas must be an integer >= 1, got 0" in capsys.readouterr().err
    assert main(["serve", "--replicas", "1", "--router", "class"]) == 2
    assert "--router class needs --replicas >= 2" in capsys.readouterr().err
    assert main(["serve", "--kv-events-config", '{"enable_kv_cache_events": true, "port": 1}']) == 2
    assert "unknown key 'port'" in capsys.readouterr().err
    assert main(["serve", "--replicas", "2", "--api-key", ""]) == 2   # keys resolve before Ray starts
    assert "--api-key must not be empty" in capsys.readouterr().err


def test_aggregate_metrics_labels_each_replica():
    text = ("# HELP pacer_num_requests_waiting W\n# TYPE pacer_num_requests_waiting gauge\n"
            'pacer_num_requests_waiting{model_name="m"} 2.0\n')
    out = aggregate_metrics({"a": {"rank": 0, "metrics": text}, "b": {"rank": 1, "metrics": text}})
    assert out.count("# HELP pacer_num_requests_waiting") == 1
    assert 'pacer_num_requests_waiting{replica="0",model_name="m"} 2.0' in out
    assert 'pacer_num_requests_waiting{replica="1",model_name="m"} 2.0' in out


@pytest.fixture(scope="module")
def deployment():
    from ray import serve

    from pacer.deploy.launch import build_app, start_ray

    port = _port()
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    events = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://*:0",
                         "replay_endpoint": "tcp://*:0", "topic": "kv"})
    args = parser.parse_args(["--replicas", "2", "--router", "prefix", "--port", str(port), "--num-threads", "1",
                              "--num-kv-blocks", "512", "--kv-events-config", events, "--max-waiting", "64",
                              "--metrics-api-key", METRICS_KEY])
    start_ray(None)
    with pytest.MonkeyPatch.context() as env:   # the key: in the driver's environment only
        env.setenv("PACER_API_KEY", KEY)
        env.delenv("VLLM_API_KEY", raising=False)
        app = build_app(args)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(app, name="pacer", route_prefix="/")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        import ray

        ray.shutdown()


@pytest.mark.slow
def test_the_key_only_in_the_drivers_environment_guards_the_ingress(deployment):
    chat = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(deployment + "/v1/chat/completions", json=chat, headers=headers, timeout=300)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
        assert "x-pacer-replica" not in r.headers   # refused at the ingress: no replica named
    assert httpx.post(deployment + "/tokenize", json={"prompt": "Hi"}, timeout=300).status_code == 401
    r = httpx.post(deployment + "/v1/chat/completions", json=chat, headers=AUTH, timeout=300)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    assert r.headers["x-pacer-replica"] in ("0", "1")
    assert httpx.get(deployment + "/health", timeout=300).status_code == 200   # open, as on one server
    assert httpx.get(deployment + "/metrics", headers=AUTH, timeout=300).status_code == 401   # --metrics-api-key


@pytest.mark.slow
def test_two_replicas_answer_stream_and_route_a_repeated_prefix_together(deployment):
    client = openai.OpenAI(base_url=deployment + "/v1", api_key=KEY, timeout=300)
    r = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert r.choices[0].message.content and r.usage.completion_tokens > 0
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True) if c.choices)
    assert text
    seen = []
    for q in ["My chain squeaks.", "My brakes feel soft.", "A spoke broke.", "The saddle is loose."]:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=2, temperature=0,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
        seen.append(raw.headers["x-pacer-replica"])
        assert raw.parse().choices[0].message.content is not None
    assert len(set(seen)) == 1, seen   # the shared system prompt keeps them on one replica
    assert raw.parse().usage.prompt_tokens_details.cached_tokens > 0
    bad = httpx.post(deployment + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 0},
                     headers=AUTH, timeout=300)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    assert "x-pacer-replica" not in bad.headers   # a replica's refusal names no replica either

    metrics = _metrics_of_both_replicas(deployment)
    assert metrics.status_code == 200 and "pacer_ingress_requests_waiting 0" in metrics.text
    for rank in ("0", "1"):   # every replica's own series, labelled with its rank
        assert f'pacer_num_requests_running{{replica="{rank}",' in metrics.text, metrics.text[-2000:]



@pytest.mark.slow
def test_a_dead_replica_fails_its_requests_with_503_and_ray_serve_replaces_it(deployment):
    # runs after the routing test (module order): it kills every replica of the deployment. The
    # request streams, so its response has started when the replica dies (Ray Serve cannot retry
    # it elsewhere): the stream must end with a service_unavailable error event, never hang
    import ray

    events: list[str] = []
    done = threading.Event()

    def long_request() -> None:
        with httpx.stream("POST", deployment + "/v1/completions", timeout=300, headers=AUTH, json={
                "model": MODEL, "prompt": "Tell me a long story", "max_tokens": 3000, "ignore_eos": True,
                "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
        done.set()

    t = threading.Thread(target=long_request, daemon=True)
    t.start()
    wait_for(lambda: len(events) >= 3, 120, "the long request to stream tokens")
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True) if "PacerReplica" in a["name"]]
    assert len(replicas) == 2, replicas
    for a in replicas:
        ray.kill(ray.get_actor(a["name"], namespace=a["namespace"]), no_restart=True)
    assert done.wait(120), "the stream of a dead replica hung"
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "service_unavailable" and "replica" in error["message"], error

    def answered() -> bool:
        r = httpx.post(deployment + "/v1/completions", timeout=300, headers=AUTH,
                       json={"model": MODEL, "prompt": "Hello", "max_tokens": 2})
        return r.status_code == 200
    wait_for(answered, 300, "Ray Serve to replace the dead replicas")

def test_asgi_bridge_streams_and_reports_disconnects():
    import asyncio

    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse

    from pacer.deploy.ray_app import asgi_call

    app = FastAPI()
    seen: list[str] = []

    @app.post("/s")
    async def stream(request: Request):
        body = await request.json()

        async def gen():
            for i in range(body["n"]):
                yield f"data: {i}\n\n"
            seen.append("done")
        return StreamingResponse(gen(), media_type="text/event-stream")

    async def run() -> list[dict]:
        req = {"method": "POST", "path": "/s", "headers": [("content-type", "application/json")],
               "body": b'{"n": 3}'}
        return [item async for item in asgi_call(app, req, extra_headers=[("x-pacer-replica", "7")])]

    items = asyncio.run(run())
    assert items[0]["status"] == 200 and ("x-pacer-replica", "7") in items[0]["headers"]
    assert b"".join(i["body"] for i in items[1:]) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert seen == ["done"]


def _metrics_of_both_replicas(deployment: str, deadline_s: float = 30.0) -> httpx.Response:
    """/metrics once Ray Serve has polled both replicas' routing stats (it asks each every
    second, asynchronously: a replica that served nothing yet may not be in the first read)."""
    end = time.monotonic() + deadline_s
    while True:
        r = httpx.get(deployment + "/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}, timeout=300)
        both = all(f'pacer_num_requests_running{{replica="{k}",' in r.text for k in ("0", "1"))
        if both or r.status_code != 200 or time.monotonic() > end:
            return r
        time.sleep(0.5)   # the next poll of Ray Serve's routing stats (every 1 s)
