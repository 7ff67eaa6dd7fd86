"""Tests for bo_online.models.wiski.grid: interpolation weights against GPyTorch's and against
polynomials."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from gpytorch.utils.interpolation import Interpolation

from bo_online.models.wiski.grid import (
    RegularGrid,
    interp_gram,
    interp_matmul,
    interp_vector,
    keys_cubic,
)

DT = torch.float64


def _full_grid_dense_W_gpytorch(grid: RegularGrid, X: torch.Tensor) -> torch.Tensor:
    """Dense n x prod(sizes) weights on the FULL padded grid from GPyTorch's implementation."""
    axes = [
        grid.lower[k] + grid.spacing[k] * torch.arange(g, dtype=DT)
        for k, g in enumerate(grid.sizes)
    ]
    idx, val = Interpolation().interpolate(axes, X)
    W = torch.zeros(X.shape[0], math.prod(grid.sizes), dtype=DT)
    return W.scatter_add(-1, idx, val)


def _interior_positions(grid: RegularGrid) -> torch.Tensor:
    """Flat full-grid index of each interior point, in the interior ordering."""
    ranges = [torch.arange(1, g - 1) for g in grid.sizes]
    mesh = torch.meshgrid(*ranges, indexing="ij")
    flat = torch.zeros_like(mesh[0])
    for k, g in enumerate(grid.sizes):
        flat = flat * g + mesh[k]
    return flat.reshape(-1)


@pytest.mark.parametrize("sizes", [[12], [9, 7], [6, 8, 7]])
def test_weights_match_gpytorch_and_ring_is_empty(sizes):
    torch.manual_seed(0)
    d = len(sizes)
    grid = RegularGrid(sizes)
    X = torch.rand(50, d, dtype=DT)
    X[0] = 0.0
    X[1] = 1.0  # both faces of the box
    W_ref = _full_grid_dense_W_gpytorch(grid, X)
    pos = _interior_positions(grid)
    W = grid.dense_weights(X)
    assert W.shape == (50, math.prod(g - 2 for g in sizes))
    torch.testing.assert_close(W, W_ref[:, pos], rtol=0, atol=1e-13)
    # The outer ring of the padded grid never carries weight (what makes dropping it exact).
    mask = torch.ones(W_ref.shape[-1], dtype=torch.bool)
    mask[pos] = False
    assert float(W_ref[:, mask].abs().max()) < 1e-14
    idx, val = grid.interpolate(X)
    assert idx.shape == (50, 4**d) and val.shape == (50, 4**d)


def test_grid_points_and_padding():
    grid = RegularGrid([10, 8], bounds=torch.tensor([[0.0, -1.0], [2.0, 1.0]], dtype=DT))
    pts = grid.points()
    h = grid.spacing
    torch.testing.assert_close(h, torch.tensor([2.0 / 5, 2.0 / 3], dtype=DT))
    # interior points run from lower - h to upper + h (two padding cells, outer ring dropped)
    torch.testing.assert_close(pts.min(0).values, torch.tensor([-h[0], -1 - h[1]], dtype=DT))
    torch.testing.assert_close(pts.max(0).values, torch.tensor([2 + h[0], 1 + h[1]], dtype=DT))
    assert pts.shape == (8 * 6, 2)


def test_cubic_reproduces_quadratics_and_partition_of_unity():
    torch.manual_seed(1)
    grid = RegularGrid([14, 11])
    X = torch.rand(200, 2, dtype=DT)
    W = grid.dense_weights(X)
    P = grid.points()
    torch.testing.assert_close(W.sum(-1), torch.ones(200, dtype=DT), rtol=0, atol=1e-13)
    for f in (
        lambda Z: Z[:, 0],
        lambda Z: 3 * Z[:, 1] - 1,
        lambda Z: Z[:, 0] ** 2 - Z[:, 0] * Z[:, 1],
    ):
        torch.testing.assert_close(W @ f(P), f(X), rtol=0, atol=1e-12)


def test_keys_kernel_values():
    s = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 2.5], dtype=DT)
    # u(0)=1, u(1)=u(2)=0, u(0.5)=0.5625, u(1.5)=-0.0625 for a = -1/2
    expected = torch.tensor([1.0, 0.5625, 0.0, -0.0625, 0.0, 0.0], dtype=DT)
    torch.testing.assert_close(keys_cubic(s), expected)
    torch.testing.assert_close(keys_cubic(-s), expected)


