r"""WISKI's cached factors, tied to the hyperparameters, and their rank-q updates.

With ``R R^T = K_UU + jitter`` and ``A = sigma^2 I + R^T G R = L_A L_A^T`` (``m x m``), the
posterior needs ``R``, ``L_A``, ``v = L_A^-1 R^T z_r`` and the mean coefficients
``R L_A^-T v``; built once per hyperparameter state in O(m^3), independent of n. Lazily, for
bulk requests and fantasies, ``S = R L_A^-T`` and ``M = S S^T = R A^-1 R^T`` too; new points
update them by Woodbury algebra in O(m^2 q) (:func:`_updated_roots`) instead of a rebuild (in
float64; below it they are dropped, and rebuilt from ``L_A`` as a loaded model's are).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from gpytorch.utils.warnings import NumericalWarning
from torch import Tensor

from bo_online.linalg import (
    psd_cholesky,
    psd_cholesky_and_jitter,
    solve_lower,
    solve_lower_transpose,
)
from bo_online.models.wiski.grid import interp_matmul
from bo_online.models.wiski.kronecker import kron_congruence, kron_dense, kron_roots

__all__ = ["WISKICacheMixin"]


class WISKICacheMixin:
    r"""Methods of :class:`~bo_online.models.wiski.WISKI` that build its cached factors."""

    def _block_sizes(self, active: Tensor | None = None) -> list[int] | None:
        r"""Sizes of the diagonal blocks of ``K_UU`` (restricted to the ``active`` grid points,
        which are sorted) for the additive model; None for a single grid."""
        if self.input_groups is None:
            return None
        sizes = self.grid.sizes_per_grid
        if active is None:
            return list(sizes)
        comp = self._component_of_points(active.device)[active]
        return torch.bincount(comp, minlength=len(sizes)).tolist()

    def _component_of_points(self, device: torch.device) -> Tensor:
        r"""``m``: the additive component each stacked grid point belongs to."""
        sizes = self.grid.sizes_per_grid
        return torch.repeat_interleave(
            torch.arange(len(sizes), device=device), torch.tensor(sizes, device=device)
        )

    @staticmethod
    def _root_and_gram(K: Tensor, G: Tensor, sizes: list[int] | None) -> tuple[Tensor, Tensor]:
        r"""``R`` (``R R^T = K``, lower) and ``R^T G R``. For a block-diagonal ``K`` (the additive
        model, diagonal blocks of ``sizes``) ``R`` is the block-diagonal of the blocks' Cholesky
        factors (which is the Cholesky factor of ``K``) and both products go block by block:
        ``2 m^3 / J`` flops instead of ``2 m^3``."""
        if sizes is None or len(sizes) == 1:
            R = psd_cholesky(K)
            return R, R.mT @ G @ R
        starts = [sum(sizes[:j]) for j in range(len(sizes))]
        roots = [psd_cholesky(K[a : a + b, a : a + b]) for a, b in zip(starts, sizes)]
        GR = torch.cat([G[:, a : a + b] @ Rb for a, b, Rb in zip(starts, sizes, roots)], -1)
        RtGR = torch.cat([Rb.mT @ GR[a : a + b] for a, b, Rb in zip(starts, sizes, roots)], 0)
        return torch.block_diag(*roots), RtGR

    def _root_and_gram_of_model(self, G: Tensor) -> tuple[Tensor, Tensor]:
        r"""``R`` (``R R^T`` = :meth:`_grid_kernel`, lower, ``m x m``) and ``R^T G R`` for this
        model's kernel: by Kronecker algebra where the kernel factors over dimensions
        (:mod:`.kronecker`), else densely (:meth:`_root_and_gram`)."""
        factors = self._kronecker_factors()
        if factors is None:
            return self._root_and_gram(self._grid_kernel(), G, self._block_sizes())
        roots = kron_roots(factors)
        return kron_dense(roots), kron_congruence(roots, G)

    def _rebuild_caches(self) -> None:
        R, A = self._root_and_gram_of_model(self.G)
        sigma2 = self._sigma2()
        m = R.shape[-1]
        A = A + sigma2 * torch.eye(m, dtype=A.dtype, device=A.device)
        L_A, shift = psd_cholesky_and_jitter(0.5 * (A + A.mT))
        _warn_if_jitter_rivals_noise(shift, sigma2)
        z_r, _ = self._residual_stats()
        v = solve_lower(L_A, (R.mT @ z_r).unsqueeze(-1)).squeeze(-1)
        # R row-major: every update reads rows of it through a sparse product (grid.interp_matmul),
        # which would copy a column-major (LAPACK-layout) R each time; L_A stays column-major,
        # the layout of the blocked Cholesky update (linalg._panels_column_major).
        self.chol_K, self.chol_A, self.v = R.contiguous(), L_A, v
        self.mean_coef = self._mean_coef(R, L_A, v)
        self._shared = {}
        if self.d_idx is not None:
            self.d_F, self.d_C, self.d_mean_coef, self.d_SF = self._delta_caches(
                self.d_idx, self.d_val, self.d_D, self.d_y
            )

    @staticmethod
    def _mean_coef(R: Tensor, L_A: Tensor, b: Tensor) -> Tensor:
        r"""``R L_A^-T b`` for ``b``: ``... x m`` (one triangular solve with many right sides)."""
        m = b.shape[-1]
        cols = b.reshape(-1, m).mT
        return (R @ solve_lower_transpose(L_A, cols)).mT.reshape(b.shape)

    def _factor_root(self) -> Tensor:
        r"""``S = R L_A^-T`` (``m x m``, ``S S^T = R A^-1 R^T``), O(m^3) once per factor state,
        cached in ``_shared`` (shared with conditioned models, replaced when the factors
        change)."""
        S = self._shared.get("S")
        if S is None:
            S = solve_lower(self.chol_A, self.chol_K.mT).mT.contiguous()  # row-major: rows read
            self._shared["S"] = S
        return S

    def _factor_gram(self) -> Tensor:
        r"""``M = S S^T = R A^-1 R^T`` (``m x m``, symmetric), cached like :meth:`_factor_root`."""
        M = self._shared.get("M")
        if M is None:
            S = self._factor_root()
            M = S @ S.mT
            M = 0.5 * (M + M.mT)
            self._shared["M"] = M
        return M


#: Jitter on ``A = sigma^2 I + R^T G R`` above this fraction of ``sigma^2`` is warned about.
JITTER_WARN_FRACTION = 0.01


def _warn_if_jitter_rivals_noise(shift: Tensor, sigma2: Tensor) -> None:
    r"""Warn where the jitter ``shift`` that factorising ``A = sigma^2 I + R^T G R`` needed is
    more than :data:`JITTER_WARN_FRACTION` of ``sigma^2`` (scalar tensors, standardised units).

    ``A + j I`` is the factor of a model whose prior covariance is shrunk by about
    ``sigma^2 / (sigma^2 + j)``: silently, a float32 WISKI on near-noise-free repeated points
    (d = 6, all pairs) took ``j`` = 9.6 to 29 against ``sigma^2`` = 2.2 at its refactorisations
    and predicted 0.5 (70% of the targets' sd) away from the same model in float64.
    """
    j, s2 = float(shift.max()), float(sigma2)
    if j <= JITTER_WARN_FRACTION * s2:
        return
    warnings.warn(
        f"WISKI's factor needed jitter {j:.3g} on its diagonal, {j / s2:.3g} times its noise "
        f"term sigma^2 = {s2:.3g}, in {shift.dtype}: its predictions are those of a model "
        "with a smaller prior variance. Its statistics are too ill-conditioned for this "
        "precision (near-noise-free or much-repeated data): run it in float64 (dtype="
        "torch.float64, --dtype float64), or give it more observation noise.",
        NumericalWarning,
        stacklevel=3,
    )


def _updated_roots(shared: dict[str, Any], idx: Tensor, wv: Tensor) -> dict[str, Any]:
    r"""The cached root ``S`` and Gram ``M = S S^T = R A^-1 R^T`` (both ``m x m``) after
    ``A' = A + U U^T``, ``U = R^T W^T D^-1/2`` (``idx``/``wv``: ``q x K`` interpolation indices
    and weights already scaled by ``D^-1/2``), by rank-q algebra in O(m^2 q) instead of the
    O(m^3) rebuild; a new dict, and new tensors when the old dict is shared with conditioned
    models or other shallow copies (``"aliased"``), else the old tensors updated in place.

    With ``F = S^T W^T D^-1/2`` (``m x q``, 4^d rows of ``S`` per point) and ``SF = S F =
    M W^T D^-1/2`` (4^d rows of ``M``), Woodbury gives
    ``M' = M - SF (I + F^T F)^-1 SF^T``, and ``S' = S (I + F Gamma F^T)`` is a root of it when
    ``(I + F Gamma F^T)^2 = (I + F F^T)^-1``: in the eigenbasis ``F^T F = E diag(lam) E^T``,
    ``Gamma = E diag(gamma) E^T`` with ``gamma = -1 / (s (1 + s))``, ``s = sqrt(1 + lam)``.
    ``S'`` is then a root of ``M'`` but no longer ``R L_A'^-T``; every use of ``S`` needs only
    ``S S^T = M`` (:meth:`WISKI._delta_caches` reads ``S v`` as the mean coefficients).
    Cached rows of points (``"rows"``) are dropped: they belong to the old state.
    """
    S, M = shared.get("S"), shared.get("M")
    if S is None:
        return {}
    F = interp_matmul(idx, wv, S).mT  # m x q
    FtF = F.mT @ F
    SF = interp_matmul(idx, wv, M).mT if M is not None else S @ F  # m x q
    lam, E = torch.linalg.eigh(FtF)
    root = (1.0 + lam).sqrt()
    Gamma = (E * (-1.0 / (root * (1.0 + root))).unsqueeze(-2)) @ E.mT
    # In place (one pass over each matrix instead of a fresh copy, ~3x faster at m = 1,000)
    # unless another model object reads the same dict (WISKI._shallow_copy marks it).
    in_place = not shared.get("aliased", False)
    if in_place:
        out = {"S": S.addmm_(SF @ Gamma, F.mT)}
    else:
        out = {"S": torch.addmm(S, SF @ Gamma, F.mT)}
    if M is not None:
        C = torch.linalg.cholesky(torch.eye(F.shape[-1], dtype=F.dtype, device=F.device) + FtF)
        H = torch.linalg.solve_triangular(C, SF.mT, upper=False)  # C^-1 SF^T: q x m
        if in_place:
            out["M"] = M.addmm_(H.mT, H, alpha=-1.0)
        else:
            out["M"] = torch.addmm(M, H.mT, H, alpha=-1.0)
    return out
