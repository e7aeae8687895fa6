"""Structured outputs and tool calls through the official `openai` client against `pacer serve`:
parsed Pydantic objects, choice and regex, forced tool calls that validate at temperature 1,
a two-turn tool conversation, streamed tool-call deltas that reassemble exactly, and the
400s for bad constraints, each naming its field."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field

from tests.server.conftest import MODEL, serve

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 16},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["zone"],
                   "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what time is it in UTC?"}]


class Pet(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=30)
    color: Literal["red", "green", "blue"]


@pytest.fixture(scope="module")
def served(llm):
    with serve(llm.engine, "--enable-auto-tool-choice", "--tool-call-parser", "hermes") as s:
        yield s


def test_parse_returns_a_pydantic_object(client):
    r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Describe a pet."}],
                                      response_format=Pet, temperature=1.0, seed=3, max_tokens=60)
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet) and r.choices[0].finish_reason == "stop"
    assert 0 <= pet.age <= 30 and len(pet.name) <= 12


def test_json_object_and_schema_on_completions_streamed(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    # seeded: sampled at temperature 1, the answer would otherwise depend on what the shared
    # engine sampled before (an unseeded request draws from the executor's one generator)
    stream = client.completions.create(model=MODEL, prompt="A number as JSON:", max_tokens=30, stream=True,
                                       seed=0, extra_body={"guided_json": schema})
    text = "".join(c.choices[0].text for c in stream)
    jsonschema.validate(json.loads(text), schema)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Some JSON"}],
                                       response_format={"type": "json_object"}, max_tokens=80, temperature=0)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


def test_choice_and_regex_match(client):
    choices = ["yes", "no", "maybe"]
    for body in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is it raining?"}],
                                           max_tokens=10, temperature=1.0, extra_body=body)
        assert r.choices[0].message.content in choices
    r = client.completions.create(model=MODEL, prompt="Call me at", max_tokens=20, temperature=1.0,
                                  extra_body={"structured_outputs": {"regex": r"\d{3}-\d{4}"}})
    assert re.fullmatch(r"\d{3}-\d{4}", r.choices[0].text)
    r = client.completions.create(model=MODEL, prompt="Answer:", max_tokens=20,
                                  extra_body={"guided_grammar": 'start: "A" | "B" "!"'})
    assert r.choices[0].text in ("A", "B!")


def test_required_tool_call_validates_at_temperature_1(client):
    for seed in range(2):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           temperature=1.0, seed=seed, max_tokens=80, parallel_tool_calls=False)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.id.startswith("call_") and call.type == "function"
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_named_function_and_parallel_calls(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], temperature=1.0, seed=1,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       max_tokens=60)
    calls = r.choices[0].message.tool_calls
    assert calls and all(c.function.name == "get_time" for c in calls)
    assert all(json.loads(c.function.arguments)["zone"] in ("UTC", "CET", "PST") for c in calls[:-1])
    assert len({c.id for c in calls}) == len(calls)


def _reassemble(chunks):
    content, calls, finish = "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.function.name, "a call's first delta carries its id and name"
                calls[tc.index] = {"name": tc.function.name, "arguments": tc.function.arguments or ""}
            else:
                assert tc.id is None and not tc.function.name
                calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content or None, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_streamed_tool_deltas_reassemble_to_the_message(client, tool_choice):
    kwargs = {"model": MODEL, "messages": ASK, "tools": [WEATHER, TIME], "tool_choice": tool_choice,
              "temperature": 0, "max_tokens": 64}
    r = client.chat.completions.create(**kwargs)
    message = r.choices[0].message
    content, calls, finish = _reassemble(client.chat.completions.create(**kwargs, stream=True))
    assert content == message.content and finish == r.choices[0].finish_reason
    assert calls == [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]
    if tool_choice == "required":   # greedy, parallel calls allowed: it may go on calling until max_tokens
        assert calls and finish in ("tool_calls", "length")


def test_two_turn_tool_conversation(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           temperature=0, max_tokens=100, parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, {"role": "assistant", "content": None,
                      "tool_calls": [{"id": call.id, "type": "function",
                                      "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice="none",
                                            temperature=0, max_tokens=30)
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20   # the call and its result were rendered


CALL_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
               "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "kelvin"]}}}
CALL_TAG = {"type": "structural_tag", "triggers": ["<function="],
            "structures": [{"begin": "<function=get_weather>", "schema": CALL_SCHEMA, "end": "</function>"}]}
# a few calls of another function: the model goes on with a get_time call unless constrained
CALLS = ('Calls:\n<function=get_time>{"zone": "UTC"}</function>\n<function=get_time>{"zone": "CET"}</function>\n'
         '<function=get_time>{"zone": "PST"}</function>\n')


def _tagged_call(text):
    m = re.search(r"<function=get_weather>(.*?)</function>", text, re.S)
    if m is None:
        return None
    call = json.loads(m.group(1))
    jsonschema.validate(call, CALL_SCHEMA)
    return call


def test_structural_tag_constrains_the_tagged_call_only(client):
    """vLLM's structures/triggers shape: free text, then at the trigger the get_weather begin,
    a schema-valid object and the end; greedy without it the model writes get_time calls."""
    free = client.completions.create(model=MODEL, prompt=CALLS, max_tokens=40, temperature=0)
    assert "<function=get_time>" in free.choices[0].text and _tagged_call(free.choices[0].text) is None
    r = client.completions.create(model=MODEL, prompt=CALLS, max_tokens=40, temperature=0,
                                  extra_body={"response_format": CALL_TAG})
    assert r.choices[0].text.startswith("<function=get_weather>") and _tagged_call(r.choices[0].text)


def test_structural_tag_format_spelling_on_chat_streamed(client):
    """xgrammar's `format` spelling (triggered_tags) through structured_outputs, streamed chat;
    text before the trigger is free."""
    tag = {"format": {"type": "triggered_tags", "triggers": ["<function="], "tags": [
        {"begin": "<function=get_weather>", "content": {"type": "json_schema", "json_schema": CALL_SCHEMA},
         "end": "</function>"}]}}
    ask = [{"role": "user", "content": "Continue the list exactly.\n" + CALLS}]
    stream = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=60, temperature=0, stream=True,
                                            extra_body={"structured_outputs": {"structural_tag": json.dumps(tag)}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert _tagged_call(text), text


def _bad(client, **kwargs):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                       **kwargs)
    return e.value.body.get("param") if isinstance(e.value.body, dict) else None, str(e.value)


@pytest.mark.parametrize("kwargs,param,words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format.json_schema.schema", "foo"),
    ({"extra_body": {"structured_outputs": {"json": {"type": "string", "format": "no-such-format"}}}},
     "structured_outputs.json", "format"),
    ({"extra_body": {"guided_regex": "[a-"}}, "guided_regex", "regex"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].function.parameters", "parameters"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"structured_outputs": {"regex": "a"}}},
     "structured_outputs", "both"),
    ({"extra_body": {"structured_outputs": {"regex": "a", "choice": ["b"]}}}, "structured_outputs", "exactly one"),
    ({"response_format": {**CALL_TAG, "triggers": ["<tool="]}}, "response_format.structures[0].begin", "triggers"),
    ({"response_format": {"type": "structural_tag", "structures": [], "triggers": ["<"]}},
     "response_format.structures", "non-empty"),
    ({"response_format": {"type": "structural_tag", "format": {"type": "tags_with_separator"}}},
     "response_format.format.type", "triggered_tags"),
    ({"extra_body": {"structured_outputs": {"structural_tag": {"triggers": ["<f"], "structures": [
        {"begin": "<f>", "schema": {"type": "nope"}, "end": ""}]}}}}, "structured_outputs.structural_tag", "nope"),
])
def test_bad_constraints_are_400s_naming_the_field(client, kwargs, param, words):
    got_param, message = _bad(client, **kwargs)
    assert got_param == param and words in message


def test_bad_schema_streamed_is_a_400_before_any_byte(served):
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "extra_body": None, "guided_json": {"type": "object", "properties": {"a": {"type": "nope"}}}}
    r = httpx.post(served.v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_json"


def test_metrics_count_compilations_and_hits(client, served):
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"]}
    for _ in range(2):
        client.completions.create(model=MODEL, prompt="x", max_tokens=20, extra_body={"guided_json": schema})
    import httpx

    families = {f.name: f for f in text_string_to_metric_families(httpx.get(served.base_url + "/metrics").text)}
    value = {name: families[name].samples[0].value for name in families if name.startswith("pacer_structured")}
    assert value["pacer_structured_outputs_compilations"] >= 1
    assert value["pacer_structured_outputs_cache_hits"] >= 1
    assert value["pacer_structured_outputs_mask_compute_seconds"] > 0
    assert "pacer_num_requests_waiting_for_grammar" in families
