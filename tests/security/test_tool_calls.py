"""Finding 9: tool calls are validated at the final parse (arguments that parse as a JSON
object, a name declared in `tools`), else their text comes back as content, as vLLM does;
text after a call stays content; streamed and non-streamed agree. The real model writes
exactly the text under test: a regex constraint (llguidance) beside `tools` in auto mode."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.conftest import MODEL, serve, wrapped_engine

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _regex(text: str) -> str:
    """A regex matching exactly `text`."""
    return "".join("\\" + c if c in "\\.^$|?*+()[]{}" else c for c in text)


@pytest.fixture(scope="module")
def client(llm):
    engine = wrapped_engine(llm, lambda inner: inner, num_blocks=128)
    with serve(engine, "--enable-auto-tool-choice", "--tool-call-parser", "hermes") as s, \
            openai.OpenAI(base_url=s.v1, api_key="none", max_retries=0, timeout=120) as c:
        yield c


def _both(client, text: str, **extra):
    """The non-streamed message and the streamed deltas reassembled, for an output forced to `text`."""
    kwargs = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": "auto", "temperature": 0,
              "max_tokens": 80, "extra_body": {"structured_outputs": {"regex": _regex(text)}}, **extra}
    whole = client.chat.completions.create(**kwargs).choices[0]
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                if tc.id:
                    calls[tc.index] = {"name": tc.function.name, "arguments": tc.function.arguments or ""}
                else:
                    calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    message_calls = [{"name": c.function.name, "arguments": c.function.arguments}
                     for c in whole.message.tool_calls or []]
    streamed = (content or None, [calls[i] for i in sorted(calls)], finish)
    assert streamed == (whole.message.content, message_calls, whole.finish_reason), "stream and message differ"
    return whole


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/"}}\n</tool_call>',      # not in tools
    '<tool_call>\n{"name": "get_weather", "arguments": nonsense}\n</tool_call>',     # not JSON
    '<tool_call>\n{"name": "get_weather", "arguments": "Paris"}\n</tool_call>',      # not an object
    '<tool_call>\n{"name": get_weather}\n</tool_call>',                              # not a call object
])
def test_an_invalid_call_comes_back_as_content(client, text):
    choice = _both(client, text)
    assert not choice.message.tool_calls and choice.message.content == text
    assert choice.finish_reason == "stop"


def test_a_call_cut_off_by_max_tokens_comes_back_as_content(client):
    """Cut off inside its arguments (CALL is 30 tokens): the name is complete, the object is not."""
    choice = _both(client, CALL, max_tokens=20)
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert CALL.startswith(choice.message.content) and len(choice.message.content) < len(CALL)
    assert '"arguments": {' in choice.message.content


def test_text_after_a_call_is_kept_as_content(client):
    choice = _both(client, CALL + "\nI will tell you when I know.")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert choice.message.content == "I will tell you when I know." and choice.finish_reason == "tool_calls"


def test_a_valid_call_among_invalid_ones_is_the_only_call(client):
    bad = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    choice = _both(client, f"Checking.\n{bad}\n{CALL}")
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    assert choice.message.content == f"Checking.\n{bad}"
