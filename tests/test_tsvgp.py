"""TSVGP against dense SGPR / exact GP computations, conditioning, fantasies, EM and BoTorch use."""

from __future__ import annotations

import math

import pytest
import torch
from botorch.sampling.normal import SobolQMCNormalSampler

from bo_online.likelihoods import Bernoulli, Gaussian, Poisson, StudentT
from bo_online.models.exact import OnlineExactGP
from bo_online.models.tsvgp import TSVGP

DT = torch.float64


def _data(n=30, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    return X, Y


def _set_hypers(model, lengthscale=0.3, noise=0.05, const=0.1):
    with torch.no_grad():
        model.covar_module.lengthscale = lengthscale
        model.covar_module.outputscale = 1.3 if hasattr(model.covar_module, "outputscale") else None
        if isinstance(model.likelihood, Gaussian) and not model.fixed_noise:
            model.likelihood.gaussian.noise = noise
        model.mean_module.constant.fill_(const)
    return model


def _dense_sgpr(model, X, y, Z, Xt, noise):
    r"""Titsias' SGPR computed densely (standardised units): mean, covariance, collapsed bound."""
    k = model.covar_module
    c = model.mean_module.constant.detach()
    n = X.shape[0]
    noise = torch.as_tensor(noise, dtype=DT).expand(n)
    Kuu, Kuf = k(Z).to_dense(), k(Z, X).to_dense()
    Ksu, Kss = k(Xt, Z).to_dense(), k(Xt).to_dense()
    Sig = torch.linalg.inv(Kuu + (Kuf / noise) @ Kuf.T)
    mean = c + Ksu @ Sig @ Kuf @ ((y - c) / noise)
    cov = Kss - Ksu @ torch.linalg.solve(Kuu, Ksu.T) + Ksu @ Sig @ Ksu.T
    Q = Kuf.T @ torch.linalg.solve(Kuu, Kuf)
    mvn = torch.distributions.MultivariateNormal(c.expand(n), Q + torch.diag(noise))
    bound = mvn.log_prob(y) - 0.5 * ((k(X, diag=True) - Q.diagonal()) / noise).sum()
    return mean.detach(), cov.detach(), bound.detach()


def _latent(model, Xt):
    post = model.posterior(Xt)
    std = model.outcome_std
    mean = (post.mean.squeeze(-1) - model.outcome_mean) / std
    return mean.detach(), (post.covariance_matrix / std**2).detach()


# ---------------------------------------------------------------------------- Gaussian = SGPR


def test_gaussian_one_e_step_equals_dense_sgpr():
    X, Y = _data()
    Z = torch.rand(10, 2, generator=torch.Generator().manual_seed(1), dtype=DT)
    model = _set_hypers(TSVGP(X, Y, inducing_points=Z))
    # Scramble the sites, then one full-batch E-step with rho = 1 (quadrature path) must land
    # exactly on SGPR: alpha = (y - m)/s2, beta = 1/s2 -> g1 = (y - c)/s2.
    model.set_sites(torch.randn(30, dtype=DT), torch.rand(30, dtype=DT) * 5)
    model.e_step(rho=1.0)
    Xt = torch.rand(7, 2, dtype=DT, generator=torch.Generator().manual_seed(2))
    mean, cov, bound = _dense_sgpr(model, X, model.train_y, Z, Xt, 0.05)
    m, C = _latent(model, Xt)
    assert torch.allclose(m, mean, atol=1e-8, rtol=0)
    assert torch.allclose(C, cov, atol=1e-8, rtol=0)
    assert abs(float(model.elbo().detach()) - float(bound)) < 1e-8 * max(1.0, abs(float(bound)))
    # KL from the caches equals the dense Gaussian KL of q(u) = N(m_u, S_u) to p(u) = N(0, K).
    m_u, S_u = model.q_u()
    Kuu = model.covar_module(Z).to_dense().detach()
    kl = torch.distributions.kl_divergence(
        torch.distributions.MultivariateNormal(m_u, S_u),
        torch.distributions.MultivariateNormal(torch.zeros(10, dtype=DT), Kuu),
    )
    assert abs(float(model.kl_divergence()) - float(kl)) < 1e-8


def test_gaussian_z_equals_x_is_exact_gp():
    X, Y = _data(n=15)
    model = _set_hypers(TSVGP(X, Y, inducing_points=X))
    exact = OnlineExactGP(X, Y)
    with torch.no_grad():
        exact.covar_module.lengthscale = 0.3
        exact.likelihood.noise = 0.05
        exact.mean_module.constant.fill_(0.1)
    Xt = torch.rand(6, 2, dtype=DT, generator=torch.Generator().manual_seed(3))
    p1, p2 = model.posterior(Xt), exact.posterior(Xt)
    assert torch.allclose(p1.mean, p2.mean, atol=1e-8, rtol=0)
    assert torch.allclose(p1.covariance_matrix, p2.covariance_matrix, atol=1e-8, rtol=0)
    # and the collapsed bound equals the exact log marginal likelihood when Z = X
    assert abs(float(model.elbo()) / 15 - float(exact.marginal_log_likelihood(False))) < 1e-8


def test_fixed_noise_equals_dense_sgpr():
    X, Y = _data(n=20)
    Yvar = 0.01 + 0.05 * torch.rand(20, 1, dtype=DT, generator=torch.Generator().manual_seed(4))
    Z = X[::2].clone()
    model = _set_hypers(TSVGP(X, Y, train_Yvar=Yvar, inducing_points=Z))
    Xt = torch.rand(5, 2, dtype=DT)
    mean, cov, bound = _dense_sgpr(model, X, model.train_y, Z, Xt, model.train_noise)
    m, C = _latent(model, Xt)
    assert torch.allclose(m, mean, atol=1e-8, rtol=0)
    assert torch.allclose(C, cov, atol=1e-8, rtol=0)
    assert abs(float(model.elbo()) - float(bound)) < 1e-8 * abs(float(bound))
    # observation noise for fixed-noise models: the mean training noise, as BoTorch
    post = model.posterior(Xt, observation_noise=True)
    add = (post.variance.squeeze(-1) - model.posterior(Xt).variance.squeeze(-1)) / model.outcome_std**2
    assert torch.allclose(add, model.train_noise.mean().expand(5), atol=1e-10)


# ---------------------------------------------------------------------------- conditioning


@pytest.mark.parametrize("fixed", [False, True])
def test_condition_equals_sgpr_on_union_any_order(fixed):
    X, Y = _data(n=25)
    Xs, Ys = _data(n=6, seed=7)
    Z = torch.rand(12, 2, generator=torch.Generator().manual_seed(5), dtype=DT)
    Yvar = torch.full((25, 1), 0.03, dtype=DT) if fixed else None
    model = _set_hypers(TSVGP(X, Y, train_Yvar=Yvar, inducing_points=Z))
    noise_s = torch.full((6, 1), 0.02, dtype=DT) if fixed else None  # user units
    Xt = torch.rand(8, 2, dtype=DT, generator=torch.Generator().manual_seed(6))
    std = model.outcome_std
    # dense SGPR on D u D* (standardised targets with the model's scaling)
    Xall = torch.cat([X, Xs])
    yall = model._standardise(torch.cat([Y, Ys])).squeeze(-1)
    noise = torch.cat([torch.full((25,), 0.03), torch.full((6,), 0.02)]).to(DT) / std**2 if fixed else 0.05
    mean, cov, _ = _dense_sgpr(model, Xall, yall, Z, Xt, noise)
    cond_noise = None if noise_s is None else noise_s / std**2
    cond = model.condition_on_observations(Xs, Ys, noise=cond_noise)
    m, C = _latent(cond, Xt)
    assert torch.allclose(m, mean, atol=1e-8, rtol=0)
    assert torch.allclose(C, cov, atol=1e-8, rtol=0)
    # in-place updates, one point at a time in reverse order, give the same model
    before = {k: v.clone() for k, v in model.state_dict().items() if v is not None}
    for i in reversed(range(6)):
        model.update(Xs[i : i + 1], Ys[i : i + 1], None if noise_s is None else noise_s[i : i + 1])
    m2, C2 = _latent(model, Xt)
    assert torch.allclose(m2, mean, atol=1e-8, rtol=0)
    assert torch.allclose(C2, cov, atol=1e-8, rtol=0)
    assert model.num_data == 31
    # and conditioning did not touch the original model's state (checked before the updates)
    assert before["num_data_"] == 25


def test_fantasize_shares_factor_and_matches_per_sample_conditioning():
    X, Y = _data(n=20)
    model = _set_hypers(TSVGP(X, Y, inducing_points=8))
    Xf = torch.rand(3, 2, 2, dtype=DT)  # batch 3, q = 2
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([4]), seed=0)
    fm = model.fantasize(Xf, sampler)
    assert fm.batch_shape == torch.Size([4, 3])
    assert fm.chol_B.shape == torch.Size([3, 8, 8])  # Lam (every variance) shared by samples
    assert fm.v.shape == torch.Size([4, 3, 8])
    Xt = torch.rand(3, 5, 2, dtype=DT)
    post = fm.posterior(Xt)
    assert post.mean.shape == torch.Size([4, 3, 5, 1])
    Yf = fm._cy * model.outcome_std + model.outcome_mean  # the fantasy observations
    for s in range(4):
        for b in range(3):
            single = model.condition_on_observations(Xf[b], Yf[s, b].unsqueeze(-1))
            ps = single.posterior(Xt[b])
            assert torch.allclose(ps.mean, post.mean[s, b], atol=1e-10)
            assert torch.allclose(ps.covariance_matrix, post.covariance_matrix[s, b], atol=1e-10)


