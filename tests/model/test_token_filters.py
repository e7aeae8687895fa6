"""The sampling fields clients send, at the sampler and in SamplingParams (no model): logit_bias,
allowed_token_ids, bad_words (single and multi-token, matched against the output's tail),
min_p; bad values name the field and its range."""

from __future__ import annotations

import pytest
import torch

from pacer import SamplingParams
from pacer.errors import FieldError
from pacer.model.sampler import Sampler, SamplingRow, TokenHistory


def _greedy(params: SamplingParams, outputs: list[int] = ()) -> int:
    logits = torch.arange(10, dtype=torch.float32).unsqueeze(0)   # token 9 most likely, then 8, ...
    history = TokenHistory([], list(outputs)) if params.needs_history else None
    return Sampler().sample(logits, [SamplingRow(params, len(outputs), history)]).token_ids[0]


def test_bias_allowed_and_bad_words_steer_the_greedy_token():
    assert _greedy(SamplingParams(temperature=0)) == 9
    assert _greedy(SamplingParams(temperature=0, logit_bias={3: 100})) == 3
    assert _greedy(SamplingParams(temperature=0, allowed_token_ids=[1, 4])) == 4
    assert _greedy(SamplingParams(temperature=0, bad_words_token_ids=((9,),))) == 8
    multi = SamplingParams(temperature=0, bad_words_token_ids=((5, 9),))
    assert _greedy(multi, [1, 5]) == 8 and _greedy(multi, [5, 1]) == 9   # banned only after its prefix


def test_min_p_one_keeps_only_the_top_token():
    logits = torch.zeros(1, 10)
    logits[0, 7] = 0.5
    rows = [SamplingRow(SamplingParams(temperature=1.0, min_p=1.0, seed=s), 0) for s in range(1)]
    assert {Sampler().sample(logits, rows).token_ids[0] for _ in range(20)} == {7}


@pytest.mark.parametrize("kw, field", [
    ({"logit_bias": {1: 100.5}}, "logit_bias"), ({"min_p": -0.1}, "min_p"), ({"allowed_token_ids": []},
    "allowed_token_ids"), ({"bad_words": [""]}, "bad_words"), ({"truncate_prompt_tokens": 0},
    "truncate_prompt_tokens"), ({"prompt_logprobs": 21}, "prompt_logprobs"),
])
def test_bad_values_name_the_field(kw, field):
    with pytest.raises(FieldError) as e:
        SamplingParams(**kw)
    assert e.value.field == field
