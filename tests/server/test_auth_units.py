"""API keys, the keys file, tenant binding, priority clamping, the SLO hook and request limits,
as units (no model, no server)."""

from __future__ import annotations

import hashlib
import json

import pytest

from pacer.server.access.auth import KeyRing, apply_key, bound_slo_targets, hash_key, load_keys_file
from pacer.server.api.errors import APIError
from pacer.server.api.limits import RequestLimits
from pacer.server.api.protocol import parse_chat, parse_completion

KEYS_YAML = """
tenant_weights: {acme: 2}
keys:
  - name: acme-prod
    key_sha256: {acme_sha}
    tenant: acme
    priority: [2, 8]
    requests_per_minute: 60
    tokens_per_minute: 10000
    max_concurrent: 4
    tightest_slo: {ttft: 0.5}
  - name: globex
    key: globex-secret
    tenant: globex
  - name: router
    key: router-secret
    gateway: true
    allowed_tenants: [acme, initech]
"""


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS_YAML.replace("{acme_sha}", hashlib.sha256(b"acme-secret").hexdigest()))
    return path


def test_keys_file_loads_hashed_and_clear_keys(keys_file):
    loaded = load_keys_file(keys_file)
    ring = KeyRing(loaded.keys)
    assert loaded.tenant_weights == {"acme": 2.0}
    acme = ring.authenticate("Bearer acme-secret")
    assert acme is not None and acme.name == "acme-prod" and acme.tenant == "acme"
    assert acme.priority_range == (2, 8) and acme.limits.max_concurrent == 4 and acme.has_limits
    assert ring.authenticate("bearer globex-secret").name == "globex"
    for bad in (None, "", "Bearer", "Bearer wrong", "Basic acme-secret", "Bearer acme-secre"):
        assert ring.authenticate(bad) is None
    assert "acme-secret" not in repr(acme)   # the digest is not even in the repr


@pytest.mark.parametrize("entry, message", [
    ({"name": "x", "tenant": "a"}, "exactly one of 'key'"),
    ({"name": "x", "key": "k", "key_sha256": "00" * 32, "tenant": "a"}, "exactly one of 'key'"),
    ({"name": "x", "key_sha256": "abc", "tenant": "a"}, "64 hex digits"),
    ({"name": "x", "key": "k"}, "'tenant' is required"),
    ({"key": "k", "tenant": "a"}, "'name' is required"),
    ({"name": "x", "key": "k", "tenant": "a", "priority": [5, 1]}, "low <= high"),
    ({"name": "x", "key": "k", "tenant": "a", "max_concurrent": 0}, "max_concurrent must be an integer > 0"),
    ({"name": "x", "key": "k", "tenant": "a", "rpm": 5}, "unknown fields"),
    ({"name": "x", "key": "k", "tenant": "a", "allowed_tenants": ["b"]}, "on a gateway key"),
])
def test_keys_file_errors_name_the_field(tmp_path, entry, message):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [entry]}))
    with pytest.raises(ValueError, match=message):
        load_keys_file(path)


def test_duplicate_keys_refused(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps([{"name": "a", "key": "k", "tenant": "a"}, {"name": "b", "key": "k", "tenant": "b"}]))
    with pytest.raises(ValueError, match="listed twice"):
        load_keys_file(path)


def _chat(**extra):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    return parse_chat(body), body


def test_tenant_comes_from_the_key(keys_file):
    ring = KeyRing(load_keys_file(keys_file).keys)
    acme, router = ring.authenticate("Bearer acme-secret"), ring.authenticate("Bearer router-secret")
    parsed, body = _chat(user="end-user-17")
    assert parsed.tenant == "end-user-17"                                  # no keys: `user` as before
    assert apply_key(acme, parsed, body, {}).tenant == "acme"         # keys: `user` never selects
    plain = KeyRing.from_plain(["k"]).keys[0]                              # --api-key: trusted, names any
    assert apply_key(plain, parsed, body, {}).tenant == "default"
    assert apply_key(plain, parsed, body, {"x-llm-d-inference-fairness-id": "t9"}).tenant == "t9"
    parsed, body = _chat(tenant="acme")
    assert apply_key(acme, parsed, body, {}).tenant == "acme"
    parsed, body = _chat(tenant="globex")
    with pytest.raises(APIError) as e:
        apply_key(acme, parsed, body, {})
    assert e.value.status == 403 and e.value.param == "tenant" and e.value.code == "tenant_not_allowed"
    # a gateway names the tenant in llm-d's header, within its allowed tenants
    parsed, body = _chat()
    header = {"x-llm-d-inference-fairness-id": "initech"}
    assert apply_key(router, parsed, body, header).tenant == "initech"
    with pytest.raises(APIError) as e:
        apply_key(router, parsed, body, {"x-llm-d-inference-fairness-id": "globex"})
    assert e.value.status == 403