def test_bernoulli_condition_adds_sites_at_current_marginal():
    X, _ = _data(n=30)
    Y = (X.sum(-1, keepdim=True) > 1.0).to(DT)
    Z = X[::3].clone()
    model = TSVGP(X, Y, inducing_points=Z, likelihood=Bernoulli("probit"))
    Xs = torch.rand(4, 2, dtype=DT, generator=torch.Generator().manual_seed(8))
    Ys = torch.tensor([[1.0], [0.0], [1.0], [1.0]], dtype=DT)
    cond = model.condition_on_observations(Xs, Ys)
    # by hand: marginals at X*, expected derivatives, sites g1 = beta m + alpha, then the model
    # holding all sites (base + new) rebuilt from scratch
    post = model.posterior(Xs)
    c = model.mean_module.constant.detach()
    mean, var = post.mean.squeeze(-1).detach(), post.variance.squeeze(-1).detach()
    alpha, beta = model.likelihood.expected_derivatives(Ys.squeeze(-1), mean, var)
    g1 = beta * (mean - c) + alpha
    full = TSVGP(torch.cat([X, Xs]), torch.cat([Y, Ys]), inducing_points=Z,
                 likelihood=Bernoulli("probit"), num_init_e_steps=0)
    full.covar_module.load_state_dict(model.covar_module.state_dict())
    full.mean_module.load_state_dict(model.mean_module.state_dict())
    g_base, b_base = model.sites
    full.set_sites(torch.cat([g_base, g1]), torch.cat([b_base, beta]))
    Xt = torch.rand(6, 2, dtype=DT)
    p1, p2 = cond.posterior(Xt), full.posterior(Xt)
    assert torch.allclose(p1.mean, p2.mean, atol=1e-10)
    assert torch.allclose(p1.covariance_matrix, p2.covariance_matrix, atol=1e-10)
    # the in-place update gives the same model, and extra steps move only the new sites
    model.update(Xs, Ys)
    assert torch.allclose(model.posterior(Xt).mean, p1.mean, atol=1e-10)


