"""Kronecker algebra of the grid kernel (bo_online.models.wiski.kronecker) against dense
Kronecker products, and which kernels take that path."""

from __future__ import annotations

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from wiski_reference import dense_mll, dense_posterior, grid_kernel

from bo_online.models import WISKI
from bo_online.models.wiski.kronecker import (
    kron_congruence,
    kron_dense,
    kron_matmul,
    kronecker_factors,
)
from bo_online.models.wiski.statistics import _STAT_NAMES

DT = torch.float64


def _factors(sizes, seed=0, lower=False):
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(s, s, generator=g, dtype=DT) for s in sizes]
    return [F.tril() for F in out] if lower else out


@pytest.mark.parametrize("sizes", [[7], [3, 5], [4, 3, 5]])
def test_kron_products_equal_dense_kronecker_products(sizes):
    factors = _factors(sizes)
    dense = factors[0]
    for F in factors[1:]:
        dense = torch.kron(dense, F)
    m = dense.shape[0]
    M = torch.randn(m, 6, generator=torch.Generator().manual_seed(1), dtype=DT)
    torch.testing.assert_close(kron_dense(factors), dense, rtol=0, atol=0)
    torch.testing.assert_close(kron_matmul(factors, M), dense @ M, rtol=1e-12, atol=1e-12)
    roots = _factors(sizes, seed=2, lower=True)
    R = roots[0]
    for F in roots[1:]:
        R = torch.kron(R, F)
    G = M @ M.mT + torch.eye(m, dtype=DT)
    torch.testing.assert_close(kron_congruence(roots, G), R.mT @ G @ R, rtol=1e-11, atol=1e-11)


def test_kron_congruence_gradient_equals_the_dense_products():
    roots = [F.requires_grad_() for F in _factors([3, 4], seed=3, lower=True)]
    G = torch.randn(12, 12, generator=torch.Generator().manual_seed(4), dtype=DT)
    G = G @ G.mT
    W = torch.randn(12, 12, generator=torch.Generator().manual_seed(5), dtype=DT)
    ours = torch.autograd.grad((kron_congruence(roots, G) * W).sum(), roots)
    R = torch.kron(roots[0], roots[1])
    ref = torch.autograd.grad((R.mT @ G @ R * W).sum(), roots)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_factors_multiply_to_the_kernel_on_the_grid_up_to_the_per_factor_jitter():
    X = torch.rand(20, 3, generator=torch.Generator().manual_seed(6), dtype=DT)
    covar = ScaleKernel(RBFKernel(ard_num_dims=3))
    model = WISKI(X, X.sum(-1, keepdim=True), grid_size=8, covar_module=covar)
    covar.outputscale = 2.5
    covar.base_kernel.lengthscale = torch.tensor([[0.2, 0.5, 1.3]], dtype=DT)
    with torch.no_grad():
        exact = covar(model.grid_points).to_dense()
        unjittered = kronecker_factors(covar, _axes(model), 0.0)
        torch.testing.assert_close(kron_dense(unjittered), exact, rtol=1e-12, atol=1e-12)
        jittered = model._grid_kernel()
    eps = model.grid_jitter
    expected = torch.ones(1, 1, dtype=DT)
    for F in unjittered:
        expected = torch.kron(expected, F + eps * F[0, 0] * torch.eye(F.shape[0], dtype=DT))
    torch.testing.assert_close(jittered, expected, rtol=1e-13, atol=1e-13)
    # the structure costs O(jitter) against the scalar jitter of non-factoring kernels
    scalar = exact + eps * 2.5 * torch.eye(exact.shape[0], dtype=DT)
    assert float((jittered - scalar).abs().max()) < 4 * eps * 2.5


def _axes(model):
    sizes = model.grid.inner_sizes
    return [torch.unique(model.grid_points[:, j]) for j in range(len(sizes))]


@pytest.mark.parametrize(
    "covar, factors",
    [
        (None, True),  # the default RBF-ARD kernel
        (ScaleKernel(RBFKernel(ard_num_dims=2)), True),
        (RBFKernel(), True),  # one lengthscale for both dimensions
        (MaternKernel(nu=2.5, ard_num_dims=2), False),
        (ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=2)), False),
        (RBFKernel(active_dims=[1]), False),
        (ScaleKernel(RBFKernel(), active_dims=[0]), False),  # the outer kernel's dims apply
        (ScaleKernel(RBFKernel(ard_num_dims=2), active_dims=[0, 1]), True),
    ],
)
def test_which_kernels_take_the_kronecker_path(covar, factors):
    X = torch.rand(15, 2, generator=torch.Generator().manual_seed(7), dtype=DT)
    model = WISKI(X, X.sum(-1, keepdim=True), grid_size=10, covar_module=covar)
    assert (model._kronecker_factors() is not None) == factors


