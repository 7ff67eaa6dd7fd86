r"""Tests of DecoupledSVGP against independent dense computations (float64, CPU, seeded)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from botorch.acquisition import qLogExpectedImprovement, qUpperConfidenceBound
from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import LinearKernel
from memory_profile import LargestAllocation

from bo_online.models import DecoupledSVGP, OnlineExactGP

DT = torch.float64


def _data(n: int = 30, d: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    return X, Y


def _generic_model(seed: int = 0, n: int = 30, mb: int = 6, ma: int = 15, noise: float = 0.05):
    r"""A decoupled model in a generic state: random bases, coefficients and a full square L."""
    X, Y = _data(n, seed=seed)
    m = DecoupledSVGP(X, Y, num_mean_bases=ma, num_cov_bases=mb)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        m.covar_module.lengthscale = torch.tensor([[0.3, 0.5]], dtype=DT)
        m.likelihood.noise = torch.tensor([noise], dtype=DT)
        m.mean_module.constant.fill_(0.2)
    m.set_variational_parameters(
        torch.rand(mb, 2, generator=g, dtype=DT),
        torch.randn(mb, mb, generator=g, dtype=DT),
        torch.randn(mb, generator=g, dtype=DT),
        torch.rand(ma - mb, 2, generator=g, dtype=DT),
        torch.randn(ma - mb, generator=g, dtype=DT),
    )
    return m


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same_state(s1, s2):
    return s1.keys() == s2.keys() and all(
        s1[k].shape == s2[k].shape and torch.equal(s1[k], s2[k]) for k in s1
    )


# ---------------------------------------------------------------------- (1) the model


def test_kl_and_predictive_equal_explicit_gaussians_on_finite_feature_space():
    # Linear kernel k(x, x') = v x^T x': feature map phi(x) = sqrt(v) x in R^D, prior w ~ N(0, I).
    D, mb, mr = 7, 3, 4
    g = torch.Generator().manual_seed(3)
    X = torch.randn(5, D, generator=g, dtype=DT)
    Y = torch.randn(5, 1, generator=g, dtype=DT)
    kern = LinearKernel().to(DT)
    with torch.no_grad():
        kern.variance = torch.tensor(1.7, dtype=DT)
    m = DecoupledSVGP(X, Y, num_mean_bases=mb + mr, num_cov_bases=mb, covar_module=kern)
    with torch.no_grad():
        m.mean_module.constant.zero_()
    beta = torch.randn(mb, D, generator=g, dtype=DT)
    alpha = torch.randn(mr, D, generator=g, dtype=DT)
    L = torch.randn(mb, mb, generator=g, dtype=DT)
    a_b, a_a = torch.randn(mb, generator=g, dtype=DT), torch.randn(mr, generator=g, dtype=DT)
    m.set_variational_parameters(beta, L, a_b, alpha, a_a)
    v = kern.variance.detach()
    phi = lambda Z: Z * v.sqrt()  # noqa: E731
    # Explicit q = N(mu, Sigma) with mu = Psi_alpha a, Sigma = (I + Psi_beta B Psi_beta^T)^-1.
    mu = phi(torch.cat([beta, alpha])).T @ torch.cat([a_b, a_a])
    Pb = phi(beta).T
    Sigma = torch.linalg.inv(torch.eye(D, dtype=DT) + Pb @ (L @ L.T) @ Pb.T)
    kl_dense = 0.5 * (torch.trace(Sigma) + mu @ mu - D - torch.logdet(Sigma))
    kl = m.kl_divergence()
    assert abs(float(kl.detach() - kl_dense)) < 1e-10
    # The predictive GP is phi(x)^T mu, phi(x)^T Sigma phi(x').
    Xt = torch.randn(4, D, generator=g, dtype=DT)
    post = m.posterior(Xt)
    s = m.outcome_std
    assert torch.allclose(post.mean.squeeze(-1), (phi(Xt) @ mu) * s + m.outcome_mean, atol=1e-10)
    assert torch.allclose(post.covariance_matrix, phi(Xt) @ Sigma @ phi(Xt).T * s**2, atol=1e-10)
    # Gaussian expected log likelihood (Eq. 10) with the decoupled mean, from the same Gaussians.
    yt = torch.randn(4, generator=g, dtype=DT)
    s2 = m.likelihood.noise.detach()
    mf, vf = phi(Xt) @ mu, (phi(Xt) @ Sigma * phi(Xt)).sum(-1)
    ell_dense = -0.5 * (torch.log(2 * math.pi * s2) + ((yt - mf) ** 2 + vf) / s2).sum()
    assert abs(float(m.expected_log_likelihood(Xt, yt).detach() - ell_dense)) < 1e-10


def test_elbo_equals_exact_marginal_likelihood_and_predictive_equals_exact_gp():
    X, Y = _data(20, seed=1)
    m = DecoupledSVGP(X, Y, num_mean_bases=40, num_cov_bases=25)
    e = OnlineExactGP(X, Y)
    with torch.no_grad():
        for mod in (m, e):
            mod.covar_module.lengthscale = torch.tensor([[0.25, 0.4]], dtype=DT)
            mod.likelihood.noise = torch.tensor([0.03], dtype=DT)
            mod.mean_module.constant.fill_(-0.1)
    # Set alpha = beta = X, a = (K + s2 I)^-1 (y - c), B = s2^-1 I by hand (dense solve).
    s2 = 0.03
    K = m.covar_module(m.train_X).to_dense()
    a = torch.linalg.solve(K + s2 * torch.eye(20, dtype=DT), m.train_y + 0.1)
    m.set_variational_parameters(m.train_X, torch.eye(20, dtype=DT) / math.sqrt(s2), a)
    elbo = m.elbo()
    exact = e.marginal_log_likelihood(include_priors=False) * 20
    assert abs(float(elbo.detach() - exact.detach())) < 1e-8
    Xt = torch.rand(7, 2, generator=torch.Generator().manual_seed(5), dtype=DT)
    p1, p2 = m.posterior(Xt, observation_noise=True), e.posterior(Xt, observation_noise=True)
    assert torch.allclose(p1.mean, p2.mean, atol=1e-8)
    assert torch.allclose(p1.covariance_matrix, p2.covariance_matrix, atol=1e-8)
    # Constructed from few points the model *starts* as the exact GP.
    m2 = DecoupledSVGP(X, Y, num_mean_bases=40, num_cov_bases=25)
    with torch.no_grad():
        m2.covar_module.lengthscale = torch.tensor([[0.25, 0.4]], dtype=DT)
        m2.likelihood.noise = torch.tensor([0.03], dtype=DT)
        m2.mean_module.constant.fill_(-0.1)
        m2._set_exact_state(m2.train_X)
    assert torch.allclose(m2.posterior(Xt).mean, p2.mean, atol=1e-8)


def test_minibatch_elbo_and_column_subsampling_are_unbiased():
    m = _generic_model(n=12, mb=4, ma=8)
    full = m.elbo()
    # Averaging the minibatch estimate over a partition of the data gives the full ELL exactly.
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    kl = m.kl_divergence()
    parts = [m.elbo(perm[i : i + 4]) + kl for i in range(0, 12, 4)]
    assert abs(float((sum(parts) / 3 - kl - full).detach())) < 1e-10
    # The column-subsampled a^T K_alpha a averaged over every subset of size 3 is exact.
    M = m.num_alpha
    ests = [m.kl_divergence(columns=torch.tensor(S)) for S in itertools.combinations(range(M), 3)]
    assert abs(float(torch.stack(ests).mean() - kl)) < 1e-10
    assert float(torch.stack(ests).std()) > 1e-3  # the estimate really is random


def test_gaussian_expected_log_likelihood_matches_quadrature():
    m = _generic_model(n=10)
    X, y = m.train_X, m.train_y
    closed = m.expected_log_likelihood(X, y)
    m.ensure_caches()
    mvn = m._latent_posterior(X.unsqueeze(0))
    mean, var = mvn.mean.squeeze(0).detach(), mvn.variance.squeeze(0).detach()

    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    f = mean.unsqueeze(-1) + var.sqrt().unsqueeze(-1) * torch.tensor(nodes, dtype=DT)
    s2 = m.likelihood.noise.detach()
    logp = -0.5 * (torch.log(2 * math.pi * s2) + (y.unsqueeze(-1) - f) ** 2 / s2)
    quad = (logp * torch.tensor(weights / weights.sum(), dtype=DT)).sum()
    assert abs(float(closed - quad)) < 1e-8


# ---------------------------------------------------------------------- (2) conditioning


def _dense_condition(model, Xn, Yn, noise, Xt):
    r"""Posterior-as-prior: condition the model's own joint posterior on (Xn, Yn) densely."""
    q = Xn.shape[-2]
    post = model.posterior(torch.cat([Xn, Xt], dim=-2))
    mu, S = post.mean.squeeze(-1), post.covariance_matrix
    Snn = S[..., :q, :q] + torch.diag_embed(noise)
    Stn = S[..., q:, :q]
    gain = Stn @ torch.linalg.inv(Snn)
    mean = mu[..., q:] + (gain @ (Yn.squeeze(-1) - mu[..., :q]).unsqueeze(-1)).squeeze(-1)
    cov = S[..., q:, q:] - gain @ Stn.transpose(-1, -2)
    return mean, cov