def test_out_of_box_and_bad_inputs_raise():
    grid = RegularGrid([10, 10])
    for bad in ([[1.01, 0.5]], [[-0.001, 0.5]], [[float("nan"), 0.5]], [[0.5, float("inf")]]):
        with pytest.raises(ValueError, match="outside"):
            grid.interpolate(torch.tensor(bad, dtype=DT))
    with pytest.raises(ValueError, match="columns"):
        grid.interpolate(torch.rand(3, 3, dtype=DT))
    with pytest.raises(ValueError):
        RegularGrid([5, 10])


def test_products_match_dense():
    torch.manual_seed(2)
    grid = RegularGrid([9, 8, 7])
    m = grid.num_points
    X = torch.rand(2, 30, 3, dtype=DT)
    W = grid.dense_weights(X)
    idx, val = grid.interpolate(X)
    M = torch.randn(m, 5, dtype=DT)
    torch.testing.assert_close(interp_matmul(idx, val, M), W @ M)
    # differentiable path (chunked gathers) gives the same numbers and gradients in X
    Xg = X.clone().requires_grad_(True)
    idx_g, val_g = grid.interpolate(Xg)
    out = interp_matmul(idx_g, val_g, M, chunk=1000)
    torch.testing.assert_close(out.detach(), W @ M)
    out.sum().backward()
    Xd = X.clone().requires_grad_(True)
    (grid.dense_weights(Xd) @ M).sum().backward()
    torch.testing.assert_close(Xg.grad, Xd.grad)
    a = torch.randn(4, 1, m, dtype=DT)
    torch.testing.assert_close(interp_vector(idx, val, a), (W @ a.unsqueeze(-1)).squeeze(-1))
    w = torch.rand(30, dtype=DT) + 0.1
    Wf = W[0]
    torch.testing.assert_close(
        interp_gram(idx[0], val[0], w, m, chunk=64), Wf.T @ (w[:, None] * Wf)
    )


def test_gram_cell_blocked_path_matches_dense():
    torch.manual_seed(3)
    for sizes in ([11, 9], [8, 7, 9]):
        grid = RegularGrid(sizes)
        X = torch.rand(1500, len(sizes), dtype=DT)
        X[:500] = 0.3 + 0.01 * X[:500]  # a crowded cell
        idx, val = grid.interpolate(X)
        w = torch.rand(1500, dtype=DT) + 0.1
        W = grid.dense_weights(X)
        G0 = torch.randn(grid.num_points, grid.num_points, dtype=DT)
        G = interp_gram(idx, val, w, grid.num_points, out=G0.clone())
        torch.testing.assert_close(G, G0 + W.T @ (w[:, None] * W), rtol=1e-12, atol=1e-12)


def test_float32_points_on_the_upper_face_are_inside_the_box():
    """float32 rounds the box's 1e-9 tolerance away in grid coordinates (97 + 9e-8 is 97): a
    float32 WISKI with the default grid took x = 1 for outside the unit cube. Points on the
    faces, and one float32 ulp beyond, are inside for every grid size; a point clearly outside
    is refused with its value printed to 10 digits. The two finest grids are checked on the
    model's own grid, the interpolation its posterior calls: their first posterior solves an
    m x m system (m = 3,844 and 8,100), 23 s of this test for no further coverage."""
    from bo_online.models import WISKI

    g = torch.Generator().manual_seed(0)
    X = torch.rand(20, 2, generator=g, dtype=torch.float32)
    Y = X.sum(-1, keepdim=True)
    one_up = float(torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)))
    points = [[0.5, 1.0], [1.0, 0.0], [0.0, one_up]]
    for size in (6, 30, 34, 64, 92):
        model = WISKI(X, Y, grid_size=size)
        for point in points:
            x = torch.tensor([point], dtype=torch.float32)
            if size <= 34:
                assert torch.isfinite(model.posterior(x).mean).all()
            else:
                idx, val = model.grid.interpolate(x)
                assert val.dtype == torch.float32
                torch.testing.assert_close(val.sum(-1), torch.ones(1))  # a full stencil
    with pytest.raises(ValueError, match=r"value 1\.00100004"):
        model.posterior(torch.tensor([[0.5, 1.001]], dtype=torch.float32))