def test_priority_is_clamped_into_the_keys_range(keys_file):
    acme = KeyRing(load_keys_file(keys_file).keys).authenticate("Bearer acme-secret")
    for asked, got in ((None, 2), (0, 2), (-100, 2), (5, 5), (8, 8), (50, 8)):
        extra = {} if asked is None else {"priority": asked}
        body = {"model": "m", "prompt": "x", **extra}
        assert apply_key(acme, parse_completion(body), body, {}).priority == got


def test_slo_hook_raises_targets_to_the_keys_tightest(keys_file):
    acme = KeyRing(load_keys_file(keys_file).keys).authenticate("Bearer acme-secret")
    assert bound_slo_targets(acme, {"ttft": 0.1, "tpot": 0.01}) == {"ttft": 0.5, "tpot": 0.01}
    assert bound_slo_targets(acme, {"ttft": 2.0}) == {"ttft": 2.0}
    assert bound_slo_targets(None, {"ttft": 0.1}) == {"ttft": 0.1}


def test_plain_keys_hash_once():
    ring = KeyRing.from_plain(["a", "b"])
    assert [k.name for k in ring.keys] == ["api-key-0", "api-key-1"]
    assert ring.keys[0].digest == hash_key("a") and ring.authenticate("Bearer b") is ring.keys[1]
    assert not KeyRing().enabled


@pytest.mark.parametrize("body, param, limit", [
    ({"messages": [{"role": "user", "content": "x"}] * 5}, "messages", "--max-messages"),
    ({"stop": ["a", "b", "c"]}, "stop", "--max-stop-strings"),
    ({"stop": "x" * 11}, "stop", "--max-stop-string-length"),
    ({"n": 3}, "n", "--max-n"),
    ({"logprobs": 3}, "logprobs", "--max-logprobs"),
    ({"top_logprobs": 3}, "top_logprobs", "--max-logprobs"),
    ({"tools": [{}] * 3}, "tools", "--max-tools"),
    ({"prompt": ["a", "b", "c"]}, "prompt", "--max-prompts"),
])
def test_request_limits_name_field_and_flag(body, param, limit):
    limits = RequestLimits(max_messages=4, max_stop_strings=2, max_stop_string_length=10, max_n=2,
                           max_logprobs=2, max_tools=2, max_prompts=2)
    with pytest.raises(APIError) as e:
        limits.check(body)
    assert e.value.status == 400 and e.value.param == param and limit in e.value.message
    limits.check({"prompt": [1, 2, 3, 4, 5], "logprobs": True, "stop": "x" * 10})   # token ids; chat's bool


def test_request_limit_flags_are_checked():
    with pytest.raises(ValueError, match="--max-n must be <= 8"):
        RequestLimits(max_n=9)
    with pytest.raises(ValueError, match="--max-messages must be an integer >= 1"):
        RequestLimits(max_messages=0)


def test_api_key_flags_and_environment(monkeypatch, keys_file):
    import argparse

    from pacer.cli.serve import add_args as add_serve_args
    from pacer.server.cli import build_access

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    monkeypatch.delenv("PACER_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    access, _ = build_access(parser.parse_args([]))
    assert not access.api_keys.enabled and not access.metrics_keys.enabled    # `make run`: open
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm-env")
    access, _ = build_access(parser.parse_args([]))
    assert access.api_keys.authenticate("Bearer from-vllm-env") is not None and not access.binds_tenants
    monkeypatch.setenv("PACER_API_KEY", "from-pacer-env")
    access, _ = build_access(parser.parse_args([]))
    assert access.api_keys.authenticate("Bearer from-pacer-env") is not None
    assert access.api_keys.authenticate("Bearer from-vllm-env") is None
    access, weights = build_access(parser.parse_args(["--api-key", "k1", "--api-keys", str(keys_file),
                                                      "--metrics-api-key", "m"]))
    assert access.binds_tenants and weights == {"acme": 2.0} and len(access.api_keys.keys) == 4
    assert access.metrics_keys.authenticate("Bearer m") is not None
