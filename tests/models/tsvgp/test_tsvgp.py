"""TSVGP against dense SGPR / exact GP computations, conditioning, fantasies, EM and BoTorch use."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.sampling.normal import SobolQMCNormalSampler
from gpytorch.kernels import RBFKernel, ScaleKernel

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
    add = (
        post.variance.squeeze(-1) - model.posterior(Xt).variance.squeeze(-1)
    ) / model.outcome_std**2
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
    yall = model._standardize(torch.cat([Y, Ys])).squeeze(-1)
    noise = (
        torch.cat([torch.full((25,), 0.03), torch.full((6,), 0.02)]).to(DT) / std**2
        if fixed
        else 0.05
    )
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


@pytest.mark.parametrize("dense_max_q", [512, 0])  # dense covariance, and the lazy operator path
def test_chained_conditioning_equals_sgpr_on_union(dense_max_q):
    # three conditionings in a row (pending Woodbury sites 2 + 3 + 1) then the posterior, against
    # dense SGPR on all the data; the in-place update of the last model folds them into L_B
    X, Y = _data(n=25)
    Z = torch.rand(12, 2, generator=torch.Generator().manual_seed(5), dtype=DT)
    model = _set_hypers(TSVGP(X, Y, inducing_points=Z))
    model.dense_posterior_max_q = dense_max_q
    parts = [_data(n=k, seed=10 + k) for k in (2, 3, 1)]
    cond = model
    for Xs, Ys in parts:
        cond = cond.condition_on_observations(Xs, Ys)
    assert cond.chol_B is model.chol_B and cond._lr_W.shape == torch.Size([12, 6])
    Xall = torch.cat([X] + [p[0] for p in parts])
    yall = model._standardize(torch.cat([Y] + [p[1] for p in parts])).squeeze(-1)
    Xt = torch.rand(7, 2, dtype=DT, generator=torch.Generator().manual_seed(6))
    mean, cov, _ = _dense_sgpr(model, Xall, yall, Z, Xt, 0.05)
    m, C = _latent(cond, Xt)
    assert torch.allclose(m, mean, atol=1e-8, rtol=0)
    assert torch.allclose(C, cov, atol=1e-8, rtol=0)
    # q(u) and the KL of the conditioned model (factor materialised) against dense SGPR at Z
    mean_u, S_u, _ = _dense_sgpr(model, Xall, yall, Z, Z, 0.05)
    m_u = mean_u - model.mean_module.constant.detach()
    q_m, q_S = (t.detach() for t in cond.q_u())
    assert torch.allclose(q_m, m_u, atol=1e-8, rtol=0)
    assert torch.allclose(q_S, S_u, atol=1e-8, rtol=0)
    Kuu = model.covar_module(Z).to_dense().detach()
    kl = torch.distributions.kl_divergence(
        torch.distributions.MultivariateNormal(m_u, S_u),
        torch.distributions.MultivariateNormal(torch.zeros(12, dtype=DT), Kuu),
    )
    # (K_uu has condition number ~1e6 here, which limits the dense KL to ~1e-7 relative)
    ours = float(cond.kl_divergence().detach())
    assert abs(ours - float(kl)) < 1e-6 * abs(float(kl))
    # and exactly the KL of the model updated in place on the same data (rank-one factor updates)
    inplace = _set_hypers(TSVGP(X, Y, inducing_points=Z))
    for Xs, Ys in parts:
        inplace.update(Xs, Ys)
    assert abs(ours - float(inplace.kl_divergence().detach())) < 1e-10 * abs(ours)


def test_whitening_memo_follows_in_place_changes_of_x():
    X, Y = _data(n=20)
    model = _set_hypers(TSVGP(X, Y, inducing_points=8))
    Xt = torch.rand(5, 2, dtype=DT, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        first = model.posterior(Xt).mean.clone()
        Xt.mul_(0.5)  # same tensor object, new values: the memo must not be reused
        second = model.posterior(Xt).mean
        fresh = model.posterior(Xt.clone()).mean
    assert not torch.allclose(first, second)
    assert torch.equal(second, fresh)


def test_fantasize_shares_factor_and_matches_per_sample_conditioning():
    X, Y = _data(n=20)
    model = _set_hypers(TSVGP(X, Y, inducing_points=8))
    Xf = torch.rand(3, 2, 2, dtype=DT)  # batch 3, q = 2
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([4]), seed=0)
    fm = model.fantasize(Xf, sampler)
    assert fm.batch_shape == torch.Size([4, 3])
    # the parent's factor is shared, not copied; the new sites' Woodbury terms (hence every
    # variance) carry the X batch only, shared by the 4 samples
    assert fm.chol_B is model.chol_B
    assert fm._lr_W.shape == torch.Size([3, 8, 2]) and fm._lr_C.shape == torch.Size([3, 2, 2])
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


def test_fantasy_posterior_at_shared_points_forms_no_per_candidate_covariance():
    r"""qNIPV's pattern: a fantasy model (``s x b``) asked for its posterior variance at
    integration points shared by every candidate set (``k x d``). The covariance was formed
    densely per candidate set (``b x k x k``: 268 MB each, 531 MB peak at b = 512, 256 points,
    q = 6); the shared block is now formed once and each set's pending-site term kept lazy. The
    moments equal Titsias' SGPR computed densely on the data plus each fantasy's observations."""
    from memory_profile import LargestAllocation

    X, Y = _data(n=40)
    model = _set_hypers(TSVGP(X, Y, inducing_points=8))
    g = torch.Generator().manual_seed(3)
    s, b, q, k = 2, 64, 2, 48
    Xf = torch.rand(b, q, 2, generator=g, dtype=DT)
    Xt = torch.rand(k, 2, generator=g, dtype=DT)
    with torch.no_grad():
        fm = model.fantasize(Xf, SobolQMCNormalSampler(sample_shape=torch.Size([s]), seed=0))
        fm.posterior(Xt[:2]).variance  # caches built outside the measurement
        with LargestAllocation() as largest:
            var = fm.posterior(Xt).variance
        assert var.shape == (s, b, k, 1)
        assert largest.numel < b * k * k // 4, (largest.numel, b * k * k)
        post = fm.posterior(Xt)
        mean, cov = _latent(fm, Xt)
    torch.testing.assert_close(post.variance, var, atol=0, rtol=0)
    noise = model.likelihood.gaussian.noise.detach().reshape(())
    y = (Y.squeeze(-1) - model.outcome_mean) / model.outcome_std
    for i, j in ((0, 0), (s - 1, b - 1), (1, 30)):
        Xall = torch.cat([X, Xf[j]])
        yall = torch.cat([y, fm._cy[i, j]])  # the fantasy's observations, standardised
        m_ref, c_ref, _ = _dense_sgpr(model, Xall, yall, model.inducing_points, Xt, noise)
        torch.testing.assert_close(mean[i, j], m_ref, atol=1e-10, rtol=0)
        torch.testing.assert_close(cov[i, j], c_ref, atol=1e-10, rtol=0)


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
    full = TSVGP(
        torch.cat([X, Xs]),
        torch.cat([Y, Ys]),
        inducing_points=Z,
        likelihood=Bernoulli("probit"),
        num_init_e_steps=0,
    )
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
    # per-sample factors differ (beta depends on y): the new sites' Woodbury terms carry the
    # 64 samples and the X batch of 2
    assert fm._lr_W.shape[:2] == torch.Size([64, 2]) and fm._lr_C.shape[:2] == torch.Size([64, 2])


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
        clf.update(
            torch.rand(1, 2, dtype=DT), torch.ones(1, 1, dtype=DT), torch.ones(1, 1, dtype=DT)
        )
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
    fresh = TSVGP(
        torch.cat([X] + [_data(n=2, seed=10 + i)[0] for i in range(5)] + [_data(n=1, seed=99)[0]]),
        torch.cat([Y] + [_data(n=2, seed=10 + i)[1] for i in range(5)] + [_data(n=1, seed=99)[1]]),
        inducing_points=model.inducing_points.detach(),
    )
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
        cond = model.condition_on_observations(Xq[0], torch.zeros(2, 1, dtype=DT), noise=None)
        ref = -cond.posterior(mc).variance.mean()
        assert torch.allclose(acq(Xq), ref.reshape(1), atol=1e-10)


# ---------------------------------------------------------------------------- E-step and M-step


def _gpytorch_ngd_model(model, lik):
    """GPyTorch SVGP with a NaturalVariationalDistribution at the prior, same kernel/mean/Z."""
    import copy

    import gpytorch

    Z = model.inducing_points.detach().clone()

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self):
            dist = gpytorch.variational.NaturalVariationalDistribution(
                Z.shape[0], mean_init_std=0.0
            )
            strat = gpytorch.variational.VariationalStrategy(
                self, Z, dist, learn_inducing_locations=False, jitter_val=1e-14
            )
            super().__init__(strat)
            self.mean_module = copy.deepcopy(model.mean_module)
            self.covar_module = copy.deepcopy(model.covar_module)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x)
            )

    return SVGP().to(DT)


def _exact_probit_bernoulli_cls():
    import gpytorch
    import numpy as np

    class ExactProbitBernoulli(gpytorch.likelihoods.BernoulliLikelihood):
        """GPyTorch's BernoulliLikelihood with an exact log Phi and float64 Gauss-Hermite nodes.

        GPyTorch's own ``log_normal_cdf`` is an approximation (errors ~5e-5) and its quadrature
        nodes pass through float32 (~1e-7), which would hide the comparison at 1e-6.
        """

        def __init__(self):
            super().__init__()
            locs, w = np.polynomial.hermite.hermgauss(20)
            self.quadrature.locations = torch.from_numpy(locs)
            self.quadrature.weights = torch.from_numpy(w)

        def expected_log_prob(self, observations, function_dist, *args, **kwargs):
            s = observations.mul(2).sub(1)
            return self.quadrature(lambda f: torch.special.log_ndtr(f * s), function_dist)

    return ExactProbitBernoulli


def _ExactProbitBernoulli():
    return _exact_probit_bernoulli_cls()()


@pytest.mark.parametrize("lik_name", ["gaussian", "bernoulli"])
def test_e_step_equals_gpytorch_ngd_step(lik_name):
    import gpytorch

    X, Y = _data(n=25)
    Z = X[::3].clone()
    if lik_name == "gaussian":
        model = _set_hypers(TSVGP(X, Y, inducing_points=Z))
        glik = gpytorch.likelihoods.GaussianLikelihood().to(DT)
        glik.noise = 0.05
        y = model.train_y
    else:
        Y = (Y > 0).to(DT)
        model = TSVGP(X, Y, inducing_points=Z, likelihood=Bernoulli("probit"), num_init_e_steps=0)
        with torch.no_grad():  # the default kernel of a Bernoulli model has an outputscale
            model.covar_module.base_kernel.lengthscale = 0.3
            model.covar_module.outputscale = 1.7
        model.invalidate_caches()
        glik = _ExactProbitBernoulli()
        y = Y.squeeze(-1)
    n = X.shape[0]
    model.set_sites(torch.zeros(n, dtype=DT), torch.zeros(n, dtype=DT))  # q(u) = prior
    gp = _gpytorch_ngd_model(model, glik)
    rho = 0.3
    ngd = gpytorch.optim.NGD(gp.variational_parameters(), num_data=n, lr=rho)
    mll = gpytorch.mlls.VariationalELBO(glik, gp, num_data=n)
    Xt = torch.rand(6, 2, dtype=DT, generator=torch.Generator().manual_seed(11))
    for _ in range(2):  # two steps: the second starts away from the prior
        gp.train()
        ngd.zero_grad()
        (-mll(gp(X), y)).backward()
        ngd.step()
        model.e_step(rho=rho)
        gp.eval()
        with torch.no_grad():
            ref = gp(Xt)
        post = model.posterior(Xt)
        mean = (post.mean.squeeze(-1) - model.outcome_mean) / model.outcome_std
        var = post.variance.squeeze(-1) / model.outcome_std**2
        assert torch.allclose(mean.detach(), ref.mean, atol=1e-6, rtol=0)
        assert torch.allclose(var.detach(), ref.variance, atol=1e-6, rtol=0)


def test_minibatch_e_step_scaling():
    # Tied minibatch update (paper Eqs. 22-23, docs/math.md §2) with |B| = N/2: the summaries move
    # to (1 - rho) * old + rho * (N/|B|) * (batch contribution), checked against a dense
    # computation.
    X, Y = _data(n=20)
    model = _set_hypers(TSVGP(X, Y, inducing_points=X[::4].clone()))
    model.ensure_caches()
    lam_before, chol_before = model.lam_w.clone(), model.chol_B.clone()
    g = torch.Generator().manual_seed(0)
    model.e_step(rho=0.5, batch_size=10, generator=g)
    idx = torch.randperm(20, generator=torch.Generator().manual_seed(0))[:10]
    A = model._whiten(model.chol_K, X[idx])
    s2 = 0.05
    g1 = (model.train_y[idx] - model.mean_module.constant.detach()) / s2
    lam_expected = 0.5 * lam_before + 0.5 * 2.0 * (A @ g1)
    P_old = chol_before @ chol_before.T - torch.eye(5, dtype=DT)
    P_expected = 0.5 * P_old + 0.5 * 2.0 * (A / s2) @ A.T
    assert torch.allclose(model.lam_w, lam_expected, atol=1e-9)
    L = model.chol_B
    assert torch.allclose(L @ L.T, torch.eye(5, dtype=DT) + P_expected, atol=1e-9)


def _standard_elbo(model, m_u, S_u):
    r"""The standard M-step objective: q(u) = N(m_u, S_u) FIXED, ELBO as a function of theta."""
    k = model.covar_module
    Z, X, y = model.inducing_points, model.train_X, model.train_y
    Kuu = k(Z).to_dense()
    Kuf = k(Z, X).to_dense()
    Aa = torch.linalg.solve(Kuu, Kuf)  # a_i = K^-1 k_i
    c = model.mean_module.constant
    mean = c + Aa.T @ m_u
    var = k(X, diag=True) - ((Kuu - S_u) @ Aa * Aa).sum(0)
    ell = model.likelihood.expected_log_prob(y, mean, var).sum()
    kl = torch.distributions.kl_divergence(
        torch.distributions.MultivariateNormal(m_u, S_u),
        torch.distributions.MultivariateNormal(torch.zeros_like(m_u), Kuu),
    )
    return ell - kl


def test_bernoulli_tighter_bound_equals_standard_at_theta_t_and_dominates():
    g = torch.Generator().manual_seed(3)
    X = torch.rand(40, 1, dtype=DT, generator=g)
    Y = (torch.sin(8 * X) + 0.3 * torch.randn(40, 1, dtype=DT, generator=g) > 0).to(DT)
    Z = torch.linspace(0, 1, 10, dtype=DT).unsqueeze(-1)
    kernel = ScaleKernel(RBFKernel())
    model = TSVGP(
        X,
        Y,
        inducing_points=Z,
        likelihood=Bernoulli("probit"),
        covar_module=kernel,
        num_init_e_steps=0,
    )
    with torch.no_grad():
        model.covar_module.base_kernel.lengthscale = 0.2
    model.invalidate_caches()
    for _ in range(60):  # E-step to convergence at theta_t
        model.e_step(rho=1.0)
    m_u, S_u = (t.detach() for t in model.q_u())
    params = [
        model.covar_module.base_kernel.raw_lengthscale,
        model.covar_module.raw_outputscale,
        model.mean_module.raw_constant,
    ]
    tight = model.elbo()
    std = _standard_elbo(model, m_u, S_u)
    assert abs(float(tight - std)) < 1e-8 * abs(float(std))
    g_tight = torch.autograd.grad(tight, params)
    g_std = torch.autograd.grad(std, params)
    for a, b in zip(g_tight, g_std):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-6)
    # away from theta_t the tighter bound is at least as large (and strictly larger somewhere)
    gaps = []
    for ls in [0.05, 0.1, 0.15, 0.3, 0.4]:
        for os_ in [0.5, 1.0, 3.0]:
            with torch.no_grad():
                model.covar_module.base_kernel.lengthscale = ls
                model.covar_module.outputscale = os_
                gaps.append(float(model.elbo() - _standard_elbo(model, m_u, S_u)))
    assert min(gaps) >= -1e-9
    assert max(gaps) > 1e-2


def test_em_fit_improves_bound_and_classifies():
    g = torch.Generator().manual_seed(5)
    X = torch.rand(60, 2, dtype=DT, generator=g)
    Y = ((X - 0.5).pow(2).sum(-1, keepdim=True) < 0.1).to(DT)
    model = TSVGP(X, Y, inducing_points=15, likelihood=Bernoulli("logit"))
    before = float(model.elbo())
    model.fit(method="adam", max_iter=20, lr=0.05, num_em_iters=2, num_e_steps=3)
    after = float(model.elbo())
    assert after > before
    p = model.posterior(X).mean.squeeze(-1)
    assert ((p > 0).to(DT) == Y.squeeze(-1)).to(DT).mean() > 0.85
    # Gaussian: fit maximises the collapsed bound (L-BFGS), which must not decrease
    Xg, Yg = _data(n=30)
    gm = TSVGP(Xg, Yg, inducing_points=10)
    b0 = float(gm.elbo())
    gm.fit(max_iter=20)
    assert float(gm.elbo()) > b0


@pytest.mark.parametrize("lik", [Poisson(), Bernoulli("logit")])
def test_e_steps_reach_the_elbo_maximum_in_q(lik):
    """Log-concave likelihoods: converged E-steps are a stationary point of the ELBO in q (any small
    perturbation of the sites, either direction, lowers the bound) and never decreased it."""
    g = torch.Generator().manual_seed(9)
    X = torch.rand(30, 1, dtype=DT, generator=g)
    f = torch.sin(6 * X).squeeze(-1)
    if isinstance(lik, Poisson):
        Y = torch.poisson(torch.exp(f), generator=g).unsqueeze(-1)
    else:
        Y = (f + 0.3 * torch.randn(30, dtype=DT, generator=g) > 0).to(DT).unsqueeze(-1)
    model = TSVGP(X, Y, inducing_points=8, likelihood=lik, num_init_e_steps=0)
    elbos = [float(model.elbo())]
    for _ in range(40):
        model.e_step(rho=0.7)
        elbos.append(float(model.elbo()))
    assert all(b >= a - 1e-9 for a, b in zip(elbos, elbos[1:]))
    g1, beta = (t.clone() for t in model.sites)
    best = elbos[-1]
    for k in range(4):
        d1 = torch.randn(30, dtype=DT, generator=g)
        d2 = torch.randn(30, dtype=DT, generator=g) * beta
        for sign in (1.0, -1.0):
            model.set_sites(g1 + sign * 1e-3 * d1, beta + sign * 1e-3 * d2)
            assert float(model.elbo()) < best
    model.set_sites(g1, beta)
    assert abs(float(model.elbo()) - best) < 1e-10


def _dense_poisson_vi(K: torch.Tensor, y: torch.Tensor, c: float, iters: int = 400):
    r"""The Gaussian variational posterior of a full GP ``f = c + h``, ``h ~ N(0, K)``, under a
    Poisson likelihood, by fixed-point (CVI) iterations in dense ``n x n`` algebra: sites
    ``beta = E_q[exp f] = exp(mu + v / 2)``, ``g1 = beta (mu - c) + y - beta`` (closed form, no
    quadrature). Returns the marginal means and variances of f."""
    n = y.shape[0]
    g1, beta = torch.zeros(n, dtype=DT), torch.zeros(n, dtype=DT)
    for _ in range(iters):
        S = torch.diag(beta.sqrt())
        C = torch.linalg.cholesky(torch.eye(n, dtype=DT) + S @ K @ S)
        V = torch.cholesky_solve(S @ K, C)  # (I + S K S)^-1 S K
        Sigma = K - K @ S @ V
        mu, v = c + Sigma @ g1, torch.diagonal(Sigma)
        rate = torch.exp(mu + v / 2)
        g1_new, beta_new = rate * (mu - c) + y - rate, rate
        step = float((g1_new - g1).abs().max())
        g1, beta = 0.5 * g1 + 0.5 * g1_new, 0.5 * beta + 0.5 * beta_new  # damped: from the prior
    assert step < 1e-9, step  # the reference converged
    return mu, v


def test_poisson_sites_start_near_large_counts_and_reach_the_variational_optimum():
    """Counts in the tens: the constructor's E-steps start from sites linearised at log(y + 1/2),
    so with the data as inducing inputs the model is at the full GP's Gaussian variational
    optimum (computed densely). From the prior the first step overshot to a latent mean of about
    the count itself (rate e^30) and each later step came back by about 1: the model ended with
    log-rates far above log(85), and fit() failed on a kernel matrix that was not positive
    definite."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g, dtype=DT)
    rate = torch.exp(1.5 + 3 * torch.sin(3 * X[:, 0]) * X[:, 1])
    Y = torch.poisson(rate, generator=g).unsqueeze(-1)
    assert Y.max() > 50
    model = TSVGP(X, Y, inducing_points=X.clone(), likelihood=Poisson())  # Z = X: the full GP
    with torch.no_grad():
        K = model.covar_module(X).to_dense()
        c = float(model.mean_module.constant)
        mu, v = _dense_poisson_vi(K, Y.squeeze(-1), c)
        post = model.posterior(X)
    # after the constructor's 5 E-steps: close to the optimum (from the prior: 20 nats off)
    torch.testing.assert_close(post.mean.squeeze(-1), mu, rtol=0, atol=1e-4)
    torch.testing.assert_close(post.variance.squeeze(-1), v, rtol=1e-3, atol=1e-8)
    for _ in range(15):  # and the E-steps' fixed point is that optimum
        model.e_step()
    with torch.no_grad():
        post = model.posterior(X)
    torch.testing.assert_close(post.mean.squeeze(-1), mu, rtol=0, atol=1e-8)
    torch.testing.assert_close(post.variance.squeeze(-1), v, rtol=1e-7, atol=1e-10)
    model.fit()  # and the hyperparameters can be fitted from there
    latent = model.posterior(X).mean.squeeze(-1)
    assert float((latent - rate.log()).abs().max()) < 1.0