@pytest.mark.parametrize("q", [1, 3])
def test_conditioning_equals_posterior_as_prior(q):
    m = _generic_model()
    g = torch.Generator().manual_seed(11)
    Xn = torch.rand(q, 2, generator=g, dtype=DT)
    Yn = torch.randn(q, 1, generator=g, dtype=DT)
    Xt = torch.rand(6, 2, generator=g, dtype=DT)
    noise_user = m.likelihood.noise.detach() * m.outcome_std**2
    mean_ref, cov_ref = _dense_condition(m, Xn, Yn, noise_user.expand(q), Xt)
    before = _state(m)
    c = m.condition_on_observations(Xn, Yn)
    assert _same_state(before, _state(m))  # the original model is untouched
    pc = c.posterior(Xt)
    assert torch.allclose(pc.mean.squeeze(-1), mean_ref, atol=1e-10, rtol=0)
    assert torch.allclose(pc.covariance_matrix, cov_ref, atol=1e-10, rtol=0)
    assert c.num_beta == m.num_beta + q and c.num_alpha == m.num_alpha + q
    m.update(Xn, Yn)
    pu = m.posterior(Xt)
    assert torch.allclose(pu.mean.squeeze(-1), mean_ref, atol=1e-10, rtol=0)
    assert torch.allclose(pu.covariance_matrix, cov_ref, atol=1e-10, rtol=0)
    # The Cholesky of H kept by the bordered append equals a fresh factorisation.
    m.invalidate_caches()
    fresh = m._chol_H(m.beta_points, m.L)
    assert torch.allclose(fresh, m.chol_H, atol=1e-10)


