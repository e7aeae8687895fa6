"""Verification of drafts preserves the target distribution (rejection sampling for point-mass
drafts): a statistical test on a small vocabulary with a fixed seed, and the acceptance rule."""

from __future__ import annotations

import torch

from pacer.model.sampler import Sampler
from pacer.model.spec_verify import accept_drafts, fold_results, sampling_rows
from pacer.request import SamplingParams
from pacer.sched.contract import ScheduledRequest

V = 6
CHI2_DF5_P001 = 20.52   # chi-square critical value, 5 degrees of freedom, p = 0.001


def test_accept_rule():
    assert accept_drafts([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]   # all hold: one bonus token
    assert accept_drafts([4, 5, 6], [4, 9, 6, 7]) == [4, 9]         # the first mismatch is emitted instead
    assert accept_drafts([4], [3, 8]) == [3]


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum()
    expected = probs * n
    return float(((counts - expected) ** 2 / expected).sum())


def test_rejection_sampling_preserves_the_target_distribution():
    torch.manual_seed(0)
    logits = torch.randn(3, V) * 1.5          # the target's logits at the last token and two drafts
    drafts = [int(logits[0].argsort()[-3]), int(logits[1].argmax())]   # a less likely draft, then a likely one
    params = SamplingParams(temperature=0.8, top_k=5, max_tokens=10)
    sr = ScheduledRequest("r", [1], 7, [], False, True, False, 3, draft_token_ids=drafts)
    n_trials = 30_000
    rows, spans = sampling_rows([sr] * n_trials, [params] * n_trials, [None] * n_trials)
    sampled = Sampler(seed=1234).sample(logits.repeat(n_trials, 1), rows).token_ids
    first = torch.zeros(V)
    second = torch.zeros(V)   # emitted second token, given the first draft held
    for i in range(n_trials):
        out = accept_drafts(drafts, sampled[3 * i:3 * i + 3])
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    def target(row: torch.Tensor) -> torch.Tensor:
        z = row / params.temperature
        z[z.argsort()[:V - params.top_k]] = float("-inf")   # top_k keeps the 5 largest
        return torch.softmax(z, dim=-1)
    p0, p1 = target(logits[0].clone()), target(logits[1].clone())
    assert chi2(first[p0 > 0], p0[p0 > 0]) < CHI2_DF5_P001
    assert first[p0 == 0].sum() == 0
    assert second.sum() > 1000 and chi2(second[p1 > 0], p1[p1 > 0]) < CHI2_DF5_P001
    # the first draft is accepted about as often as the target samples it
    assert abs(first[drafts[0]] / n_trials - p0[drafts[0]]) < 0.01


def test_fold_results_trims_the_mirrored_table_to_verified_tokens():
    sr = ScheduledRequest("r", [9], 14, [], False, True, False, 0, draft_token_ids=[1, 2, 3, 4])
    tables = {"r": [10, 11, 12]}   # block size 8: positions 0..23; drafts at 15..18
    res = fold_results([sr], [5], [1, 5, 0, 0, 0], {}, tables, 8)
    assert list(res["r"].token_ids) == [1, 5]          # one draft held
    assert tables["r"] == [10, 11]                      # 16 verified tokens: two blocks (12 held drafts only)
