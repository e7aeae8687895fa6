"""Finding 7: keys fail closed on priority, SLO targets, request class and cache salt. Real
HTTP with the official client; what each request ran with is read from the request log."""

from __future__ import annotations

import json

import openai
import pytest

from pacer.telemetry.request_log import read_request_log
from tests.server.conftest import MODEL, serve, wait_for, wrapped_engine

TRUSTED = "trusted-key"
KEYS = {"keys": [
    {"name": "bound", "key": "bound-key", "tenant": "t1", "allowed_classes": ["rag"]},
    {"name": "other", "key": "other-key", "tenant": "t2"},
    {"name": "ranged", "key": "ranged-key", "tenant": "t3", "priority": [-5, 5], "tightest_slo": {"ttft": 0.25}},
    {"name": "agent", "key": "agent-key", "tenant": "t4", "max_kv_retention_s": 20},
]}
PROMPT = " ".join(f"token{i}" for i in range(48))


@pytest.fixture(scope="module")
def served(llm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("key-bounds")
    keys, log = tmp / "keys.json", tmp / "requests.jsonl"
    keys.write_text(json.dumps(KEYS))
    # a shared cache, chosen explicitly, to show salts stay inside their tenant even there
    engine = wrapped_engine(llm, lambda inner: inner, num_blocks=128, slo=("rag:ttft=5s",))
    with serve(engine, "--api-keys", str(keys), "--api-key", TRUSTED, "--tenant-isolation", "shared",
               "--request-log", str(log)) as s:
        s.log_path = log
        yield s


def _client(served, key):
    return openai.OpenAI(base_url=served.v1, api_key=key, max_retries=0, timeout=120)


def _run(served, key, prompt="Hello", **extra):
    """One completion; its request-log line."""
    before = len(read_request_log(served.log_path)) if served.log_path.exists() else 0
    with _client(served, key) as c:
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, **extra)
    rows = wait_for(lambda: (rows := read_request_log(served.log_path))[before:] and rows, 30, "the log line")
    return r, rows[before]


def test_a_key_without_a_range_runs_no_more_important_than_the_default(served):
    assert _run(served, "bound-key", extra_body={"priority": -1_000_000_000})[1]["priority"] == 0
    assert _run(served, "bound-key", extra_body={"priority": 7})[1]["priority"] == 7      # less important: fine
    assert _run(served, "ranged-key", extra_body={"priority": -100})[1]["priority"] == -5  # its own range
    assert _run(served, TRUSTED, extra_body={"priority": -100})[1]["priority"] == -100     # a trusted key


def _ttft_target(row):
    return None if row["ttft_deadline"] is None else round(row["ttft_deadline"] - row["timestamp"], 3)


def test_slo_targets_are_floored_by_the_class_or_the_key(served):
    tight = {"slo": {"ttft_ms": 1}}
    # class chat has no target: a file key's own 1 ms is not used; a trusted key's is
    assert _ttft_target(_run(served, "bound-key", extra_body=tight)[1]) is None
    assert _ttft_target(_run(served, TRUSTED, extra_body=tight)[1]) == 0.001
    # class rag's 5 s is the floor, for file keys and (by default under keys) trusted ones
    rag = {"x-pacer-class": "rag"}
    assert _ttft_target(_run(served, "bound-key", extra_body=tight, extra_headers=rag)[1]) == 5.0
    assert _ttft_target(_run(served, TRUSTED, extra_body=tight, extra_headers=rag)[1]) == 5.0
    # a key's own tightest_slo is its floor where the class has none
    assert _ttft_target(_run(served, "ranged-key", extra_body=tight)[1]) == 0.25
    assert _ttft_target(_run(served, "bound-key", extra_body={"slo": {"ttft_ms": 9000}}, extra_headers=rag)[1]) == 9.0


def test_the_class_header_is_honoured_only_from_keys_allowed_to_set_it(served):
    assert _run(served, "bound-key", extra_headers={"x-pacer-class": "long_context"})[1]["class"] == "rag"
    for key, cls in (("bound-key", "batch"), ("other-key", "rag")):
        with _client(served, key) as c, pytest.raises(openai.PermissionDeniedError) as e:
            c.completions.create(model=MODEL, prompt="Hi", max_tokens=1, extra_headers={"x-pacer-class": cls})
        assert e.value.body["param"] == "x-pacer-class" and e.value.body["code"] == "class_not_allowed"
    assert _run(served, TRUSTED, extra_headers={"x-pacer-class": "batch"})[1]["class"] == "batch"


def test_a_cache_salt_stays_inside_its_tenant(served):
    salted = {"cache_salt": "team-salt"}
    first, _ = _run(served, "bound-key", PROMPT, extra_body=salted)
    probe, _ = _run(served, "other-key", PROMPT, extra_body=salted)   # same salt, another tenant
    own, _ = _run(served, "bound-key", PROMPT, extra_body=salted)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert probe.usage.prompt_tokens_details.cached_tokens == 0, "another tenant matched the salted prefix"
    assert own.usage.prompt_tokens_details.cached_tokens >= 32
    _run(served, "other-key", PROMPT)                 # the shared cache, as chosen, shares unsalted prompts
    again, _ = _run(served, "bound-key", PROMPT)
    assert again.usage.prompt_tokens_details.cached_tokens >= 32


def test_a_keys_retention_bound_caps_its_sessions_hints(served):
    session = {"session": "s-1"}
    assert _run(served, "agent-key", extra_body={**session, "kv_retention": {"ttl_s": 15}})[0].choices
    with pytest.raises(openai.BadRequestError) as bad:
        _run(served, "agent-key", extra_body={**session, "kv_retention": {"ttl_s": 30}})
    assert bad.value.body["param"] == "kv_retention" and "20" in bad.value.body["message"]
    # another key keeps the server's bound (300 s)
    assert _run(served, "other-key", extra_body={**session, "kv_retention": {"ttl_s": 30}})[0].choices
