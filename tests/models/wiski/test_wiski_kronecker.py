"""Kronecker algebra of the grid kernel (bo_online.models.wiski.kronecker) against dense
Kronecker products, and which kernels take that path."""

from __future__ import annotations

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

from bo_online.models import WISKI
from bo_online.models.wiski.kronecker import (
    kron_congruence,
    kron_dense,
    kron_matmul,
    kronecker_factors,
)

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
