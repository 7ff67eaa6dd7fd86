"""WISKI against dense SKI (W K W^T + sigma^2 D built explicitly), float64."""

from __future__ import annotations

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

from bo_online.models import WISKI
from wiski_reference import dense_mll, dense_posterior

DT = torch.float64


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _data(n: int, d: int, seed: int, hetero: bool):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = 3 + 2 * torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    Yvar = (0.02 + 0.1 * torch.rand(n, 1, generator=g, dtype=DT)) if hetero else None
    return X, Y, Yvar


def _model(X, Y, Yvar, grid_size, kernel="matern"):
    d = X.shape[-1]
    if kernel == "matern":
        base = MaternKernel(nu=2.5, ard_num_dims=d)
    else:
        base = RBFKernel(ard_num_dims=d)
    covar = ScaleKernel(base)
    model = WISKI(X, Y, Yvar, grid_size=grid_size, covar_module=covar)
    covar.outputscale = 1.7
    base.lengthscale = torch.linspace(0.25, 0.4, d, dtype=DT)
    model.mean_module.constant = 0.3
    if Yvar is None:
        model.likelihood.noise = 0.07
    return model


CASES = [  # (d, grid size per dim incl. padding, n)
    (3, 10, 40),
    (3, 10, 700),
    (2, 30, 60),
    (2, 30, 1100),
]


@pytest.mark.parametrize("hetero", [False, True])
@pytest.mark.parametrize("d,g,n", CASES)
def test_mll_and_gradient_match_dense_ski(d, g, n, hetero):
    X, Y, Yvar = _data(n, d, seed=n + d, hetero=hetero)
    model = _model(X, Y, Yvar, g)
    params = [p for _, p in model._trainable_parameters()[0].items()]
    ref = dense_mll(model, X, Y, Yvar)
    ref_grads = torch.autograd.grad(ref, params)
    ours = model.marginal_log_likelihood(include_priors=False)
    grads = torch.autograd.grad(ours, params)
    assert abs(float(ours.detach() - ref.detach())) / abs(float(ref.detach())) < 1e-8
    for p, a, b in zip(params, grads, ref_grads):
        assert _rel(a, b) < 1e-8, (p.shape, a, b)


@pytest.mark.parametrize("hetero", [False, True])
@pytest.mark.parametrize("d,g,n", CASES)
def test_posterior_matches_dense_ski(d, g, n, hetero):
    X, Y, Yvar = _data(n, d, seed=10 * n + d, hetero=hetero)
    model = _model(X, Y, Yvar, g)
    torch.manual_seed(0)
    for N in (7, 150):  # dense covariance path and lazy operator path
        Xs = torch.rand(N, d, dtype=DT)
        post = model.posterior(Xs)
        mean_ref, cov_ref = dense_posterior(model, X, Y, Yvar, Xs)
        sd2 = model.outcome_std.reshape(()) ** 2
        assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-8
        cov = post.mvn.lazy_covariance_matrix.to_dense() / sd2
        assert _rel(cov, cov_ref) < 1e-8
        assert _rel(post.variance.squeeze(-1) / sd2, torch.diagonal(cov_ref)) < 1e-8


def test_batched_posterior_and_observation_noise():
    X, Y, Yvar = _data(30, 2, seed=3, hetero=False)
    model = _model(X, Y, Yvar, 12)
    Xs = torch.rand(4, 3, 2, dtype=DT)
    post = model.posterior(Xs, observation_noise=True)
    assert post.mean.shape == (4, 3, 1)
    _, cov_ref = dense_posterior(model, X, Y, Yvar, Xs[1])
    sd2 = model.outcome_std.reshape(()) ** 2
    cov = post.mvn.covariance_matrix[1] / sd2
    expected = cov_ref + model.likelihood.noise * torch.eye(3, dtype=DT)
    assert _rel(cov, expected) < 1e-8


def test_rbf_default_kernel_and_d_gt_3_error():
    X, Y, _ = _data(10, 2, seed=4, hetero=False)
    model = WISKI(X, Y)
    assert model.grid.sizes == (30, 30) and model.num_grid_points == 28 * 28
    X3, Y3, _ = _data(10, 3, seed=4, hetero=False)
    assert WISKI(X3, Y3).grid.sizes == (10, 10, 10)
    X5, Y5, _ = _data(10, 5, seed=4, hetero=False)
    with pytest.raises(ValueError, match="projection"):
        WISKI(X5, Y5)
