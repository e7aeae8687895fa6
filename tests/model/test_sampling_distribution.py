"""Sampling controls by their effect: many seeded draws from one row of logits against the
distribution each control defines (written out independently below, in float64).

Each case draws N tokens from identical rows with a fixed seed and checks (a) that tokens
the definition excludes never occur, and (b) a chi-square bound (significance 1e-6, so the
real sampler passes under any seed) and a total-variation bound on the kept tokens. The
distributions are vLLM's: temperature divides the logits; top_k keeps the k most likely;
top_p keeps the smallest most-likely prefix whose mass reaches p, computed after top_k on
its renormalised distribution; penalties as OpenAI/vLLM define them; a row short of
min_tokens cannot sample EOS or a stop token id.
"""

from __future__ import annotations

import math

import pytest
import torch

from pacer.model.sampler import Sampler, SamplingRow, TokenHistory
from pacer.request import SamplingParams
from tests.model.test_sampler import reference_penalties

V = 12
N = 20_000
EOS = 3
# distinct, well-spread logits: probabilities from ~0.3 down to ~0.003
LOGITS = torch.tensor([2.0, 1.6, 1.1, 0.9, 0.5, 0.2, -0.1, -0.5, -0.9, -1.3, -1.8, -2.4])


def reference(logits: list[float], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> list[float]:
    """The distribution the controls define, token by token in float64."""
    z = [x / temperature for x in logits]
    order = sorted(range(len(z)), key=lambda i: -z[i])
    kept = order[:top_k] if top_k else order
    top = max(z[i] for i in kept)
    weights = {i: math.exp(z[i] - top) for i in kept}
    total = sum(weights.values())
    probs = {i: w / total for i, w in weights.items()}
    if top_p < 1.0:
        prefix, mass = [], 0.0
        for i in kept:             # most likely first; stop once the prefix holds top_p
            if mass >= top_p:
                break
            prefix.append(i)
            mass += probs[i]
        probs = {i: probs[i] / mass for i in prefix}
    return [probs.get(i, 0.0) for i in range(len(z))]


def draw(logits: torch.Tensor, params: SamplingParams, n: int = N, output_index: int = 0,
         history: TokenHistory | None = None, eos: tuple[int, ...] = (), seed: int = 0) -> list[int]:
    """Counts per token of n draws from identical rows (unseeded rows: the sampler's generator)."""
    rows = [SamplingRow(params, output_index, history)] * n
    tokens = Sampler(seed, eos).sample(logits.expand(n, -1).contiguous(), rows).token_ids
    return torch.bincount(torch.tensor(tokens), minlength=logits.shape[-1]).tolist()


def chi2_critical(df: int, z: float = 4.753) -> float:
    """Upper quantile of chi-square(df) by Wilson-Hilferty; z=4.753 is the normal 1 - 1e-6 quantile."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def assert_distribution(counts: list[int], expected: list[float]) -> None:
    """No draw outside the support; chi-square below its 1e-6 quantile (kept tokens expected
    fewer than 5 times pooled into one bin); total variation within 0.01 plus twice its
    expected sampling noise."""
    n = sum(counts)
    outside = {i: c for i, c in enumerate(counts) if expected[i] == 0 and c}
    assert not outside, f"tokens the controls exclude were sampled: {outside}"
    support = [i for i, p in enumerate(expected) if p > 0]
    tv = 0.5 * sum(abs(counts[i] / n - expected[i]) for i in support)
    noise = 0.5 * sum(math.sqrt(expected[i] * (1 - expected[i]) / n) for i in support)
    assert tv < 0.01 + 2 * noise, f"total variation {tv:.4f} (noise {noise:.4f})"
    bins = [([i], expected[i]) for i in support if n * expected[i] >= 5]
    rest = [i for i in support if n * expected[i] < 5]
    if rest:
        bins.append((rest, sum(expected[i] for i in rest)))
    if len(bins) > 1:
        chi2 = sum((sum(counts[i] for i in ids) - n * p) ** 2 / (n * p) for ids, p in bins)
        assert chi2 < chi2_critical(len(bins) - 1), (chi2, counts, expected)


def test_the_bounds_reject_a_different_distribution():
    # the check has power: plain softmax draws fail against the T=0.7 distribution
    counts = draw(LOGITS, SamplingParams(temperature=1.0))
    assert_distribution(counts, reference(LOGITS.tolist()))
    with pytest.raises(AssertionError):
        assert_distribution(counts, reference(LOGITS.tolist(), temperature=0.7))


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_divides_the_logits(temperature):
    assert_distribution(draw(LOGITS, SamplingParams(temperature=temperature)),
                        reference(LOGITS.tolist(), temperature))


@pytest.mark.parametrize("top_k", [1, 3, 7])
def test_top_k_keeps_the_k_most_likely(top_k):
    counts = draw(LOGITS, SamplingParams(temperature=1.0, top_k=top_k))
    assert_distribution(counts, reference(LOGITS.tolist(), top_k=top_k))
    assert sum(c > 0 for c in counts) == top_k


@pytest.mark.parametrize("top_p", [0.3, 0.6, 0.9])
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p):
    assert_distribution(draw(LOGITS, SamplingParams(temperature=1.0, top_p=top_p)),
                        reference(LOGITS.tolist(), top_p=top_p))


def test_temperature_then_top_k_then_top_p_in_vllms_order():
    # top_p on the renormalised top-k distribution keeps fewer tokens here than top_p on the
    # full one followed by top_k would: 0.65 of the top-4 mass is 2 tokens, of the full mass 3
    params = SamplingParams(temperature=0.8, top_k=4, top_p=0.65)
    want = reference(LOGITS.tolist(), 0.8, 4, 0.65)
    assert sum(p > 0 for p in want) == 2
    assert_distribution(draw(LOGITS, params), want)
    # and rows with different controls in one batch each get their own
    mixed = [SamplingRow(SamplingParams(temperature=2.0), 0), SamplingRow(params, 0)] * (N // 2)
    tokens = Sampler(5).sample(LOGITS.expand(N, -1).contiguous(), mixed).token_ids
    for j, want_j in ((0, reference(LOGITS.tolist(), 2.0)), (1, want)):
        assert_distribution(torch.bincount(torch.tensor(tokens[j::2]), minlength=V).tolist(), want_j)


@pytest.mark.parametrize("kw", [dict(frequency_penalty=0.8), dict(presence_penalty=1.5),
                                dict(repetition_penalty=1.8), dict(frequency_penalty=-0.5, repetition_penalty=0.8)])
def test_penalties_shape_the_distribution(kw):
    prompt, output = [0, 1, 1], [1, 2, 2, 5]
    params = SamplingParams(temperature=1.0, **kw)
    history = TokenHistory(prompt, output)
    want = reference(reference_penalties(LOGITS.tolist(), prompt, output, params))
    assert_distribution(draw(LOGITS, params, output_index=len(output), history=history), want)


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    params = SamplingParams(temperature=1.0, max_tokens=8, min_tokens=4, stop_token_ids=(0,))
    logits = LOGITS.tolist()
    banned = list(logits)
    banned[0] = banned[EOS] = -math.inf
    for output_index in range(4):        # short of min_tokens: neither EOS nor the stop id
        assert_distribution(draw(LOGITS, params, output_index=output_index, eos=(EOS,), n=N // 4),
                            reference(banned))
    assert_distribution(draw(LOGITS, params, output_index=4, eos=(EOS,)), reference(logits))
    ignoring = SamplingParams(temperature=1.0, max_tokens=8, min_tokens=4, ignore_eos=True)
    assert draw(LOGITS, ignoring, output_index=0, eos=(EOS,))[EOS] > 0   # EOS is not a stop token then
    greedy = SamplingParams(temperature=0, max_tokens=8, min_tokens=2, stop_token_ids=(0,))
    assert draw(LOGITS, greedy, n=1, eos=(EOS,)) == [int(i == 1) for i in range(V)]   # next best


def test_seeded_rows_draw_the_same_distribution():
    rows = [SamplingRow(SamplingParams(temperature=0.9, top_k=6, seed=s), 0) for s in range(N)]
    tokens = Sampler(0).sample(LOGITS.expand(N, -1).contiguous(), rows).token_ids
    assert_distribution(torch.bincount(torch.tensor(tokens), minlength=V).tolist(),
                        reference(LOGITS.tolist(), 0.9, 6))


def test_one_seeded_request_draws_afresh_at_every_output_index():
    # a seeded request's successive tokens are independent draws from the distribution (its
    # noise is seeded by seed and output index), not one draw repeated at every position
    p = SamplingParams(temperature=0.9, top_k=6, seed=1234)
    rows = [SamplingRow(p, i) for i in range(N)]
    tokens = Sampler(0).sample(LOGITS.expand(N, -1).contiguous(), rows).token_ids
    assert_distribution(torch.bincount(torch.tensor(tokens), minlength=V).tolist(),
                        reference(LOGITS.tolist(), 0.9, 6))
    again = Sampler(99).sample(LOGITS.expand(N, -1).contiguous(), rows).token_ids
    assert again == tokens   # and the same seed gives the same tokens whatever the sampler's own generator
