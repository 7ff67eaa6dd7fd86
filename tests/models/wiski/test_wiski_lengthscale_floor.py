"""WISKI's default kernel keeps its lengthscales at or above one grid spacing: below it the SKI
prior variance ``w_x^T K_UU w_x`` (computed densely here) oscillates between grid nodes, which
makes acquisition functions propose grid nodes."""

from __future__ import annotations

import pytest
import torch

from bo_online.models import WISKI

DT = torch.float64


def _dense_prior_variance(model: WISKI, Xs: torch.Tensor) -> torch.Tensor:
    """``diag(W K_UU W^T)`` with ``W`` built densely from the interpolation weights."""
    idx, val = model.grid.interpolate(Xs)
    W = torch.zeros(Xs.shape[0], model.num_grid_points, dtype=DT).scatter_add_(1, idx, val)
    K = model._grid_kernel().detach()
    return torch.einsum("ij,jk,ik->i", W, K, W)


def _data(n: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 3, generator=g, dtype=DT)
    Y = torch.sin(40 * X).sum(-1, keepdim=True)  # wants lengthscales far below 0.2
    return X, Y


def test_default_floor_is_one_grid_spacing_and_holds_after_fit():
    X, Y = _data()
    model = WISKI(X, Y)  # 3-D: 10 points per dimension, spacing 0.2 on the unit cube
    h = float(model.grid.spacing.min())
    assert model.lengthscale_floor == pytest.approx(h) and h == pytest.approx(0.2)
    model.fit(max_iter=30)
    assert float(model.covar_module.lengthscale.detach().min()) >= h * (1 - 1e-9)
    # BoTorch's own bound where asked for, and where the grid is finer than it.
    assert WISKI(X, Y, lengthscale_floor=None).lengthscale_floor == 0.025
    assert WISKI(X[:, :1], Y, grid_size=400).lengthscale_floor == 0.025


def test_prior_variance_is_flat_between_grid_nodes_at_the_floor():
    r"""Along a line through the grid, the interpolated prior variance varies by < 10% of its
    mean at the floor lengthscale, but by > 30% at 0.4 of it (the node-attraction regime)."""
    X, Y = _data(10)
    model = WISKI(X, Y)
    t = torch.linspace(0, 1, 201, dtype=DT)
    Xs = torch.stack([t, torch.full_like(t, 0.5), torch.full_like(t, 0.5)], -1)
    spread = {}
    for ls in (model.lengthscale_floor, 0.4 * model.lengthscale_floor):
        model.covar_module.lengthscale = ls
        v = _dense_prior_variance(model, Xs)
        spread[ls] = float((v.max() - v.min()) / v.mean())
    low, high = sorted(spread)
    assert spread[high] < 0.1 and spread[low] > 0.3, spread


def test_bad_floor_is_a_clear_error():
    X, Y = _data(10)
    for bad in (0.0, -1.0, "coarse"):
        with pytest.raises(ValueError, match="lengthscale_floor"):
            WISKI(X, Y, lengthscale_floor=bad)
    from gpytorch.kernels import RBFKernel

    with pytest.raises(ValueError, match="default kernel only"):
        WISKI(X, Y, covar_module=RBFKernel(ard_num_dims=3), lengthscale_floor=0.3)
