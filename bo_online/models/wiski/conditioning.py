r"""WISKI's conditioning: lazy rank-q corrections for fantasies, in-place updates for the loop.

``condition_on_observations``/``fantasize`` keep the base model's factors and a rank-q correction
``F = L_A^-1 U``, ``C C^T = I + F^T F`` with ``U = R^T W*^T D*^-1/2`` for the q new points: the
covariance is shared by all fantasy samples (only the mean coefficients differ), O(4^d m q) per
candidate batch. ``update`` folds points into the statistics and ``L_A`` by a rank-q Cholesky
update, O(m^2 q) whatever n is (docs/math.md §1).
"""

from __future__ import annotations

import torch
from torch import Tensor
from typing_extensions import Self

from bo_online.linalg import cholesky_update, matmul_folded, solve_lower
from bo_online.models.wiski.caches import _updated_roots
from bo_online.models.wiski.grid import interp_matmul, interp_vector
from bo_online.models.wiski.statistics import _DELTA_NAMES

__all__ = ["WISKIConditioningMixin"]


class WISKIConditioningMixin:
    r"""Methods of :class:`~bo_online.models.wiski.WISKI` that condition it on new points."""

    def _delta_caches(
        self, idx: Tensor, val: Tensor, D: Tensor, y: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        r"""Rank-q correction for pending points: ``F = L_A^-1 U`` (``batch x m x q``),
        ``C C^T = I + F^T F``, the mean coefficients ``R A'^-1 R^T z'`` (``sample x batch x m``)
        and ``S F = M W*^T D*^-1/2`` (``batch x m x q``).
        ``U = R^T W*^T D*^-1/2``; nothing of size m x m per batch is formed."""
        q = idx.shape[-2]
        # Everything per candidate batch reads 4^d rows of two m x m matrices cached once per
        # base state (fantasies come in thousands of batches from one base model):
        #   F^T = D*^-1/2 W* R L_A^-T = D*^-1/2 W* S                      (O(4^d m q))
        #   S F = D*^-1/2 W* S S^T  (transposed), S S^T = R A^-1 R^T = M  (O(4^d m q))
        # instead of a triangular solve with L_A (O(m^2 q)) and a product with S (O(m^2)) per
        # batch and sample.
        wv = val * D.rsqrt().unsqueeze(-1)
        F = interp_matmul(idx, wv, self._factor_root()).mT  # batch x m x q
        SF = interp_matmul(idx, wv, self._factor_gram()).mT  # batch x m x q
        eye = torch.eye(q, dtype=F.dtype, device=F.device)
        FtF = F.mT @ F
        C = torch.linalg.cholesky(eye + FtF)
        r = (y - self._offset()) / self.outcome_std.reshape(())  # sample x batch x q
        a = r * D.rsqrt()  # sample x batch x q
        # u = v + F a; b = u - F (I + F^T F)^-1 F^T u = v + F (a - corr); coefficients S b.
        # F^T v = D*^-1/2 W* S v with S v = R A^-1 R^T z_r = mean_coef: read through the mean
        # coefficients, so that any root S of M works (the root is updated, not rebuilt, by _fold).
        Ftu = interp_vector(idx, wv, self.mean_coef) + (FtF @ a.unsqueeze(-1)).squeeze(-1)
        corr = torch.cholesky_solve(Ftu.unsqueeze(-1), C).squeeze(-1)
        # Folded: SF (batch x m x q) is shared by the samples, which torch.matmul broadcasting
        # would copy once per sample (sample x batch x m x q: 1.1 GB for qKG's 64 fantasies at
        # b = 512, m = 1,500, q = 3).
        mean_coef = self.mean_coef + matmul_folded(SF, (a - corr).unsqueeze(-1)).squeeze(-1)
        return F, C, mean_coef, SF

    def _shallow_copy(self) -> Self:
        new = super()._shallow_copy()
        # The copy reads the same cached S and M (``_shared``): updates of either model must
        # then replace them rather than write into them (see _updated_roots).
        self._shared["aliased"] = True
        return new

    def _condition(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> Self:
        if noise is not None and noise.dim() > X.dim() - 1:
            # Noise carries fantasy sample dims; it is the same for every sample.
            noise = noise[(0,) * (noise.dim() - X.dim() + 1)]  # (reshape fails for q = 0)
        idx, val = self._interp(X)
        D = self._to_D(X, noise).expand(X.shape[:-1])
        y = Y * self.outcome_std.reshape(()) + self.outcome_mean.reshape(())  # user units
        if self.d_idx is not None:  # chained conditioning: append to the pending points
            idx, val, D, y = _append_pending(
                (self.d_idx, self.d_val, self.d_D, self.d_y), (idx, val, D, y)
            )
        new = self._shallow_copy()
        new._stats_shared = True
        self._stats_shared = True
        new.d_idx, new.d_val, new.d_D, new.d_y = idx, val, D, y
        if not self._holds_exact_rows():  # (the exact regime's posterior does not read them)
            new.d_F, new.d_C, new.d_mean_coef, new.d_SF = self._delta_caches(idx, val, D, y)
        new._batch_shape = torch.broadcast_shapes(y.shape[:-1], idx.shape[:-2])
        return new

    def _update(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        # Everything is computed before the first assignment, so a failure leaves the model as
        # it was.
        idx, val = self._interp(X)
        D = self._to_D(X, noise).expand(X.shape[:-1])
        y = Y * self.outcome_std.reshape(()) + self.outcome_mean.reshape(())
        self._fold(idx.detach(), val.detach(), D.detach(), y.detach())

    def _fold(self, idx: Tensor, val: Tensor, D: Tensor, y: Tensor) -> None:
        r"""Fold pending conditioned points and ``q`` new ones (non-batched) into the statistics
        and the factor: rank-q Cholesky update of ``L_A`` (refactor if q is large)."""
        if self.d_idx is not None:
            if self.d_y.dim() != 1:
                raise ValueError("A batched (fantasy) WISKI model is read-only.")
            idx = torch.cat([self.d_idx, idx], 0)
            val = torch.cat([self.d_val, val], 0)
            D = torch.cat([self.d_D, D], 0)
            y = torch.cat([self.d_y, y], 0)
        q, m = idx.shape[0], self.grid.num_points
        with torch.no_grad():
            stats = self._stats_added(idx, val, D, y)
            # A refactorisation is cheaper than q rank-one updates when q is large; below float64
            # it is also due every REFACTOR_EVERY points, since the factor's rounding accumulates
            # over a chain of updates while the statistics are plain sums.
            if 3 * q >= m or self._refactor_due(y.numel()):
                for name, value in stats.items():
                    setattr(self, name, value)
                for name in _DELTA_NAMES:
                    setattr(self, name, None)
                self._stats_shared = False
                self.invalidate_caches()
                self.ensure_caches()
                return
            R = self.chol_K
            Ut = interp_matmul(idx, val * D.rsqrt().unsqueeze(-1), R)  # q x m
            L_A = cholesky_update(self.chol_A, Ut.mT)
            beta, sd = self._stats_offset(), self.outcome_std.reshape(())
            z_r = (stats["z"] - beta * stats["h"]) / sd
            v = solve_lower(L_A, (R.mT @ z_r).unsqueeze(-1)).squeeze(-1)
            mean_coef = self._mean_coef(R, L_A, v)
            # Below float64 the lazy S and M are dropped rather than updated: they are not part
            # of a saved state, and a loaded model builds them from L_A, which a chain of
            # updates of them differs from in single precision (a resumed run proposed other
            # points). Built again from L_A at the next request, they are the loaded model's.
            if L_A.dtype == torch.float64:
                shared = _updated_roots(self._shared, idx, val * D.rsqrt().unsqueeze(-1))
            else:
                shared = {}
        for name, value in stats.items():
            setattr(self, name, value)
        for name in _DELTA_NAMES:
            setattr(self, name, None)
        self._stats_shared = False
        self.chol_A, self.v, self.mean_coef = L_A, v, mean_coef
        self._shared = shared

    #: Below float64, ``update`` refactorises ``L_A`` from the statistics (O(m^3)) whenever n
    #: passes a multiple of this, instead of updating it (see :meth:`_refactor_due`). On n, not
    #: on a count since the last factorisation, which a saved state does not hold: a resumed
    #: run refactorises where an uninterrupted one does.
    REFACTOR_EVERY: int = 64

    def _refactor_due(self, added: int) -> bool:
        r"""Whether the factor is rebuilt rather than updated as ``added`` points join the
        statistics (see :attr:`REFACTOR_EVERY`). Never in float64, whose drift over a chain is
        at round-off level (docs/math.md, section 1); decided there before n is read, which
        costs a device sync on a GPU.

        In float32 the statistics are sums (each new point adds its terms once), but a chain of
        rank-one updates of ``L_A`` drifts from their factor like a random walk. Measured (2-D, 784
        grid points, fixed hyperparameters, posterior mean in standardised units against a float64
        model of the same points): 2.9e-5 for a float32 factor built afresh; after 30 / 100 / 300 /
        3,000 updates without a refactorisation 4.6e-5 / 9.9e-5 / 1.4e-4 / 3.0e-4. A rebuild costs
        about 4-6 updates (37 ms against 9.7 ms at m = 784, 83 ms against 16 ms at m = 1,500, one
        thread), so refactorising every 64 points adds 3-8% to the time of an update."""
        if self.chol_A.dtype == torch.float64:
            return False
        n_before = self.num_data
        return n_before // self.REFACTOR_EVERY != (n_before + added) // self.REFACTOR_EVERY

    def add_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, chunk_size: int = 65536
    ) -> Self:
        r"""Bulk-load many observations: statistics accumulated in chunks (O(n 16^d) for the
        Gram matrix, nothing stored per point), then ONE O(m^3) refactorisation.

        The same result as :meth:`update` (which does a rank-q Cholesky update, O(m^2 q)), but
        cheaper when q is large. Validates everything before changing any state.

        Args:
            X: ``n x d`` inputs; Y: ``n x 1`` (or ``n``) observations, user units.
            noise: ``n x 1`` (or ``n``) noise variances, user units (required with fixed noise).
            chunk_size: points per accumulation chunk (bounds the temporary memory).
        """
        X, Y, noise = self._checked_observations(X, Y, noise, "add_observations()")
        self.ensure_caches()
        noise_s = self._standardized_noise(noise, X, Y.shape)
        D = self._to_D(X, noise_s).expand(X.shape[:-1])
        self._materialize()
        y = Y.to(X).squeeze(-1)
        with torch.no_grad():
            for start in range(0, X.shape[0], chunk_size):
                sl = slice(start, start + chunk_size)
                idx, val = self._interp(X[sl])
                stats = self._stats_added(idx, val, D[sl], y[sl])
                for name, value in stats.items():
                    setattr(self, name, value)
                self._stats_shared = False
        self.invalidate_caches()
        self.ensure_caches()
        return self

    def _materialize(self) -> None:
        """Turn a non-batched conditioned model into a plain one (statistics and factor)."""
        if self.d_idx is None:
            return
        if self.batch_shape != torch.Size():
            raise ValueError("A batched (fantasy) WISKI model cannot be refit or updated.")
        self.ensure_caches()
        e = self.d_idx[:0]
        self._fold(e, self.d_val[:0], self.d_D[:0], self.d_y[:0])


def _append_pending(
    old: tuple[Tensor, Tensor, Tensor, Tensor], new: tuple[Tensor, Tensor, Tensor, Tensor]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""Concatenate pending points along q after broadcasting batch shapes."""
    (oi, ov, oD, oy), (ni, nv, nD, ny) = old, new
    xb = torch.broadcast_shapes(oi.shape[:-2], ni.shape[:-2])
    yb = torch.broadcast_shapes(oy.shape[:-1], ny.shape[:-1], xb)
    K = oi.shape[-1]
    idx = torch.cat([oi.expand(*xb, *oi.shape[-2:]), ni.expand(*xb, ni.shape[-2], K)], -2)
    val = torch.cat([ov.expand(*xb, *ov.shape[-2:]), nv.expand(*xb, nv.shape[-2], K)], -2)
    D = torch.cat([oD.expand(*xb, oD.shape[-1]), nD.expand(*xb, nD.shape[-1])], -1)
    y = torch.cat([oy.expand(*yb, oy.shape[-1]), ny.expand(*yb, ny.shape[-1])], -1)
    return idx, val, D, y
