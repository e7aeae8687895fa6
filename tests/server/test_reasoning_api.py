"""Reasoning outputs through the official `openai` client against `pacer serve
--reasoning-parser qwen3` on a tiny Qwen3-architecture model built locally (tests/server/
tiny_qwen3.py) with pacer's shipped Qwen3 template (`--chat-template qwen3`): the thinking in
`message.reasoning_content` / `reasoning` and in streamed deltas, `chat_template_kwargs` over
`--default-chat-template-kwargs`, `thinking_token_budget` forcing `</think>`, a grammar
(response_format, a forced tool call) that starts only after the thinking, and 400s naming the
field. The model's text is noise: what is asserted is forced (the budget puts `</think>` at a
known token; the grammar decides the answer), and compared with the offline engine's output."""

from __future__ import annotations

import json

import openai
import pytest
import torch
import transformers

from pacer import LLM, SamplingParams
from pacer.request import StructuredOutputsParams
from pacer.server.tools.template import render_chat, shipped_template
from tests.model.test_parity import hf_greedy
from tests.server.conftest import serve
from tests.server.tiny_qwen3 import build_tiny_qwen3

MODEL = "tiny-qwen3"
MESSAGES = [{"role": "user", "content": "Why is the sky blue?"}]
THINK = {"enable_thinking": True}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
N = 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))
    llm = LLM(model=path, reasoning_parser="qwen3", num_kv_blocks=64, num_threads=1)
    tok = llm.engine.tokenizer
    template = shipped_template("qwen3")
    prompts = {think: render_chat(tok, MESSAGES, None, template, {"enable_thinking": think}) for think in (True, False)}
    greedy = dict(max_tokens=N, temperature=0, ignore_eos=True)
    refs = {
        "plain": llm.generate([prompts[True]], SamplingParams(**greedy))[0],
        "budget": llm.generate([prompts[True]], SamplingParams(**greedy, thinking_token_budget=4))[0],
        "nothink": llm.generate([prompts[False]], SamplingParams(**greedy, thinking_token_budget=2))[0],
        "json": llm.generate([prompts[True]], SamplingParams(
            max_tokens=40, temperature=0, thinking_token_budget=3,
            structured_outputs=StructuredOutputsParams(json=SCHEMA)))[0],
    }
    end_id = tok.hf.convert_tokens_to_ids("</think>")
    return llm, path, prompts, refs, end_id


@pytest.fixture(scope="module")
def served(tiny):
    llm = tiny[0]
    with serve(llm.engine, "--chat-template", "qwen3", "--served-model-name", MODEL,
               "--default-chat-template-kwargs", '{"enable_thinking": false}') as s:
        yield s


def _split(text: str) -> tuple[str, str]:
    reasoning, _, content = text.partition("</think>")
    return reasoning, content


def test_tiny_qwen3_matches_hf_float32(tiny):
    """The Qwen3 architecture (tied embeddings, q/k norm) against HF float32 on the same weights."""
    llm, path, prompts, refs, _ = tiny
    hf = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert hf_greedy(hf, [prompts[True]], N) == [list(refs["plain"].token_ids)]
    ids = prompts[True]
    scored = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    with torch.inference_mode():
        want = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1)
    got = [entry[t] for entry, t in zip(scored.prompt_logprobs[1:], ids[1:])]
    err = max(abs(g - float(want[p, t])) for p, (g, t) in enumerate(zip(got, ids[1:])))
    assert err < 1e-4, err   # each prompt token's logprob, as HF float32 computes it


def test_budget_forces_the_end_of_thinking_offline(tiny):
    _, _, prompts, refs, end_id = tiny
    assert end_id not in refs["plain"].token_ids[:5]          # left alone, the model does not stop thinking
    assert refs["budget"].token_ids[:4] == refs["plain"].token_ids[:4]
    assert refs["budget"].token_ids[4] == end_id                # after 4 thinking tokens: </think>
    assert end_id not in refs["nothink"].token_ids              # enable_thinking false: no budget to spend
    assert len(prompts[False]) > len(prompts[True])             # ... its prompt holds the empty <think></think>


def test_offline_chat_takes_the_template_and_its_kwargs(tiny):
    llm, _, prompts, refs, _ = tiny
    out = llm.chat(MESSAGES, SamplingParams(max_tokens=N, temperature=0, ignore_eos=True, thinking_token_budget=2),
                   chat_template=shipped_template("qwen3"), chat_template_kwargs={"enable_thinking": False})[0]
    assert out.prompt_token_ids == prompts[False] and out.token_ids == refs["nothink"].token_ids