def test_chain_of_50_updates_equals_joint_conditioning():
    m = _generic_model(seed=4)
    g = torch.Generator().manual_seed(12)
    sizes = [1, 2, 1, 3] * 12 + [1, 1]  # 50 updates
    Xs = [torch.rand(s, 2, generator=g, dtype=DT) for s in sizes]
    Ys = [torch.randn(s, 1, generator=g, dtype=DT) for s in sizes]
    noises = [0.02 + 0.05 * torch.rand(s, 1, generator=g, dtype=DT) for s in sizes]  # user units
    Xt = torch.rand(5, 2, generator=g, dtype=DT)
    mean_ref, cov_ref = _dense_condition(
        m, torch.cat(Xs), torch.cat(Ys), torch.cat(noises).squeeze(-1), Xt
    )
    for X, Y, N in zip(Xs, Ys, noises):
        m.update(X, Y, noise=N)
    p = m.posterior(Xt)
    assert torch.allclose(p.mean.squeeze(-1), mean_ref, atol=1e-10, rtol=0)
    assert torch.allclose(p.covariance_matrix, cov_ref, atol=1e-10, rtol=0)
    assert m.num_beta == 6 + sum(sizes) and m.num_data == 30 + sum(sizes)


def test_fantasize_shares_covariance_and_matches_conditioning():
    m = _generic_model()
    Xf = torch.rand(3, 2, 2, generator=torch.Generator().manual_seed(2), dtype=DT)  # b=3, q=2
    sampler = SobolQMCNormalSampler(torch.Size([4]), seed=0)
    f = m.fantasize(Xf, sampler)
    assert f.batch_shape == torch.Size([4, 3])
    assert f.L.shape[:-2] == torch.Size([3]) and f.chol_H.shape[:-2] == torch.Size([3])
    Xt = torch.rand(3, 5, 2, generator=torch.Generator().manual_seed(9), dtype=DT)
    pf = f.posterior(Xt)
    # Each fantasy equals conditioning on that sample's Y.
    Yf = sampler(m.posterior(Xf, observation_noise=True))  # 4 x 3 x 2 x 1
    noise_user = m.likelihood.noise.detach() * m.outcome_std**2
    for s in range(4):
        mean_ref, cov_ref = _dense_condition(m, Xf, Yf[s], noise_user.expand(3, 2), Xt)
        assert torch.allclose(pf.mean[s].squeeze(-1), mean_ref, atol=1e-9)
        assert torch.allclose(pf.covariance_matrix[s], cov_ref, atol=1e-9)


