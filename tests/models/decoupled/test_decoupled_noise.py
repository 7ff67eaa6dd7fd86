"""DecoupledSVGP's expected log-likelihood takes its noise from ``OnlineModel._noise_of_points``:
the given variances, else the likelihood's; a fixed-noise model has none of its own."""

from __future__ import annotations

import math

import pytest
import torch

from bo_online.models import DecoupledSVGP

DT = torch.float64


def _data(n: int = 20, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=DT)
    return X, torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(
        n, 1, generator=g, dtype=DT
    )


def _gaussian_ell_by_hand(m: DecoupledSVGP, X: torch.Tensor, y: torch.Tensor, s2: torch.Tensor):
    r"""``sum_i E_q[log N(y_i | f_i, s2_i)]`` from the latent marginals (standardised units)."""
    m.ensure_caches()
    mvn = m._latent_posterior(X.unsqueeze(0))
    mean, var = mvn.mean.squeeze(0), mvn.variance.squeeze(0)
    return (-0.5 * (torch.log(2 * math.pi * s2) + ((y - mean) ** 2 + var) / s2)).sum()


def test_expected_log_likelihood_noise_fallback() -> None:
    X, Y = _data()
    m = DecoupledSVGP(X, Y, num_mean_bases=10, num_cov_bases=5)
    with torch.no_grad():
        m.likelihood.noise = torch.tensor([0.07], dtype=DT)
    y = m.train_y
    ref = _gaussian_ell_by_hand(m, X, y, torch.full_like(y, 0.07))
    assert torch.allclose(m.expected_log_likelihood(X, y).detach(), ref.detach(), rtol=1e-10)
    s2 = 0.02 + torch.rand(y.shape, generator=torch.Generator().manual_seed(3), dtype=DT)
    ref = _gaussian_ell_by_hand(m, X, y, s2)
    assert torch.allclose(m.expected_log_likelihood(X, y, s2).detach(), ref.detach(), rtol=1e-10)


def test_fixed_noise_expected_log_likelihood_needs_noise() -> None:
    r"""A fixed-noise model's likelihood noise is not trained; it must not stand in for the
    noise of the points (the held rows' noise is what ``elbo`` passes)."""
    X, Y = _data()
    Yvar = torch.full_like(Y, 0.01)
    m = DecoupledSVGP(X, Y, train_Yvar=Yvar, num_mean_bases=10, num_cov_bases=5)
    with pytest.raises(ValueError, match="fixed per-point noise: pass `noise`"):
        m.expected_log_likelihood(X, m.train_y)
    ell = m.expected_log_likelihood(X, m.train_y, m.train_noise)
    ref = _gaussian_ell_by_hand(m, X, m.train_y, m.train_noise)
    assert torch.allclose(ell.detach(), ref.detach(), rtol=1e-10)
