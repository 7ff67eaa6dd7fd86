"""WISKI: fitting, re-standardisation, cache invalidation, bad input, kernels, BoTorch
acquisition."""

from __future__ import annotations

import warnings

import pytest
import torch
from gpytorch.kernels import MaternKernel, ScaleKernel, SpectralMixtureKernel
from linear_operator.utils.warnings import NumericalWarning
from wiski_reference import dense_mll, dense_posterior

from bo_online.models import WISKI

DT = torch.float64


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a).detach(), torch.as_tensor(b).detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _data(n, d, seed, hetero=False):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = (
        1
        - 2 * torch.cos(4 * X).sum(-1, keepdim=True)
        + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    )
    Yvar = (0.01 + 0.05 * torch.rand(n, 1, generator=g, dtype=DT)) if hetero else None
    return X, Y, Yvar


@pytest.mark.parametrize("method", ["lbfgs", "adam"])
def test_fit_increases_mll_and_matches_dense_optimum(method):
    X, Y, _ = _data(60, 2, seed=0)
    model = WISKI(X, Y, grid_size=12)
    before = float(model.marginal_log_likelihood().detach())
    # (Adam steps are ~lr in raw units; BoTorch noise is untransformed, so keep lr small)
    model.fit(method=method, max_iter=60 if method == "lbfgs" else 40, lr=0.005)
    after = float(model.marginal_log_likelihood().detach())
    assert after > before + 1e-3
    # the fitted caches describe the fitted hyperparameters (dense SKI at the new values)
    Xt = torch.rand(5, 2, dtype=DT)
    mean_ref, cov_ref = dense_posterior(model, X, Y, None, Xt)
    post = model.posterior(Xt)
    assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-8
    if method == "lbfgs":  # at an optimum of the same function the dense MLL is stationary
        params, bounds = model._trainable_parameters()
        ref = dense_mll(model, X, Y, None) + model._log_prior() / 60
        grads = torch.autograd.grad(ref, list(params.values()))
        for (name, p), gr in zip(params.items(), grads):
            lo, hi = bounds.get(name, (None, None))
            at_bound = (lo is not None and bool((p - lo).abs().max() < 1e-6)) or (
                hi is not None and bool((p - hi).abs().max() < 1e-6)
            )
            assert at_bound or float(gr.abs().max()) < 1e-3, (name, gr)


def test_streaming_adam_steps_and_fixed_noise_fit():
    X, Y, Yvar = _data(30, 1, seed=1, hetero=True)
    model = WISKI(X, Y, Yvar, grid_size=20)
    noise_params = [p.clone() for p in model.likelihood.parameters()]
    for _ in range(3):
        Xn, Yn, Vn = _data(2, 1, seed=int(torch.randint(100, (1,))), hetero=True)
        model.update(Xn, Yn, noise=Vn)
        hypers = [p.detach().clone() for p in model._trainable_parameters()[0].values()]
        before = float(model.marginal_log_likelihood().detach())
        model.fit(method="adam", max_iter=2, lr=0.05, restandardize=False)
        # the two Adam steps moved every hyperparameter and raised the MLL on the same data
        after = [p.detach() for p in model._trainable_parameters()[0].values()]
        assert all(not torch.equal(a, b) for a, b in zip(after, hypers))
        assert float(model.marginal_log_likelihood().detach()) > before
    # fixed noise: the likelihood's noise is not a hyperparameter of this model
    for p, q in zip(model.likelihood.parameters(), noise_params):
        assert torch.equal(p, q)


@pytest.mark.parametrize("hetero", [False, True])
def test_restandardize_is_exact(hetero):
    X, Y, Yvar = _data(25, 2, seed=2, hetero=hetero)
    covar = ScaleKernel(MaternKernel(nu=1.5, ard_num_dims=2))
    model = WISKI(
        X[:5], Y[:5], None if Yvar is None else Yvar[:5], grid_size=12, covar_module=covar
    )
    if Yvar is None:  # keep the mapped noise above the likelihood's lower bound (1e-4)
        model.likelihood.noise = 0.1
    model.update(X[5:], 10 * Y[5:] + 50, None if Yvar is None else 100 * Yvar[5:])
    Yall = torch.cat([Y[:5], 10 * Y[5:] + 50])
    Vall = None if Yvar is None else torch.cat([Yvar[:5], 100 * Yvar[5:]])
    Xt = torch.rand(6, 2, dtype=DT)
    p0 = model.posterior(Xt)
    model.restandardize()
    assert abs(float(model.outcome_mean) - float(Yall.mean())) < 1e-10 * abs(float(Yall.mean()))
    assert abs(float(model.outcome_std) - float(Yall.std())) < 1e-10 * float(Yall.std())
    p1 = model.posterior(Xt)  # the model in user units is unchanged
    assert _rel(p1.mean, p0.mean) < 1e-9
    assert _rel(p1.mvn.covariance_matrix, p0.mvn.covariance_matrix) < 1e-9
    ref = dense_mll(model, X, Yall, Vall)
    assert _rel(model.marginal_log_likelihood(include_priors=False), ref) < 1e-9