def test_fantasy_posterior_does_not_copy_the_covariance_factor_per_sample():
    r"""qKG's pattern: a fantasy model (``S x b`` batch, ``L``/``chol_H`` shared by the S samples,
    ``b x M x M``) asked for its posterior at ``S x b x 1 x d``. ``torch.matmul`` broadcasting
    copied ``L`` once per sample (``S x b x M x M``: 260 MB for qKG at 32 fantasies, 64 raw
    samples, M_beta = 128); the product is now folded into columns (linear in S)."""
    m = _generic_model(mb=24, ma=30)
    S, b = 16, 8
    g = torch.Generator().manual_seed(3)
    Xf = torch.rand(b, 1, 2, generator=g, dtype=DT)
    with torch.no_grad():
        f = m.fantasize(Xf, SobolQMCNormalSampler(torch.Size([S]), seed=0))
        M = f.L.shape[-1]
        assert f.L.shape == (b, M, M) and f.batch_shape == (S, b)
        Xt = torch.rand(S, b, 1, 2, generator=g, dtype=DT)
        f.posterior(Xt[:1, :1])  # caches built outside the measurement
        with LargestAllocation(count_views=True) as largest:
            p = f.posterior(Xt)
            mean, var = p.mean, p.variance
        assert largest.numel < S * b * M * M // 4, (largest.numel, S * b * M * M)
        for s in (0, S - 1):  # the same values as one sample at a time
            ps = f.posterior(Xt[s])
            torch.testing.assert_close(mean[s], ps.mean[s], atol=1e-12, rtol=0)
            torch.testing.assert_close(var[s], ps.variance[s], atol=1e-12, rtol=0)


