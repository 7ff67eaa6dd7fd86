"""DecoupledSVGP's default fit on more points than its exact-fit subset: the hyperparameters are
refined on the collapsed (Titsias 2009) bound of the chosen bases, checked against a dense
computation of that bound and against an exact GP on the same data (many inputs, few
covariance bases: the case where the subset's exact-GP hyperparameters left the predictive
variance near the prior)."""

import math

import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch.distributions import MultivariateNormal

from bo_online.models.decoupled import DecoupledSVGP


def _data(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    f = torch.sin(3 * X).sum(-1) / 2 + 4 * X[:, 0] * X[:, 1]
    return X, f + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


def _scores(model, X: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        post = model.posterior(X, observation_noise=True)
    mu, var = post.mean.squeeze(-1).detach(), post.variance.squeeze(-1).detach()
    rmse = float(((mu - y) ** 2).mean().sqrt())
    nll = float((0.5 * torch.log(2 * math.pi * var) + 0.5 * (y - mu) ** 2 / var).mean())
    return rmse, nll


def test_collapsed_bound_matches_dense_computation():
    X, y = _data(60, 3, seed=1)
    model = DecoupledSVGP(X, y.unsqueeze(-1), num_mean_bases=20, num_cov_bases=8)
    Z = X[:12] + 0.01
    idx = torch.arange(5, 50)
    with torch.no_grad():
        got = model.collapsed_bound(Z, idx)
        Xs, ys = model.train_X[idx], model.train_y[idx]
        k = model.covar_module
        K_Z = k(Z).to_dense() + 1e-6 * torch.eye(12, dtype=torch.float64)
        K_XZ = k(Xs, Z).to_dense()
        Q = K_XZ @ torch.linalg.solve(K_Z, K_XZ.T)
        noise = float(model.likelihood.noise)
        cov = Q + noise * torch.eye(len(idx), dtype=torch.float64)
        c = model.mean_module.constant.expand(len(idx))
        want = (
            MultivariateNormal(c, cov).log_prob(ys)
            - 0.5 * (k(Xs).to_dense().diagonal() - Q.diagonal()).sum() / noise
        )
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-8)


def test_default_fit_beyond_exact_subset_is_calibrated_in_eight_dimensions():
    X, y = _data(400, 8, seed=0)
    Xt, yt = _data(400, 8, seed=3)
    gp = SingleTaskGP(X, y.unsqueeze(-1))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    rmse_gp, nll_gp = _scores(gp, Xt, yt)
    model = DecoupledSVGP(
        X, y.unsqueeze(-1), num_mean_bases=64, num_cov_bases=16, exact_fit_points=100
    )
    model.fit(max_iter=50)
    rmse, nll = _scores(model, Xt, yt)
    # Before the collapsed refinement: RMSE 1.58x the exact GP's and NLL +0.81 nats.
    assert rmse <= 1.1 * rmse_gp
    assert nll <= nll_gp + 0.35


def test_refit_after_collapsed_refinement_starts_from_it_and_survives_state_dict():
    X, y = _data(150, 3, seed=2)
    model = DecoupledSVGP(
        X, y.unsqueeze(-1), num_mean_bases=24, num_cov_bases=8, exact_fit_points=40
    )
    calls = []
    exact = model._exact_hyperparameters
    model._exact_hyperparameters = lambda *a, **k: (calls.append(1), exact(*a, **k))
    model.fit(max_iter=30)
    assert calls == [1] and model.collapsed_fit is not None
    model.fit(max_iter=30)
    assert calls == [1]  # the second refit does not go back to the subset's exact fit
    clone = DecoupledSVGP(
        X, y.unsqueeze(-1), num_mean_bases=24, num_cov_bases=8, exact_fit_points=40
    )
    clone.load_state_dict(model.state_dict())
    assert clone.collapsed_fit is not None