def test_student_t_e_steps_converge_with_the_beta_clip():
    """Student-t (not log-concave): an outlier's expected curvature is negative, its site
    precision is clipped at BETA_MIN (docs/math.md §2), the E-steps reach a fixed point and raise
    the bound."""
    from bo_online.likelihoods import BETA_MIN

    g = torch.Generator().manual_seed(9)
    X = torch.rand(30, 1, dtype=DT, generator=g)
    Y = (torch.sin(6 * X).squeeze(-1) + 0.1 * torch.randn(30, dtype=DT, generator=g)).unsqueeze(-1)
    Y[3] += 8.0
    model = TSVGP(
        X, Y, inducing_points=8, likelihood=StudentT(), num_init_e_steps=0, standardize=False
    )
    start = float(model.elbo())
    for _ in range(60):
        model.e_step(rho=0.7)
    g1, beta = (t.clone() for t in model.sites)
    model.e_step(rho=0.7)
    assert torch.allclose(model.sites[0], g1, atol=1e-9) and torch.allclose(
        model.sites[1], beta, atol=1e-9
    )
    assert float(beta[3]) == BETA_MIN and bool((beta > BETA_MIN).sum() >= 25)
    assert float(model.elbo()) > start
    # the outlier barely moves the fit: the posterior mean at x_3 stays near the clean curve
    m3 = float(model.posterior(X[3:4]).mean)
    assert abs(m3 - float(torch.sin(6 * X[3]))) < 0.5