def test_fantasy_factors_are_not_formed_per_candidate_set():
    r"""qNIPV's and qKG's pattern: fantasies at ``b x q`` candidate sets, the fantasy model's
    posterior asked at integration points shared by every set (``k x d``) and at points of its
    own (``b x k x d``). Conditioning formed ``L'`` and ``chol_H'`` whole for every set
    (``b x (M_b + q) x (M_b + q)`` each, and the posterior ``b x k x (M_b + q)`` kernel blocks
    against the grown bases): qNIPV at b = 512, q = 3, 128 points on a model of 512 covariance
    bases peaked at 3.1 GB and 27 s. The fantasy model now keeps the parent's blocks shared and
    only the new rows per set; its posterior (and the gradient in the candidates) equals the
    dense posterior-as-prior conditioning of each set, and forming the factors whole on read
    gives the same model."""
    m = _generic_model(mb=24, ma=30)
    b, q, k = 16, 2, 5
    g = torch.Generator().manual_seed(7)
    Xf = torch.rand(b, q, 2, generator=g, dtype=DT)
    Xt = torch.rand(k, 2, generator=g, dtype=DT)
    Xtb = torch.rand(b, k, 2, generator=g, dtype=DT)
    sampler = SobolQMCNormalSampler(torch.Size([2]), seed=0)
    M = m.num_beta + q
    with torch.no_grad():
        m.posterior(Xt).variance  # caches built outside the measurement
        with LargestAllocation(count_views=True) as largest:
            f = m.fantasize(Xf, sampler)
            f.posterior(Xt).variance
        assert largest.numel < b * M * M // 4, (largest.numel, b * M * M)
    Yf = sampler(m.posterior(Xf, observation_noise=True)).detach()  # 2 x b x q x 1
    noise_user = (m.likelihood.noise * m.outcome_std**2).detach().expand(q)
    x = Xf.clone().requires_grad_(True)
    x_ref = Xf.clone().requires_grad_(True)
    f = m.condition_on_observations(x, Yf)  # what fantasize conditions on, with a gradient
    assert f.batch_shape == (2, b)
    for points in (Xt, Xtb):
        p = f.posterior(points)
        mean, cov = p.mean.squeeze(-1), p.covariance_matrix
        assert mean.shape == (2, b, k) and cov.shape == (2, b, k, k)
        total = mean.sum() + cov.sum()
        total_ref = 0.0
        for s, i in itertools.product(range(2), range(b)):
            Xi = points if points.dim() == 2 else points[i]
            mean_ref, cov_ref = _dense_condition(m, x_ref[i], Yf[s, i], noise_user, Xi)
            torch.testing.assert_close(mean[s, i], mean_ref, atol=1e-10, rtol=0)
            torch.testing.assert_close(cov[s, i], cov_ref, atol=1e-10, rtol=0)
            total_ref = total_ref + mean_ref.sum() + cov_ref.sum()
        (grad,) = torch.autograd.grad(total, x, retain_graph=True)
        (grad_ref,) = torch.autograd.grad(total_ref, x_ref, retain_graph=True)
        torch.testing.assert_close(grad, grad_ref, atol=1e-9, rtol=0)
    # The factors formed whole on read (a fantasy of the fantasy reads them) predict the same.
    with torch.no_grad():
        before = f.posterior(Xtb)
        assert f.L.shape == (b, M, M) and f.chol_H.shape == (b, M, M)
        after = f.posterior(Xtb)
        torch.testing.assert_close(after.mean, before.mean, atol=1e-12, rtol=0)
        torch.testing.assert_close(
            after.covariance_matrix, before.covariance_matrix, atol=1e-12, rtol=0
        )


def test_bad_input_raises_and_leaves_state_unchanged():
    m = _generic_model()
    before = _state(m)
    X = torch.rand(2, 2, dtype=DT)
    bad = [
        (X, torch.tensor([[float("nan")], [0.0]], dtype=DT), None),
        (torch.rand(2, 3, dtype=DT), torch.zeros(2, 1, dtype=DT), None),
        (X, torch.zeros(3, 1, dtype=DT), None),
        (X, torch.zeros(2, 1, dtype=DT), torch.tensor([[-1.0], [0.1]], dtype=DT)),
        (X, torch.zeros(2, 1, dtype=DT), torch.tensor([[0.0], [0.1]], dtype=DT)),  # zero noise
    ]
    for Xb, Yb, Nb in bad:
        with pytest.raises(ValueError):
            m.update(Xb, Yb, noise=Nb)
        assert _same_state(before, _state(m))
    fixed = DecoupledSVGP(*_data(8), train_Yvar=torch.full((8, 1), 0.01, dtype=DT))
    before = _state(fixed)
    with pytest.raises(ValueError, match="noise"):
        fixed.update(X, torch.zeros(2, 1, dtype=DT))  # fixed noise needs noise
    assert _same_state(before, _state(fixed))
    with pytest.raises(ValueError):
        DecoupledSVGP(X, torch.zeros(2, 1, dtype=DT), num_mean_bases=2, num_cov_bases=4)
    bounded = DecoupledSVGP(*_data(8), bounds=torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT))
    before = _state(bounded)
    with pytest.raises(ValueError, match="outside"):
        bounded.update(torch.tensor([[1.5, 0.2]], dtype=DT), torch.zeros(1, 1, dtype=DT))
    assert _same_state(before, _state(bounded))