def test_bernoulli_fantasize_draws_labels():
    X, _ = _data(n=20)
    Y = (X[:, :1] > 0.5).to(DT)
    model = TSVGP(X, Y, inducing_points=10, likelihood=Bernoulli("logit"))
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([64]), seed=3)
    Xf = torch.tensor([[[0.9, 0.5]], [[0.1, 0.5]]], dtype=DT)
    fm = model.fantasize(Xf, sampler)
    labels = fm._cy
    assert set(labels.unique().tolist()) <= {0.0, 1.0}
    # the labels follow the predictive probability (high at x0 = 0.9, low at 0.1)
    assert labels[:, 0].mean() > labels[:, 1].mean()
    # same sampler -> same fantasies (deterministic, for qKG's fixed base samples)
    fm2 = model.fantasize(Xf, sampler)
    assert torch.equal(fm2._cy, labels)
    # per-sample factors differ (beta depends on y)
    assert fm.chol_B.shape[0] == 64


@pytest.mark.parametrize("lik", [Bernoulli("probit"), Poisson(), StudentT()])
def test_observation_noise_non_gaussian(lik):
    X, Y = _data(n=20)
    if isinstance(lik, Bernoulli):
        Y = (Y > 0).to(DT)
    elif isinstance(lik, Poisson):
        Y = torch.round(torch.exp(Y))
    model = TSVGP(X, Y, inducing_points=8, likelihood=lik)
    Xt = torch.rand(5, 2, dtype=DT)
    p0, p1 = model.posterior(Xt), model.posterior(Xt, observation_noise=True)
    f = (p0.mean.squeeze(-1) - model.outcome_mean) / model.outcome_std
    added = (p1.variance - p0.variance).squeeze(-1) / model.outcome_std**2
    assert torch.allclose(added, lik.noise_variance(f).detach(), atol=1e-10)
    assert (added > 0).all()