def test_bernoulli_condition_steps_reach_the_new_sites_fixed_point():
    X, _ = _data(n=30)
    Y = (X.sum(-1, keepdim=True) > 1.0).to(DT)
    model = TSVGP(X, Y, inducing_points=X[::3].clone(), likelihood=Bernoulli("probit"))
    Xs = torch.rand(3, 2, dtype=DT, generator=torch.Generator().manual_seed(8))
    Ys = torch.tensor([[1.0], [0.0], [0.0]], dtype=DT)
    one = model.condition_on_observations(Xs, Ys)
    model.condition_steps = 40
    many = model.condition_on_observations(Xs, Ys)
    # at the fixed point the new sites equal the E-step result at their own updated marginals
    post = many.posterior(Xs)
    c = model.mean_module.constant.detach()
    mean, var = post.mean.squeeze(-1).detach(), post.variance.squeeze(-1).detach()
    alpha, beta = model.likelihood.expected_derivatives(Ys.squeeze(-1), mean, var)
    assert torch.allclose(many._cbeta, beta, atol=1e-8)
    assert torch.allclose(many._cg1, beta * (mean - c) + alpha, atol=1e-8)
    # one step (the default) is not yet there, and only the new sites moved
    assert not torch.allclose(one._cg1, many._cg1, atol=1e-6)
    assert torch.equal(many.sites[0], model.sites[0])