def test_state_dict_round_trip_after_growth():
    m = _generic_model()
    m.update(torch.rand(4, 2, dtype=DT), torch.randn(4, 1, dtype=DT))
    fresh = _generic_model()
    fresh.load_state_dict(m.state_dict())
    Xt = torch.rand(5, 2, dtype=DT)
    assert torch.equal(fresh.posterior(Xt).mean, m.posterior(Xt).mean)
    assert torch.equal(fresh.posterior(Xt).covariance_matrix, m.posterior(Xt).covariance_matrix)


@pytest.mark.parametrize("acqf", ["qUCB", "qLogEI", "qNIPV"])
def test_works_under_botorch_acquisitions(acqf):
    X, Y = _data(8, seed=3)
    m = DecoupledSVGP(X, Y, num_mean_bases=16, num_cov_bases=6)
    m.fit(max_iter=10, lr=0.05)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    sampler = SobolQMCNormalSampler(torch.Size([16]), seed=0)
    if acqf == "qUCB":
        acq = qUpperConfidenceBound(m, beta=2.0, sampler=sampler)
    elif acqf == "qLogEI":
        acq = qLogExpectedImprovement(m, best_f=Y.max(), sampler=sampler)
    else:
        pts = torch.rand(32, 2, generator=torch.Generator().manual_seed(0), dtype=DT)
        one = SobolQMCNormalSampler(torch.Size([1]))
        acq = qNegIntegratedPosteriorVariance(m, mc_points=pts, sampler=one)
    cand, val = optimize_acqf(
        acq, bounds=bounds, q=2, num_restarts=2, raw_samples=16, options={"maxiter": 8}
    )
    assert cand.shape == (2, 2) and bool(torch.isfinite(val).all())
    assert bool(((cand >= 0) & (cand <= 1)).all())
    m.update(cand, torch.sin(5 * cand).sum(-1, keepdim=True))
    assert m.num_data == 10


# ---------------------------------------------------------------------- (3) training


def test_median_heuristic_initialisation():
    X, Y = _data(40)
    m = DecoupledSVGP(X, Y, lengthscale_init="median")
    med = torch.pdist(X).median()
    assert torch.allclose(m.covar_module.lengthscale.detach(), med.expand(1, 2), atol=1e-6)


def test_fit_adam_improves_elbo_grows_bases_and_keeps_L_nonzero():
    X, Y = _data(120, seed=5)
    m = DecoupledSVGP(X[:3], Y[:3], num_mean_bases=40, num_cov_bases=10)
    # Hand the model the full data, as a refit after many updates would see it.
    m.train_X, m.train_y = X, m._standardize(Y).squeeze(-1)
    m.invalidate_caches()
    before = float(m.elbo())
    m.fit(
        max_iter=25,
        lr=0.05,
        batch_size=48,
        grow=4,
        num_kl_columns=10,
        compress=False,
        restandardize=False,
    )
    assert m.num_beta == 10 and m.num_alpha == 40
    assert float(m.elbo()) > before
    assert float(m.L.abs().sum()) > 0


def test_fit_compresses_after_conditioning_and_small_data_is_exact():
    X, Y = _data(6, seed=6)
    m = DecoupledSVGP(X, Y, num_mean_bases=12, num_cov_bases=8)
    Xn, Yn = _data(10, seed=7)
    for i in range(10):
        m.update(Xn[i : i + 1], Yn[i : i + 1])
    assert m.num_beta == 16 and m.num_alpha == 16
    m.fit(max_iter=30, lr=0.05)
    assert m.num_beta == 8 and m.num_alpha == 12
    Xt = torch.rand(5, 2, dtype=DT)
    assert bool(torch.isfinite(m.posterior(Xt).variance).all())
    # With all data inside the covariance bases, fit ends at the exact GP for its hyperparameters.
    s = DecoupledSVGP(X, Y, num_mean_bases=12, num_cov_bases=8)
    s.fit(max_iter=30, lr=0.05)
    e = OnlineExactGP(X, Y, covar_module=s.covar_module, likelihood=s.likelihood)
    e.mean_module = s.mean_module
    assert torch.allclose(s.posterior(Xt).mean, e.posterior(Xt).mean, atol=1e-8)
    assert torch.allclose(s.posterior(Xt).variance, e.posterior(Xt).variance, atol=1e-8)