@pytest.mark.parametrize(
    "sizes, rows, c",
    [
        ([9, 8, 7], 5, 504),  # a few rows: gathered rows of M
        ([9, 8, 7], 40, 3),  # K c <= m: gathered rows of M, in blocks
        ([9, 8, 7], 40, 504),  # coarse grid (m <= 48 K): dense W blocks times M
        ([48, 40], 40, 120),  # fine grid (m > 48 K, K c > m): the sparse CSR product
    ],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_interp_matmul_routes_equal_the_dense_product_and_its_gradient(sizes, rows, c, dtype):
    """Each route of ``W M`` (chosen by rows, K, c and m) equals the product with the dense
    interpolation matrix, for a row-major and a transposed ``M``, and its gradient in the
    inputs equals autograd through the dense ``W``. The fine grid's case goes through the
    sparse CSR product, and only that one."""
    torch.manual_seed(3)
    grid = RegularGrid(sizes)
    m = grid.num_points
    X = torch.rand(rows, len(sizes), dtype=DT)
    W = grid.dense_weights(X)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}
    for M in (torch.randn(m, c, dtype=DT), torch.randn(c, m, dtype=DT).mT):
        idx, val = grid.interpolate(X)
        with mock.patch("torch.sparse_csr_tensor", wraps=torch.sparse_csr_tensor) as csr:
            out = interp_matmul(idx, val.to(dtype), M.to(dtype))
        K = idx.shape[-1]
        assert csr.called == (rows > 8 and K * c > m and m > 48 * K), (sizes, rows, c)
        torch.testing.assert_close(out, (W @ M).to(dtype), **tol)
        G = torch.randn(rows, c, dtype=DT)
        Xg = X.clone().requires_grad_(True)
        idx_g, val_g = grid.interpolate(Xg)
        out = interp_matmul(idx_g, val_g, M, chunk=2_000)  # several blocks in every route
        torch.testing.assert_close(out.detach(), W @ M)
        (out * G).sum().backward()
        Xd = X.clone().requires_grad_(True)
        ((grid.dense_weights(Xd) @ M) * G).sum().backward()
        torch.testing.assert_close(Xg.grad, Xd.grad)


@pytest.mark.parametrize(
    "sizes, rows, c",
    [([9, 8, 7], 5, 504), ([9, 8, 7], 40, 3), ([9, 8, 7], 40, 504), ([48, 40], 40, 120)],
    ids=["few rows", "K c <= m", "dense W", "CSR"],
)
@pytest.mark.parametrize("grad", [False, True], ids=["no grad", "grad"])
def test_interp_matmul_of_weights_and_m_of_two_dtypes_is_in_the_wider_one(sizes, rows, c, grad):
    """Weights and ``M`` of different dtypes (float32 weights, float64 ``M`` or the reverse)
    give the product in the wider dtype on every route, with the gradient in the weights, as
    the gathered product did before the routes (which raised torch's dtype errors)."""
    torch.manual_seed(5)
    grid = RegularGrid(sizes)
    X = torch.rand(rows, len(sizes), dtype=DT)
    idx, val = grid.interpolate(X)
    M = torch.randn(grid.num_points, c, dtype=DT)
    G = torch.randn(rows, c, dtype=DT)
    for v_dtype, m_dtype in ((torch.float32, DT), (DT, torch.float32)):
        v = val.to(v_dtype).requires_grad_(grad)
        Mx = M.to(m_dtype)
        out = interp_matmul(idx, v, Mx)
        W = torch.zeros(rows, grid.num_points, dtype=DT).scatter_add(-1, idx, v.double())
        assert out.dtype == DT
        torch.testing.assert_close(out, W @ Mx.double())
        if grad:
            (dv,) = torch.autograd.grad((out * G).sum(), v)
            (ref,) = torch.autograd.grad(((W @ Mx.double()) * G).sum(), v)
            assert dv.dtype == v_dtype
            torch.testing.assert_close(dv, ref.to(v_dtype))


def test_interp_matmul_gradient_keeps_no_gathered_rows():
    """With a gradient in the weights, ``W M`` for many rows of a wide ``M`` holds no ``rows x
    K x c`` gather for the backward pass (512 rows, K = 64, c = m = 1,000: 262 MB that autograd
    used to keep; qLogNEI's restarts over a WISKI model's baseline points asked for GBs)."""
    from memory_profile import peak_allocated_bytes

    torch.manual_seed(4)
    grid = RegularGrid([10, 10, 10])
    m = grid.num_points
    X = torch.rand(512, 3, dtype=DT, requires_grad=True)
    M = torch.randn(m, m, dtype=DT)

    def forward_backward():
        idx, val = grid.interpolate(X)
        interp_matmul(idx, val, M).pow(2).sum().backward()

    peak = peak_allocated_bytes(forward_backward)
    gathered = 512 * 64 * m * 8
    assert peak < gathered / 4, f"peak {peak / 1e6:.0f} MB, a full gather is {gathered / 1e6:.0f}"
    Xd = X.detach().clone().requires_grad_(True)
    (grid.dense_weights(Xd) @ M).pow(2).sum().backward()
    torch.testing.assert_close(X.grad, Xd.grad)