@pytest.mark.parametrize(
    "option", [{"condition_steps": -1}, {"num_init_e_steps": -1}, {"condition_steps": 1.5}]
)
def test_negative_or_fractional_step_counts_are_refused_at_construction(option):
    r"""``condition_steps=-1`` (``--model-option condition_steps=-1``) was accepted and left no
    conditioning step: every later ``update`` of a Bernoulli model failed with an
    UnboundLocalError (after a stream run had written its first checkpoint)."""
    X, _ = _data(n=20)
    Y = (X.sum(-1, keepdim=True) > 1.0).to(DT)
    name = next(iter(option))
    with pytest.raises(ValueError, match=f"{name} must be an integer >= 0"):
        TSVGP(X, Y, inducing_points=5, likelihood=Bernoulli(), **option)


@pytest.mark.parametrize(
    "option", [{"condition_steps": float("nan")}, {"num_init_e_steps": float("inf")}]
)
def test_non_finite_step_counts_are_refused_with_the_same_message(option):
    # int() of them raised "cannot convert float NaN to integer" (inf: an OverflowError)
    X, _ = _data(n=20)
    Y = (X.sum(-1, keepdim=True) > 1.0).to(DT)
    name = next(iter(option))
    with pytest.raises(ValueError, match=f"{name} must be an integer >= 0"):
        TSVGP(X, Y, inducing_points=5, likelihood=Bernoulli(), **option)


