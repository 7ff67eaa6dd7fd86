r"""WISKI's marginal likelihood while there are fewer observations than grid points.

``G = W^T D^-1 W`` has rank ``r <= n``. While ``n`` is well below the number of active grid points
``m``, a rank-``r`` factor ``G = L L^T`` (``m x r``, pivoted Cholesky, computed once per data
state: ``G`` does not depend on the hyperparameters) turns every ``m x m`` operation of the
likelihood into an ``r x r`` one. ``z`` and ``h`` lie in the range of ``G`` in exact arithmetic,
but the factor stops at a tolerance, and directions of ``G`` below it can still carry a part of
them (observations that cluster, as a BO search's do, make ``G`` numerically rank-deficient:
measured up to 1e-7 of ``z``). So ``z_r = L u + e`` with ``u`` the least-squares coordinates and
``e`` the remainder, and with ``R R^T = K_UU``, the determinant identity and Woodbury's identity
for ``A = sigma^2 I + R^T L L^T R`` give::

    M = L^T K_UU L,   p = L^T K_UU e,   c = e^T K_UU e                (r x r, r, scalar)
    log det A = (m - r) log sigma^2 + log det(sigma^2 I_r + M)
    |L_A^-1 R^T z_r|^2 = u^T u + c / sigma^2 - sigma^2 b^T (sigma^2 I_r + M)^-1 b
                         with b = u - p / sigma^2

(with ``e = 0`` the last line is ``u^T M (sigma^2 I_r + M)^-1 u``). A fit step costs
``O(r m^2 + r^3)`` instead of ``O(m^3)`` (docs/math.md §1), or less with Kronecker products.
Early in a BO run (tens to hundreds of points on a grid of hundreds to a thousand) this is most of
WISKI's step time.
"""

from __future__ import annotations

import math
import weakref

import torch
from linear_operator.functions import pivoted_cholesky
from torch import Tensor

from bo_online.linalg import logdet_and_inverse_quad

__all__ = ["LowRankStatistics", "TensorRef", "low_rank_statistics", "low_rank_log_likelihood"]

#: Relative accuracy asked of the factor: the pivoted Cholesky stops when the residual's trace is
#: below this fraction of the largest diagonal entry of ``G``.
_FACTOR_TOL = 1e-12
#: For ``G`` accumulated below float64: the tolerance per observation in units of the dtype's
#: machine epsilon (each row of ``W^T D^-1 W`` adds its rounding).
_SINGLE_TOL_PER_ROW = 4.0


class TensorRef:
    r"""A weak reference to the statistics tensor a cached factor was computed from: the cache
    is keyed on the tensor itself, not on its address, which a new tensor may reuse once the old
    one is freed. Copied or pickled, it is a dead reference (the copy's statistics are other
    tensors, so its caches are rebuilt), and the model stays picklable."""

    __slots__ = ("_ref",)

    def __init__(self, tensor: Tensor | None = None) -> None:
        self._ref = None if tensor is None else weakref.ref(tensor)

    def __call__(self) -> Tensor | None:
        return None if self._ref is None else self._ref()

    def __reduce__(self) -> tuple[type, tuple]:
        return (TensorRef, ())


class LowRankStatistics:
    r"""``G = L L^T`` (``L``: ``m x r``) with ``z = L u_z + e_z`` and ``h = L u_h + e_h``
    (``u``: ``r``, least-squares coordinates; ``e``: ``m``, the remainders)."""

    def __init__(self, L: Tensor, u_z: Tensor, u_h: Tensor, e_z: Tensor, e_h: Tensor) -> None:
        self.L, self.u_z, self.u_h, self.e_z, self.e_h = L, u_z, u_h, e_z, e_h

    @property
    def rank(self) -> int:
        return self.L.shape[-1]


def low_rank_statistics(
    G: Tensor, z: Tensor, h: Tensor, max_rank: int, tol: float = _FACTOR_TOL
) -> LowRankStatistics | None:
    r"""The rank-``r`` factor of ``G`` (``m x m``, PSD, no gradient) with ``r <= max_rank``, and
    the coordinates of ``z`` and ``h`` (``m``) in it with their remainders; None when ``G``
    needs a larger rank (then the caller uses the ``m x m`` path). Below float64 the factor and
    coordinates are computed in float64 and returned in ``G``'s dtype: single precision cannot
    reach the factor's tolerance (the ``m x m`` path would take over, several times slower)."""
    if max_rank < 1 or G.requires_grad:
        return None
    if G.dtype != torch.float64:
        # G summed in single precision is low rank only to its rounding: ask that of the factor
        tol = max(tol, _SINGLE_TOL_PER_ROW * max_rank * torch.finfo(G.dtype).eps)
        low = low_rank_statistics(G.double(), z.double(), h.double(), max_rank, tol)
        if low is None:
            return None
        parts = (low.L, low.u_z, low.u_h, low.e_z, low.e_h)
        return LowRankStatistics(*(t.to(G.dtype) for t in parts))
    L = pivoted_cholesky(G, rank=max_rank, error_tol=tol)
    r = L.shape[-1]
    residual = torch.diagonal(G).sum() - L.pow(2).sum()
    if r >= G.shape[-1] or residual > tol * G.shape[-1] * torch.diagonal(G).max():
        return None
    targets = torch.stack([z, h], -1)
    # least squares by Householder QR (LAPACK's default least-squares driver here gave results
    # that differed in the last bits from call to call, so two equal fits could part)
    Q, T = torch.linalg.qr(L)
    coords = torch.linalg.solve_triangular(T, Q.mT @ targets, upper=True)
    rest = targets - L @ coords
    return LowRankStatistics(L, coords[:, 0], coords[:, 1], rest[:, 0], rest[:, 1])


def low_rank_log_likelihood(
    low: LowRankStatistics,
    M_ext: Tensor,
    sigma2: Tensor,
    beta: Tensor,
    sd: Tensor,
    s_r: Tensor,
    n: Tensor,
    logdet_D: Tensor,
) -> Tensor:
    r"""``log p(y_std)`` of the SKI GP from the factored statistics (module docstring).

    Args:
        low: the factor of ``G`` and the coordinates of ``z``, ``h`` with their remainders.
        M_ext: ``[L, e]^T K_UU [L, e]`` (``(r + 1) x (r + 1)``; ``K_UU`` with jitter, on the
            same active grid points; ``e = (e_z - beta e_h) / sd``), differentiable: ``M``,
            ``p`` and ``c`` of the module docstring.
        sigma2: standardised noise variance; ``beta``, ``sd``: the mean offset and outcome scale
            (``z_r = (z - beta h) / sd``); ``s_r``: the standardised ``y^T D^-1 y``.
        n, logdet_D: the number of observations and ``log det D``.
    """
    m, r = low.L.shape
    u = (low.u_z - beta * low.u_h) / sd
    M, p, c = M_ext[:r, :r], M_ext[:r, r], M_ext[r, r]
    eye = torch.eye(r, dtype=M.dtype, device=M.device)
    logdet_C, quad = logdet_and_inverse_quad(0.5 * (M + M.mT) + sigma2 * eye, u - p / sigma2)
    fit_term = u.pow(2).sum() + c / sigma2 - sigma2 * quad  # |L_A^-1 R^T z_r|^2
    logdet_A = (m - r) * sigma2.log() + logdet_C
    return -0.5 * (
        (s_r - fit_term) / sigma2
        + (n - m) * sigma2.log()
        + logdet_D
        + logdet_A
        + n * math.log(2 * math.pi)
    )
