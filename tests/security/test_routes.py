"""Finding 10: deny by default, no docs under keys, bad JSON is a 400, exception text never
reaches a client, and a server anyone may use says so at start-up. Real HTTP."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import MODEL, serve, wrapped_engine

KEY = "route-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _engine(llm, **kwargs):
    """An engine of its own over the session's model: one engine loop per engine."""
    return wrapped_engine(llm, lambda inner: inner, num_blocks=128, **kwargs)


@pytest.fixture(scope="module")
def keyed(llm):
    with serve(_engine(llm, tenant_isolation="isolated"), "--api-key", KEY) as s:   # what keys imply
        yield s


@pytest.fixture(scope="module")
def open_server(llm):
    with serve(llm.engine) as s:
        yield s


def _routes(app) -> list[tuple[str, str]]:
    return sorted((m, r.path) for r in app.routes for m in getattr(r, "methods", ()) or () if m != "HEAD")


def test_every_route_but_health_needs_a_key(keyed):
    app = keyed.server.config.app
    routes = _routes(app)
    assert ("POST", "/tokenize") in routes and ("GET", "/version") in routes and ("GET", "/debug/state") in routes
    for method, path in routes:
        r = httpx.request(method, keyed.base_url + path, json={}, timeout=30)
        if path in ("/health", "/metrics"):   # open: liveness, and /metrics without --metrics-api-key
            assert r.status_code == 200, (method, path, r.status_code)
        else:
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (method, path)
    # a route nobody listed (a later addition, a typo): denied too, before it could be found
    assert httpx.get(keyed.base_url + "/no/such/route").status_code == 401
    assert httpx.get(keyed.base_url + "/version", headers=AUTH).status_code == 200


def test_a_route_added_later_is_denied_by_default(keyed):
    app = keyed.server.config.app
    app.add_api_route("/added-later", lambda: {"secret": 1}, methods=["GET"])
    assert httpx.get(keyed.base_url + "/added-later").status_code == 401
    assert httpx.get(keyed.base_url + "/added-later", headers=AUTH).json() == {"secret": 1}


def test_no_docs_or_schema_when_keys_are_required(keyed, open_server):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(keyed.base_url + path).status_code == 401
        assert httpx.get(keyed.base_url + path, headers=AUTH).status_code == 404
    assert httpx.get(open_server.base_url + "/openapi.json").status_code == 200   # a local, open server keeps them


@pytest.mark.parametrize("raw, words", [
    (b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deeper than 64 levels"),
    (b'{"model": "m", "prompt": ' + b"[" * 70 + b"1" + b"]" * 70 + b"}", "deeper than 64 levels"),
    (b'{"model": "m", "prompt": "x", "seed": ' + b"9" * 5000 + b"}", "more than 4300 digits"),
    (b'{"model": "m", "prompt": "x"', "not valid JSON"),
])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
def test_hostile_json_is_a_400(open_server, path, raw, words):
    r = httpx.post(open_server.base_url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_exception_text_never_reaches_the_client(open_server, caplog):
    tokenizer = open_server.service.engine.tokenizer
    real = tokenizer.encode

    def broken(*args, **kwargs):
        raise RuntimeError("secret path /srv/model/weights.gguf")

    tokenizer.encode = broken
    try:
        with caplog.at_level("ERROR", logger="pacer.server"):
            r = httpx.post(open_server.base_url + "/tokenize", json={"prompt": "hello"}, timeout=30)
    finally:
        del tokenizer.encode
    assert tokenizer.encode == real
    assert r.status_code == 500 and "secret" not in r.text
    message = r.json()["error"]["message"]
    error_id = message.split("error id ")[1].split(";")[0]
    logged = [rec for rec in caplog.records if error_id in rec.getMessage()]
    assert logged and "secret path" in str(logged[0].exc_info[1])   # the operator's log has it all


def test_an_open_server_says_so_at_start_up(llm, capfd):
    engine = _engine(llm)
    with serve(engine) as s:
        assert httpx.get(s.base_url + "/health").status_code == 200
    err = capfd.readouterr().err
    assert "WARNING: no API key is required" in err and "any local user" in err
    with serve(engine, "--api-key", KEY, "--tenant-isolation", "shared") as s:
        with openai.OpenAI(base_url=s.v1, api_key=KEY, max_retries=0) as c:
            assert [m.id for m in c.models.list().data] == [MODEL]
    err = capfd.readouterr().err
    assert "no API key is required" not in err and "/metrics needs no key" in err