def test_whole_step_counts_of_any_number_type_are_accepted():
    r"""NumPy integers (as before the check) and whole floats (as the check says) build and
    update a Bernoulli model: 2.0 passed the check, then ``range(2.0)`` failed."""
    X, _ = _data(n=20)
    Y = (X.sum(-1, keepdim=True) > 1.0).to(DT)
    for steps in (np.int64(2), 2.0):
        model = TSVGP(
            X[:15],
            Y[:15],
            inducing_points=5,
            likelihood=Bernoulli(),
            num_init_e_steps=steps,
            condition_steps=steps,
        )
        assert model.condition_steps == 2
        model.update(X[15:], Y[15:])


def test_one_dimensional_targets_get_a_shape_hint():
    X = torch.rand(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(
        ValueError, match=r"train_Y must be n x m .*got shape \(30,\); use train_Y.unsqueeze\(-1\)"
    ):
        TSVGP(X, X.sum(-1))


def test_a_chain_of_conditionings_keeps_its_pending_rank_bounded_and_equals_updates():
    """Conditioning a conditioned model again and again folds the pending low-rank sites into a
    new factor once their rank passes 32 (or a quarter of m), so a step's cost does not grow
    with the chain; the chain's end is the model with the same points added by ``update``."""
    X, Y = _data(n=20 + 40 * 3, d=2, seed=4)
    model = _set_hypers(TSVGP(X[:20], Y[:20], inducing_points=16))
    model.eval()
    updated = _set_hypers(TSVGP(X[:20], Y[:20], inducing_points=16))
    updated.load_state_dict(model.state_dict())
    child, ranks = model, []
    for i in range(20, X.shape[0], 3):
        child = child.condition_on_observations(X[i : i + 3], Y[i : i + 3])
        updated.update(X[i : i + 3], Y[i : i + 3])
        ranks.append(0 if child._lr_U is None else child._lr_U.shape[-1])
    assert max(ranks) <= 32 + 3
    Xt = torch.rand(25, 2, generator=torch.Generator().manual_seed(9), dtype=DT)
    with torch.no_grad():
        pc, pu = child.posterior(Xt), updated.posterior(Xt)
    assert torch.allclose(pc.mean, pu.mean, atol=1e-10)
    assert torch.allclose(pc.variance, pu.variance, rtol=1e-9, atol=1e-12)
    # the root model is untouched by its descendants
    assert model._lr_U is None and model.num_data == 20


def test_update_of_several_points_is_a_rank_q_update_and_equals_dense_sgpr(monkeypatch):
    r"""``update`` of q = 6 points (m = 40 inducing inputs) folds their sites into ``chol(B)`` by a
    rank-q update, O(m^2 q) as documented: no ``m x m`` factorisation (with q >= 4 it
    refactorised, O(m^3)); the result is dense SGPR on all the points."""
    import bo_online.linalg as linalg

    X, Y = _data(n=30, d=3, seed=2)
    Xs, Ys = _data(n=6, d=3, seed=8)
    Z = torch.rand(40, 3, generator=torch.Generator().manual_seed(5), dtype=DT)
    model = _set_hypers(TSVGP(X, Y, inducing_points=Z))
    model.ensure_caches()
    factored = []
    original = linalg.psd_cholesky

    def spy(A, *args, **kwargs):
        factored.append(A.shape[-1])
        return original(A, *args, **kwargs)

    monkeypatch.setattr(linalg, "psd_cholesky", spy)
    model.update(Xs, Ys)
    assert 40 not in factored
    Xt = torch.rand(7, 3, dtype=DT, generator=torch.Generator().manual_seed(6))
    y = model._standardize(torch.cat([Y, Ys])).squeeze(-1)
    mean, cov, _ = _dense_sgpr(model, torch.cat([X, Xs]), y, Z, Xt, 0.05)
    m, C = _latent(model, Xt)
    assert torch.allclose(m, mean, atol=1e-8, rtol=0)
    assert torch.allclose(C, cov, atol=1e-8, rtol=0)


def test_inducing_points_as_one_value_is_a_whole_number_or_a_clear_error():
    """``inducing_points=2.5`` failed as "inducing_points must be m x d, got ()", ``"abc"`` as
    "new(): invalid data type 'str'", and NumPy's ``int64(8)`` (a whole number) took the tensor
    path and failed like 2.5. A whole number (any integral type, 8.0) is a number of points;
    anything else one value is refused with what is accepted."""
    X = torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    Y = X.sum(-1, keepdim=True)
    for m in (8, 8.0, np.int64(8), torch.tensor(8)):
        assert TSVGP(X, Y, inducing_points=m).inducing_points.shape == (8, 2)
    for bad in (2.5, "abc", 0, -5, True, float("nan")):
        with pytest.raises(ValueError, match="inducing_points must be a whole number m >= 1 or"):
            TSVGP(X, Y, inducing_points=bad)


def test_the_sobol_fill_of_the_inducing_inputs_repeats_no_data_point():
    r"""A loop's initial design of seed 0 is the scrambled Sobol sequence the fill draws, so the
    fill repeated the design's points (K_ZZ singular up to its jitter). Now every inducing
    input is distinct, the data points come first, and the fill is still the Sobol sequence
    (in its order, the repeated points left out)."""
    from gpytorch.kernels import RBFKernel
    from torch.quasirandom import SobolEngine

    from bo_online.models.tsvgp.inducing import select_inducing_points

    X = SobolEngine(2, scramble=True, seed=0).draw(10, dtype=torch.float64)  # a loop's design
    kernel = RBFKernel().double()
    Z = select_inducing_points(X, kernel, 30)
    assert Z.shape == (30, 2)
    assert torch.equal(Z[:10].sort(0).values, X.sort(0).values)  # every data point picked
    distances = torch.cdist(Z, Z) + torch.eye(30, dtype=Z.dtype)
    assert distances.min() > 1e-6  # no input repeated
    sobol = SobolEngine(2, scramble=True, seed=0).draw(40).double()  # as the fill draws it
    assert torch.equal(Z[10:], sobol[10:30])  # the sequence after the repeated points
    # with an unrelated design the fill is the sequence from its start, as before
    Y = torch.rand(10, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(select_inducing_points(Y, kernel, 30)[10:], sobol[:20])


@pytest.mark.parametrize("outputs", [1, 2])
def test_conditioned_model_holds_the_added_points_as_botorch_conditioned_models_do(outputs):
    r"""``train_inputs`` / ``train_targets`` of a conditioned (and twice conditioned) t-SVGP equal
    those of BoTorch's ``SingleTaskGP`` conditioned on the same points, batch and sample dims
    included; they held only the base data before."""
    g = torch.Generator().manual_seed(5)
    X = torch.rand(15, 2, generator=g, dtype=DT)
    Y = torch.sin(5 * X[:, :1]) + torch.arange(outputs, dtype=DT)
    X1 = torch.rand(3, 2, 2, generator=g, dtype=DT)  # batch 3, q = 2
    Y1 = torch.randn(4, 3, 2, outputs, generator=g, dtype=DT)  # 4 samples
    X2 = torch.rand(3, 1, 2, generator=g, dtype=DT)
    Y2 = torch.randn(4, 3, 1, outputs, generator=g, dtype=DT)
    models = []
    for model in (TSVGP(X, Y, inducing_points=8), SingleTaskGP(X, Y, outcome_transform=None)):
        model.eval()
        model.posterior(X1)  # BoTorch's conditioning needs a prediction cache
        once = model.condition_on_observations(X1, Y1)
        models.append((once, once.condition_on_observations(X2, Y2)))
    for ours, reference in zip(*models):
        X_ref = reference.train_inputs[0]
        if outputs > 1:  # BoTorch repeats the inputs per output (batch dim -3); t-SVGP shares them
            assert bool((X_ref == X_ref[..., :1, :, :]).all())
            X_ref = X_ref[..., 0, :, :]
        assert ours.train_inputs[0].shape == X_ref.shape
        torch.testing.assert_close(ours.train_inputs[0], X_ref, rtol=0, atol=0)
        # the targets make one round trip through the outcome scaling
        torch.testing.assert_close(
            ours.train_targets, reference.train_targets, rtol=1e-12, atol=1e-14
        )
