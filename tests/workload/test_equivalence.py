"""TOST and Student's t (standard library) against published table values."""

from __future__ import annotations

import random

import pytest

from pacer.workload.equivalence import student_t_cdf, student_t_ppf, tost_paired


@pytest.mark.parametrize("p, df, want", [(0.95, 10, 1.812461), (0.975, 29, 2.045230), (0.95, 29, 1.699127),
                                         (0.95, 2, 2.919986), (0.99, 5, 3.364930), (0.9, 100, 1.290075)])
def test_t_quantiles_match_tables(p, df, want):
    assert student_t_ppf(p, df) == pytest.approx(want, abs=2e-6)
    assert student_t_cdf(want, df) == pytest.approx(p, abs=1e-6)
    assert student_t_cdf(-want, df) == pytest.approx(1 - p, abs=1e-6)


def test_tost_declares_equivalence_only_inside_the_margin():
    rng = random.Random(0)
    near = tost_paired([rng.gauss(0.0, 0.1) for _ in range(30)], margin=0.1)
    far = tost_paired([rng.gauss(-0.5, 0.1) for _ in range(30)], margin=0.1)
    noisy = tost_paired([rng.gauss(0.0, 1.0) for _ in range(10)], margin=0.1)   # no evidence either way
    assert near.equivalent and near.ci_low > -0.1 and near.ci_high < 0.1
    assert not far.equivalent and far.ci_high < -0.1
    assert not noisy.equivalent
    with pytest.raises(ValueError, match="at least 3"):
        tost_paired([0.0, 1.0], 0.1)
