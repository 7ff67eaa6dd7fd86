r"""Exact conditioning of a fitted QSGP on new Gaussian observations ("posterior as prior").

The conditioned posterior is kept in weight space (docs/math.md §5), so its cost does not grow
with the number ``p`` of points conditioned on: with ``A_c = Phi_c C`` (``p x m``) and
``E = N +`` augmentation (diagonal), ``P = I + A_c^T E^-1 A_c`` (``m x m``) and
``r = A_c^T E^-1 (y_c - Phi_c mu)``; then ``mean(x) = phi_x^T mu + a_x^T P^-1 r`` and
``cov(x, x') = a_x^T P^-1 a_x'``, ``a_x = C^T phi_x``. The buffers ``cond_X``, ``cond_y``,
``cond_noise`` hold the data (absorbed into ``q(w)`` by the next fit) and ``cond_L``
(``chol(P)``), ``cond_r`` and ``cond_u = P^-1 r`` the caches.
"""

from __future__ import annotations

import torch
from torch import Tensor
from typing_extensions import Self

from bo_online.linalg import (
    LowRankUpdatedCholesky,
    cholesky_solve,
    cholesky_update,
    psd_cholesky,
)
from bo_online.models.exact_regime import BorderedCholesky

__all__ = ["QSGPConditioningMixin"]

#: Why zero noise is refused (at construction and for new points: a refit weighs every held
#: point by 1/noise, whatever the Prop. 4 augmentation adds in conditioning).
ZERO_NOISE = (
    "QSGP weighs each observation by 1/noise, so the noise variances must be > 0 (got a "
    "zero); pass a small positive noise instead."
)


