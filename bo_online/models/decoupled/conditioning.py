r"""Closed-form folding of new points into the decoupled SVGP (docs/math.md §3).

Exact conditioning grows the covariance basis by the new points (``L' = blockdiag(L, N*^{-1/2})``,
bordered Cholesky of ``H``, a rank-q correction of ``a_beta``); in fold mode the new points are
added to the site statistics of fixed bases and ``a, B`` re-solved (rank-q Cholesky updates of
the kept factors)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor
from typing_extensions import Self

from bo_online.linalg import (
    cholesky_solve,
    cholesky_update,
    matmul_folded,
    psd_cholesky,
    schur_cholesky,
    solve_lower,
    solve_lower_transpose,
)

__all__ = ["BorderedState", "DecoupledConditioningMixin"]


@dataclasses.dataclass(frozen=True)
class BorderedState:
    r"""The covariance state after exact conditioning on ``q`` points, as the parent's blocks
    plus the new rows: ``L' = blockdiag(L0, diag(r))`` and ``chol_H' = [[C0, 0], [S_t, D]]``.

    Attributes:
        beta0: the parent's covariance bases, ``batch0 x M_b x d``.
        L0: the parent's ``L``, ``batch0 x M_b x M_b``.
        C0: the parent's ``chol_H``, ``batch0 x M_b x M_b``.
        r: ``N*^{-1/2}`` of the new points, ``batch x q``.
        S_t: the new rows' off-diagonal block of ``chol_H'``, ``batch x q x M_b``.
        D: their diagonal block, ``batch x q x q``.
    """

    beta0: Tensor
    L0: Tensor
    C0: Tensor
    r: Tensor
    S_t: Tensor
    D: Tensor

    def L(self) -> Tensor:
        r"""``L'`` as one ``batch x (M_b + q) x (M_b + q)`` tensor."""
        batch = torch.broadcast_shapes(self.L0.shape[:-2], self.r.shape[:-1])
        m, q = self.L0.shape[-1], self.r.shape[-1]
        out = self.L0.new_zeros(*batch, m + q, m + q)
        out[..., :m, :m] = self.L0
        out[..., m:, m:] = torch.diag_embed(self.r)
        return out

    def chol_H(self) -> Tensor:
        r"""``chol_H'`` as one ``batch x (M_b + q) x (M_b + q)`` tensor."""
        batch = torch.broadcast_shapes(self.C0.shape[:-2], self.S_t.shape[:-2])
        m, q = self.C0.shape[-1], self.D.shape[-1]
        out = self.C0.new_zeros(*batch, m + q, m + q)
        out[..., :m, :m] = self.C0
        out[..., m:, :m] = self.S_t
        out[..., m:, m:] = self.D
        return out


