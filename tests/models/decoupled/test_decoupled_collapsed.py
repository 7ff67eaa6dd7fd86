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


def test_as_many_mean_bases_as_the_subset_skip_the_refinement_and_stay_calibrated():
    r"""With ``num_mean_bases >= exact_fit_points`` (a long stream's default, 2,048 / 2,048) the
    default fit beyond the subset keeps the subset's exact-GP hyperparameters: it never
    evaluates the collapsed bound over all the bases (``O(2048 M_alpha^2)`` per iteration),
    and in eight dimensions it predicts within the exact GP's error and calibration on all the
    data. A model with fewer mean bases than its subset still refines."""
    X, y = _data(400, 8, seed=0)
    Xt, yt = _data(400, 8, seed=3)
    gp = SingleTaskGP(X, y.unsqueeze(-1))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    rmse_gp, nll_gp = _scores(gp, Xt, yt)
    bounds = []
    for num_mean_bases in (200, 150):
        model = DecoupledSVGP(
            X,
            y.unsqueeze(-1),
            num_mean_bases=num_mean_bases,
            num_cov_bases=100,
            exact_fit_points=200,
        )
        bound = model.collapsed_bound
        calls = []
        model.collapsed_bound = lambda *a, **k: (calls.append(1), bound(*a, **k))[1]
        model.fit(max_iter=50)
        bounds.append((len(calls), model.collapsed_fit is not None))
        if num_mean_bases == 200:
            rmse, nll = _scores(model, Xt, yt)
            # measured: 1.05x the exact GP's RMSE, NLL +0.05 nats
            assert rmse <= 1.1 * rmse_gp
            assert nll <= nll_gp + 0.15
    assert bounds[0] == (0, False)
    assert bounds[1][0] > 0 and bounds[1][1]


def _hyper(model) -> list[torch.Tensor]:
    # kernel and noise (the constant mean is remapped whenever a fit re-standardises)
    modules = (model.covar_module, model.likelihood)
    return [p.detach().clone() for m in modules for p in m.parameters()]


def test_hyperparameters_are_retrained_once_n_has_grown_by_the_refit_growth():
    r"""``hyperparameter_refit_growth=2`` past a full subset: a refit at less than twice the
    n of the last training keeps the hyperparameters but re-solves the mean on all the data
    (the collapsed optimum for its bases, checked densely); at twice the n it retrains; the
    n of the last training survives a state_dict round trip; with the default 1 every fit
    retrains."""
    X, y = _data(300, 4, seed=5)
    kw = dict(num_mean_bases=60, num_cov_bases=20, exact_fit_points=50)
    model = DecoupledSVGP(X[:100], y[:100, None], hyperparameter_refit_growth=2.0, **kw)
    model.fit(max_iter=30)
    assert float(model.hyperparameters_fit_n) == 100
    first = _hyper(model)
    model.update(X[100:180], y[100:180, None])
    model.fit(max_iter=30)
    assert all(torch.equal(a, b) for a, b in zip(first, _hyper(model)))
    # the mean is the collapsed optimum for the re-selected bases on all 180 points
    Z = torch.cat([model.beta_points, model.alpha_points], dim=-2)
    with torch.no_grad():
        k, Xs, ys = model.covar_module, model.train_X, model.train_y
        noise = float(model.likelihood.noise)
        K_ZX = k(Z, Xs).to_dense()
        c = model.mean_module.constant
        A = k(Z).to_dense() + K_ZX @ K_ZX.T / noise
        w = torch.linalg.solve(A, K_ZX @ (ys - c)) / noise
        want = k(X[200:], Z).to_dense() @ w + c
        got = model.posterior(X[200:]).mean.squeeze(-1)
        got = (got - model.outcome_mean) / model.outcome_std
    assert torch.allclose(got, want, atol=1e-6)
    clone = DecoupledSVGP(X[:180], y[:180, None], hyperparameter_refit_growth=2.0, **kw)
    clone.load_state_dict(model.state_dict())
    assert float(clone.hyperparameters_fit_n) == 100
    model.update(X[180:200], y[180:200, None])
    model.fit(max_iter=30)
    assert float(model.hyperparameters_fit_n) == 200
    assert not all(torch.equal(a, b) for a, b in zip(first, _hyper(model)))

    every = DecoupledSVGP(X[:100], y[:100, None], **kw)
    every.fit(max_iter=30)
    before = _hyper(every)
    every.update(X[100:180], y[100:180, None])
    every.fit(max_iter=30)
    assert not all(torch.equal(a, b) for a, b in zip(before, _hyper(every)))
    for bad in (0.5, float("inf"), "2", True):
        try:
            DecoupledSVGP(X[:10], y[:10, None], hyperparameter_refit_growth=bad)
        except ValueError as err:
            assert "hyperparameter_refit_growth" in str(err)
        else:
            raise AssertionError(f"accepted {bad!r}")