def test_whitened_training_coordinates_round_trip_and_lbfgs_fit():
    m = _generic_model(seed=8)
    Xt = torch.rand(5, 2, generator=torch.Generator().manual_seed(1), dtype=DT)
    before = m.posterior(Xt)
    m.fit(max_iter=0, restandardize=False, compress=False)  # whiten and un-whiten only
    after = m.posterior(Xt)
    assert torch.allclose(before.mean, after.mean, atol=1e-7)
    assert torch.allclose(before.covariance_matrix, after.covariance_matrix, atol=1e-7)
    e0 = float(m.elbo().detach())
    m.fit(method="lbfgs", max_iter=15, restandardize=False, compress=False)
    assert float(m.elbo().detach()) > e0


def test_init_hyperparameters_maximise_exact_marginal_likelihood_of_subset():
    X, Y = _data(40, seed=9)
    m = DecoupledSVGP(X, Y, num_mean_bases=30, num_cov_bases=10)
    e = OnlineExactGP(X, Y, covar_module=m.covar_module, likelihood=m.likelihood)
    e.mean_module = m.mean_module
    before = float(e.marginal_log_likelihood(include_priors=False))
    m.fit(max_iter=0, init_hyperparameters=40, restandardize=False, compress=False)  # subset = all
    assert float(e.marginal_log_likelihood(include_priors=False)) > before + 0.1


def test_adam_step_count_and_wall_clock_budget():
    X, Y = _data(60, seed=11)
    m = DecoupledSVGP(X, Y, num_mean_bases=20, num_cov_bases=8)
    m.fit(max_iter=7, lr=0.01, restandardize=False, compress=False)
    assert m.last_fit_steps == 7
    # A zero budget stops after the first step: time-matched comparisons take what fits.
    m.fit(max_iter=10**6, lr=0.01, timeout_sec=0.0, restandardize=False, compress=False)
    assert m.last_fit_steps == 1


def test_scaled_kernel_without_priors_reproduces_exact_gp():
    # The experiment's paper-style modules (rho^2 * SE kernel, no hyperpriors): with the bases
    # equal to the data the model is the exact GP for any hyperparameters.
    from gpytorch.kernels import RBFKernel, ScaleKernel
    from gpytorch.likelihoods import GaussianLikelihood

    X, Y = _data(25, seed=13)
    k, lik = ScaleKernel(RBFKernel(ard_num_dims=2)).to(DT), GaussianLikelihood().to(DT)
    with torch.no_grad():
        k.outputscale = torch.tensor(1.7, dtype=DT)
        k.base_kernel.lengthscale = torch.tensor([[0.3, 0.6]], dtype=DT)
        lik.noise = torch.tensor([0.02], dtype=DT)
    m = DecoupledSVGP(X, Y, num_mean_bases=25, num_cov_bases=25, covar_module=k, likelihood=lik)
    e = OnlineExactGP(X, Y, covar_module=k, likelihood=lik)
    e.mean_module = m.mean_module
    Xt = torch.rand(6, 2, generator=torch.Generator().manual_seed(2), dtype=DT)
    pm, pe = m.posterior(Xt), e.posterior(Xt)
    assert torch.allclose(pm.mean, pe.mean, atol=1e-8)
    assert torch.allclose(pm.covariance_matrix, pe.covariance_matrix, atol=1e-8)
    assert float(m._log_prior()) == 0.0  # no priors registered: the ELBO is the paper's


