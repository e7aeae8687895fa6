"""Tool-call parsers and streamed deltas: the deltas of any chunking of a text reassemble to
exactly the message parsed from the whole text (chunk boundaries inside strings, escapes,
markers and numbers included)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pacer.server.tools.json_scan import scan_object, value_end
from pacer.server.tools.parsers import HermesParser, Llama3JsonParser, get_parser
from pacer.server.tools.stream import ToolDeltaStream, tool_message

HERMES = ('Let me check. \n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris\\\\", '
          '"note": "a}b{c", "n": [1, {"x": "\\u00e9"}]}}\n</tool_call>\n<tool_call>\n'
          '{"name":"get_time","arguments":{"zone":"UTC"}}\n</tool_call>')
LLAMA = '{"name": "add", "parameters": {"a": 12, "b": "x;y"}}; {"name": "neg", "parameters": {"v": -3.5e2}}'
PLAIN = "No tools needed: the answer is 4 <tool and done."


def _stream(parser, text, cuts):
    stream = ToolDeltaStream(parser)
    bounds = sorted(set(c for c in cuts if 0 < c < len(text)))
    deltas = []
    start = 0
    for end in [*bounds, len(text)]:
        deltas += stream.update(text[start:end], final=False)
        start = end
    deltas += stream.update("", final=True)
    content, calls = "", {}
    for d in deltas:
        content += d.get("content", "")
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                assert tc["index"] not in calls and tc["function"]["arguments"] == ""
                calls[tc["index"]] = {"name": tc["function"]["name"], "arguments": ""}
            else:
                calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
    return content or None, [calls[i] for i in sorted(calls)], stream


def _message(parser, text):
    message, finish = tool_message(parser, text, "stop")
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in message.get("tool_calls", [])]
    return message["content"], calls, finish


def test_hermes_message():
    content, calls, finish = _message(HermesParser(), HERMES)
    assert content == "Let me check." and finish == "tool_calls"
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"])["city"] == 'Pa"ris\\'
    assert calls[1]["arguments"] == '{"zone":"UTC"}'


def test_llama3_json_message():
    content, calls, _ = _message(Llama3JsonParser(), LLAMA)
    assert content is None and [json.loads(c["arguments"]) for c in calls] == [{"a": 12, "b": "x;y"}, {"v": -350.0}]


def test_plain_text_is_content():
    for parser in (HermesParser(), Llama3JsonParser()):
        assert _message(parser, PLAIN) == (PLAIN, [], "stop")


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["hermes", "llama3_json"]), st.sampled_from([HERMES, LLAMA, PLAIN]),
       st.lists(st.integers(0, len(HERMES)), max_size=40))
def test_any_chunking_reassembles_to_the_message(parser_name, text, cuts):
    parser = get_parser(parser_name)
    content, calls, _ = _stream(parser, text, cuts)
    want_content, want_calls, _ = _message(parser, text)
    assert calls == want_calls
    assert content == want_content


def test_every_single_character_chunking():
    for text in (HERMES, LLAMA):
        parser = HermesParser() if text is HERMES else Llama3JsonParser()
        content, calls, stream = _stream(parser, text, range(len(text)))
        assert (content, calls) == _message(parser, text)[:2] and stream.finish_reason("stop") == "tool_calls"


def test_unfinished_call_comes_back_as_content():
    """A call cut off (max_tokens) is not a call: streamed or not, its text is the content
    (issue 27, finding 9; this test used to expect the cut-off arguments as a call)."""
    parser = HermesParser()
    text = '<tool_call>\n{"name": "f", "arguments": {"q": "abc'
    content, calls, _ = _stream(parser, text, [5, 20, 30])
    assert calls == [] and content == text
    assert _message(parser, text) == (text, [], "stop")


@pytest.mark.parametrize("text,end", [('"a\\"b" x', 6), ('{"a": "}"} x', 10), ("12, ", 2), ('[1, "]"]', 8),
                                      ('"abc', None), ("12", None), ('{"a": [1, 2', None)])
def test_value_end(text, end):
    assert value_end(text, 0) == end


def test_scan_object_members_and_broken():
    scan = scan_object('{"a": 1, "b": {"c": "}"}}', 0)
    assert scan.end == 25 and set(scan.members) == {"a", "b"}
    assert scan_object('{"a" 1}', 0).broken
