"""WISKI: learned projection for d > 3 and the Dirichlet classification layer."""

from __future__ import annotations

import pytest
import torch
from wiski_reference import dense_mll, dense_posterior

from bo_online.models import WISKI
from bo_online.models.wiski.projection import TanhProjection

DT = torch.float64


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a).detach(), torch.as_tensor(b).detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _data5(n, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 5, generator=g, dtype=DT)
    Y = torch.sin(3 * (X[:, :1] + X[:, 1:2] - X[:, 2:3])) + 0.05 * torch.randn(
        n, 1, generator=g, dtype=DT
    )
    return X, Y


def test_projection_model_matches_dense_ski_on_features():
    X, Y = _data5(80, 0)
    model = WISKI(X, Y, projection=TanhProjection(5, 2, seed=0), grid_size=14)
    assert model.num_features == 2 and model.grid.sizes == (14, 14)
    ref = dense_mll(model, X, Y, None)
    assert _rel(model.marginal_log_likelihood(include_priors=False), ref) < 1e-8
    Xt = torch.rand(6, 5, dtype=DT)
    mean_ref, cov_ref = dense_posterior(model, X, Y, None, Xt)
    post = model.posterior(Xt)
    assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-8
    assert _rel(post.mvn.covariance_matrix / model.outcome_std**2, cov_ref) < 1e-8


def test_fit_projection_improves_and_rebuilds_statistics():
    X, Y = _data5(120, 1)
    proj = TanhProjection(5, 2, seed=1)
    model = WISKI(X[:20], Y[:20], projection=proj, grid_size=14)
    model.update(X[20:], Y[20:])
    before = float(model.marginal_log_likelihood().detach())
    weight0 = proj.linear.weight.detach().clone()
    model.fit_projection(X, Y, method="adam", max_iter=30, lr=0.02)
    assert not torch.equal(proj.linear.weight, weight0)
    assert float(model.marginal_log_likelihood().detach()) > before
    # statistics are exactly those of the data under the final (fixed) projection
    scratch = WISKI(
        X,
        Y,
        projection=proj,
        grid_size=14,
        covar_module=model.covar_module,
        likelihood=model.likelihood,
    )
    ours, ref = model.statistics(), scratch.statistics()
    for name in ours:
        assert _rel(ours[name], ref[name]) < 1e-10, name
    Xt = torch.rand(4, 5, dtype=DT)
    mean_ref, _ = dense_posterior(model, X, Y, None, Xt)
    assert _rel(model.posterior(Xt).mean.squeeze(-1), mean_ref) < 1e-8


