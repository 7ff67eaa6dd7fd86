r"""TSVGP with m > 1 independent outputs (outputs as an internal batch dimension, BoTorch's
batched multi-output layout) against m single-output TSVGPs computed separately."""

from __future__ import annotations

import pytest
import torch
from botorch.acquisition import UpperConfidenceBound, qUpperConfidenceBound
from botorch.acquisition.objective import ScalarizedPosteriorTransform
from botorch.optim import optimize_acqf
from botorch.sampling.normal import SobolQMCNormalSampler
from gpytorch.distributions import MultitaskMultivariateNormal

from bo_online.models.tsvgp import TSVGP

DT = torch.float64
M_OUT, D, N, M_IND = 3, 2, 40, 12
LS = torch.tensor([[0.3, 0.5], [0.6, 0.2], [0.4, 0.4]], dtype=DT)
NOISE = torch.tensor([0.01, 0.05, 0.2], dtype=DT)
CONST = torch.tensor([0.1, -0.3, 0.2], dtype=DT)


def data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(N, D, generator=g, dtype=DT)
    F = torch.stack([torch.sin(6 * X[:, 0]), X.sum(-1) ** 2, torch.cos(4 * X[:, 1])], -1)
    Y = F * torch.tensor([1.0, 3.0, 0.5], dtype=DT) + 0.1 * torch.randn(
        N, M_OUT, generator=g, dtype=DT
    )
    Z = torch.rand(M_IND, D, generator=g, dtype=DT)
    return X, Y, Z


def models(X, Y, Z):
    multi = TSVGP(X, Y, inducing_points=Z)
    with torch.no_grad():
        multi.covar_module.lengthscale = LS.unsqueeze(-2)
        multi.likelihood.gaussian.noise = NOISE.unsqueeze(-1)
        multi.mean_module.constant.copy_(CONST)
    singles = []
    for j in range(M_OUT):
        s = TSVGP(X, Y[:, j : j + 1], inducing_points=Z)
        with torch.no_grad():
            s.covar_module.lengthscale = LS[j]
            s.likelihood.gaussian.noise = NOISE[j]
            s.mean_module.constant.fill_(CONST[j])
        singles.append(s)
    return multi, singles


def assert_matches(post, singles_posts, tol=1e-10):
    r"""``post`` (MTMVN over batch x q x m) equals the independent single-output posteriors."""
    mvn = post.distribution
    assert isinstance(mvn, MultitaskMultivariateNormal)
    mean = post.mean  # batch x q x m
    C = mvn.covariance_matrix  # batch x qm x qm, interleaved (point-major)
    m = len(singles_posts)
    for j, sp in enumerate(singles_posts):
        assert torch.allclose(mean[..., j], sp.mean.squeeze(-1), atol=tol, rtol=0)
        assert torch.allclose(C[..., j::m, j::m], sp.covariance_matrix, atol=tol, rtol=0)
        for k in range(m):
            if k != j:
                assert C[..., j::m, k::m].abs().max() == 0  # independent outputs


def test_shapes_and_posterior_match_singles():
    X, Y, Z = data()
    multi, singles = models(X, Y, Z)
    assert multi.num_outputs == M_OUT and singles[0].num_outputs == 1
    assert multi.outcome_mean.shape == (M_OUT,)
    Xt = torch.rand(2, 5, D, dtype=DT, generator=torch.Generator().manual_seed(1))
    post = multi.posterior(Xt)
    assert post.mean.shape == (2, 5, M_OUT)
    assert_matches(post, [s.posterior(Xt) for s in singles])
    post = multi.posterior(Xt, observation_noise=True)
    assert_matches(post, [s.posterior(Xt, observation_noise=True) for s in singles])
    # KL, ELBO and q(u), per output
    kl = multi.kl_divergence()
    for j, s in enumerate(singles):
        assert torch.allclose(kl[j], s.kl_divergence(), atol=1e-10)
        m_u, S_u = multi.q_u()
        sm, sS = s.q_u()
        assert torch.allclose(m_u[j], sm, atol=1e-10) and torch.allclose(S_u[j], sS, atol=1e-10)
    assert torch.allclose(multi.elbo(), sum(s.elbo() for s in singles), atol=1e-9)


def test_output_indices():
    X, Y, Z = data()
    multi, singles = models(X, Y, Z)
    Xt = torch.rand(4, D, dtype=DT, generator=torch.Generator().manual_seed(2))
    p1 = multi.posterior(Xt, output_indices=[1])
    s1 = singles[1].posterior(Xt)
    assert p1.mean.shape == (4, 1)
    assert torch.allclose(p1.mean, s1.mean, atol=1e-10)
    assert torch.allclose(p1.covariance_matrix, s1.covariance_matrix, atol=1e-10)
    p02 = multi.posterior(Xt, output_indices=[0, 2])
    assert_matches(p02, [singles[0].posterior(Xt), singles[2].posterior(Xt)])
    with pytest.raises(ValueError, match="output_indices"):
        multi.posterior(Xt, output_indices=[3])


