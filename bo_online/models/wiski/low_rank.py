r"""WISKI's marginal likelihood while there are fewer observations than grid points.

``G = W^T D^-1 W`` has rank ``r <= n``. While ``n`` is well below the number of active grid points
``m``, a rank-``r`` factor ``G = L L^T`` (``m x r``, pivoted Cholesky, computed once per data
state: ``G`` does not depend on the hyperparameters) turns every ``m x m`` operation of the
likelihood into an ``r x r`` one. With ``V = L^T R`` (``R R^T = K_UU``) and ``z_r = L u``
(``z`` and ``h`` lie in the range of ``G``), the push-through and determinant identities give::

    M = L^T K_UU L                                          (r x r)
    log det(sigma^2 I_m + R^T G R) = (m - r) log sigma^2 + log det(sigma^2 I_r + M)
    |L_A^-1 R^T z_r|^2 = u^T M (sigma^2 I_r + M)^-1 u = u^T u - sigma^2 u^T (sigma^2 I_r + M)^-1 u

so a fit step costs ``O(r m^2 + r^3)`` instead of ``O(m^3)`` (docs/math.md §1). Early in a BO run
(tens of points on a grid of hundreds to a thousand) this is most of WISKI's step time.
"""

from __future__ import annotations

import math

import torch
from linear_operator.functions import pivoted_cholesky
from torch import Tensor

from bo_online.linalg import logdet_and_inverse_quad

__all__ = ["LowRankStatistics", "low_rank_statistics", "low_rank_log_likelihood"]

#: Relative accuracy asked of the factor: the pivoted Cholesky stops when the residual's trace is
#: below this fraction of the largest diagonal entry of ``G``.
_FACTOR_TOL = 1e-12
#: A factor is kept only if it reproduces ``z`` and ``h`` to this relative accuracy.
_RANGE_TOL = 1e-9


class LowRankStatistics:
    r"""``G = L L^T`` (``L``: ``m x r``) with ``z = L u_z`` and ``h = L u_h`` (``r`` each)."""

    def __init__(self, L: Tensor, u_z: Tensor, u_h: Tensor) -> None:
        self.L, self.u_z, self.u_h = L, u_z, u_h

    @property
    def rank(self) -> int:
        return self.L.shape[-1]


def low_rank_statistics(G: Tensor, z: Tensor, h: Tensor, max_rank: int) -> LowRankStatistics | None:
    r"""The rank-``r`` factor of ``G`` (``m x m``, PSD, no gradient) with ``r <= max_rank``, and
    the coordinates of ``z`` and ``h`` (``m``) in it; None when ``G`` needs a larger rank, when
    the factor does not reproduce ``z`` and ``h`` to ``_RANGE_TOL`` (then the caller uses the
    ``m x m`` path), or in single precision (the factor's rounding would show in the fit)."""
    if G.dtype != torch.float64 or max_rank < 1 or G.requires_grad:
        return None
    L, piv = pivoted_cholesky(G, rank=max_rank, error_tol=_FACTOR_TOL, return_pivots=True)
    r = L.shape[-1]
    residual = torch.diagonal(G).sum() - L.pow(2).sum()
    if r >= G.shape[-1] or residual > _FACTOR_TOL * G.shape[-1] * torch.diagonal(G).max():
        return None
    # Rows piv[:r] of L are lower triangular (pivot k has non-zeros in columns 0..k only).
    head = L[piv[:r]]
    coords = torch.linalg.solve_triangular(head, torch.stack([z, h], -1)[piv[:r]], upper=False)
    for target, u in zip((z, h), coords.unbind(-1)):
        scale = target.abs().max().clamp_min(torch.finfo(G.dtype).tiny)
        if (L @ u - target).abs().max() > _RANGE_TOL * scale:
            return None
    return LowRankStatistics(L, coords[:, 0], coords[:, 1])


def low_rank_log_likelihood(
    low: LowRankStatistics,
    M: Tensor,
    sigma2: Tensor,
    beta: Tensor,
    sd: Tensor,
    s_r: Tensor,
    n: Tensor,
    logdet_D: Tensor,
) -> Tensor:
    r"""``log p(y_std)`` of the SKI GP from the factored statistics (module docstring).

    Args:
        low: the factor of ``G`` and the coordinates of ``z``, ``h``.
        M: ``L^T K_UU L`` (``r x r``; ``K_UU`` with jitter, on the same active grid points),
            differentiable.
        sigma2: standardised noise variance; ``beta``, ``sd``: the mean offset and outcome scale
            (``z_r = (z - beta h) / sd``); ``s_r``: the standardised ``y^T D^-1 y``.
        n, logdet_D: the number of observations and ``log det D``.
    """
    m, r = low.L.shape
    u = (low.u_z - beta * low.u_h) / sd
    eye = torch.eye(r, dtype=M.dtype, device=M.device)
    logdet_C, quad = logdet_and_inverse_quad(0.5 * (M + M.mT) + sigma2 * eye, u)
    fit_term = u.pow(2).sum() - sigma2 * quad  # |L_A^-1 R^T z_r|^2
    logdet_A = (m - r) * sigma2.log() + logdet_C
    return -0.5 * (
        (s_r - fit_term) / sigma2
        + (n - m) * sigma2.log()
        + logdet_D
        + logdet_A
        + n * math.log(2 * math.pi)
    )