def test_dirichlet_targets_and_classifier():
    import math

    import pytest

    from bo_online.models.wiski.classification import WISKIDirichletClassifier, dirichlet_targets

    t, v = dirichlet_targets(torch.tensor([1, 0]), 3)
    a_hit, a_miss = 1.01, 0.01
    assert abs(float(v[0, 1]) - math.log(1 + 1 / a_hit)) < 1e-14
    assert abs(float(t[0, 1]) - (math.log(a_hit) - math.log(1 + 1 / a_hit) / 2)) < 1e-14
    assert abs(float(t[0, 0]) - (math.log(a_miss) - math.log(1 + 1 / a_miss) / 2)) < 1e-14
    g = torch.Generator().manual_seed(3)
    X = torch.rand(150, 2, generator=g, dtype=DT)
    labels = (X[:, 0] + 0.3 * X[:, 1] > 0.65).long()
    clf = WISKIDirichletClassifier(X[:100], labels[:100], 2, grid_size=12)
    clf.update(X[100:], labels[100:])
    clf.fit(max_iter=20)
    # each class model is the fixed-noise WISKI regression on its Dirichlet targets
    tt, vv = dirichlet_targets(labels, 2)
    ref = WISKI(X, tt[:, 1:], vv[:, 1:], grid_size=12, covar_module=clf.models[1].covar_module)
    ref.mean_module.constant = clf.models[1].mean_module.constant.detach()
    Xt = torch.rand(200, 2, generator=g, dtype=DT)
    assert _rel(clf.models[1].posterior(Xt[:20]).mean, ref.posterior(Xt[:20]).mean) < 1e-9
    yt = (Xt[:, 0] + 0.3 * Xt[:, 1] > 0.65).long()
    acc = float((clf.predict(Xt) == yt).double().mean())
    assert acc > 0.9, acc
    p = clf.predict_proba(Xt)
    torch.testing.assert_close(p.sum(-1), torch.ones(200, dtype=DT))
    assert float(((p.argmax(-1) == yt).double()).mean()) > 0.9
    before = {k: v.clone() for k, v in clf.models[0].state_dict().items()}
    with pytest.raises(ValueError, match="labels"):
        clf.update(torch.rand(2, 2, dtype=DT), torch.tensor([0, 2]))
    after = clf.models[0].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_online_projection_step_matches_full_mll_gradient():
    X, Y = _data5(60, 4)
    proj = TanhProjection(5, 2, seed=2)
    model = WISKI(X[:50], Y[:50], projection=proj, grid_size=12)
    model.likelihood.noise = 0.05
    Xn, Yn = X[50:53], Y[50:53]
    params = list(proj.parameters())
    # brute force: MLL of the old statistics plus the new points' weights under phi (O(m^3))
    from bo_online.models.wiski.statistics import _STAT_NAMES, _stats_with

    base = {k: getattr(model, k) for k in _STAT_NAMES}
    model.projection.eval()  # as projection_step uses it
    with model.projection_gradients():
        idx, val = model._interp(Xn)
    D = torch.ones(3, dtype=DT)
    full = model._mll_from_stats(
        _stats_with(base, idx, val, D, model._centred(Yn.squeeze(-1)), model.grid.num_points)
    )
    g_full = torch.autograd.grad(full, params)
    w0 = [p.detach().clone() for p in params]
    obj0 = model.projection_step(Xn, Yn, lr=1e-3)
    g_step = [(p.detach() - w) / 1e-3 for p, w in zip(params, w0)]
    for a, b in zip(g_step, g_full):
        assert _rel(a, b) < 1e-6
    obj1 = model._projection_objective(Xn, Yn.squeeze(-1), D)
    assert float(obj1.detach()) > float(obj0)  # the step ascends the objective
    model.update(Xn, Yn)
    assert model.num_data == 53


def test_qnipv_fast_path_matches_dense_ski_on_repeated_mc_points():
    r"""qNIPV's pattern: one base model fantasised on many candidate batches, each fantasy asked
    for the variance at the SAME mc_points. From the second request on the mc_points' rows (and
    their product with R A^-1 R^T) are cached; the fantasy variances and means must still equal
    the dense SKI posterior of the base data plus the candidate batch (variance: independent of
    the fantasy values)."""
    from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance
    from botorch.sampling import SobolQMCNormalSampler

    g = torch.Generator().manual_seed(3)
    X = torch.rand(40, 2, generator=g, dtype=DT)
    Y = torch.sin(5 * X[:, :1]) * X[:, 1:] + 0.05 * torch.randn(40, 1, generator=g, dtype=DT)
    model = WISKI(X, Y, grid_size=12)
    mc = torch.rand(70, 2, generator=g, dtype=DT)
    acq = qNegIntegratedPosteriorVariance(
        model, mc_points=mc, sampler=SobolQMCNormalSampler(torch.Size([1]), seed=0)
    )
    for call in range(3):  # cold cache, then cached rows
        Xc = torch.rand(4, 3, 2, generator=g, dtype=DT)
        with torch.no_grad():
            value = acq(Xc)
            fant = model.fantasize(Xc, SobolQMCNormalSampler(torch.Size([2]), seed=call))
            post = fant.posterior(mc)
        for b in (0, 3):
            Yb = fant.d_y[0, b].unsqueeze(-1)  # the fantasy values (user units)
            Xall, Yall = torch.cat([X, Xc[b]]), torch.cat([Y, Yb])
            mean_ref, cov_ref = dense_posterior(model, Xall, Yall, None, mc)
            var = post.variance[0, b].squeeze(-1) / model.outcome_std**2
            assert _rel(var, torch.diagonal(cov_ref)) < 1e-7
            assert _rel(post.mean[0, b].squeeze(-1), mean_ref) < 1e-7
            assert float(value[b]) == pytest.approx(-float(post.variance[0, b].mean()), rel=1e-9)
        assert len(model._shared["rows"]) == 5  # the mc_points' rows and their T are cached