def test_update_condition_and_fantasize_match_singles():
    X, Y, Z = data()
    multi, singles = models(X, Y, Z)
    g = torch.Generator().manual_seed(3)
    Xn, Yn = torch.rand(3, D, generator=g, dtype=DT), torch.randn(3, M_OUT, generator=g, dtype=DT)
    multi.update(Xn, Yn)
    for j, s in enumerate(singles):
        s.update(Xn, Yn[:, j : j + 1])
    Xt = torch.rand(6, D, dtype=DT, generator=g)
    assert_matches(multi.posterior(Xt), [s.posterior(Xt) for s in singles])
    # conditioning on batched (fantasy-like) observations: sample x batch x q x m
    Xc = torch.rand(2, 4, D, generator=g, dtype=DT)
    Yc = torch.randn(5, 2, 4, M_OUT, generator=g, dtype=DT)
    cm = multi.condition_on_observations(Xc, Yc)
    assert cm.batch_shape == (5, 2)
    cs = [s.condition_on_observations(Xc, Yc[..., j : j + 1]) for j, s in enumerate(singles)]
    assert_matches(cm.posterior(Xt), [c.posterior(Xt) for c in cs])
    # conditioning a conditioned model again
    Yc2 = torch.randn(5, 2, 1, M_OUT, generator=g, dtype=DT)
    Xc2 = torch.rand(2, 1, D, generator=g, dtype=DT)
    cm2 = cm.condition_on_observations(Xc2, Yc2)
    cs2 = [c.condition_on_observations(Xc2, Yc2[..., j : j + 1]) for j, c in enumerate(cs)]
    assert_matches(cm2.posterior(Xt), [c.posterior(Xt) for c in cs2])
    # fantasize: a batch of fantasy models whose observations are the sampled ones
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([4]), seed=0)
    fm = multi.fantasize(Xc, sampler)
    assert fm.batch_shape == (4, 2)
    Yf = fm._user_units(fm._cy).transpose(-1, -2)  # 4 x 2 x q x m, user units
    fs = [s.condition_on_observations(Xc, Yf[..., j : j + 1]) for j, s in enumerate(singles)]
    assert_matches(fm.posterior(Xt), [f.posterior(Xt) for f in fs])
    # the untouched original still matches
    assert_matches(multi.posterior(Xt), [s.posterior(Xt) for s in singles])


def test_state_dict_roundtrip_and_bad_input():
    X, Y, Z = data()
    multi, _ = models(X, Y, Z)
    multi.update(torch.rand(2, D, dtype=DT), torch.randn(2, M_OUT, dtype=DT))
    before = {k: v.clone() for k, v in multi.state_dict().items()}
    with pytest.raises(ValueError):
        multi.update(torch.rand(2, D, dtype=DT), torch.randn(2, 1, dtype=DT))  # wrong m
    with pytest.raises(ValueError):
        bad = torch.randn(2, M_OUT, dtype=DT)
        bad[0, 1] = float("nan")
        multi.update(torch.rand(2, D, dtype=DT), bad)
    after = multi.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    clone = TSVGP(X, Y, inducing_points=Z)
    clone.load_state_dict(after)
    Xt = torch.rand(5, D, dtype=DT)
    assert torch.allclose(clone.posterior(Xt).mean, multi.posterior(Xt).mean, atol=1e-12)
    assert clone.num_data == N + 2


def test_fit_increases_elbo():
    X, Y, Z = data()
    multi, _ = models(X, Y, Z)
    e0 = float(multi.elbo().detach())
    multi.fit(max_iter=30)
    multi.ensure_caches()
    assert multi.covar_module.lengthscale.shape == (M_OUT, 1, D)
    # fit restandardises (unchanged data: same scaling), so the bound is comparable
    assert float(multi.elbo().detach()) > e0


def test_scalarized_ucb_and_optimize_acqf():
    torch.manual_seed(0)  # optimize_acqf's raw samples
    X, Y, Z = data()
    multi, singles = models(X, Y, Z)
    w = torch.tensor([0.5, -1.0, 2.0], dtype=DT)
    tf = ScalarizedPosteriorTransform(weights=w)
    Xt = torch.rand(7, 1, D, dtype=DT, generator=torch.Generator().manual_seed(4))
    ucb = UpperConfidenceBound(multi, beta=2.0, posterior_transform=tf)(Xt)
    mu = sum(w[j] * s.posterior(Xt).mean.squeeze(-1).squeeze(-1) for j, s in enumerate(singles))
    var = sum(
        w[j] ** 2 * s.posterior(Xt).variance.squeeze(-1).squeeze(-1) for j, s in enumerate(singles)
    )
    assert torch.allclose(ucb, mu + 2.0**0.5 * var.sqrt(), atol=1e-10)
    acqf = qUpperConfidenceBound(
        multi,
        beta=2.0,
        posterior_transform=tf,
        sampler=SobolQMCNormalSampler(sample_shape=torch.Size([64]), seed=0),
    )
    bounds = torch.stack([torch.zeros(D, dtype=DT), torch.ones(D, dtype=DT)])
    cand, val = optimize_acqf(acqf, bounds=bounds, q=2, num_restarts=2, raw_samples=32)
    assert cand.shape == (2, D) and bool(((cand >= 0) & (cand <= 1)).all())
    rand = torch.rand(16, 2, D, dtype=DT, generator=torch.Generator().manual_seed(5))
    assert float(val.detach()) >= float(acqf(rand).max().detach()) - 1e-9


