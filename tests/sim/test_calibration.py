"""Calibration: NNLS, and a round trip on synthetic timings that recovers known coefficients."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pacer.perf.cost_model import LINEAR_FEATURES, LinearCostModel, batch_features
from pacer.perf.profiles import get_hardware, get_model
from pacer.sim.calibrate import Sample, default_grid, fit_samples, synthetic_output
from pacer.sim.fit import fit_relative, nnls

CPU, SMOL = get_hardware("cpu-local"), get_model("smollm2-135m")


def test_nnls_matches_an_exact_nonnegative_solution_and_clips_negative_ones():
    rng = np.random.default_rng(0)
    a = rng.random((30, 4))
    x_true = np.array([0.5, 0.0, 2.0, 1.0])
    assert np.allclose(nnls(a, a @ x_true), x_true, atol=1e-9)
    # unconstrained optimum has a negative coefficient: NNLS keeps it at 0
    b = a @ np.array([1.0, -1.0, 0.5, 0.0])
    x = nnls(a, b)
    assert (x >= 0).all()
    assert np.linalg.norm(a @ x - b) <= np.linalg.norm(a @ np.clip(np.linalg.lstsq(a, b, rcond=None)[0], 0, None) - b)


def test_fit_relative_rejects_bad_input():
    with pytest.raises(ValueError):
        fit_relative([[1.0]], [0.0])
    with pytest.raises(ValueError):
        fit_relative([[1.0], [2.0]], [1.0])


def test_grid_outputs_are_valid_scheduler_outputs():
    for point in default_grid(quick=True):
        out = synthetic_output(point, 3, 16, 100)
        f = batch_features(out)
        assert f.num_seqs == len(point.rows)
        assert f.num_tokens == sum(n for n, _, _ in point.rows)
        for sr in out.scheduled:
            assert len(sr.block_ids) * 16 >= sr.start_position + sr.num_tokens
            assert all(0 <= b < 100 for b in sr.block_ids)


@pytest.mark.parametrize("noise", [0.0, 0.02])
def test_calibration_round_trip_recovers_known_coefficients(noise):
    true = {"const": 0.004, "linear_roofline_s": 1.6, "tokens": 2e-5, "sampled": 4e-4, "seqs": 1e-4,
            "chunks": 2e-3, "chunk_attn_pairs": 3e-9, "chunk_kv_tokens": 5e-6, "single_kv_tokens": 2e-6,
            "single_padded_kv": 0.0}
    truth = LinearCostModel(CPU, SMOL, "float32", true)
    rng = random.Random(1)
    samples = []
    for point in default_grid(quick=False):
        f = batch_features(synthetic_output(point, 0, 16, 4096))
        samples.append(Sample(f, truth.step_cost(f).time_s * (1 + rng.uniform(-noise, noise))))
    coef, stats = fit_samples(samples, SMOL, CPU, "float32")
    assert set(coef) == set(LINEAR_FEATURES)
    if noise == 0.0:
        assert stats.max_rel_err < 1e-6
        for k, v in true.items():
            assert coef[k] == pytest.approx(v, rel=1e-3, abs=1e-9), k
    else:
        assert stats.median_rel_err < 0.02
        fitted = LinearCostModel(CPU, SMOL, "float32", coef)
        for s in samples:
            assert fitted.step_cost(s.features).time_s == pytest.approx(s.seconds, rel=0.06)