def test_caches_follow_hyperparameters():
    X, Y, _ = _data(40, 2, seed=3)
    model = WISKI(X, Y, grid_size=12)
    Xt = torch.rand(4, 2, dtype=DT)
    m0 = model.posterior(Xt).mean
    model.covar_module.lengthscale = torch.tensor([[0.3, 0.2]], dtype=DT)
    model.likelihood.noise = 0.02
    post = model.posterior(Xt)
    assert not torch.allclose(post.mean, m0)
    mean_ref, cov_ref = dense_posterior(model, X, Y, None, Xt)
    assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-9
    assert _rel(post.mvn.covariance_matrix / model.outcome_std**2, cov_ref) < 1e-9


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_bad_input_raises_and_leaves_state():
    X, Y, _ = _data(10, 2, seed=4)
    model = WISKI(X, Y, grid_size=10)
    before = _state(model)
    good = torch.rand(2, 2, dtype=DT)
    cases = [
        (
            torch.tensor([[0.5, 1.2], [0.1, 0.1]], dtype=DT),
            torch.zeros(2, 1, dtype=DT),
            None,
            "outside",
        ),
        (torch.tensor([[0.5, -0.01]], dtype=DT), torch.zeros(1, 1, dtype=DT), None, "outside"),
        (torch.tensor([[float("nan"), 0.5]], dtype=DT), torch.zeros(1, 1, dtype=DT), None, "NaN"),
        (good, torch.tensor([[1.0], [float("inf")]], dtype=DT), None, "NaN"),
        (torch.rand(2, 3, dtype=DT), torch.zeros(2, 1, dtype=DT), None, "columns"),
        (good, torch.zeros(3, 1, dtype=DT), None, "rows"),
        (good, torch.zeros(2, 1, dtype=DT), torch.tensor([[0.1], [-0.1]], dtype=DT), "negative"),
        (good, torch.zeros(2, 1, dtype=DT), torch.tensor([[0.1], [0.0]], dtype=DT), "positive"),
    ]
    for Xb, Yb, nb, msg in cases:
        with pytest.raises(ValueError, match=msg):
            model.update(Xb, Yb, nb)
        _same(before, _state(model))
    with pytest.raises(ValueError, match="outside"):
        model.posterior(torch.tensor([[1.5, 0.5]], dtype=DT))
    with pytest.raises(ValueError, match="outside"):
        model.condition_on_observations(
            torch.tensor([[1.5, 0.5]], dtype=DT), torch.zeros(1, 1, dtype=DT)
        )
    _same(before, _state(model))
    Xh, Yh, Vh = _data(10, 2, seed=5, hetero=True)
    fixed = WISKI(Xh, Yh, Vh, grid_size=10)
    before = _state(fixed)
    with pytest.raises(ValueError, match="noise"):
        fixed.update(good, torch.zeros(2, 1, dtype=DT))
    _same(before, _state(fixed))
    with pytest.raises(ValueError, match="outside"):
        WISKI(torch.tensor([[2.0, 0.5]], dtype=DT), torch.zeros(1, 1, dtype=DT))


