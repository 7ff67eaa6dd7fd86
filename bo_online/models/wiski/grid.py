r"""Regular grids and sparse cubic interpolation weights for structured kernel interpolation.

SKI (Wilson and Nickisch, 2015) approximates ``k(x, x') ~ w_x^T K_UU w_x'`` with ``K_UU`` the
kernel on a fixed regular grid ``U`` and ``w_x`` a sparse vector of cubic interpolation weights.
This module owns the grid and the weights; the models own the kernel.

* :class:`RegularGrid` -- a product grid covering a data box plus two cells of padding on every
  side (docs/math.md §1), with row-major flat indexing.
* :meth:`RegularGrid.interpolate` -- Keys cubic-convolution weights, 4 points per dimension, so
  ``4^d`` non-zeros per row; returned as ``(indices, values)`` and never as a dense ``n x m``
  matrix. Inputs whose stencil would leave the grid raise ``ValueError`` (never a silent clamp).
* :func:`interp_matmul`, :func:`interp_gram` -- products with the implicit sparse ``W`` by
  gathering and scattering; :func:`interp_quad` -- ``W M W^T`` for a few points, differentiable
  in the weights at the cost of the ``(N K)^2`` entries of ``M`` it reads.

GPyTorch's ``Interpolation`` class computes the same weights but clamps out-of-grid inputs and
returns dense index tensors sized for its own operators; we need a strict domain check, a
scatter-accumulated Gram matrix and products that stay differentiable in ``X``, hence this module.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Callable, Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from bo_online.models.validation import first_outside

__all__ = [
    "RegularGrid",
    "keys_cubic",
    "interp_matmul",
    "interp_gram",
    "interp_vector",
    "interp_quad",
]

# Keys' cubic convolution parameter (a = -1/2 gives third-order accuracy; GPyTorch uses the same).
_KEYS_A = -0.5

#: Keys' weights (a = -1/2) at stencil offsets -1, 0, 1, 2 as cubics in the fraction f in
#: [0, 1]: row p holds the coefficients of f^p (from u(1 + f), u(f), u(1 - f), u(2 - f)).
_KEYS_POLY = torch.tensor(
    [[0.0, 1.0, 0.0, 0.0], [-0.5, 0.0, 0.5, 0.0], [1.0, -2.5, 2.0, -0.5], [-0.5, 1.5, -1.5, 0.5]],
    dtype=torch.float64,
)

#: The grid extends this many cells beyond the data box on every side (docs/math.md §1).
PADDING_CELLS = 2


def keys_cubic(s: Tensor) -> Tensor:
    r"""Keys' cubic convolution kernel ``u(s)`` (support ``|s| < 2``), elementwise."""
    a = _KEYS_A
    s = s.abs()
    near = ((a + 2) * s - (a + 3)) * s * s + 1
    far = ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
    return torch.where(s <= 1, near, torch.where(s < 2, far, torch.zeros_like(s)))


