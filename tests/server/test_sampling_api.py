"""logprobs, penalties and n > 1 through the official `openai` client against `pacer serve`:
greedy logprobs are the top of their distribution and equal the offline engine's, streamed
logprobs add up to the non-streamed ones, penalties move repetition the expected way (and
nothing at their neutral values), n fans out into distinct, reproducible choices."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from pacer.request import SamplingParams
from tests.server.conftest import MODEL, serve

PROMPT = "The capital of France is"
REPEAT = "the the the the the the"     # greedy SmolLM2 falls into a loop on it
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def offline(llm):
    """Offline greedy logprobs, computed before the server takes the engine."""
    return llm.generate(PROMPT, SamplingParams(max_tokens=8, temperature=0, logprobs=5))[0]


@pytest.fixture(scope="module")
def served(llm, offline):
    with serve(llm.engine) as s:
        yield s


def _check_distribution(chosen: float, top: list[float]) -> None:
    assert top == sorted(top, reverse=True)
    assert sum(math.exp(lp) for lp in top) <= 1 + 1e-5
    assert chosen == pytest.approx(top[0])          # greedy: the sampled token is the most likely one


def test_completion_logprobs_greedy_and_streamed(client, offline):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=5)
    choice = r.choices[0]
    lp = choice.logprobs
    assert choice.text == offline.text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for tok, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 5 and tok in top
        _check_distribution(chosen, list(top.values()))
    assert lp.token_logprobs == pytest.approx([e[t] for t, e in zip(offline.token_ids, offline.logprobs)], abs=1e-4)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=5,
                                            stream=True))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
    assert [t for s in streamed for t in s.tokens] == lp.tokens
    assert [o for s in streamed for o in s.text_offset] == lp.text_offset
    assert [x for s in streamed for x in s.token_logprobs] == pytest.approx(lp.token_logprobs, abs=1e-4)
    k0 = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=0)
    assert [list(top) for top in k0.choices[0].logprobs.top_logprobs] == [[t] for t in k0.choices[0].logprobs.tokens]
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).choices[0].logprobs is None


def test_chat_logprobs_greedy_and_streamed(client):
    kwargs = {"model": MODEL, "messages": CHAT, "max_tokens": 8, "temperature": 0, "logprobs": True,
              "top_logprobs": 3}
    r = client.chat.completions.create(**kwargs)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 3 and item.top_logprobs[0].token == item.token
        _check_distribution(item.logprob, [t.logprob for t in item.top_logprobs])
    spelled = bytes(b for item in content for b in item.bytes).decode()
    assert spelled.removesuffix("<|im_end|>") == r.choices[0].message.content   # EOS is a token, not text
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed = [item for c in chunks if c.choices and c.choices[0].logprobs for item in c.choices[0].logprobs.content]
    assert [i.token for i in streamed] == [i.token for i in content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    bare = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, temperature=0, logprobs=True)
    assert all(item.top_logprobs == [] for item in bare.choices[0].logprobs.content)


def _repeats(client, **kwargs) -> tuple[int, str]:
    r = client.completions.create(model=MODEL, prompt=REPEAT, max_tokens=24, temperature=0, logprobs=0, **kwargs)
    tokens = r.choices[0].logprobs.tokens
    return len(tokens) - len(set(tokens)), r.choices[0].text


@pytest.fixture(scope="module")
def plain(client):
    return _repeats(client)


@pytest.mark.parametrize("kwargs", [{"frequency_penalty": 1.5}, {"presence_penalty": 2.0},
                                    {"extra_body": {"repetition_penalty": 1.5}}])
def test_penalties_reduce_repetition(client, plain, kwargs):
    penalised, text = _repeats(client, **kwargs)
    assert penalised < plain[0], (plain[1], text)


def test_penalties_at_neutral_values_change_nothing(client, plain):
    assert _repeats(client, frequency_penalty=0, presence_penalty=0.0, extra_body={"repetition_penalty": 1}) == plain
    assert _repeats(client, frequency_penalty=-1.0)[0] > plain[0]   # a negative penalty rewards repeats


def test_n_choices_seeded_reproducible_and_streamed(client):
    kwargs = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0, "seed": 1234,
              "logprobs": 0}
    r = client.completions.create(n=3, **kwargs)
    texts = [c.text for c in r.choices]
    assert [c.index for c in r.choices] == [0, 1, 2] and len(set(texts)) > 1
    assert [c.text for c in client.completions.create(n=3, **kwargs).choices] == texts
    one = client.completions.create(**kwargs)
    assert one.choices[0].text == texts[0]                                   # choice 0 keeps the seed
    assert r.usage.prompt_tokens == one.usage.prompt_tokens                  # the prompt counts once
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)
    chunks = list(client.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **kwargs))
    by_index = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in range(3)]
    assert by_index == texts
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == one.usage.prompt_tokens


def test_n_choices_chat_and_many_prompts(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0.8, n=2,
                                                 seed=7, stream=True))
    assert {c.choices[0].index for c in chunks} == {0, 1}
    assert sum(c.choices[0].finish_reason is not None for c in chunks) == 2
    r = client.completions.create(model=MODEL, prompt=[PROMPT, "1, 2, 3,"], max_tokens=4, temperature=0, n=2)
    texts = [c.text for c in r.choices]
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert texts[0] == texts[1] and texts[2] == texts[3] and texts[0] != texts[2]   # greedy: n copies per prompt


BAD = [
    ("completions", {"n": 9}, "n"),
    ("completions", {"n": 0}, "n"),
    ("completions", {"logprobs": 21}, "logprobs"),
    ("completions", {"logprobs": -1}, "logprobs"),
    ("completions", {"logprobs": True}, "logprobs"),
    ("completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("completions", {"frequency_penalty": -3}, "frequency_penalty"),
    ("completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("completions", {"repetition_penalty": "high"}, "repetition_penalty"),
    ("completions", {"echo": 1}, "echo"),
    ("completions", {"best_of": 2}, "best_of"),
    ("completions", {"suffix": "x"}, "suffix"),
    ("completions", {"logit_bias": {"1": 500}}, "logit_bias"),
    ("completions", {"prompt_logprobs": 21}, "prompt_logprobs"),
    ("chat/completions", {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("chat/completions", {"logprobs": 1}, "logprobs"),
    ("chat/completions", {"n": 100}, "n"),
]


@pytest.mark.parametrize("endpoint,extra,param", BAD)
def test_bad_sampling_options_name_the_field(served, endpoint, extra, param):
    body = {"model": MODEL, "max_tokens": 2, **extra}
    body.update({"messages": CHAT} if endpoint.startswith("chat") else {"prompt": PROMPT})
    r = httpx.post(f"{served.v1}/{endpoint}", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err
