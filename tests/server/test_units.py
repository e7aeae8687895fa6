"""Pure pieces of the server room: admission control, request classes, percentiles, the
request-log record, and request parsing. No model, no HTTP."""

from __future__ import annotations

import math

import pytest

from pacer.config.slo import ClassRules
from pacer.request import RequestMetrics, sample_seed
from pacer.sched.admission import AdmissionController
from pacer.server.api.errors import APIError
from pacer.server.api.protocol import parse_chat, parse_completion
from pacer.telemetry.request_log import REQUEST_LOG_FIELDS, make_log_record, percentiles, summarize


def test_admission_caps_and_displaces_lowest_priority_latest_first():
    ac = AdmissionController(max_waiting=3)
    for i, prio in enumerate([5, 9, 9]):
        assert ac.try_admit(f"r{i}", prio, now=0.0).admitted
    refused = ac.try_admit("r3", 9, now=0.0)          # not more important than the worst: refused
    assert not refused.admitted and refused.reason == "queue_full" and refused.retry_after_s >= 1
    d = ac.try_admit("r4", 1, now=0.0)                 # more important: displaces the latest prio-9
    assert d.admitted and d.displaced_id == "r2"
    d = ac.try_admit("r5", 1, now=0.0)
    assert d.displaced_id == "r1"
    d = ac.try_admit("r6", 1, now=0.0)
    assert d.displaced_id == "r0"
    assert not ac.try_admit("r7", 1, now=0.0).admitted  # ties never displace
    assert ac.num_refused == {"queue_full": 2, "displaced": 3}


def test_admission_frees_places_on_start_and_release():
    ac = AdmissionController(max_waiting=1)
    assert ac.try_admit("a", 0, 0.0).admitted
    ac.mark_started("a", 1.0)
    assert ac.try_admit("b", 0, 1.0).admitted
    ac.release("b")
    assert ac.num_waiting == 0 and ac.try_admit("c", 0, 1.0).admitted
    with pytest.raises(ValueError, match="already waiting"):
        ac.try_admit("c", 0, 1.0)


def test_admission_unlimited_and_retry_after_from_start_rate():
    ac = AdmissionController(None)
    for i in range(1000):
        assert ac.try_admit(str(i), i % 7, 0.0).admitted
    ac = AdmissionController(max_waiting=1)
    for i in range(5):
        ac.try_admit(f"s{i}", 0, float(i * 4))
        ac.mark_started(f"s{i}", float(i * 4))         # one start every 4 s
    ac.try_admit("w", 0, 20.0)
    assert ac.try_admit("x", 0, 20.0).retry_after_s == 4
    with pytest.raises(ValueError, match="max_waiting"):
        AdmissionController(-1)


@pytest.mark.parametrize("prompt,max_tokens,agent,want", [
    (10, 16, False, "chat"), (10, None, False, "chat"), (5000, 16, False, "rag"),
    (10, 4096, False, "batch"), (5000, 4096, True, "agent"), (2048, 1023, False, "chat"),
])
def test_class_rules(prompt, max_tokens, agent, want):
    assert ClassRules(rag_min_tokens=2048, batch_max_tokens=1024).classify(prompt, max_tokens, agent) == want


def test_class_rules_validate():
    with pytest.raises(ValueError, match="batch_max_tokens"):
        ClassRules(batch_max_tokens=0)


def test_percentiles_and_summary():
    p = percentiles([1, 2, 3, 4, 5])
    assert p["p50"] == 3 and p["p90"] == pytest.approx(4.6) and p["p99"] == pytest.approx(4.96)
    assert math.isnan(percentiles([])["p50"])
    s = summarize([2.0, 4.0])
    assert s["mean"] == 3.0 and s["count"] == 2 and s["max"] == 4.0


def test_log_record_fields_and_times():
    m = RequestMetrics(arrival_time=101.0, first_scheduled_time=101.5, first_token_time=102.0,
                       finish_time=103.0, token_times=[102.0, 102.5, 103.0], prompt_tokens=7, cached_tokens=0)
    rec = make_log_record(metrics=m, start=100.0, clock_to_unix=1000.0, request_id="r", api_id="cmpl-1",
                          index=0, endpoint="completions", model="m", stream=False, tenant="t", priority=0,
                          max_tokens=3, finish_reason="length", status=200, **{"class": "chat"})
    assert tuple(rec) == REQUEST_LOG_FIELDS
    assert (rec["timestamp"], rec["arrival_unix"], rec["finished_at"]) == (1.0, 1101.0, 3.0)
    assert (rec["queue_wait"], rec["ttft"], rec["tpot"], rec["e2e"]) == (0.5, 1.0, 0.5, 2.0)
    assert (rec["output_tokens"], rec["itl_mean"], rec["itl_max"]) == (3, 0.5, 0.5)
    with pytest.raises(ValueError, match="unknown fields"):
        make_log_record(metrics=m, start=0.0, clock_to_unix=0.0, bogus=1)


