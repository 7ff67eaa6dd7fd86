"""WISKI's marginal likelihood with fewer observations than grid points (the rank-r factor of
``G``, bo_online/models/wiski/low_rank.py) against the dense SKI likelihood built explicitly
(wiski_reference.dense_mll) and against WISKI's own m x m path, value and gradient; and the
additive model's acquisition-time covariances read from that factor, against the dense SKI
posterior (wiski_reference.dense_posterior)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from wiski_reference import dense_mll, dense_posterior

from bo_online.models import WISKI
from bo_online.models.wiski.low_rank import low_rank_statistics

DT = torch.float64


def _data(n: int, d: int, hetero: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    Yvar = (0.02 + 0.1 * torch.rand(n, 1, generator=g, dtype=DT)) if hetero else None
    return X, Y, Yvar


def _mll_and_grad(model, low_rank: bool):
    r"""MLL (no priors) and its gradient in every hyperparameter, through the factored path or
    (``low_rank=False``) the m x m path."""
    model.zero_grad()
    model.__dict__["_low_rank_cache"] = None
    if not low_rank:  # an instance attribute shadows the method: no factor, the m x m path
        model._low_rank = lambda *args, **kwargs: None
    try:
        mll = model.marginal_log_likelihood(include_priors=False)
        mll.backward()
    finally:
        model.__dict__.pop("_low_rank", None)
    grads = torch.cat(
        [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None and p.requires_grad]
    )
    return mll.detach(), grads


@pytest.mark.parametrize("hetero", [False, True])
@pytest.mark.parametrize("structure", ["grid", "all-pairs"])
def test_factored_likelihood_equals_the_dense_and_the_m_by_m_one(structure, hetero):
    d = 2 if structure == "grid" else 4
    X, Y, Yvar = _data(25, d, hetero)
    options = {"grid_size": 14} if structure == "grid" else {"projection": "all-pairs"}
    model = WISKI(X, Y, Yvar, **options)
    model.fit(max_iter=8)  # hyperparameters away from their defaults
    active = torch.nonzero(torch.diagonal(model.G) > 0)[:, 0]
    assert 25 <= active.numel() / 2  # the factored path applies (n <= m / 2)
    assert model._low_rank(model.statistics(), active, False) is not None
    fac, g_fac = _mll_and_grad(model, low_rank=True)
    full, g_full = _mll_and_grad(model, low_rank=False)
    assert g_fac.numel() == g_full.numel() >= 3
    assert float((fac - full).abs()) < 1e-10 * abs(float(full))
    assert float((g_fac - g_full).abs().max()) < 1e-8 * float(g_full.abs().max())
    if structure == "grid":
        ref = dense_mll(model, X, Y, Yvar)
        assert float((fac - ref.detach()).abs()) < 1e-9 * abs(float(ref.detach()))


def test_factor_reproduces_the_statistics_and_declines_when_it_cannot_help():
    X, Y, _ = _data(30, 2, False)
    model = WISKI(X, Y, grid_size=14)
    active = torch.diagonal(model.G) > 0
    G, z, h = model.G[active][:, active], model.z[active], model.h[active]
    low = low_rank_statistics(G, z, h, max_rank=30)
    assert low is not None and low.rank <= 30
    assert torch.allclose(low.L @ low.L.mT, G, rtol=0, atol=1e-10 * float(G.abs().max()))
    assert torch.allclose(low.L @ low.u_z, z, rtol=0, atol=1e-9 * float(z.abs().max()))
    assert low_rank_statistics(G, z, h, max_rank=10) is None  # G has rank 30 > 10
    # single precision: factored in float64, returned in float32 (the fit's fast path)
    low32 = low_rank_statistics(G.float(), z.float(), h.float(), max_rank=30)
    assert low32 is not None and low32.L.dtype == torch.float32 and low32.rank == low.rank
    assert torch.allclose(low32.L.double(), low.L, rtol=0, atol=1e-6 * float(low.L.abs().max()))
    # more observations than half the active grid points: the m x m path
    Xb, Yb, _ = _data(120, 2, False, seed=1)
    big = WISKI(Xb, Yb, grid_size=10)
    a = torch.nonzero(torch.diagonal(big.G) > 0)[:, 0]
    assert big._low_rank(big.statistics(), a, False) is None


def test_updates_refresh_the_factor():
    X, Y, _ = _data(30, 2, False)
    model = WISKI(X[:20], Y[:20], grid_size=14)
    model.fit(max_iter=5)
    model.marginal_log_likelihood(include_priors=False)
    assert model.__dict__["_low_rank_cache"][-1].rank == 20
    model.update(X[20:], Y[20:])
    after = model.marginal_log_likelihood(include_priors=False).detach()  # the cache's key moved
    assert model.__dict__["_low_rank_cache"][-1].rank == 30
    scratch = WISKI(X, Y, grid_size=14)
    scratch.load_state_dict(model.state_dict())
    ref, _ = _mll_and_grad(scratch, low_rank=False)
    assert float((after - ref).abs()) < 1e-10 * abs(float(ref))


def test_with_a_kronecker_kernel_the_factor_serves_beyond_half_the_active_points():
    X, Y, Yvar = _data(40, 2, False, seed=2)
    model = WISKI(X, Y, Yvar, grid_size=10)  # 8 x 8 = 64 grid points that can carry weight
    model.fit(max_iter=8)
    active = torch.nonzero(torch.diagonal(model.G) > 0)[:, 0]
    full = active.numel() == model.num_grid_points
    assert active.numel() / 2 < 40 < active.numel()
    assert model._kronecker_factors() is not None
    assert model._low_rank(model.statistics(), active, full, kronecker=False) is None
    assert model._low_rank(model.statistics(), active, full, kronecker=True) is not None
    fac, g_fac = _mll_and_grad(model, low_rank=True)
    dense, g_dense = _mll_and_grad(model, low_rank=False)
    assert float((fac - dense).abs()) < 1e-10 * abs(float(dense))
    assert float((g_fac - g_dense).abs().max()) < 1e-8 * float(g_dense.abs().max())
    ref = dense_mll(model, X, Y, Yvar)
    assert float((fac - ref.detach()).abs()) < 1e-9 * abs(float(ref.detach()))


def test_clustered_observations_keep_the_factored_form_exact():
    """Observations that cluster (as a BO search's do) make ``G`` numerically rank-deficient, so
    the factor cannot reproduce ``z`` to rounding; the remainder enters the likelihood exactly."""
    g = torch.Generator().manual_seed(4)
    centres = torch.rand(12, 3, generator=g, dtype=DT)
    X = (centres.repeat(15, 1) + 1e-4 * torch.randn(180, 3, generator=g, dtype=DT)).clamp(0, 1)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.3 * torch.randn(180, 1, generator=g, dtype=DT)
    model = WISKI(X, Y, grid_size=10)
    model.fit(max_iter=8)
    active = torch.nonzero(torch.diagonal(model.G) > 0)[:, 0]
    low = model._low_rank(model.statistics(), active, False, kronecker=True)
    assert low is not None and low.rank < 180
    assert float(low.e_z.norm()) > 1e-9 * float(model.z.norm())  # z is not in the factor's range
    fac, g_fac = _mll_and_grad(model, low_rank=True)
    full, g_full = _mll_and_grad(model, low_rank=False)
    assert float((fac - full).abs()) < 1e-10 * abs(float(full))
    assert float((g_fac - g_full).abs().max()) < 1e-8 * float(g_full.abs().max())
    ref = dense_mll(model, X, Y)
    assert float((fac - ref.detach()).abs()) < 1e-9 * abs(float(ref.detach()))


def test_a_float32_model_takes_the_factored_path_and_matches_float64():
    """In float32 the factor was refused, so every likelihood evaluation took the m x m path
    (a 6-D all-pairs fit on 12 points: 0.47 s against 0.07 s per evaluation in float64). The
    factor is now computed in float64 and cast; the float32 likelihood and its gradient match
    the float64 model's at the same hyperparameters to single precision."""
    X, Y, _ = _data(20, 4, False)
    m64 = WISKI(X, Y, projection="all-pairs")
    m64.fit(max_iter=8)
    m32 = WISKI(X.float(), Y.float(), projection="all-pairs")
    m32.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in m64.state_dict().items()}
    )
    active = torch.nonzero(torch.diagonal(m32.G) > 0)[:, 0]
    assert m32._low_rank(m32.statistics(), active, False) is not None
    mll64, g64 = _mll_and_grad(m64, low_rank=True)
    # single precision's own error: the m x m path it replaces, measured 1.4e-5 (MLL,
    # relative) and 7e-4 (gradient) here; the factored path 1.5e-5 and 1e-3
    for low_rank in (True, False):
        mll32, g32 = _mll_and_grad(m32, low_rank=low_rank)
        assert abs(float(mll32) - float(mll64)) < 5e-5 * abs(float(mll64))
        assert float((g32.double() - g64).abs().max()) < 5e-3 * float(g64.abs().max())


