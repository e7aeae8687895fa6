"""Agent sessions over HTTP (pacer.kv.retention): the official openai client names its session
with the x-session-id header (extra_headers) or the `session` body field (extra_body); a turn's
finish opens a retention window, the next turn of the session finds its history there, and
/metrics, the snapshot and a release hint say so. Bad hints get a 400 naming the field."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import MODEL, serve, wait_for

SYSTEM = "You are an agent that plans a trip step by step and calls tools for prices. " * 4


def _retention(served) -> dict:
    return dict(served.service.loop.state.retention)


def test_session_turns_retain_and_release_over_http(llm):
    with serve(llm.engine) as served:
        client = openai.OpenAI(base_url=served.v1, api_key="x")
        history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Find a flight to Lisbon."}]
        first = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, messages=history,
                                               extra_headers={"x-session-id": "agent-7"})
        wait_for(lambda: _retention(served)["windows_opened"] >= 1, what="the window in the published state")
        history += [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "The tool says: 120 EUR. Book it?"}]
        second = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, messages=history,
                                                extra_body={"session": "agent-7", "kv_retention": {"release": True}})
        assert second.usage.prompt_tokens_details.cached_tokens > 0
        stats = wait_for(lambda: (s := _retention(served))["releases"] + s["returns"] >= 1 and s, what="the return")
        assert stats["returns"] >= 1 and stats["hit_tokens"] > 0
        metrics = httpx.get(served.base_url + "/metrics").text
        assert "session_retention_hit_tokens" in metrics and "session_retention_retained_blocks" in metrics
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model=MODEL, max_tokens=2, messages=history,
                                           extra_body={"session": "agent-7", "kv_retention": {"ttl_s": 10_000}})
        assert bad.value.body["param"] == "kv_retention" and "300" in bad.value.body["message"]


PRICE = {"type": "function", "function": {
    "name": "flight_price", "description": "The price of a flight to a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"enum": ["Lisbon", "Porto"]}}}}}


def test_a_window_stays_open_only_while_a_tool_runs(llm):
    """A session's chat turn with `tools` keeps its window when it ends in tool_calls (the tool
    is running) and closes it when it answers instead (a person, not a tool, is next)."""
    with serve(llm.engine) as served:
        client = openai.OpenAI(base_url=served.v1, api_key="x")
        before = _retention(served)   # the engine is shared with other tests: count from here

        def since() -> dict:
            now = _retention(served)
            return {k: now[k] - before.get(k, 0) for k in now} | {"retained_blocks": now["retained_blocks"]}
        history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Price a flight to Lisbon."}]
        call = client.chat.completions.create(model=MODEL, max_tokens=96, temperature=0, messages=history,
                                              tools=[PRICE], tool_choice="required",
                                              extra_headers={"x-session-id": "agent-9"})
        assert call.choices[0].finish_reason == "tool_calls"
        opened = wait_for(lambda: (s := since())["windows_opened"] >= 1 and s, what="the window")
        assert opened["answered"] == 0 and opened["retained_blocks"] > 0
        tool_call = call.choices[0].message.tool_calls[0]
        history += [{"role": "assistant", "content": None, "tool_calls": [tool_call.model_dump()]},
                    {"role": "tool", "tool_call_id": tool_call.id, "content": "120 EUR"}]
        answer = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, messages=history,
                                                tools=[PRICE], tool_choice="none",
                                                extra_headers={"x-session-id": "agent-9"})
        assert answer.choices[0].finish_reason in ("stop", "length")
        stats = wait_for(lambda: (s := since())["answered"] >= 1 and s, what="the answered turn")
        assert stats["returns"] == 1 and stats["windows_opened"] == 2 and stats["retained_blocks"] == 0
        assert "session_retention_answered" in httpx.get(served.base_url + "/metrics").text