# ---------------------------------------------------------------------------- bad input, state


def test_bad_input_leaves_state_unchanged():
    X, Y = _data(n=10)
    model = TSVGP(X, Y, inducing_points=6, bounds=torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT))
    model.update(*_data(n=2, seed=3))
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    bad = [
        (torch.tensor([[float("nan"), 0.5]], dtype=DT), torch.ones(1, 1, dtype=DT), None),
        (torch.rand(1, 2, dtype=DT), torch.tensor([[float("inf")]], dtype=DT), None),
        (torch.rand(1, 3, dtype=DT), torch.ones(1, 1, dtype=DT), None),
        (torch.tensor([[1.5, 0.5]], dtype=DT), torch.ones(1, 1, dtype=DT), None),
        (torch.rand(2, 2, dtype=DT), torch.ones(3, 1, dtype=DT), None),
        (torch.rand(1, 2, dtype=DT), torch.ones(1, 1, dtype=DT), torch.ones(1, 1, dtype=DT)),
        (torch.rand(1, 2, dtype=DT), torch.ones(1, 1, dtype=DT), -torch.ones(1, 1, dtype=DT)),
    ]
    for i, (Xb, Yb, nb) in enumerate(bad):
        with pytest.raises(ValueError):
            model.update(Xb, Yb, nb)
        if i != 5:  # (a noise tensor is legitimate when conditioning: BoTorch's fantasy noise)
            with pytest.raises(ValueError):
                model.condition_on_observations(Xb.unsqueeze(0), Yb.unsqueeze(0), nb)
    with pytest.raises(ValueError):
        model.posterior(torch.tensor([[0.5, float("nan")]], dtype=DT))
    state = model.state_dict()
    assert state.keys() == ref.keys()
    for k in ref:
        assert torch.equal(state[k], ref[k]), k
    clf = TSVGP(X, (Y > 0).to(DT), inducing_points=6, likelihood=Bernoulli())
    ref = {k: v.clone() for k, v in clf.state_dict().items()}
    with pytest.raises(ValueError, match="labels"):
        clf.update(torch.rand(1, 2, dtype=DT), torch.full((1, 1), 0.5, dtype=DT))
    with pytest.raises(ValueError, match="noise"):
        clf.update(torch.rand(1, 2, dtype=DT), torch.ones(1, 1, dtype=DT), torch.ones(1, 1, dtype=DT))
    for k, v in clf.state_dict().items():
        assert torch.equal(v, ref[k]), k
    with pytest.raises(ValueError, match="labels"):
        TSVGP(X, Y, likelihood=Bernoulli())
    with pytest.raises(ValueError):
        TSVGP(X, Y, inducing_points=torch.rand(4, 3, dtype=DT))