def test_fixed_noise_outputs_match_singles():
    X, Y, Z = data()
    g = torch.Generator().manual_seed(6)
    Yvar = 0.01 + 0.05 * torch.rand(N, M_OUT, generator=g, dtype=DT)
    multi = TSVGP(X, Y, train_Yvar=Yvar, inducing_points=Z)
    with torch.no_grad():
        multi.covar_module.lengthscale = LS.unsqueeze(-2)
    singles = []
    for j in range(M_OUT):
        s = TSVGP(X, Y[:, j : j + 1], train_Yvar=Yvar[:, j : j + 1], inducing_points=Z)
        with torch.no_grad():
            s.covar_module.lengthscale = LS[j]
        singles.append(s)
    Xn, Yn = torch.rand(2, D, generator=g, dtype=DT), torch.randn(2, M_OUT, generator=g, dtype=DT)
    nn = 0.02 + 0.1 * torch.rand(2, M_OUT, generator=g, dtype=DT)
    multi.update(Xn, Yn, noise=nn)
    for j, s in enumerate(singles):
        s.update(Xn, Yn[:, j : j + 1], noise=nn[:, j : j + 1])
    Xt = torch.rand(5, D, generator=g, dtype=DT)
    assert_matches(multi.posterior(Xt), [s.posterior(Xt) for s in singles])
    assert_matches(
        multi.posterior(Xt, observation_noise=True),
        [s.posterior(Xt, observation_noise=True) for s in singles],
    )
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([3]), seed=1)
    fm = multi.fantasize(Xn, sampler)  # fantasy noise: mean training noise per output
    Yf = fm._user_units(fm._cy).transpose(-1, -2)
    noise_s = fm._cnoise[..., -2:].transpose(-1, -2)  # standardised, per output
    fs = [
        s.condition_on_observations(Xn, Yf[..., j : j + 1], noise=noise_s[..., j : j + 1])
        for j, s in enumerate(singles)
    ]
    for j, s in enumerate(singles):  # the same fantasy noise as the single model would use
        assert torch.allclose(noise_s[..., j], s._default_fantasy_noise().expand(3, 2), atol=1e-12)
    assert_matches(fm.posterior(Xt), [f.posterior(Xt) for f in fs])


def test_non_gaussian_several_outputs_rejected():
    from bo_online.likelihoods import Bernoulli

    X, _, Z = data()
    labels = (torch.rand(N, 2, dtype=DT) > 0.5).to(DT)
    with pytest.raises(ValueError, match="Gaussian likelihoods only"):
        TSVGP(X, labels, inducing_points=Z, likelihood=Bernoulli())


def test_e_steps_and_noise_tensor_match_singles():
    X, Y, Z = data()
    multi, singles = models(X, Y, Z)
    g1, beta = (t.clone() for t in multi.sites)  # m x n
    multi.set_sites(0.5 * g1, 0.7 * beta)
    for j, s in enumerate(singles):
        s.set_sites(0.5 * g1[j], 0.7 * beta[j])
    Xt = torch.rand(5, D, dtype=DT, generator=torch.Generator().manual_seed(7))
    multi.e_step(rho=0.5)
    for s in singles:
        s.e_step(rho=0.5)
    assert_matches(multi.posterior(Xt), [s.posterior(Xt) for s in singles])
    multi.e_step(rho=0.5, batch_size=10, generator=torch.Generator().manual_seed(0))
    for s in singles:  # same minibatch for every output
        s.e_step(rho=0.5, batch_size=10, generator=torch.Generator().manual_seed(0))
    assert_matches(multi.posterior(Xt), [s.posterior(Xt) for s in singles])
    obs = 0.1 * torch.rand(5, M_OUT, dtype=DT, generator=torch.Generator().manual_seed(8))
    assert_matches(
        multi.posterior(Xt, observation_noise=obs),
        [s.posterior(Xt, observation_noise=obs[:, j : j + 1]) for j, s in enumerate(singles)],
    )


def test_default_inducing_points_shared_by_outputs():
    X, Y, _ = data()
    multi = TSVGP(X, Y, inducing_points=10)
    single = TSVGP(X, Y[:, :1], inducing_points=10)  # same default kernel before fitting
    assert torch.equal(multi.inducing_points, single.inducing_points)
    assert multi.covar_module.lengthscale.shape == (M_OUT, 1, D)
    assert multi.likelihood.noise.shape == (M_OUT, 1)