@pytest.mark.parametrize("d", [4, 6])
def test_all_pairs_components_in_one_batched_kernel_equal_gpytorchs_per_component(d):
    r"""The loops' all-pairs structure evaluates its ``d (d - 1) / 2`` RBF components as one
    batched tensor in the factored likelihood; the likelihood with priors and its gradient in
    every hyperparameter equal those from GPyTorch's kernel called per component."""
    X, Y, _ = _data(20, d, False, seed=d)
    model = WISKI(X, Y, **{**WISKI.loop_default_options(d), "exact_max_n": 0})
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # every component different, away from the defaults
        for kernel in model.covar_module.kernels:
            kernel.base_kernel.lengthscale = 0.2 + torch.rand(1, 2, generator=g, dtype=DT)
            kernel.outputscale = 0.1 + torch.rand((), generator=g, dtype=DT)
    assert model._stacked_rbf_blocks() is not None  # the batched path applies

    def mll_and_grad():
        model.zero_grad()
        mll = model.marginal_log_likelihood(include_priors=True)
        mll.backward()
        return mll.detach(), torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    batched, g_batched = mll_and_grad()
    model._stacked_rbf_blocks = lambda: None  # instance attribute: GPyTorch per component
    per_component, g_per = mll_and_grad()
    assert float((batched - per_component).abs()) < 1e-12 * abs(float(per_component))
    assert float((g_batched - g_per).abs().max()) < 1e-9 * float(g_per.abs().max())