def test_state_dict_roundtrip_and_small_n():
    X, Y = _data(n=3)
    model = TSVGP(X, Y)  # m = 128 > n: 3 data points + Sobol fill
    assert model.num_inducing == 128
    for i in range(5):
        model.update(*_data(n=2, seed=10 + i))
    assert model.num_data == 13
    state = model.state_dict()
    assert state["_X"].shape == (13, 2)
    clone = TSVGP(X, Y)
    clone.load_state_dict(state)
    Xt = torch.rand(4, 2, dtype=DT)
    assert torch.equal(clone.posterior(Xt).mean, model.posterior(Xt).mean)
    clone.update(*_data(n=1, seed=99))
    model.update(*_data(n=1, seed=99))
    assert torch.allclose(clone.posterior(Xt).mean, model.posterior(Xt).mean, atol=1e-12)
    # a hyperparameter change rebuilds from the per-point sites: equals a fresh model on all data
    with torch.no_grad():
        model.covar_module.lengthscale = 0.4
    fresh = TSVGP(torch.cat([X] + [_data(n=2, seed=10 + i)[0] for i in range(5)] + [_data(n=1, seed=99)[0]]),
                  torch.cat([Y] + [_data(n=2, seed=10 + i)[1] for i in range(5)] + [_data(n=1, seed=99)[1]]),
                  inducing_points=model.inducing_points.detach())
    fresh.outcome_mean, fresh.outcome_std = model.outcome_mean, model.outcome_std
    fresh._y[:] = model.train_y
    fresh.covar_module.load_state_dict(model.covar_module.state_dict())
    fresh.invalidate_caches()
    assert torch.allclose(fresh.posterior(Xt).mean, model.posterior(Xt).mean, atol=1e-9)


# ---------------------------------------------------------------------------- BoTorch acquisition


@pytest.mark.parametrize("lik", ["gaussian", "bernoulli"])
def test_works_under_botorch_acquisitions(lik):
    from botorch.acquisition import qKnowledgeGradient, qUpperConfidenceBound
    from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance
    from botorch.acquisition.logei import qLogExpectedImprovement
    from botorch.optim import optimize_acqf

    torch.manual_seed(0)
    X, Y = _data(n=8)
    if lik == "bernoulli":
        model = TSVGP(X, (Y > 0).to(DT), inducing_points=16, likelihood=Bernoulli())
    else:
        model = TSVGP(X, Y, inducing_points=16)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    best = float(model.posterior(X).mean.max())
    acqs = [
        qUpperConfidenceBound(model, beta=2.0),
        qLogExpectedImprovement(model, best_f=best),
        qNegIntegratedPosteriorVariance(model, mc_points=torch.rand(32, 2, dtype=DT)),
    ]
    opts = {"maxiter": 5}
    for acq in acqs:
        cand, val = optimize_acqf(acq, bounds, q=2, num_restarts=2, raw_samples=16, options=opts)
        assert cand.shape == (2, 2) and torch.isfinite(val).all()
        assert (cand >= 0).all() and (cand <= 1).all()
    kg = qKnowledgeGradient(model, num_fantasies=4)
    cand, val = optimize_acqf(kg, bounds, q=1, num_restarts=2, raw_samples=16, options=opts)
    assert cand.shape == (1, 2) and torch.isfinite(val).all()
    # qNIPV through our fantasies equals the integrated variance of the explicitly
    # conditioned model (Gaussian: the fantasy variance does not depend on the samples)
    if lik == "gaussian":
        mc = torch.rand(32, 2, dtype=DT)
        acq = qNegIntegratedPosteriorVariance(model, mc_points=mc)
        Xq = torch.rand(1, 2, 2, dtype=DT)
        noise = model.likelihood.noise.reshape(1, 1)
        cond = model.condition_on_observations(Xq[0], torch.zeros(2, 1, dtype=DT), noise=None)
        ref = -cond.posterior(mc).variance.mean()
        assert torch.allclose(acq(Xq), ref.reshape(1), atol=1e-10)