class DecoupledConditioningMixin:
    r"""``condition_on_observations`` / ``update`` of
    :class:`~bo_online.models.decoupled.DecoupledSVGP`, O(M_beta^2 q + M_alpha q) (exact growth)
    or O(M_alpha^2 q) (fold mode), independent of n."""

    def _conditioned_state(self, X: Tensor, noise: Tensor | None):
        r"""The Y-independent part of conditioning on ``X`` (``batch x q x d``), shared by
        fantasies: the grown ``beta``, the new covariance state in bordered form (see
        :class:`BorderedState`), and what ``a`` needs. Raises before anything changes.

        The parent's ``M_b x M_b`` blocks of ``L'`` and ``chol_H'`` are the parent's own, so
        only the ``q`` new rows are formed per batch element (O(b (M_b q + q^2)) memory, not
        the ``b x (M_b + q) x (M_b + q)`` factors): the parent's factors are never broadcast
        over the batch of ``X``."""
        N = self._noise_of_points(X, noise)  # batch x q, > 0
        batch = torch.broadcast_shapes(self.beta_points.shape[:-2], X.shape[:-2], N.shape[:-1])
        beta0, L0, chol_H0 = self.beta_points, self.L, self.chol_H
        beta = beta0.expand(*batch, *beta0.shape[-2:])
        Xb = X.expand(*batch, *X.shape[-2:])
        Nb = N.expand(*batch, N.shape[-1])
        K_bX = self.covar_module(beta, Xb).to_dense()  # batch x M_b x q
        K_XX = self.covar_module(Xb).to_dense()  # batch x q x q
        LtK = matmul_folded(L0.transpose(-1, -2), K_bX)  # batch x M_b x q, O(M_b^2 q)
        V = solve_lower(chol_H0, LtK)  # batch x M_b x q
        # Posterior covariance at the new points plus their noise, factorised (q x q).
        S = K_XX - V.transpose(-1, -2) @ V + torch.diag_embed(Nb)
        R_S = psd_cholesky(S)
        # Bordered Cholesky of H' = I + L'^T K_beta' L' with L' = blockdiag(L, N^{-1/2}): the new
        # rows [S_t, D] of chol_H', S_t = (chol_H^-1 L^T K_{beta,X*} N^{-1/2})^T = (V N^{-1/2})^T.
        r = Nb.rsqrt()
        corner = r.unsqueeze(-1) * K_XX * r.unsqueeze(-2)
        corner = corner + torch.eye(corner.shape[-1], dtype=corner.dtype, device=corner.device)
        S_t = (V * r.unsqueeze(-2)).transpose(-1, -2)  # batch x q x M_b
        D = schur_cholesky(corner, S_t.transpose(-1, -2))  # batch x q x q
        # The a-correction map: L H^{-1} L^T K_{beta,X*} = L chol_H^{-T} V (batch x M_b x q).
        corr = matmul_folded(L0, solve_lower_transpose(chol_H0, V))
        beta_new = torch.cat([beta, Xb], dim=-2)
        return beta_new, BorderedState(beta0, L0, chol_H0, r, S_t, D), R_S, corr

    def _conditioned_a(self, X: Tensor, Y: Tensor, R_S: Tensor, corr: Tensor) -> Tensor:
        r"""New ``a_beta`` (``sample x batch x (M_beta + q)``) for observations ``Y``."""
        resid = Y - self._mean_at(X)  # sample x batch x q
        c = cholesky_solve(R_S, resid.unsqueeze(-1))  # sample x batch x q x 1
        a_old = self.a_beta.unsqueeze(-1) - corr @ c  # sample x batch x M_b x 1
        return torch.cat([a_old, c], dim=-2).squeeze(-1)

    def _condition(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> Self:
        if noise is not None and noise.dim() > X.dim() - 1:
            # Noise carries fantasy sample dims; it is the same for every sample.
            noise = noise[(0,) * (noise.dim() - X.dim() + 1)]  # (reshape fails for q = 0)
        beta, bordered, R_S, corr = self._conditioned_state(X, noise)
        a_beta = self._conditioned_a(X, Y, R_S, corr)
        new = self._shallow_copy()
        new.beta_points, new.a_beta = beta, a_beta
        new._batch_shape = torch.broadcast_shapes(a_beta.shape[:-1], beta.shape[:-2])
        if new._batch_shape == torch.Size():
            new.L, new.chol_H = bordered.L(), bordered.chol_H()
        else:
            # A fantasy (batched) model: its factors stay bordered, the parent's blocks shared;
            # they are formed whole only where read (see DecoupledSVGP.__getattr__).
            new.L = None  # (drops any formation the parent had pending)
            new._buffers["chol_H"] = None
            new.__dict__["_bordered"] = bordered
            new.__dict__["_covariance_pending"] = True
        new.site_Q, new.site_s = None, None  # grown bases: exact conditioning, no sites
        if self.fixed_noise:  # the noise of every point held: its mean is observation_noise's
            batch = torch.broadcast_shapes(X.shape[:-2], self.train_noise.shape[:-1])
            old = self.train_noise.expand(*batch, self.train_noise.shape[-1])
            new.train_noise = torch.cat([old, noise.expand(*batch, X.shape[-2])], dim=-1)
        if new._batch_shape == torch.Size():  # a plain (non-fantasy) model keeps the data
            new.train_X = torch.cat([self.train_X, X], dim=-2)
            new.train_y = torch.cat([self.train_y, Y], dim=-1)
        new._cache_key = self._cache_key
        return new

    def _update(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        r"""In place. In fold mode (the state is the site optimum for fixed bases, as after
        :meth:`fit` or construction on more points than ``num_cov_bases``) the new points are
        folded into the site statistics and the bases stay capped (:meth:`_fold`). Otherwise the
        exact conditioning grows the covariance basis by ``q``; once it would exceed
        ``num_cov_bases + max_basis_growth`` the bases are compressed back to the caps and the
        model switches to fold mode on all held data (a one-off O(n M_alpha^2))."""
        if self._in_fold_mode():
            self._fold(X, Y, noise)
            return
        beta, bordered, R_S, corr = self._conditioned_state(X, noise)  # raises before changes
        a_beta = self._conditioned_a(X, Y, R_S, corr)
        train_noise = self.train_noise
        if self.fixed_noise:
            train_noise = torch.cat([self.train_noise, noise], dim=-1)
        L, chol_H = bordered.L(), bordered.chol_H()
        self.beta_points, self.L, self.chol_H, self.a_beta = beta, L, chol_H, a_beta
        self.train_X = torch.cat([self.train_X, X], dim=-2)
        self.train_y = torch.cat([self.train_y, Y], dim=-1)
        self.train_noise = train_noise
        if self._gaussian() and self.num_beta > self.num_cov_bases + self.max_basis_growth:
            self._compress()
            self._set_sites(self.beta_points, self.alpha_points)

    def _fold(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        r"""Fold ``q`` points into fixed bases: ``Q += K_{Z,X*} N*^{-1} K_{X*,Z}``, ``s +=
        K_{Z,X*} N*^{-1} (y* - c)``, then ``a = (K_Z + Q)^{-1} s`` and the covariance factor
        ``chol(K_j + P~)`` by rank-q Cholesky updates (``P~`` is ``Q``'s beta block plus jitter).

        After any chain of folds the state equals :meth:`_set_sites` on all held data with the
        same bases and hyperparameters, i.e. the optimum of the ELBO over ``(a, B)`` for those
        fixed bases (Titsias-style collapsed optimum; the paper's Eqs. 9-10 maximised in closed
        form). Fold mode predicts from ``chol(K_j)`` (unchanged) and ``chol(K_j + P~)``
        (:meth:`_whitened`), so ``L`` and ``chol_H`` are formed only when read
        (:meth:`_materialise_covariance`). Cost O(M_alpha^2 q) per update, independent of n and
        of the number of updates."""
        N = self._noise_of_points(X, noise)  # q, > 0 (raises before any change)
        Rb, RA, RC = self._fold_factors()
        # Sites and factors in their own dtype (float64 for a float32 model: see site_dtype).
        wd = RA.dtype
        Z = torch.cat([self.beta_points, self.alpha_points], dim=-2).to(wd)
        K = self.covar_module(Z, X.to(wd)).to_dense()  # M x q
        w = N.to(wd).reciprocal()
        Kw = K * w.sqrt()  # Q' = Q + Kw Kw^T
        Q = torch.addmm(self.site_Q.to(wd), Kw, Kw.transpose(-1, -2))
        s = self.site_s.to(wd) + K @ (w * (Y.to(wd) - self.mean_module.constant.detach().to(wd)))
        RA = cholesky_update(RA, Kw)
        RC = cholesky_update(RC, Kw[: self.beta_points.shape[-2]])
        a = cholesky_solve(RA, s.unsqueeze(-1)).squeeze(-1).to(self.beta_points.dtype)
        train_noise = self.train_noise
        if self.fixed_noise:
            train_noise = torch.cat([self.train_noise, noise], dim=-1)
        mb = self.beta_points.shape[-2]
        self.a_beta, self.a_alpha = a[:mb], a[mb:]
        self.site_Q, self.site_s = Q, s
        self._kept_fold_factors = (Q, Rb, RA, RC)
        self.__dict__["_covariance_pending"] = True  # L and chol_H: formed when read
        self._buffers["L"], self._buffers["chol_H"] = None, None
        self.train_X = torch.cat([self.train_X, X], dim=-2)
        self.train_y = torch.cat([self.train_y, Y], dim=-1)
        self.train_noise = train_noise
