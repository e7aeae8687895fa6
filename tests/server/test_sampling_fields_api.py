"""The sampling fields clients commonly send, through the official `openai` client against
`pacer serve`: OpenAI's `logit_bias` and vLLM's `min_p`, `allowed_token_ids`, `bad_words`,
`truncate_prompt_tokens`; out-of-range values get a 400 naming the field and its range, and
`best_of` stays refused with a message saying what to do instead."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import MODEL, serve

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def served(llm):
    with serve(llm.engine) as s:
        yield s


def _greedy(client, **extra):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1,
                                  extra_body=extra or None)
    return r.choices[0]


def _token_id(served, text: str) -> int:
    r = httpx.post(f"{served.base_url}/tokenize", json={"model": MODEL, "prompt": text})
    return r.json()["tokens"][-1]


def test_logit_bias_allowed_and_bad_words_change_the_greedy_token(client, served):
    plain = _greedy(client)
    first = plain.logprobs.tokens[0]
    banned = _greedy(client, logit_bias={str(_token_id(served, first)): -100})
    assert banned.logprobs.tokens[0] != first
    only = _greedy(client, allowed_token_ids=[_token_id(served, " yes"), _token_id(served, " no")])
    assert set(only.logprobs.tokens) <= {" yes", " no"}
    no_word = _greedy(client, bad_words=[first.strip()])
    assert no_word.logprobs.tokens[0] != first


def test_min_p_and_truncate_prompt_tokens(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=1.0, seed=3,
                                  extra_body={"min_p": 1.0})
    assert r.choices[0].text == _greedy(client).text   # min_p 1 keeps only the top token
    t = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                  extra_body={"truncate_prompt_tokens": 2})
    assert t.usage.prompt_tokens == 2


@pytest.mark.parametrize("body, field, words", [
    ({"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    ({"min_p": 1.5}, "min_p", "[0, 1]"),
    ({"allowed_token_ids": []}, "allowed_token_ids", "non-empty"),
    ({"allowed_token_ids": [10**9]}, "allowed_token_ids", "vocabulary"),
    ({"bad_words": [""]}, "bad_words", "non-empty"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", ">= 1"),
    ({"best_of": 3}, "best_of", "n choices"),
])
def test_bad_values_name_the_field_and_range(client, body, field, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body=body)
    assert e.value.body["param"] == field and words in e.value.body["message"]


@pytest.mark.parametrize("body, field, words", [
    ({"prompt_logprobs": 21}, "prompt_logprobs", "<= 20"),
    ({"logit_bias": {"five": 1}}, "logit_bias", "token ids"),
    ({"logit_bias": {"5": -100.5}}, "logit_bias", "[-100, 100]"),
    ({"min_p": -0.1}, "min_p", "[0, 1]"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens", ">= -1"),
    ({"return_metrics": "yes"}, "return_metrics", "boolean"),
    ({"response_format": {"type": "structural_tag", "triggers": ["<f="], "structures": [
        {"begin": "<g>", "schema": {}, "end": ""}]}}, "response_format.structures[0].begin", "triggers"),
])
def test_bad_values_on_chat_name_the_field_and_range(client, body, field, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       extra_body=body)
    assert e.value.body["param"] == field and words in e.value.body["message"], e.value.body