def test_reasoning_content_non_streamed(tiny, client):
    refs = tiny[3]
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=N, temperature=0,
                                       extra_body={"chat_template_kwargs": THINK, "thinking_token_budget": 4,
                                                   "ignore_eos": True})
    msg = r.choices[0].message
    reasoning, content = _split(refs["budget"].text)
    assert (msg.reasoning_content, msg.content) == (reasoning, content)
    assert msg.reasoning == reasoning and reasoning
    assert r.usage.completion_tokens == N and r.usage.prompt_tokens == len(tiny[2][True])


def test_reasoning_content_streamed(tiny, client):
    refs = tiny[3]
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=N, temperature=0,
                                            stream=True, extra_body={"chat_template_kwargs": THINK,
                                                                     "thinking_token_budget": 4, "ignore_eos": True})
    thoughts, answer, kinds = [], [], []
    for chunk in stream:
        for c in chunk.choices:
            d = c.delta.model_extra or {}
            if d.get("reasoning_content"):
                assert d["reasoning"] == d["reasoning_content"] and not c.delta.content
                thoughts.append(d["reasoning_content"])
                kinds.append("r")
            if c.delta.content:
                answer.append(c.delta.content)
                kinds.append("c")
    assert ("".join(thoughts), "".join(answer)) == _split(refs["budget"].text)
    assert kinds == sorted(kinds, reverse=True) and kinds.count("r") >= 2   # thinking first, then the answer


def test_default_chat_template_kwargs_turn_thinking_off(tiny, client):
    """The server's default (`enable_thinking: false`) writes the empty thinking block: the
    output is all answer and the budget has nothing to force."""
    refs = tiny[3]
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=N, temperature=0,
                                       extra_body={"thinking_token_budget": 2, "ignore_eos": True})
    assert r.usage.prompt_tokens == len(tiny[2][False])
    msg = r.choices[0].message
    assert msg.reasoning_content is None and msg.content == refs["nothink"].text


def test_json_schema_applies_after_the_thinking(tiny, client):
    _, _, _, refs, end_id = tiny
    ref = refs["json"]
    assert ref.token_ids[:3] == refs["plain"].token_ids[:3] and ref.token_ids[3] == end_id   # unconstrained thinking
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "ok", "schema": SCHEMA}},
        extra_body={"chat_template_kwargs": THINK, "thinking_token_budget": 3})
    msg = r.choices[0].message
    assert (msg.reasoning_content, msg.content) == _split(ref.text)
    assert isinstance(json.loads(msg.content)["ok"], bool)


def test_a_json_mode_does_not_switch_thinking_off(client):
    """Without a budget the (noise) model never writes </think>: the grammar never starts, so
    the output is all thinking, not a JSON object."""
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0,
                                       response_format={"type": "json_object"},
                                       extra_body={"chat_template_kwargs": THINK})
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and msg.content is None and msg.reasoning_content


def test_forced_tool_call_is_read_after_the_thinking(client):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "maxLength": 3}}, "required": ["q"],
        "additionalProperties": False}}}]
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=60, temperature=0, tools=tools,
              tool_choice={"type": "function", "function": {"name": "lookup"}},
              extra_body={"chat_template_kwargs": THINK, "thinking_token_budget": 2})
    msg = client.chat.completions.create(**kw).choices[0].message
    assert msg.reasoning_content and msg.tool_calls and msg.tool_calls[0].function.name == "lookup"
    assert "q" in json.loads(msg.tool_calls[0].function.arguments)
    thoughts, args, names = [], [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            thoughts.append((c.delta.model_extra or {}).get("reasoning_content") or "")
            for call in c.delta.tool_calls or []:
                names.append(call.function.name)
                args.append(call.function.arguments or "")
    assert "".join(thoughts) == msg.reasoning_content
    assert [n for n in names if n] == ["lookup"] and "".join(args) == msg.tool_calls[0].function.arguments


@pytest.mark.parametrize("body, field, words", [
    ({"thinking_token_budget": -1}, "thinking_token_budget", ">= 0"),
    ({"thinking_token_budget": "many"}, "thinking_token_budget", "integer"),
    ({"chat_template_kwargs": "x"}, "chat_template_kwargs", "object"),
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs", "tokenize"),
])
def test_bad_values_name_the_field(client, body, field, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, extra_body=body)
    assert e.value.body["param"] == field and words in e.value.body["message"]
