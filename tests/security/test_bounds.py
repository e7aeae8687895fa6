"""Finding 8: bounds before work. Body limits and the key's charge on /tokenize and
/detokenize; on /v1 the key's charge before the tokenizer, which runs off the event loop;
prompts x n capped; a finite default queue; caps on what client-named tenants leave behind
(Prometheus labels, suffix-drafter windows); streamed tool calls read once, not re-parsed per
chunk. Real HTTP on the real model, except the pure drafter and the tool reader."""

from __future__ import annotations

import json
import sys
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pacer.sched.drafters import SuffixDrafter
from pacer.server.tools.parsers import HermesParser
from pacer.server.tools.stream import ToolDeltaStream
from tests.server.conftest import MODEL, serve, wrapped_engine

KEYS = {"keys": [{"name": "slow", "key": "slow-key", "tenant": "slow", "requests_per_minute": 2},
                 {"name": "free", "key": "free-key", "tenant": "free"}]}


def _engine(llm, **kwargs):
    return wrapped_engine(llm, lambda inner: inner, num_blocks=128, **kwargs)


@pytest.fixture(scope="module")
def keyed(llm, tmp_path_factory):
    path = tmp_path_factory.mktemp("bounds") / "keys.json"
    path.write_text(json.dumps(KEYS))
    with serve(_engine(llm, tenant_isolation="isolated"), "--api-keys", str(path),
               "--max-request-body-bytes", "4096") as s:
        yield s


def _auth(key):
    return {"Authorization": f"Bearer {key}"}


def test_tokenize_and_detokenize_bodies_are_bounded(keyed):
    for path, body in (("/tokenize", {"prompt": "x" * 5000}), ("/detokenize", {"tokens": [1] * 3000})):
        r = httpx.post(keyed.base_url + path, json=body, headers=_auth("free-key"), timeout=30)
        assert r.status_code == 413 and "--max-request-body-bytes" in r.json()["error"]["message"], path


def test_tokenize_charges_the_key_before_the_work(keyed):
    """The key allows 2 requests a minute: /tokenize and /detokenize spend them; then a
    completion whose prompt would fail to tokenize gets the 429, not the tokenizer's 400."""
    h = _auth("slow-key")
    assert httpx.post(keyed.base_url + "/tokenize", json={"prompt": "Hello"}, headers=h).json()["count"] > 0
    assert httpx.post(keyed.base_url + "/detokenize", json={"tokens": [1, 2]}, headers=h).status_code == 200
    r = httpx.post(keyed.base_url + "/tokenize", json={"prompt": "Hello"}, headers=h)
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
    bad_ids = {"model": MODEL, "prompt": [10**9], "max_tokens": 2}   # out of the vocabulary
    r = httpx.post(keyed.v1 + "/completions", json=bad_ids, headers=h)
    assert r.status_code == 429 and "requests_per_minute" in r.json()["error"]["message"]
    r = httpx.post(keyed.v1 + "/completions", json=bad_ids, headers=_auth("free-key"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_prompts_times_n_is_capped(keyed):
    body = {"model": MODEL, "prompt": [f"p{i}" for i in range(40)], "n": 8, "max_tokens": 1}
    r = httpx.post(keyed.v1 + "/completions", json=body, headers=_auth("free-key"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert "320 engine requests" in r.json()["error"]["message"]
    assert "--max-sequences-per-request" in r.json()["error"]["message"]


def test_the_template_and_tokenizer_run_off_the_event_loop(llm):
    engine = _engine(llm)
    tok = engine.tokenizer
    threads: list[str] = []
    real_encode, real_template = tok.encode, tok.apply_chat_template

    def encode(*a, **k):
        threads.append(threading.current_thread().name)
        return real_encode(*a, **k)

    def template(*a, **k):
        threads.append(threading.current_thread().name)
        return real_template(*a, **k)

    with serve(engine) as s:
        tok.encode, tok.apply_chat_template = encode, template
        try:
            with openai.OpenAI(base_url=s.v1, api_key="none", max_retries=0) as c:
                c.completions.create(model=MODEL, prompt="Hello", max_tokens=1)
                c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
            assert httpx.post(s.base_url + "/tokenize", json={"prompt": "Hello"}).status_code == 200
        finally:
            del tok.encode, tok.apply_chat_template
    assert len(threads) >= 3
    assert "uvicorn-test" not in threads, f"tokenized on the event loop's thread: {threads}"


def test_the_waiting_queue_is_capped_by_default(llm, capfd):
    engine = _engine(llm)
    with serve(engine) as s:
        assert s.service.admission.max_waiting == 512
    with serve(engine, "--max-waiting", "none") as s:
        assert s.service.admission.max_waiting is None
    assert "WARNING: --max-waiting none" in capfd.readouterr().err


def test_client_named_tenants_share_one_label_past_the_cap(llm):
    with serve(_engine(llm), "--max-tenant-labels", "3") as s:
        for i in range(8):   # each refused (it can never fit), each under a new tenant name
            r = httpx.post(s.v1 + "/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 10**7,
                                                        "tenant": f"t{i}"})
            assert r.status_code == 400
        text = httpx.get(s.base_url + "/metrics").text
    counts = {x.labels["tenant"]: x.value for fam in text_string_to_metric_families(text)
              for x in fam.samples if x.name == "pacer_tenant_request_refused_total"}
    assert counts == {"t0": 1, "t1": 1, "t2": 1, "other": 5}


def test_suffix_drafter_keeps_a_bounded_number_of_tenant_windows():
    drafter = SuffixDrafter(2, 3, max_cached_requests=4, max_tenants=8)
    for i in range(1000):
        drafter.finish(f"r{i}", f"tenant-{i}", [1, 2, 3, 4, 5])
    assert drafter.num_tenants == 8
    assert drafter.propose("new", "tenant-999", [7, 1, 2], [], 3) == [3, 4, 5]   # the newest kept its window
    assert drafter.propose("new2", "tenant-0", [7, 1, 2], [], 3) == []            # the oldest was dropped


def _lines_run(num_chunks: int) -> int:
    """Python lines executed in pacer's tool modules while streaming one call of `num_chunks`
    argument pieces one by one (a count of work, not of time)."""
    pieces = ['<tool_call>\n{"name": "f", "arguments": {"items": ['] + [f'"item {i}", ' for i in range(num_chunks)]
    pieces += ['"end"]}}\n</tool_call>']
    stream = ToolDeltaStream(HermesParser(["f"]))
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if "pacer/server/tools" not in frame.f_code.co_filename:
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        deltas = [d for p in pieces for d in stream.update(p, final=False)] + stream.update("", final=True)
    finally:
        sys.settrace(None)
    args = "".join(tc["function"].get("arguments", "") for d in deltas for tc in d.get("tool_calls", []))
    assert json.loads(args)["items"][-1] == "end"
    return count


def test_a_streamed_tool_call_is_read_once_not_reparsed_per_chunk():
    """Re-parsing the whole text on every chunk made a call of n chunks cost O(n^2); each
    character is now read once: 4x the chunks cost about 4x the work."""
    small, large = _lines_run(200), _lines_run(800)
    assert large < 5 * small, (small, large)