@pytest.mark.parametrize(
    "projection, hetero, prior_variance",
    [("all-pairs", False, "exact"), ("pairs+tanh", True, "interpolated")],
)
def test_acquisition_covariances_from_the_factor_equal_the_dense_ski_posterior(
    projection, hetero, prior_variance
):
    r"""With fewer observations than half the active grid points, an additive model's
    covariances for candidate batches (with a gradient, as an acquisition optimiser asks, and
    a bulk request without one) come from ``K_UU - U U^T`` (``U``: m x r, from the factor of
    ``G``) instead of the m x m ``M = R A^-1 R^T``. Batched ``b x q x d`` requests equal the
    dense SKI posterior of each batch element (plus ``k(x, x) - w^T K_UU w`` on the diagonal
    for ``prior_variance="exact"``), their gradients equal the ``M`` path's, and neither ``M``
    nor ``S = R L_A^-T`` (O(m^3) each) is built."""
    d = 6 if projection == "all-pairs" else 8
    X, Y, Yvar = _data(30, d, hetero, seed=d)
    model = WISKI(X, Y, Yvar, projection=projection, prior_variance=prior_variance)
    model.fit(max_iter=5)
    assert model.G.shape[-1] >= 2 * 30 * 2  # the factor applies (n <= m_active / 2)
    sd2 = model.outcome_std.reshape(()) ** 2
    g = torch.Generator().manual_seed(3)
    Xs = torch.rand(5, 3, d, generator=g, dtype=DT, requires_grad=True)
    Xbulk = torch.rand(600, 1, d, generator=g, dtype=DT)  # 4 x 600 >= m: a bulk request
    calls = []
    original = type(model)._low_rank_covariance

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    with mock.patch.object(type(model), "_low_rank_covariance", counted):
        post = model.posterior(Xs)
        cov = post.mvn.covariance_matrix
        (grad,) = torch.autograd.grad((cov.sum() + post.mean.sum()), Xs)
        with torch.no_grad():
            bulk = model.posterior(Xbulk).variance.reshape(-1)
    assert len(calls) == 2
    assert "M" not in model._shared and "S" not in model._shared
    for b in range(Xs.shape[0]):
        mean_ref, cov_ref = dense_posterior(model, X, Y, Yvar, Xs[b].detach())
        if prior_variance == "exact":
            with torch.no_grad():
                W = model.grid.dense_weights(model._features(Xs[b].detach()))
                K = model._prior_gram()
                kss = torch.diagonal(K)[model.grid.offsets].sum()
                gap = (kss - torch.einsum("nm,mk,nk->n", W, K, W)).clamp_min(0.0)
            cov_ref = cov_ref + torch.diag(gap)
        torch.testing.assert_close(post.mean[b].squeeze(-1), mean_ref, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(cov[b] / sd2, cov_ref, rtol=1e-8, atol=1e-12)
    _, ref_bulk = dense_posterior(model, X, Y, Yvar, Xbulk[:40, 0])
    if prior_variance == "interpolated":
        torch.testing.assert_close(bulk[:40] / sd2, torch.diagonal(ref_bulk), rtol=1e-8, atol=1e-12)
    # the same gradient through M (an instance attribute shadows the method: no factor)
    model._shared = {}
    model._low_rank_root = lambda: None
    post_m = model.posterior(Xs)
    (grad_m,) = torch.autograd.grad((post_m.mvn.covariance_matrix.sum() + post_m.mean.sum()), Xs)
    assert "M" in model._shared
    torch.testing.assert_close(grad, grad_m, rtol=1e-8, atol=1e-10)


def test_the_factor_cache_follows_the_statistics_tensors_not_their_addresses():
    """The factor of G (and the covariance root built on it) is cached per data state. It was
    keyed on G's address and version counters, so new statistics put where freed ones were (as
    the allocator may, e.g. after a projection refit) with equal version counts were read with
    the old factor: a wrong likelihood. Here other targets' statistics are written into the old
    tensors' memory through new tensor objects, versions matched, and the likelihood and the
    covariances are compared with the same model's after its caches are dropped by hand."""
    X, Y, _ = _data(20, 4, False)
    model = WISKI(X, Y, projection="all-pairs")
    other = WISKI(X, torch.cos(3 * Y), projection="all-pairs")  # the same G, another z
    Xq = torch.rand(2, 3, 4, dtype=DT, requires_grad=True)
    with torch.no_grad():  # version counts a new tensor can reach (set_ counts one)
        for name in ("G", "z", "h"):
            getattr(model, name).add_(0.0).add_(0.0)
    model.marginal_log_likelihood()  # caches the factor of model's G
    for name in ("G", "z", "h"):
        old, new = getattr(model, name), getattr(other, name)
        version = old._version
        writer = torch.empty(0, dtype=DT).set_(old.untyped_storage(), 0, old.shape, old.stride())
        with torch.no_grad():
            writer.copy_(new)
        reused = torch.empty(0, dtype=DT).set_(old.untyped_storage(), 0, old.shape, old.stride())
        with torch.no_grad():
            while reused._version < version:
                reused.add_(0.0)
        assert reused._version == version and reused.data_ptr() == old.data_ptr()
        setattr(model, name, reused)
    model.invalidate_caches()
    mll = model.marginal_log_likelihood()
    cov = model.posterior(Xq).mvn.covariance_matrix
    model.__dict__["_low_rank_cache"] = None  # by hand: a fresh factor
    model.invalidate_caches()
    torch.testing.assert_close(mll, model.marginal_log_likelihood(), rtol=1e-10, atol=0)
    torch.testing.assert_close(cov, model.posterior(Xq).mvn.covariance_matrix)


def test_float32_covariances_keep_the_m_by_m_route():
    """In single precision ``K_UU - U U^T`` loses more of a small variance than rows of ``M``
    (2.9% against 0.6% at a noise of 1e-6), so a float32 model keeps the m x m route; its
    covariances equal the float64 model's to float32 accuracy."""
    X, Y, _ = _data(20, 4, False)
    model = WISKI(X, Y, projection="all-pairs")
    m32 = WISKI(X.float(), Y.float(), projection="all-pairs")
    m32.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    )
    Xq = torch.rand(2, 3, 4, dtype=DT, requires_grad=True)
    cov64 = model.posterior(Xq).mvn.covariance_matrix
    cov32 = m32.posterior(Xq.float()).mvn.covariance_matrix
    assert m32._low_rank_root() is None and "low_rank_root" not in m32._shared
    assert model._low_rank_root() is not None
    torch.testing.assert_close(cov32.double(), cov64, rtol=2e-3, atol=2e-5)