def test_parse_completion_fields():
    p = parse_completion({"model": "m", "prompt": [[1, 2], [3]], "max_tokens": 4, "temperature": 0,
                          "stop": "x", "user": "u1", "priority": -2, "top_k": -1, "stream": True,
                          "stream_options": {"include_usage": True}, "unknown_field": 1})
    assert p.prompts == [[1, 2], [3]] and p.max_tokens == 4 and p.tenant == "u1" and p.priority == -2
    assert p.sampling["stop"] == ("x",) and p.sampling["top_k"] == 0 and p.sampling["temperature"] == 0.0
    assert p.stream and p.include_usage
    assert parse_completion({"model": "m", "prompt": "x", "tenant": "t", "user": "u"}).tenant == "t"


def test_parse_sampling_options():
    p = parse_completion({"model": "m", "prompt": "x", "logprobs": 0, "n": 3, "presence_penalty": -2,
                          "frequency_penalty": 1.5, "repetition_penalty": 1.2})
    assert p.n == 3 and p.sampling["logprobs"] == 0
    assert (p.sampling["presence_penalty"], p.sampling["frequency_penalty"]) == (-2.0, 1.5)
    assert p.sampling["repetition_penalty"] == 1.2
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert parse_chat({**chat, "logprobs": True}).sampling["logprobs"] == 0
    assert parse_chat({**chat, "logprobs": True, "top_logprobs": 5}).sampling["logprobs"] == 5
    assert "logprobs" not in parse_chat({**chat, "logprobs": False, "top_logprobs": 0}).sampling
    assert parse_completion({"model": "m", "prompt": "x"}).n == 1


def test_choice_seeds_are_distinct_and_stable():
    seeds = [sample_seed(1234, j) for j in range(8)]
    assert seeds[0] == 1234 and len(set(seeds)) == 8 and all(0 <= s < 2**63 for s in seeds)
    assert seeds == [sample_seed(1234, j) for j in range(8)]


def test_parse_chat_fields():
    p = parse_chat({"model": "m", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
        {"role": "assistant", "content": None}, {"role": "user", "content": "hi"}],
        "max_tokens": 9, "max_completion_tokens": 5,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
    assert p.messages[0] == {"role": "system", "content": "be brief"} and p.messages[1]["content"] == ""
    assert p.max_tokens == 5 and p.has_tools


@pytest.mark.parametrize("body,param", [
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"model": "m", "messages": ["hi"]}, "messages[0]"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
     "response_format"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools[0].function"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
    ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "guided_json": {"type": "object"},
      "guided_regex": "a"}, "guided_regex"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "structured_outputs": {"regex": 3}},
     "structured_outputs.regex"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "structured_outputs": {"json": "{bad"}},
     "structured_outputs.json"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "structured_outputs": {"backend": "x"}},
     "structured_outputs.backend"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "guided_choice": []}, "guided_choice"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"},
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "required"},
     "tool_choice"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "repetition_penalty": 0}, "repetition_penalty"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": "all"}, "tools"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
      "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
])
def test_parse_chat_rejects(body, param):
    with pytest.raises(APIError) as e:
        parse_chat(body)
    assert e.value.status == 400 and e.value.param == param


def test_parse_structured_fields():
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    p = parse_chat({**chat, "response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "object"}, "strict": True}}})
    assert p.sampling["structured_outputs"].json == {"type": "object"}
    assert p.structured_param == "response_format.json_schema.schema"
    p = parse_completion({"model": "m", "prompt": "x", "guided_choice": ["a", "b"]})
    assert p.sampling["structured_outputs"].choice == ("a", "b") and p.structured_param == "guided_choice"
    p = parse_chat({**chat, "structured_outputs": {"grammar": 'start: "x"', "disable_any_whitespace": False}})
    assert p.structured_param == "structured_outputs.grammar"
    assert "structured_outputs" not in parse_chat({**chat, "response_format": {"type": "text"}}).sampling
    p = parse_chat({**chat, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                    "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": False})
    assert p.tools.choice == "function" and p.tools.function_name == "f" and not p.tools.parallel
    p = parse_chat({"model": "m", "messages": [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]})
    assert p.messages[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert p.messages[1] == {"role": "tool", "content": "42", "tool_call_id": "c1"}
