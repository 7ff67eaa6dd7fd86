"""Site likelihoods: derivatives, expected derivatives by Gauss-Hermite, sampling, targets."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.integrate
import scipy.stats
import torch

from bo_online.likelihoods import (
    BETA_MIN,
    Bernoulli,
    FixedNoiseGaussian,
    Gaussian,
    Poisson,
    StudentT,
)

DT = torch.float64


def _liks():
    return [
        ("gaussian", Gaussian().to(DT)),
        ("probit", Bernoulli("probit").to(DT)),
        ("logit", Bernoulli("logit").to(DT)),
        ("poisson", Poisson().to(DT)),
        ("student_t", StudentT().to(DT)),
    ]


def _targets(name, n, g):
    if name in ("probit", "logit"):
        return (torch.rand(n, generator=g, dtype=DT) < 0.5).to(DT)
    if name == "poisson":
        return torch.randint(0, 6, (n,), generator=g).to(DT)
    return torch.randn(n, generator=g, dtype=DT)


@pytest.mark.parametrize("name,lik", _liks())
def test_derivatives_match_autograd(name, lik):
    g = torch.Generator().manual_seed(0)
    y = _targets(name, 8, g)
    f = (2 * torch.randn(8, generator=g, dtype=DT)).requires_grad_()
    lp = lik.log_prob(y, f)
    (d1,) = torch.autograd.grad(lp.sum(), f, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), f)
    assert torch.allclose(lik.d1(y, f).detach(), d1.detach(), atol=1e-10)
    assert torch.allclose(lik.d2(y, f).detach(), d2, atol=1e-10)


@pytest.mark.parametrize("name,lik", _liks())
def test_log_prob_matches_scipy(name, lik):
    g = torch.Generator().manual_seed(1)
    y = _targets(name, 6, g)
    f = torch.randn(6, generator=g, dtype=DT)
    yn, fn = y.numpy(), f.numpy()
    if name == "gaussian":
        ref = scipy.stats.norm.logpdf(yn, fn, math.sqrt(float(lik.noise)))
    elif name == "probit":
        ref = np.where(yn == 1, scipy.stats.norm.logcdf(fn), scipy.stats.norm.logsf(fn))
    elif name == "logit":
        ref = np.where(yn == 1, -np.log1p(np.exp(-fn)), -np.log1p(np.exp(fn)))
    elif name == "poisson":
        ref = scipy.stats.poisson.logpmf(yn, np.exp(fn))
    else:
        ref = scipy.stats.t.logpdf(yn, float(lik.df), fn, math.sqrt(float(lik.scale2)))
    assert np.allclose(lik.log_prob(y, f).detach().numpy(), ref, atol=1e-10)


@pytest.mark.parametrize("name,lik", _liks())
def test_expected_derivatives_against_fine_grid_quadrature(name, lik):
    """Gauss-Hermite expectations (vectorised) vs a fine-grid Simpson rule, point by point."""
    g = torch.Generator().manual_seed(2)
    y = _targets(name, 4, g)
    mean = torch.randn(4, generator=g, dtype=DT)
    var = 0.05 + torch.rand(4, generator=g, dtype=DT)
    alpha, beta = lik.expected_derivatives(y, mean, var)
    ell = lik.expected_log_prob(y, mean, var).detach()
    # Reference: Simpson's rule on a fine grid over +-12 standard deviations (independent of the
    # Gauss-Hermite nodes; error far below 1e-10 for these smooth integrands).
    t = torch.linspace(-12.0, 12.0, 24001, dtype=DT)
    for i in range(4):
        f = mean[i] + var[i].sqrt() * t
        w = torch.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)
        yi = y[i].expand_as(f)

        def expect(vals):
            return float(scipy.integrate.simpson((vals * w).detach().numpy(), x=t.numpy()))

        a_ref = expect(lik.d1(yi, f))
        b_ref = max(-expect(lik.d2(yi, f)), BETA_MIN)
        e_ref = expect(lik.log_prob(yi, f))
        assert abs(float(alpha[i]) - a_ref) < 1e-8
        assert abs(float(beta[i]) - b_ref) < 1e-8
        assert abs(float(ell[i]) - e_ref) < 1e-8


def test_expected_derivatives_broadcast_sample_dims():
    lik = Bernoulli().to(DT)
    y = (torch.rand(5, 3, 2, dtype=DT) < 0.5).to(DT)  # sample x batch x q
    mean, var = torch.randn(3, 2, dtype=DT), torch.rand(3, 2, dtype=DT) + 0.1
    alpha, beta = lik.expected_derivatives(y, mean, var)
    assert alpha.shape == beta.shape == (5, 3, 2)
    a0, b0 = lik.expected_derivatives(y[2], mean, var)
    assert torch.allclose(alpha[2], a0) and torch.allclose(beta[2], b0)


def test_gaussian_expected_derivatives_exact_and_fixed_noise():
    lik = Gaussian().to(DT)
    lik.gaussian.noise = 0.2
    y, m, v = (
        torch.tensor([1.0, -2.0], dtype=DT),
        torch.tensor([0.5, 0.1], dtype=DT),
        torch.tensor([0.3, 2.0], dtype=DT),
    )
    alpha, beta = lik.expected_derivatives(y, m, v)
    assert torch.allclose(alpha, (y - m) / 0.2, atol=1e-12)
    assert torch.allclose(beta, torch.full((2,), 5.0, dtype=DT), atol=1e-12)
    fixed = FixedNoiseGaussian().to(DT)
    noise = torch.tensor([0.1, 0.4], dtype=DT)
    alpha, beta = fixed.expected_derivatives(y, m, v, noise)
    assert torch.allclose(beta, 1 / noise, atol=1e-12)
    with pytest.raises(ValueError):
        fixed.expected_derivatives(y, m, v)


def test_student_t_beta_is_clipped():
    lik = StudentT().to(DT)
    # a far outlier: the expected curvature is negative, so beta is clipped at BETA_MIN
    alpha, beta = lik.expected_derivatives(
        torch.tensor([30.0], dtype=DT),
        torch.tensor([0.0], dtype=DT),
        torch.tensor([0.01], dtype=DT),
    )
    assert float(beta) == BETA_MIN
    raw = -float(lik.d2(torch.tensor([30.0], dtype=DT), torch.tensor([0.0], dtype=DT)))
    assert raw < 0


@pytest.mark.parametrize("name,lik", _liks())
def test_sampling_matches_distribution(name, lik):
    f = torch.full((4000,), 0.4, dtype=DT)
    y = lik.sample(f, generator=torch.Generator().manual_seed(3))
    lik.check_targets(y)
    if name in ("probit", "logit"):
        p = float(lik.prob(torch.tensor(0.4, dtype=DT)))
        assert abs(float(y.mean()) - p) < 0.03
        assert abs(float(lik.noise_variance(torch.tensor([0.4], dtype=DT))) - p * (1 - p)) < 1e-12
    elif name == "poisson":
        assert abs(float(y.mean()) - math.exp(0.4)) < 0.08
    elif name == "gaussian":
        assert abs(float(y.mean()) - 0.4) < 0.05
        assert abs(float(y.var()) - float(lik.noise)) < 0.1 * float(lik.noise)
    else:
        ks = scipy.stats.kstest(
            ((y - 0.4) / lik.scale2.sqrt()).detach().numpy(), "t", args=(float(lik.df),)
        )
        assert ks.pvalue > 1e-3


def test_target_checks():
    with pytest.raises(ValueError, match="labels"):
        Bernoulli().check_targets(torch.tensor([0.0, 2.0]))
    with pytest.raises(ValueError, match="counts"):
        Poisson().check_targets(torch.tensor([1.5]))
    with pytest.raises(ValueError, match="link"):
        Bernoulli("cloglog")