def test_refresh_equals_closed_form_optimum():
    X, Y = _data(60, seed=10)
    m = DecoupledSVGP(X, Y, num_mean_bases=20, num_cov_bases=8)
    m.fit(max_iter=5, lr=0.01, refresh=True, restandardize=False, compress=False)
    # The refreshed (a, L) maximise the ELBO over (a, B) for the trained bases/hyperparameters
    # (all 60 points are used, no subsample): L-BFGS over (a, L) alone cannot improve it, while
    # it does improve the un-refreshed state.
    e_ref = float(m.elbo().detach())
    m.fit(
        method="lbfgs",
        max_iter=40,
        train_hyperparameters=False,
        learn_inducing=False,
        restandardize=False,
        compress=False,
    )
    assert float(m.elbo().detach()) - e_ref < 1e-5 * abs(e_ref)
    n = DecoupledSVGP(X, Y, num_mean_bases=20, num_cov_bases=8)
    n.fit(max_iter=5, lr=0.01, restandardize=False, compress=False)
    e_raw = float(n.elbo().detach())
    n.fit(
        method="lbfgs",
        max_iter=40,
        train_hyperparameters=False,
        learn_inducing=False,
        restandardize=False,
        compress=False,
    )
    assert float(n.elbo().detach()) - e_raw > 1e-3 * abs(e_raw)


def test_non_gaussian_likelihood_uses_quadrature_and_refuses_closed_form_conditioning():
    from gpytorch.likelihoods import BernoulliLikelihood

    X, _ = _data(12, seed=12)
    labels = (torch.sin(6 * X[:, :1]) > 0).to(DT)
    m = DecoupledSVGP(
        X, labels, num_mean_bases=12, num_cov_bases=6, likelihood=BernoulliLikelihood()
    )
    assert torch.equal(m.train_y, labels.squeeze(-1))  # labels are not standardised
    m.ensure_caches()
    mvn = m._latent_posterior(X.unsqueeze(0))
    mean, var = mvn.mean.squeeze(0).detach(), mvn.variance.squeeze(0).detach()
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    f = mean.unsqueeze(-1) + var.sqrt().unsqueeze(-1) * torch.tensor(nodes, dtype=DT)
    y = labels  # log Phi(+-f) without underflow at the outer nodes (log of a 0 CDF is -inf)
    logp = y * torch.special.log_ndtr(f) + (1 - y) * torch.special.log_ndtr(-f)
    ref = (logp * torch.tensor(weights / weights.sum(), dtype=DT)).sum()
    ell = m.expected_log_likelihood(X, m.train_y)
    assert abs(float(ell - ref)) < 1e-3 * abs(float(ref))  # GPyTorch's 20-point quadrature
    before = float(m.elbo().detach())
    m.fit(max_iter=15, lr=0.05)
    assert torch.equal(m.train_y, labels.squeeze(-1))
    assert float(m.elbo().detach()) > before
    state = _state(m)
    with pytest.raises(ValueError, match="Gaussian"):
        m.update(X[:1], labels[:1])
    assert _same_state(state, _state(m))


def test_update_keeps_no_autograd_graph_in_caches():
    """In-place updates (OnlineModel.update) leave no autograd graph in the cached state."""
    m = _generic_model()
    for seed in (1, 2):
        Xn, Yn = _data(1, seed=40 + seed)
        m.update(Xn, Yn)
    grads = [k for k, v in m._buffers.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    assert grads == []


def test_basis_counts_given_wrongly_are_refused_and_whole_numbers_of_any_type_taken():
    """``num_cov_bases=2.5`` (e.g. from Ax model_options) was cut to 2 without a word and
    ``"128"`` failed in a comparison (TypeError); they are refused with the option's name, and
    whole numbers given as floats or NumPy integers build the same model as the ints."""
    X, Y = _data(20)
    for name, bad in (
        ("num_cov_bases", 2.5),
        ("num_cov_bases", "8"),
        ("num_mean_bases", 16.5),
        ("warm_start_points", -1),
        ("max_basis_growth", 1.5),
        ("exact_fit_points", True),
    ):
        with pytest.raises(ValueError, match=f"{name} must be an integer >= "):
            DecoupledSVGP(X, Y, **{"num_mean_bases": 16, "num_cov_bases": 8, name: bad})
    ints = DecoupledSVGP(X, Y, num_mean_bases=16, num_cov_bases=8)
    other = DecoupledSVGP(X, Y, num_mean_bases=np.int64(16), num_cov_bases=8.0)
    assert (other.num_mean_bases, other.num_cov_bases) == (16, 8)
    assert type(other.num_cov_bases) is int
    Xt = _data(5, seed=3)[0]
    with torch.no_grad():
        torch.testing.assert_close(other.posterior(Xt).mean, ints.posterior(Xt).mean)