class RegularGrid:
    r"""A regular product grid over a data box, padded by two cells on every side.

    With ``g_k`` points in dimension k and data box ``[lo_k, hi_k]``, the spacing is
    ``h_k = (hi_k - lo_k) / (g_k - 1 - 2 * PADDING_CELLS)`` and the grid runs from
    ``lo_k - 2 h_k`` to ``hi_k + 2 h_k`` (docs/math.md §1).

    The cubic stencil of a point in the box reaches at most one cell beyond the box, so the
    outermost ring of grid points never receives a non-zero weight: every interpolation row, and
    hence every statistic and prediction, lives on the ``g_k - 2`` *interior* points per
    dimension. Indices returned by :meth:`interpolate` and points returned by :meth:`points` are
    those of the interior sub-grid (``m = prod(g_k - 2)``, row-major, last dimension fastest);
    dropping the ring is exact (its rows and columns of ``W`` are identically zero).

    Args:
        sizes: number of grid points per dimension including the padding (each >= 6).
        bounds: ``2 x d`` data box (lower row, upper row); default the unit cube.
        dtype: of the grid tensors.
        device: of the grid tensors.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        bounds: Tensor | None = None,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        sizes = [int(g) for g in sizes]
        d = len(sizes)
        if d < 1:
            raise ValueError("A grid needs at least one dimension.")
        if min(sizes) < 2 * PADDING_CELLS + 2:
            raise ValueError(
                f"Grid sizes must be >= {2 * PADDING_CELLS + 2} per dimension (two padding cells "
                f"per side plus at least one interior cell), got {sizes}."
            )
        if bounds is None:
            bounds = torch.stack([torch.zeros(d), torch.ones(d)])
        bounds = torch.as_tensor(bounds, dtype=dtype, device=device)
        if bounds.shape != (2, d) or not bool((bounds[1] > bounds[0]).all()):
            raise ValueError(
                f"bounds must be 2 x {d} with upper > lower, got {tuple(bounds.shape)}."
            )
        self.sizes = tuple(sizes)
        self.inner_sizes = tuple(g - 2 for g in sizes)
        self.dim = d
        self.bounds = bounds
        g = torch.tensor(sizes, dtype=dtype, device=device)
        self.spacing = (bounds[1] - bounds[0]) / (g - 1 - 2 * PADDING_CELLS)
        self.lower = bounds[0] - PADDING_CELLS * self.spacing
        strides = [1] * d
        for k in range(d - 2, -1, -1):
            strides[k] = strides[k + 1] * self.inner_sizes[k + 1]
        self.strides = tuple(strides)

    def converted(self, fn: Callable[[Tensor], Tensor]) -> RegularGrid:
        r"""A copy of the grid whose tensors (the box, the spacing, the lower corner) went
        through ``fn``, the conversion a model's ``.to`` / ``.double()`` applies to its buffers,
        so that the grid follows the model's dtype and device (the per-dtype constants are built
        again on demand). A copy: models conditioned on one another share their grid."""
        new = copy.copy(self)
        new.bounds, new.spacing, new.lower = fn(self.bounds), fn(self.spacing), fn(self.lower)
        new.__dict__.pop("_const_cache", None)
        return new

    @property
    def num_points(self) -> int:
        """m, the number of interior grid points (those that can carry weight)."""
        return math.prod(self.inner_sizes)

    @property
    def num_points_padded(self) -> int:
        """The number of grid points including the never-weighted outer ring."""
        return math.prod(self.sizes)

    def points(self) -> Tensor:
        r"""The ``m x d`` interior grid points, row-major (last dimension fastest)."""
        axes = [
            self.lower[k]
            + self.spacing[k]
            * torch.arange(1, g - 1, dtype=self.lower.dtype, device=self.lower.device)
            for k, g in enumerate(self.sizes)
        ]
        mesh = torch.meshgrid(*axes, indexing="ij")
        return torch.stack([a.reshape(-1) for a in mesh], dim=-1)

    def _constants(self, X: Tensor) -> tuple[Tensor, ...]:
        r"""Per-(dtype, device) constants of :meth:`interpolate`, built once: lower corner,
        spacing, the largest stencil base, the box in grid coordinates, the stencil's index
        shifts and the cubics' coefficients."""
        key = (X.dtype, X.device)
        cache = self.__dict__.setdefault("_const_cache", {})
        if key not in cache:
            sizes = torch.tensor(self.sizes, device=X.device)
            # A few ulps of X's dtype at the box's far face (float32 rounds 97 + 1e-7 to 97),
            # and never less than the relative 1e-9 of the box.
            eps = torch.finfo(X.dtype).eps
            tol = torch.maximum(1e-9 * (sizes - 5), 8 * eps * (sizes - 3)).to(X.dtype)
            cache[key] = (
                self.lower.to(X),
                self.spacing.to(X),
                sizes - 4,
                2 - tol,
                (sizes - 3).to(X.dtype) + tol,
                torch.arange(-2, 2, device=X.device),  # stencil offsets -1..2, interior index
                _KEYS_POLY.to(X),
            )
        return cache[key]

    def interpolate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Sparse cubic interpolation weights of ``X`` on the (interior) grid.

        Args:
            X: ``... x n x d`` inputs inside the data box.

        Returns:
            ``(indices, values)``, both ``... x n x 4^d``: flat interior-grid indices (long) and
            weights (differentiable in ``X``); row r of the implicit ``W`` is ``sum_j
            values[r, j] e_{indices[r, j]}``.

        Raises:
            ValueError: if some input lies outside the data box (its stencil would leave the
                grid), is not finite, or ``X`` has the wrong width.
        """
        if X.shape[-1] != self.dim:
            raise ValueError(f"X must have {self.dim} columns, got shape {tuple(X.shape)}.")
        lower, spacing, top_base, lo, hi, shifts, poly = self._constants(X)
        t = (X - lower) / spacing  # grid coordinates (full grid)
        td = t.detach()
        # The box is [2, g - 3] in grid coordinates (a few ulps allowed for points on its faces);
        # NaN fails both comparisons.
        bad = first_outside(td, lo, hi)
        if bad is not None:
            where = bad.index
            raise ValueError(
                f"{bad.count} input(s) lie outside the interpolation grid's data box "
                f"(first at index {where}, value {float(X[tuple(where)]):.10g}; box "
                f"{self.bounds[0].tolist()} .. {self.bounds[1].tolist()}). Map inputs into the box "
                "or build the model with larger `bounds`."
            )
        # base in [2, g - 4]: at the upper face (t = g - 3) use base g - 4 with frac = 1, which
        # gives the same weights (0, 0, 1, 0) and keeps the stencil off the outer ring.
        base_l = torch.minimum(torch.floor(td).long().clamp_min(2), top_base)
        frac = t - base_l.to(t)  # ... x n x d, in [0, 1]
        # Keys' weights at offsets -1, 0, 1, 2 are cubics in frac: [1, f, f^2, f^3] @ poly
        # (the same values as keys_cubic(frac - offset), in one product instead of ~15 ops).
        f2 = frac * frac
        w_dim = torch.stack([torch.ones_like(frac), frac, f2, f2 * frac], -1) @ poly
        i_dim = base_l.unsqueeze(-1) + shifts  # interior indices, in [0, g - 3]
        idx = i_dim[..., 0, :] * self.strides[0]
        val = w_dim[..., 0, :]
        for k in range(1, self.dim):
            idx = (idx.unsqueeze(-1) + self.strides[k] * i_dim[..., k, :].unsqueeze(-2)).flatten(-2)
            val = (val.unsqueeze(-1) * w_dim[..., k, :].unsqueeze(-2)).flatten(-2)
        return idx, val

    def dense_weights(self, X: Tensor) -> Tensor:
        r"""Dense ``n x m`` interpolation matrix; FOR TESTS ONLY (small n)."""
        idx, val = self.interpolate(X)
        W = torch.zeros(*X.shape[:-1], self.num_points, dtype=X.dtype, device=X.device)
        return W.scatter_add(-1, idx, val)


def interp_vector(idx: Tensor, val: Tensor, a: Tensor) -> Tensor:
    r"""``W a`` for a grid vector ``a``.

    Args:
        idx: ``xb x n x K`` interpolation indices.
        val: ``xb x n x K`` interpolation weights.
        a: ``ab x m`` grid vector(s).

    Returns:
        ``broadcast(xb, ab) x n``.
    """
    batch = torch.broadcast_shapes(idx.shape[:-2], a.shape[:-1])
    n, K = idx.shape[-2:]
    ab = a.expand(*batch, a.shape[-1]).reshape(-1, a.shape[-1])
    flat_idx = idx.expand(*batch, n, K).reshape(ab.shape[0], n * K)  # n = 0 allowed
    gathered = torch.gather(ab, -1, flat_idx).reshape(*batch, n, K)
    return (gathered * val).sum(-1)


def interp_matmul(idx: Tensor, val: Tensor, M: Tensor, chunk: int = 2**22) -> Tensor:
    r"""``W M`` for a dense ``m x c`` matrix ``M`` (no batch), without forming ``W``.

    Args:
        idx: ``... x n x K`` interpolation indices.
        val: ``... x n x K`` interpolation weights.
        M: ``m x c``.
        chunk: bound on the elements of the gathered temporary (rows are processed in chunks).

    Returns:
        ``... x n x c``. Differentiable in ``val`` (hence in the inputs) and in ``M``.
    """
    batch, (n, K), c = idx.shape[:-2], idx.shape[-2:], M.shape[-1]
    if val.dtype != M.dtype:  # in the wider dtype, as their product (the routes need one)
        dtype = torch.promote_types(val.dtype, M.dtype)
        val, M = val.to(dtype), M.to(dtype)
    fi, fv = idx.reshape(-1, K), val.reshape(-1, K)
    if fi.shape[0] == 0:  # no rows (conditioning on zero points)
        return M.new_zeros(*batch, n, c)
    grad_on = torch.is_grad_enabled()
    if not (grad_on and M.requires_grad):
        if grad_on and val.requires_grad:
            return _InterpMatmul.apply(fi, fv, M, chunk).reshape(*batch, n, c)
        return _weights_matmul(fi, fv, M, chunk).reshape(*batch, n, c)
    # A gradient in M too (a fit through the factors): autograd through gathered rows.
    rows_per = max(1, chunk // max(1, K * c))
    out = []
    for start in range(0, fi.shape[0], rows_per):
        ii, vv = fi[start : start + rows_per], fv[start : start + rows_per]
        out.append((M[ii] * vv.unsqueeze(-1)).sum(-2))
    return torch.cat(out, 0).reshape(*batch, n, c)


def interp_gram(
    idx: Tensor,
    val: Tensor,
    weights: Tensor,
    m: int,
    out: Tensor | None = None,
    chunk: int = 2**22,
) -> Tensor:
    r"""``W^T diag(weights) W`` (``m x m`` dense) accumulated from the ``K`` non-zeros per row.

    Few rows: every row's ``K x K`` outer product is scattered directly. Many rows: rows are
    grouped by grid cell (all rows in a cell share one stencil, so ``idx[r] = idx[r, 0] +
    offsets``), each cell's ``K x K`` block is one small dense product ``V_c^T diag(w_c) V_c``
    and only the blocks are scattered -- the same flops, done by GEMMs instead of ``n K^2``
    random scatter-adds.

    Args:
        idx: ``n x K`` interpolation indices (no batch).
        val: ``n x K`` interpolation weights (no batch).
        weights: ``n`` row weights (``D^{-1}``).
        m: number of grid points.
        out: optional ``m x m`` contiguous matrix to accumulate into IN PLACE (returned).
        chunk: bound on the elements of the per-chunk ``rows x K x K`` temporaries.

    Returns:
        The ``m x m`` Gram matrix (symmetric), or ``out + W^T diag(weights) W``.
    """
    n, K = idx.shape
    if out is None:
        out = torch.zeros(m, m, dtype=val.dtype, device=val.device)
    G = out.view(-1)
    wv = val * weights.unsqueeze(-1)
    offsets = idx[:1] - idx[:1, :1]  # 1 x K stencil pattern
    if n > 4 * K and bool((idx - idx[:, :1] == offsets).all()):
        cells, inverse, counts = torch.unique(idx[:, 0], return_inverse=True, return_counts=True)
        order = torch.argsort(inverse)
        v_sorted, wv_sorted = val[order], wv[order]
        blocks = [
            a.mT @ b
            for a, b in zip(wv_sorted.split(counts.tolist()), v_sorted.split(counts.tolist()))
        ]
        pair = (offsets.mT * m + offsets).reshape(-1)  # (a, b) -> a m + b
        flat = cells.unsqueeze(-1) * (m + 1) + pair  # (c + a) m + (c + b)
        G.index_add_(0, flat.reshape(-1), torch.stack(blocks).reshape(-1))
        return out
    rows_per = max(1, chunk // (K * K))
    for start in range(0, n, rows_per):
        ii, vv, ww = (
            idx[start : start + rows_per],
            val[start : start + rows_per],
            wv[start : start + rows_per],
        )
        pair_idx = (ii.unsqueeze(-1) * m + ii.unsqueeze(-2)).reshape(-1)
        pair_val = (ww.unsqueeze(-1) * vv.unsqueeze(-2)).reshape(-1)
        G.index_add_(0, pair_idx, pair_val)
    return out


class _InterpQuad(torch.autograd.Function):
    r"""``W M W^T`` per batch element for a constant symmetric ``M``, differentiable in the weights.

    With ``Y = W M`` (``N x m``, one sparse product) and ``Z[j, (i, k)] = Y[j, idx_ik] =
    sum_l val_jl M[idx_jl, idx_ik]`` (``N x N K`` entries gathered from ``Y``), the output is
    ``out[i, j] = sum_k val_ik Z[j, (i, k)]`` and, since ``M`` is symmetric, the gradient for an
    output gradient ``G`` is ``dval_ik = sum_j (G + G^T)[i, j] Z[j, (i, k)]``: O(N^2 K) from the
    saved ``Z``, where autograd would keep and differentiate the gathered ``N K x m`` rows of
    ``M``. A hand-written backward because neither torch nor linear_operator has this
    sparse-dense-sparse product.
    """

    @staticmethod
    def forward(ctx, idx: Tensor, val: Tensor, M: Tensor) -> Tensor:  # type: ignore[override]
        B, N, K = idx.shape
        Y = _weights_matmul(idx.reshape(B * N, K), val.reshape(B * N, K), M).view(B, N, -1)
        Z = torch.gather(Y, -1, idx.reshape(B, 1, N * K).expand(B, N, N * K))  # B x N x NK
        # [b, j, i] = out[b, i, j]
        out = _contract(Z.view(B, N, N, K), val, "bjik,bik->bji", -3, -1)
        ctx.save_for_backward(Z)
        return 0.5 * (out + out.mT)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (Z,) = ctx.saved_tensors
        B, N, NK = Z.shape
        sym = grad + grad.mT  # the output is symmetrised: 0.5 (G + G^T) twice
        dval = _contract(Z.view(B, N, N, NK // N), sym.mT, "bjik,bji->bik", -1, -3)  # sum over j
        return None, dval, None


def _contract(Z: Tensor, w: Tensor, spec: str, new_dim: int, dim: int) -> Tensor:
    r"""``einsum(spec, Z, w)`` = ``(Z * w.unsqueeze(new_dim)).sum(dim)``: by ``einsum`` (a batched
    GEMV) when ``Z`` is large (measured: 3.5x faster at 50 points with 64 weights each), else
    elementwise (less overhead below a few thousand elements)."""
    if Z.numel() > 2**14:
        return torch.einsum(spec, Z, w)
    return (Z * w.unsqueeze(new_dim)).sum(dim)


#: ``W M`` through a dense ``W`` (scattered in row blocks, then one GEMM) while the grid has at
#: most this many points per non-zero of a row: the GEMM's extra ``m / K`` flops run at BLAS speed,
#: which torch's CPU CSR product does not reach (measured, one thread, m = 1,500, K = 240, 3,584
#: rows: 7.5 s as CSR, 0.62 s dense). Beyond it (fine grids, few non-zeros) the CSR product wins.
_DENSE_W_MAX_RATIO = 48
#: Up to this many rows ``W M`` is a gather of their ``K`` rows of ``M`` and a batched GEMV
#: (no CSR set-up, no GEMM packing of ``M``; measured 4-6x faster than either for 1-8 rows).
_GATHER_MAX_ROWS = 8


def _stencil_rows(M: Tensor, idx: Tensor) -> Tensor:
    r"""The rows of ``M`` (``m x c``) each of ``rows x K`` indices reads: ``rows x K x c``."""
    return M.index_select(0, idx.reshape(-1)).view(*idx.shape, M.shape[-1])


def _weights_matmul(idx: Tensor, val: Tensor, M: Tensor, chunk: int = 2**22) -> Tensor:
    r"""``W M`` for ``rows x K`` weights and a dense ``m x c`` ``M`` (no autograd), ``rows x c``.

    Three routes to the same product, by cost: a gather of the ``K`` rows of ``M`` that each
    row reads and a batched GEMV (a few rows, or ``K c <= m``: fewer reads than a dense row of
    ``W`` has entries), a dense ``W`` scattered in row blocks and multiplied by ``M`` (coarse
    grids, ``m <= 48 K``), or torch's sparse CSR product (fine grids). Temporaries stay below
    about ``chunk`` elements. The CSR product needs a row-major ``M`` and copies any other; the
    other two take any layout."""
    rows, K = idx.shape
    m, c = M.shape
    if rows <= _GATHER_MAX_ROWS or K * c <= m:
        per = max(1, chunk // max(1, K * c))
        out = M.new_empty(rows, c)
        for start in range(0, rows, per):
            picked = _stencil_rows(M, idx[start : start + per])
            out[start : start + per] = (val[start : start + per].unsqueeze(-2) @ picked).squeeze(-2)
        return out
    if m <= _DENSE_W_MAX_RATIO * K:
        per = max(1, chunk // m)
        out = M.new_empty(rows, c)
        for start in range(0, rows, per):
            ii, vv = idx[start : start + per], val[start : start + per]
            W = M.new_zeros(ii.shape[0], m).scatter_add_(1, ii, vv)
            torch.matmul(W, M, out=out[start : start + per])
        return out
    crow = torch.arange(0, rows * K + 1, K, device=idx.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        W = torch.sparse_csr_tensor(
            crow, idx.reshape(-1), val.reshape(-1), (rows, m), check_invariants=False
        )
        return W @ M


class _InterpMatmul(torch.autograd.Function):
    r"""``W M`` differentiable in the weights (``M`` constant), in memory bounded by ``chunk``.

    Autograd through the gathered ``rows x K x c`` rows of ``M`` keeps all of them for the
    backward pass (measured: 8.9 GB for qLogNEI's 20 restarts x 81 points with WISKI's 6-input
    grids, m = 1,500, K = 240). The gradient needs only ``dval_rk = sum_c G_rc M[idx_rk, c]``:
    rows of ``G M^T`` read at the stencil (coarse grids) or the stencil's rows of ``M`` gathered
    again, one block of rows at a time. Hand-written because torch's sparse products do not
    differentiate in the values of a CSR matrix on the CPU.
    """

    @staticmethod
    def forward(ctx, idx: Tensor, val: Tensor, M: Tensor, chunk: int) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(idx, M)
        ctx.chunk = chunk
        return _weights_matmul(idx, val, M, chunk)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        idx, M = ctx.saved_tensors
        rows, K = idx.shape
        m, c = M.shape
        dval = grad.new_empty(rows, K)
        if m <= _DENSE_W_MAX_RATIO * K and K * c > m:  # one GEMM per block, then a gather
            per = max(1, ctx.chunk // m)
            for start in range(0, rows, per):
                T = grad[start : start + per] @ M.mT  # per x m
                dval[start : start + per] = T.gather(1, idx[start : start + per])
            return None, dval, None, None
        per = max(1, ctx.chunk // max(1, K * c))
        for start in range(0, rows, per):
            picked = _stencil_rows(M, idx[start : start + per])
            dval[start : start + per] = (picked @ grad[start : start + per].unsqueeze(-1)).squeeze(
                -1
            )
        return None, dval, None, None


def interp_quad(idx: Tensor, val: Tensor, M: Tensor, chunk: int = 2**22) -> Tensor:
    r"""``W M W^T`` (``... x N x N``, symmetric) for a symmetric ``m x m`` matrix ``M``.

    One sparse product ``W M`` and a gather of ``N^2 K`` of its entries, so for a few points per
    batch (a candidate batch in an acquisition optimisation) it needs no second product with
    ``m`` columns. Differentiable in ``val`` (hence in the inputs) by a hand-written backward
    (:class:`_InterpQuad`) that costs O(N^2 K) per batch element; ``M`` must not require a
    gradient.

    Args:
        idx: ``... x N x K`` interpolation indices.
        val: ``... x N x K`` interpolation weights (same batch shape as ``idx``).
        M: ``m x m`` symmetric matrix (no batch).
        chunk: bound on the elements of the ``rows x m`` temporary ``W M``.

    Returns:
        ``... x N x N``.
    """
    if M.requires_grad and torch.is_grad_enabled():
        raise ValueError("interp_quad differentiates in the weights only; M must be a constant.")
    batch, (N, K) = idx.shape[:-2], idx.shape[-2:]
    fi = idx.reshape(-1, N, K)
    fv = val.expand(idx.shape).reshape(-1, N, K)
    per = max(1, chunk // max(1, N * M.shape[-1]))
    out = [
        _InterpQuad.apply(fi[s : s + per], fv[s : s + per], M) for s in range(0, fi.shape[0], per)
    ]
    return (out[0] if len(out) == 1 else torch.cat(out, 0)).reshape(*batch, N, N)
