"""`echo`, `max_tokens: 0` and vLLM's `prompt_logprobs` through the official `openai` client
against `pacer serve`: the legacy-format prompt logprobs lm-evaluation-harness reads (first token
null, then the offline engine's prompt logprobs), scoring without generating, and 400s naming
the field for values out of range."""

from __future__ import annotations

import openai
import pytest

from pacer.request import SamplingParams
from tests.server.conftest import MODEL, serve

PROMPT = "The capital of France is Paris, and the capital of Spain is Madrid."


@pytest.fixture(scope="module")
def offline(llm):
    """Offline prompt logprobs, computed before the server takes the engine."""
    return llm.generate(PROMPT, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1))[0]


@pytest.fixture(scope="module")
def client(llm, offline):
    with serve(llm.engine) as s, openai.OpenAI(base_url=s.v1, api_key="none", max_retries=0) as c:
        yield c


def test_echo_with_logprobs_is_what_lm_eval_reads(client, offline):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, logprobs=1, echo=True, temperature=0)
    choice = r.choices[0]
    n = len(offline.prompt_token_ids)
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    lp = choice.logprobs
    assert len(lp.token_logprobs) == n + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = [e[t] for t, e in zip(offline.prompt_token_ids[1:], offline.prompt_logprobs[1:])]
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:n], want)) < 1e-4
    assert "".join(lp.tokens[:n]) == PROMPT and lp.text_offset[:2] == [0, len(lp.tokens[0])]
    assert all(max(top.values()) >= tok for tok, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]))
    assert r.usage.completion_tokens == 1


def test_max_tokens_zero_scores_without_generating(client, offline):
    r = client.completions.create(model=MODEL, prompt=[offline.prompt_token_ids], max_tokens=0, logprobs=0,
                                  echo=True, temperature=0)
    choice = r.choices[0]
    assert choice.text == PROMPT and r.usage.completion_tokens == 0
    assert len(choice.logprobs.token_logprobs) == len(offline.prompt_token_ids)


def test_vllm_prompt_logprobs_on_completions_and_chat(client, offline):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0,
                                  extra_body={"prompt_logprobs": 2})
    entries = r.choices[0].model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(offline.prompt_token_ids)
    tok = str(offline.prompt_token_ids[1])
    assert abs(entries[1][tok]["logprob"] - offline.prompt_logprobs[1][offline.prompt_token_ids[1]]) < 1e-4
    assert sorted(e["rank"] for e in entries[1].values() if e["rank"] is not None) == [1, 2]
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
                                          extra_body={"prompt_logprobs": 0})
    assert chat.model_extra["prompt_logprobs"][0] is None and len(chat.model_extra["prompt_logprobs"]) > 3


def test_streamed_chat_prompt_logprobs_ride_the_first_chunk(client):
    """vLLM's shape: the streamed chat's prompt logprobs once, on the first chunk after the role,
    equal to the non-streamed answer's."""
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0,
           "extra_body": {"prompt_logprobs": 1}}
    whole = client.chat.completions.create(**ask).model_extra["prompt_logprobs"]
    chunks = list(client.chat.completions.create(**ask, stream=True))
    carrying = [i for i, c in enumerate(chunks) if (c.model_extra or {}).get("prompt_logprobs") is not None]
    assert carrying == [1] and chunks[0].choices[0].delta.role == "assistant"
    got = chunks[1].model_extra["prompt_logprobs"]
    assert got[0] is None and len(got) == len(whole)
    assert all(abs(g[t]["logprob"] - w[t]["logprob"]) < 1e-4 for g, w in zip(got[1:], whole[1:]) for t in w)


def test_streamed_echo_leads_with_the_prompt(client):
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, logprobs=0, echo=True,
                                       temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    first = chunks[0].choices[0]
    assert first.text.startswith(PROMPT) and first.logprobs.token_logprobs[0] is None


@pytest.mark.parametrize("body, field", [
    ({"prompt_logprobs": 21}, "prompt_logprobs"), ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"max_tokens": 0}, "max_tokens"), ({"echo": "yes"}, "echo"),
])
def test_bad_values_name_the_field(client, body, field):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, extra_body=body)
    assert e.value.body["param"] == field