class QSGPConditioningMixin:
    r"""Caches of the conditioned posterior, ``condition_on_observations`` (a child sharing the
    parent's ``m x m`` factor plus a low-rank term) and ``update`` (a rank-``q`` Cholesky update
    in place); a mixin of :class:`QSGP`."""

    def ensure_caches(self) -> None:
        r"""As :meth:`OnlineModel.ensure_caches`, except while nothing is cached: with no
        conditioning data held (after every fit) the caches are empty whatever the hyperparameters
        and variational parameters are, so the check, which compares every cached-on tensor
        (``var_cols`` is ``m x m`` for the full family) with its snapshot and cost about as much as
        the posterior itself in a BO loop's acquisition, is skipped. The snapshot is taken once, so
        the first update after a fit does not rebuild what it has just built."""
        if (
            self.cond_X is None
            and self.cond_L is None
            and self.cond_r is None
            and self.cond_u is None
            and self._cond_factor is None
        ):
            if self._cache_key is None:
                self._cache_key = self._current_key()
            return
        super().ensure_caches()

    def _rebuild_caches(self) -> None:
        self._cond_factor = None
        if self.cond_X is None:
            self.cond_L = self.cond_r = self.cond_u = None
            return
        mean_c, A_c = self._features_times_C(self.cond_X)
        E = self._cond_point_variance(self.cond_X, self.cond_noise)
        AtEinv = A_c.transpose(-1, -2) / E.unsqueeze(-2)  # batch x m x p
        eye = torch.eye(self.num_features, **self._dtype_device)
        self.cond_L = psd_cholesky(eye + AtEinv @ A_c)
        self.cond_r = (AtEinv @ (self.cond_y - mean_c).unsqueeze(-1)).squeeze(-1)
        self.cond_u = cholesky_solve(self.cond_L, self.cond_r.unsqueeze(-1)).squeeze(-1)

    def _cond_point_variance(self, X: Tensor, noise: Tensor) -> Tensor:
        r"""``E``: what a conditioned point's variance adds beyond ``A A^T`` (its noise, plus the
        Prop. 4 augmentation when enabled), ``... x q``."""
        return noise + self._augmentation(X) if self.augment_variance else noise

    def _noise_of_points(self, X: Tensor, noise: Tensor | None) -> Tensor:
        r"""As :meth:`OnlineModel._noise_of_points` (``batch x q``), for the Gaussian likelihood
        only: exact conditioning needs Gaussian observations."""
        if self.likelihood_name != "gaussian":
            raise ValueError(
                "Exact conditioning (posterior as prior) needs a Gaussian likelihood; for "
                f"likelihood {self.likelihood_name!r}, build the model again on all the data "
                "(old and new points) and fit it."
            )
        noise = super()._noise_of_points(X, noise)
        if bool((noise <= 0).any()):  # a refit weighs every held point by 1/noise
            raise ValueError(ZERO_NOISE)
        return noise

    def _new_sites(
        self, X: Tensor, Y: Tensor, noise: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        r"""What ``q`` new points add in weight space: ``U = A^T E^-1/2`` (``batch x m x q``, so
        ``P += U U^T``), ``A^T E^-1 (Y - Phi mu)`` (``sample x batch x m``, added to ``r``), and
        the points' noise (``batch x q``)."""
        point_noise = self._noise_of_points(X, noise)
        mean, A = self._features_times_C(X)
        E = self._cond_point_variance(X, point_noise)
        At = A.transpose(-1, -2)
        U = At / E.sqrt().unsqueeze(-2)
        dr = ((At / E.unsqueeze(-2)) @ (Y - mean).unsqueeze(-1)).squeeze(-1)
        return U, dr, point_noise

    def _appended_data(self, X: Tensor, Y: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""``cond_X``, ``cond_y``, ``cond_noise`` with the new points appended (kept for the next
        fit, which absorbs them, and for sample paths)."""
        if self.cond_X is None:
            batch = torch.broadcast_shapes(X.shape[:-2], noise.shape[:-1])
            return X.expand(*batch, *X.shape[-2:]), Y, noise.expand(*batch, X.shape[-2])
        batch = torch.broadcast_shapes(self.cond_X.shape[:-2], X.shape[:-2])
        new_X = torch.cat(
            [self.cond_X.expand(*batch, *self.cond_X.shape[-2:]), X.expand(*batch, *X.shape[-2:])],
            dim=-2,
        )
        new_noise = torch.cat(
            [
                self.cond_noise.expand(*batch, self.cond_noise.shape[-1]),
                noise.expand(*batch, X.shape[-2]),
            ],
            dim=-1,
        )
        batch_y = torch.broadcast_shapes(self.cond_y.shape[:-1], Y.shape[:-1])
        y = torch.cat(
            [self.cond_y.expand(*batch_y, self.cond_y.shape[-1]), Y.expand(*batch_y, Y.shape[-1])],
            dim=-1,
        )
        return new_X, y, new_noise

    def _condition(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> Self:
        if noise is not None and noise.dim() > X.dim() - 1:
            noise = noise[(0,) * (noise.dim() - X.dim() + 1)]  # (reshape fails for q = 0)
        U, dr, point_noise = self._new_sites(X, Y, noise)
        if self._cond_factor is not None:
            parent = self._cond_factor
        elif self.cond_L is not None:
            parent = LowRankUpdatedCholesky(self.cond_L)
        else:
            parent = LowRankUpdatedCholesky(torch.eye(self.num_features, **self._dtype_device))
        factor = parent.add(U)  # the parent's m x m factor is shared, not copied
        r = dr if self.cond_r is None else self.cond_r + dr
        new = self._shallow_copy()
        new.cond_X, new.cond_y, new.cond_noise = self._appended_data(X, Y, point_noise)
        new._cond_factor = factor
        new.cond_L = factor.L  # the parent's, or a new one where a long chain folded (linalg)
        new.cond_r, new.cond_u = r, factor.solve(r)
        new._batch_shape = torch.broadcast_shapes(new.cond_y.shape[:-1], new.cond_X.shape[:-2])
        new.__dict__["_kernel_cache"] = None
        if new.is_exact_gp_on_data():  # the exact GP's factor bordered by the new rows
            new._set_kernel_state(self._bordered_kernel_state(X, Y, point_noise))
        return new

    def _materialize_cond_factor(self) -> None:
        r"""Fold a conditioned model's pending low-rank term into ``cond_L`` (O(m^2 q)), the
        factor ``update`` extends and ``state_dict`` saves: until then a child of
        ``condition_on_observations`` holds its parent's factor there plus ``_cond_factor``."""
        factor = self._cond_factor
        if factor is not None and factor.has_low_rank:
            self.cond_L = factor.cholesky()
        self._cond_factor = None

    def _update(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        U, dr, point_noise = self._new_sites(X, Y, noise)  # raises before any state changes
        self._materialize_cond_factor()
        L = self.cond_L
        if L is None:
            L = torch.eye(self.num_features, **self._dtype_device)
        L = cholesky_update(L, U)  # O(m^2 q), whatever the number of points held
        r = dr if self.cond_r is None else self.cond_r + dr
        u = cholesky_solve(L, r.unsqueeze(-1)).squeeze(-1)
        # A copy of X: the first points appended would otherwise be a view of the caller's
        # tensor (which a reused buffer changes, and which may carry an autograd graph).
        X = X.detach().clone()
        kernel_state = None
        if self.is_exact_gp_on_data() and self.num_data + X.shape[-2] <= self.exact_max_n:
            kernel_state = self._bordered_kernel_state(X, Y, point_noise)
            # one factor again (what the next update borders, without a fold)
            kernel_state.inputs = kernel_state.all_inputs()
            kernel_state.factor = BorderedCholesky(kernel_state.factor.dense())
            kernel_state.border_inputs = ()
        self.cond_X, self.cond_y, self.cond_noise = self._appended_data(X, Y, point_noise)
        self.cond_L, self.cond_r, self.cond_u = L, r, u
        self.__dict__["_kernel_cache"] = None
        if kernel_state is not None:
            self._set_kernel_state(kernel_state)
