"""Segment reuse over HTTP: with --segment-reuse approximate the server marks each tool message's
content as a segment (from the chat template's render); a second conversation carrying the same
tool output after another history reuses its stored KV, and usage.prompt_tokens_details says how
many prompt tokens were reused and recomputed (absent when none were)."""

from __future__ import annotations

import httpx
import openai
import pytest

from pacer.workload.text import TextSource
from tests.conftest import make
from tests.server.conftest import MODEL, serve


def test_a_tool_output_after_another_history_is_reused(base):
    import random

    src = TextSource(base.tokenizer)
    rng = random.Random(5)
    tool = src.segment(120, rng).text
    engine = make(base, segment_reuse="approximate", segment_recompute=0.25)
    with serve(engine) as served:
        client = openai.OpenAI(base_url=served.v1, api_key="x")
        usages = []
        for history in ("Find me a flight to Lisbon next week.", "What is the weather in Porto tomorrow, roughly?"):
            messages = [{"role": "user", "content": history},
                        {"role": "assistant", "content": "Calling the search tool.", "tool_calls": [
                            {"id": "call_1", "type": "function",
                             "function": {"name": "search", "arguments": "{}"}}]},
                        {"role": "tool", "tool_call_id": "call_1", "content": tool},
                        {"role": "user", "content": "Summarize the result."}]
            r = client.chat.completions.create(model=MODEL, max_tokens=2, temperature=0, messages=messages)
            usages.append(r.usage.prompt_tokens_details)
        metrics = _segment_series(httpx.get(served.base_url + "/metrics").text)
    assert getattr(usages[0], "reused_tokens", None) is None                  # the first one stored it
    reused, recomputed = usages[1].reused_tokens, usages[1].recomputed_tokens  # the extension's fields
    assert recomputed > 0 and reused > 60 and reused + recomputed <= 125
    # /metrics: the store's series carry the same figures
    assert metrics["segment_reuse_hits_total"] == 1 and metrics["segment_store_stored_total"] == 1
    assert metrics["segment_reuse_reused_tokens_total"] == reused
    assert metrics["segment_reuse_recomputed_tokens_total"] == recomputed
    assert metrics["segment_store_segments"] == 1 and metrics["segment_store_blocks"] >= reused // 16


def _segment_series(text: str) -> dict[str, float]:
    """The segment series of a /metrics text, by name without the prefix (vllm: or pacer_)."""
    out = {}
    for line in text.splitlines():
        if "segment_" in line and not line.startswith("#"):
            name, value = line.split("{", 1)[0], line.rsplit(" ", 1)[1]
            out["segment_" + name.split("segment_", 1)[1]] = float(value)
    return out