def test_additive_models_keep_the_dense_block_algebra():
    X = torch.rand(30, 4, generator=torch.Generator().manual_seed(8), dtype=DT)
    model = WISKI(X, X.sum(-1, keepdim=True), projection="all-pairs")
    assert model._kronecker_factors() is None


def _mll_and_grad(model, X, Y):
    params = list(model._trainable_parameters()[0].values())
    ours = model.marginal_log_likelihood(include_priors=False)
    ref = dense_mll(model, X, Y)
    return (ours, torch.autograd.grad(ours, params)), (ref, torch.autograd.grad(ref, params))


def test_few_active_grid_points_take_the_restricted_form_with_the_same_kernel():
    g = torch.Generator().manual_seed(9)
    X = 0.25 * torch.rand(200, 2, generator=g, dtype=DT)  # one corner of a 28 x 28 grid
    Y = torch.sin(9 * X).sum(-1, keepdim=True) + 0.05 * torch.randn(200, 1, generator=g, dtype=DT)
    model = WISKI(X, Y, bounds=torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT))
    model.covar_module.lengthscale = torch.tensor([[0.3, 0.2]], dtype=DT)
    active = int((torch.diagonal(model.G) > 0).sum())
    assert 0.75 * active < 200 and 2 * active < model.num_grid_points  # neither form above
    (ours, grads), (ref, ref_grads) = _mll_and_grad(model, X, Y)
    assert abs(float(ours - ref)) < 1e-9 * abs(float(ref))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_float32_kronecker_likelihood_follows_float64():
    g = torch.Generator().manual_seed(10)
    X = torch.rand(300, 3, generator=g, dtype=DT)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(300, 1, generator=g, dtype=DT)
    values = []
    for dtype in (torch.float64, torch.float32):
        model = WISKI(X.to(dtype), Y.to(dtype), grid_size=8)
        model.covar_module.lengthscale = torch.tensor([[0.4, 0.3, 0.5]], dtype=dtype)
        model.likelihood.noise = 0.05
        assert model._kronecker_factors() is not None
        values.append(float(model.marginal_log_likelihood()))
    assert abs(values[1] - values[0]) < 1e-4 * abs(values[0])


def test_a_state_saved_before_the_per_factor_jitter_keeps_the_scalar_jitter():
    g = torch.Generator().manual_seed(11)
    X = torch.rand(60, 2, generator=g, dtype=DT)
    Y = torch.cos(4 * X).sum(-1, keepdim=True) + 0.01 * torch.randn(60, 1, generator=g, dtype=DT)
    model = WISKI(X, Y, grid_size=12)
    model.fit(max_iter=10)
    state = model.state_dict()
    assert float(state["jitter_per_factor"]) == 1.0
    old_state = {k: v for k, v in state.items() if k != "jitter_per_factor"}
    for saved, per_factor in ((state, True), (old_state, False)):
        loaded = WISKI(X[:5], Y[:5], grid_size=12)
        loaded.load_state_dict(saved)
        assert (loaded._kronecker_factors() is not None) == per_factor
        K = loaded._grid_kernel().detach()
        torch.testing.assert_close(K, grid_kernel(loaded), rtol=1e-12, atol=1e-14)
        raw = loaded.covar_module(loaded.grid_points).to_dense().detach()
        jitter = K - raw
        scalar = torch.allclose(jitter, jitter[0, 0] * torch.eye(K.shape[0], dtype=DT))
        assert scalar != per_factor
        # the loaded model predicts as the dense SKI GP of its own kernel
        loaded.invalidate_caches()
        Xs = torch.rand(7, 2, generator=g, dtype=DT)
        mean, _ = dense_posterior(loaded, X, Y, None, Xs)
        torch.testing.assert_close(
            loaded.posterior(Xs).mean.squeeze(-1), mean, rtol=1e-8, atol=1e-8
        )
    for name in _STAT_NAMES:  # the statistics came through unchanged
        torch.testing.assert_close(getattr(loaded, name), getattr(model, name))
