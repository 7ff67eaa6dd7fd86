r"""Inducing-point initialisation for sparse GP surrogates.

:func:`select_inducing_points` picks inducing inputs by greedy variance reduction (the pivoted
Cholesky factorisation of ``K_XX``, Burt et al. 2020): each pick is the data point whose prior
variance given the points already picked is largest. The picking stops early when every data point
is already explained (residual variance below ``tol`` times the prior variance), which is what
happens when ``m`` exceeds the number of distinct inputs -- always at the start of BO, where n is a
handful of points. The remaining slots are then filled by a scrambled Sobol sequence over the input
box, so the surrogate keeps ``m`` inducing points that cover the whole domain as data arrive.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel
from torch import Tensor
from torch.quasirandom import SobolEngine

__all__ = ["select_inducing_points"]


def select_inducing_points(
    X: Tensor,
    kernel: Kernel,
    num_inducing: int,
    bounds: Tensor | None = None,
    tol: float = 1e-6,
    seed: int = 0,
) -> Tensor:
    r"""``num_inducing x d`` inducing inputs: greedy variance reduction on ``X``, Sobol fill.

    Args:
        X: ``n x d`` training inputs.
        kernel: the GPyTorch kernel whose prior variance is reduced.
        num_inducing: m, the number of inducing points returned (any m >= 1; may exceed n).
        bounds: ``2 x d`` box for the Sobol fill; default the unit cube enlarged to contain X.
        tol: stop picking data points when the largest residual variance falls below ``tol``
            times the largest prior variance (duplicates and near-duplicates are not picked).
        seed: seed of the scrambled Sobol sequence.

    Returns:
        ``num_inducing x d`` tensor (picked data points first, then Sobol points).
    """
    if num_inducing < 1:
        raise ValueError(f"num_inducing must be >= 1, got {num_inducing}.")
    if X.dim() != 2:
        raise ValueError(f"X must be n x d, got shape {tuple(X.shape)}.")
    n, d = X.shape
    picked = X[:0]
    if n > 0:
        picked = X.detach()[_greedy_variance_pivots(X.detach(), kernel, min(num_inducing, n), tol)]
    missing = num_inducing - picked.shape[0]
    if missing <= 0:
        return picked
    if bounds is None:
        lo = torch.zeros(d, dtype=X.dtype, device=X.device)
        hi = torch.ones(d, dtype=X.dtype, device=X.device)
        if n > 0:
            lo = torch.minimum(lo, X.detach().min(0).values)
            hi = torch.maximum(hi, X.detach().max(0).values)
    else:
        lo, hi = bounds[0].to(X), bounds[1].to(X)
    # The loops' initial designs are scrambled Sobol points too (a BO run of seed 0 starts from
    # this very sequence), so fill points can coincide with data points: a repeated inducing
    # input made K_ZZ singular up to its jitter (50 of 128 repeated after 25 points). Draw as
    # many more as there are picked points and keep the first ``missing`` that repeat none.
    fill = lo + (hi - lo) * SobolEngine(d, scramble=True, seed=seed).draw(
        missing + picked.shape[0]
    ).to(X)
    if picked.shape[0]:
        scale = (hi - lo).abs().max().clamp_min(1.0)
        fresh = torch.cdist(fill, picked).min(-1).values > 1e-6 * scale  # float32 round-off
        fill = fill[fresh]
    return torch.cat([picked, fill[:missing]], dim=0)


def _greedy_variance_pivots(X: Tensor, kernel: Kernel, rank: int, tol: float) -> Tensor:
    r"""Pivots of the partial pivoted Cholesky of ``K_XX``, one kernel column per pick.

    Written out (rather than ``linear_operator``'s ``pivoted_cholesky``) so that memory stays
    O(n m): the n x n kernel matrix is never formed, which matters for n = 1e5 and beyond.
    """
    with torch.no_grad():
        resid = kernel(X, diag=True).clone()  # residual variances
        top = resid.max().clamp_min(1e-300)
        L = X.new_zeros(X.shape[0], rank)
        pivots: list[int] = []
        for j in range(rank):
            i = int(torch.argmax(resid))
            if resid[i] <= tol * top:
                break
            col = kernel(X, X[i : i + 1]).to_dense().squeeze(-1)
            col = (col - L[:, :j] @ L[i, :j]) / resid[i].sqrt()
            L[:, j] = col
            resid = (resid - col * col).clamp_min(0.0)
            resid[i] = 0.0
            pivots.append(i)
    return torch.tensor(pivots, dtype=torch.long, device=X.device)