def _conversation(history: str, document: str, *, tool: bool = True, segment: bool | None = None) -> list[dict]:
    """A history, then `document` as a tool output (or, `tool` False, a user message), then a question."""
    if tool:
        middle = [{"role": "assistant", "content": "Calling the search tool.", "tool_calls": [
                      {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": document}]
    else:
        middle = [{"role": "user", "content": document}]
    if segment is not None:
        middle[-1]["segment"] = segment
    return [{"role": "user", "content": history}, *middle, {"role": "user", "content": "Summarize it."}]


HISTORIES = ("Find me a flight to Lisbon next week.", "What is the weather in Porto tomorrow, roughly?",
             "Plan a weekend in Faro for two people, cheaply.", "Which museums in Braga open on Mondays?",
             "How long is the train from Coimbra to Aveiro?", "List three cheap restaurants near Sintra.")


def _document(base, seed: int) -> str:
    import random

    return TextSource(base.tokenizer).segment(120, random.Random(seed)).text


def _reused(usage) -> int | None:
    return getattr(usage.prompt_tokens_details, "reused_tokens", None)


def test_a_request_opts_out_and_a_client_marks_its_own_segments(base):
    tool_doc, user_doc = _document(base, 6), _document(base, 7)
    engine = make(base, segment_reuse="approximate", segment_recompute=0.25)
    with serve(engine) as served:
        client = openai.OpenAI(base_url=served.v1, api_key="x")

        def usage(messages, **extra):
            return client.chat.completions.create(model=MODEL, max_tokens=1, temperature=0, messages=messages,
                                                  extra_body=extra or None).usage

        # a request that opts out neither stores nor reuses: the next one computes the tool output too
        # (every request after another history, so the prefix cache never holds the document after it)
        assert _reused(usage(_conversation(HISTORIES[0], tool_doc), segment_reuse="off")) is None
        assert _reused(usage(_conversation(HISTORIES[1], tool_doc))) is None          # stores it
        assert _reused(usage(_conversation(HISTORIES[2], tool_doc), segment_reuse="off")) is None
        assert _reused(usage(_conversation(HISTORIES[3], tool_doc), segment_reuse="approximate")) > 60
        # a user message's content is a segment when the client marks it; a marked-false tool message is not
        assert _reused(usage(_conversation(HISTORIES[0], user_doc, tool=False, segment=True))) is None
        assert _reused(usage(_conversation(HISTORIES[1], user_doc, tool=False, segment=True))) > 60
        assert _reused(usage(_conversation(HISTORIES[4], user_doc, tool=False))) is None
        assert _reused(usage(_conversation(HISTORIES[5], tool_doc, segment=False))) is None


def test_bad_segment_fields_are_a_400_naming_the_field(base):
    engine = make(base)   # segment reuse off: a request cannot turn it on
    with serve(engine) as served:
        client = openai.OpenAI(base_url=served.v1, api_key="x")
        cases = [({"segment_reuse": "approximate"}, _conversation(HISTORIES[0], "A document."), "segment_reuse",
                  "--segment-reuse approximate"),
                 ({"segment_reuse": "sometimes"}, _conversation(HISTORIES[0], "A document."), "segment_reuse",
                  "off, approximate"),
                 ({"segment_reuse": 1}, _conversation(HISTORIES[0], "A document."), "segment_reuse", "must be one of"),
                 (None, _conversation(HISTORIES[0], "A document.", segment="yes"), "messages[2].segment",
                  "must be a boolean")]
        for extra, messages, param, text in cases:
            with pytest.raises(openai.BadRequestError) as bad:
                client.chat.completions.create(model=MODEL, max_tokens=1, messages=messages, extra_body=extra)
            assert bad.value.body["param"] == param and text in bad.value.body["message"], bad.value.body
        ok = client.chat.completions.create(model=MODEL, max_tokens=1, messages=_conversation(HISTORIES[0], "A doc."),
                                            extra_body={"segment_reuse": "off"})
        assert ok.usage.completion_tokens == 1
        with pytest.raises(openai.BadRequestError) as bad:   # the completions endpoint checks it too
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=1,
                                      extra_body={"segment_reuse": "approximate"})
        assert bad.value.body["param"] == "segment_reuse"


def test_pacer_bench_tool_reuse_over_http_is_reused_by_the_server(base, tmp_path):
    """`pacer bench --endpoint chat --workload tool-reuse`: the tool outputs travel as `role: tool`
    messages and the server marks them; one at a time, each tool output is stored by the first
    session to meet it and reused by the other."""
    from pacer.cli.main import main
    from pacer.workload.report import OVERALL, Report

    engine = make(base, segment_reuse="approximate")
    out = tmp_path / "run.json"
    with serve(engine) as served:
        rc = main(["bench", "--base-url", served.base_url, "--endpoint", "chat", "--workload", "tool-reuse",
                   "--tool-sessions", "2", "--tool-outputs", "2", "--tool-output-len", "96", "--history-len", "24",
                   "--output-len", "1", "--num-prompts", "4", "--concurrency", "1", "--no-progress", "--out", str(out)])
        metrics = _segment_series(httpx.get(served.base_url + "/metrics").text)
    assert rc == 0 and Report.load(out).summary[OVERALL]["num_ok"] == 4
    assert metrics["segment_store_stored_total"] == 2 and metrics["segment_reuse_hits_total"] == 2
    assert metrics["segment_reuse_reused_tokens_total"] > 2 * 60
