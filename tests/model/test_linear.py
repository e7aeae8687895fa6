"""Every projection backend against F.linear on the same (rounded) inputs.

Tolerances are what the dtype's rounding allows: float32 results differ only in summation
order; bfloat16 results are float32 accumulations rounded once to bfloat16 (2^-8 relative),
so 2 units in the last place plus a small absolute term for outputs near zero.
"""

import pytest
import torch
import torch.nn.functional as F

from pacer.model.linear import Linear, onednn_available

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=2 ** -7)}


@pytest.mark.parametrize("backend", ["torch", "auto", "onednn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_every_backend_matches_f_linear(backend, dtype, rows, bias):
    if backend == "onednn" and not onednn_available(dtype):
        pytest.skip(f"oneDNN cannot run {dtype} linears with this torch build on this CPU")
    g = torch.Generator().manual_seed(rows)
    w = (torch.randn(96, 80, generator=g) * 0.1).to(dtype)
    b = torch.randn(96, generator=g).to(dtype) if bias else None
    x = torch.randn(rows, 80, generator=g).to(dtype)
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    lin = Linear(w, b, backend)
    got = lin(x)
    assert got.shape == (rows, 96) and got.dtype == dtype
    torch.testing.assert_close(got.double(), want, **TOL[dtype])


def test_auto_picks_onednn_on_cpu_when_torch_has_it():
    lin = Linear(torch.randn(32, 16), None, "auto")
    assert lin.backend == ("onednn" if onednn_available(torch.float32) else "torch")


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="linear_backend"):
        Linear(torch.randn(4, 4), None, "blas")


def test_engine_config_rejects_unknown_linear_backend():
    from pacer.config import EngineConfig

    with pytest.raises(ValueError, match="linear_backend"):
        EngineConfig.from_kwargs(linear_backend="blas").validate()