def test_state_dict_round_trip_and_conditioned_update():
    X, Y, _ = _data(20, 2, seed=6)
    model = WISKI(X, Y, grid_size=10)
    cm = model.condition_on_observations(torch.rand(2, 2, dtype=DT), torch.randn(2, 1, dtype=DT))
    cm.update(torch.rand(3, 2, dtype=DT), torch.randn(3, 1, dtype=DT))  # folds the pending points
    assert cm.num_data == 25 and model.num_data == 20
    fresh = WISKI(X[:1], Y[:1], grid_size=10)
    fresh.load_state_dict(cm.state_dict())
    Xt = torch.rand(5, 2, dtype=DT)
    torch.testing.assert_close(
        fresh.posterior(Xt).mean, cm.posterior(Xt).mean, rtol=1e-12, atol=1e-12
    )
    torch.testing.assert_close(
        fresh.posterior(Xt).variance, cm.posterior(Xt).variance, rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize(
    "kernel",
    [
        lambda: MaternKernel(nu=0.5, ard_num_dims=2),
        lambda: ScaleKernel(MaternKernel(nu=1.5, ard_num_dims=2)),
        lambda: SpectralMixtureKernel(num_mixtures=3, ard_num_dims=2),
    ],
)
def test_other_stationary_kernels_match_dense(kernel):
    X, Y, _ = _data(50, 2, seed=7)
    covar = kernel()
    if isinstance(covar, SpectralMixtureKernel):
        covar.initialize_from_data(X, Y.squeeze(-1))
    model = WISKI(X, Y, grid_size=14, covar_module=covar.to(DT))
    params = list(model._trainable_parameters()[0].values())
    ref = dense_mll(model, X, Y, None)
    ours = model.marginal_log_likelihood(include_priors=False)
    assert _rel(ours, ref) < 1e-8
    for a, b in zip(torch.autograd.grad(ours, params), torch.autograd.grad(ref, params)):
        assert _rel(a, b) < 1e-7
    Xt = torch.rand(8, 2, dtype=DT)
    mean_ref, cov_ref = dense_posterior(model, X, Y, None, Xt)
    post = model.posterior(Xt)
    assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-8
    assert _rel(post.mvn.covariance_matrix / model.outcome_std**2, cov_ref) < 1e-8


def test_acquisition_functions_with_optimize_acqf():
    from botorch.acquisition import qUpperConfidenceBound
    from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance
    from botorch.acquisition.logei import qLogExpectedImprovement
    from botorch.optim import optimize_acqf
    from botorch.sampling import SobolQMCNormalSampler

    torch.manual_seed(8)
    X, Y, _ = _data(15, 2, seed=8)
    model = WISKI(X, Y, grid_size=12)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    sampler = SobolQMCNormalSampler(torch.Size([32]), seed=0)
    acqs = {
        "qUCB": qUpperConfidenceBound(model, beta=2.0, sampler=sampler),
        "qLogEI": qLogExpectedImprovement(model, best_f=Y.max(), sampler=sampler),
        "qNIPV": qNegIntegratedPosteriorVariance(model, mc_points=torch.rand(500, 2, dtype=DT)),
    }
    for name, acq in acqs.items():
        cand, val = optimize_acqf(
            acq, bounds=bounds, q=3, num_restarts=2, raw_samples=16, options={"maxiter": 15}
        )
        assert cand.shape == (3, 2) and bool(((cand >= 0) & (cand <= 1)).all()), name
        assert bool(torch.isfinite(val).all()), name
        # the optimiser improved on a random start
        with torch.no_grad():
            assert (
                float(acq(cand.unsqueeze(0))) >= float(acq(torch.rand(1, 3, 2, dtype=DT))) - 1e-9
            ), name
    model.update(cand, torch.randn(3, 1, dtype=DT))


def test_float32_model_close_to_float64():
    X, Y, _ = _data(50, 2, seed=9)
    m64 = WISKI(X, Y, grid_size=12)
    m32 = WISKI(X.float(), Y.float(), grid_size=12)
    assert m32.G.dtype == torch.float32
    Xt = torch.rand(5, 2, dtype=DT)
    p64, p32 = m64.posterior(Xt), m32.posterior(Xt.float())
    assert p32.mean.dtype == torch.float32
    torch.testing.assert_close(p32.mean.double(), p64.mean, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(p32.variance.double(), p64.variance, rtol=1e-3, atol=1e-5)
    m32.update(torch.rand(2, 2), torch.randn(2, 1))
    assert m32.chol_A.dtype == torch.float32


def test_fit_gpytorch_mll_dispatches_to_custom_fit():
    from botorch.fit import fit_gpytorch_mll
    from gpytorch.mlls import ExactMarginalLogLikelihood

    X, Y, _ = _data(30, 2, seed=10)
    model = WISKI(X, Y, grid_size=10)
    before = float(model.marginal_log_likelihood().detach())
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    assert float(model.marginal_log_likelihood().detach()) > before


def test_posterior_at_coincident_points_can_be_sampled():
    X, Y, _ = _data(20, 3, seed=11)
    model = WISKI(X, Y)
    x = torch.rand(1, 3, dtype=DT)
    Xq = torch.cat([x, x, x + 1e-9]).unsqueeze(0)  # a q-batch of (nearly) identical points
    post = model.posterior(Xq)
    with warnings.catch_warnings():  # the sampler adds jitter, as for any rank-deficient q-batch
        warnings.simplefilter("ignore", NumericalWarning)
        samples = post.rsample(torch.Size([4]))
    assert samples.shape == (4, 1, 3, 1) and bool(torch.isfinite(samples).all())


def test_changing_grid_jitter_rebuilds_caches():
    X, Y, _ = _data(30, 2, seed=12)
    model = WISKI(X, Y, grid_size=10)
    Xt = torch.rand(4, 2, dtype=DT)
    model.posterior(Xt)  # caches built with the default jitter
    model.grid_jitter = 1e-2
    mean_ref, cov_ref = dense_posterior(model, X, Y, None, Xt)
    post = model.posterior(Xt)
    assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-9
    assert _rel(post.mvn.covariance_matrix / model.outcome_std**2, cov_ref) < 1e-9


def test_load_state_dict_leaves_conditioned_models_intact():
    X, Y, _ = _data(20, 2, seed=13)
    model = WISKI(X, Y, grid_size=10)
    child = model.condition_on_observations(torch.rand(2, 2, dtype=DT), torch.randn(2, 1, dtype=DT))
    Xt = torch.rand(5, 2, dtype=DT)
    child.posterior(Xt)  # points asked for twice take the cached-rows path: compare like with like
    before = child.posterior(Xt)
    other = WISKI(*_data(25, 2, seed=14)[:2], grid_size=10)
    model.load_state_dict(other.state_dict())
    after = child.posterior(Xt)
    assert torch.equal(after.mean, before.mean)
    assert torch.equal(after.mvn.covariance_matrix, before.mvn.covariance_matrix)
