r"""A float32 WISKI whose factor ``A = sigma^2 I + R^T G R`` needs jitter comparable with
``sigma^2`` warns: on near-noise-free, much-repeated data (d = 6, all pairs, 200 points of
which 180 repeat three) ``psd_cholesky`` added 440 to the diagonal against ``sigma^2`` = 3.3
and the posterior variance at a test point came out 34 times smaller than in float64 (the
prior shrunk by the jitter), without a word."""

from __future__ import annotations

import warnings

import pytest
import torch
from gpytorch.utils.warnings import NumericalWarning

from bo_online.models import WISKI

D = 6


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    X = torch.rand(20, D, generator=g, dtype=torch.float64)
    X = torch.cat([X, X[:3].repeat(60, 1)])  # 180 repeats of three points
    Xt = torch.rand(10, D, generator=g, dtype=torch.float64)
    return X, torch.sin(3 * X).sum(-1, keepdim=True), Xt


def _posterior(dtype: torch.dtype, noise: float | None):
    X, Y, Xt = _data()
    Yvar = None if noise is None else torch.full_like(Y, noise).to(dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = WISKI(
            X.to(dtype), Y.to(dtype), Yvar, **{**WISKI.loop_default_options(D), "exact_max_n": 0}
        )
        post = model.posterior(Xt.to(dtype))
        var = post.variance.double().squeeze(-1)
    jitter = [w for w in caught if issubclass(w.category, NumericalWarning)]
    return var, [str(w.message) for w in jitter if "WISKI's factor" in str(w.message)]


def test_float32_factor_with_jitter_rivalling_the_noise_warns():
    var64, warned64 = _posterior(torch.float64, 1e-10)
    var32, warned32 = _posterior(torch.float32, 1e-10)
    assert warned64 == []
    # the premise: the jitter changed the model (the variance far from float64's)
    assert float((var64 / var32).max()) > 10
    assert len(warned32) >= 1
    assert "float64" in warned32[0] and "times its noise term" in warned32[0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_no_warning_where_no_jitter_changes_the_model(dtype):
    """The same points with the learned noise: no jitter of that size, no warning, and float32
    agrees with float64."""
    var, warned = _posterior(dtype, None)
    assert warned == []
    var64, _ = _posterior(torch.float64, None)
    torch.testing.assert_close(var, var64, rtol=1e-3, atol=0)
