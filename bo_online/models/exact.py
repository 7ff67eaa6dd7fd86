r"""Exact GP regression with an incrementally maintained Cholesky factor.

``OnlineExactGP`` is the reference surrogate of bo_online: the same model as BoTorch's
``SingleTaskGP`` (constant mean, any GPyTorch kernel, homoscedastic inferred noise or fixed
per-point noise, standardised outcomes), but it keeps the lower Cholesky factor ``L`` of
``K_XX + N`` and folds q new points in with a bordered append (``bo_online.linalg``), which costs
O(n^2 q) instead of the O(n^3) refactorisation that ``SingleTaskGP.condition_on_observations``
performs. Fantasies share the appended factor across samples; only the weight vector
``alpha = (K + N)^{-1} (y - mu)`` differs per sample.

Use it when n is at most a few thousand and exactness matters; every other bo_online surrogate
is tested against it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean
from linear_operator.operators import DenseLinearOperator, MatmulLinearOperator
from torch import Tensor
from typing_extensions import Self

from bo_online.linalg import (
    matmul_folded,
    psd_cholesky,
    schur_cholesky,
    solve_bordered,
    solve_bordered_transpose,
    solve_lower,
    solve_lower_transpose,
)
from bo_online.models.base import HeldDataMixin, OnlineModel
from bo_online.models.fitting import (
    OptimizerSettings,
    minimize_loss,
    resolve_settings,
    sum_log_priors,
    trainable_parameters_and_bounds,
    training_mode,
)
from bo_online.models.validation import (
    detached,
    require_bool,
    require_modules,
    warn_unless_unit_scaled,
)

__all__ = ["OnlineExactGP"]

#: Largest ``q`` at which a fantasy model's posterior at points shared by its batch elements is
#: read through the parent's factor once, with a dense ``q x q`` block (8 MB at 1,024 points);
#: above it each element reads its whole factor, lazily (see ``_latent_posterior_shared``).
_SHARED_FACTOR_MAX_Q = 1024


@dataclasses.dataclass(frozen=True)
class ExactFitSettings(OptimizerSettings):
    r"""Settings of :meth:`OnlineExactGP.fit` (L-BFGS-B by default, as ``fit_gpytorch_mll``).

    Attributes:
        restandardize: first recompute the outcome scaling from all data held (exact: the
            targets are stored).
    """

    restandardize: bool = True


class OnlineExactGP(HeldDataMixin, OnlineModel):
    r"""Exact GP with O(n^2 q) online conditioning.

    Args:
        train_X: ``n x d`` initial inputs (n >= 1).
        train_Y: ``n x 1`` initial observations.
        train_Yvar: optional ``n x 1`` fixed observation-noise variances (user units). If given,
            the model is a fixed-noise GP and every later ``update`` must pass ``noise``.
        covar_module: a GPyTorch kernel; default BoTorch's RBF with dimension-scaled priors.
        likelihood: a ``GaussianLikelihood`` for inferred noise; default BoTorch's.
        bounds: optional ``2 x d`` input box that every input must lie in.
        standardize: standardise outcomes with the initial data's mean and std (``Standardize``).
        input_transform: optional BoTorch input transform.
        outcome_transform: ``None`` or ``Standardize(m=1)`` (the same: outcomes are
            standardised internally); any other outcome transform is refused.

    Example:
        >>> model = OnlineExactGP(train_X, train_Y)
        >>> model.fit()
        >>> model.update(new_X, new_Y)            # O(n^2 q), in place
        >>> post = model.posterior(test_X)
    """

    #: a refit evaluates the exact marginal likelihood, O(n^3): the BO loops and the Ax
    #: integration refit it on a schedule that thins out as n grows, rebuilt from the defaults
    fit_cost_grows_with_n: bool = True

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        covar_module: Kernel | None = None,
        likelihood: GaussianLikelihood | None = None,
        bounds: Tensor | None = None,
        standardize: bool = True,
        input_transform: Any | None = None,
        outcome_transform: Any | None = None,
    ) -> None:
        dtype, device = train_X.dtype, train_X.device
        if train_X.dim() != 2:
            raise ValueError(f"train_X must be n x d, got shape {tuple(train_X.shape)}.")
        dim = OnlineModel.transformed_dim(train_X, input_transform)  # after the transform
        super().__init__(dim, bounds, input_transform, dtype, device, outcome_transform)
        train_X, train_Y, train_Yvar = detached(train_X, train_Y, train_Yvar)
        X = self._checked_training_data(train_X, train_Y, train_Yvar)
        train_Yvar = self._floor_train_Yvar(train_Y, train_Yvar)  # noise floor, with a warning
        # one point too: centred on it, as BoTorch's Standardize
        if require_bool(standardize, "standardize"):
            self._set_outcome_scaling(train_Y, X)
        self.fixed_noise = train_Yvar is not None
        require_modules(covar_module, likelihood)  # not names from --model-option
        if covar_module is None:
            warn_unless_unit_scaled(X, type(self).__name__)
        self.covar_module = covar_module or get_covar_module_with_dim_scaled_prior(ard_num_dims=dim)
        if self.fixed_noise and likelihood is not None:
            raise ValueError("Pass either train_Yvar (fixed noise) or a likelihood, not both.")
        self.likelihood = likelihood or get_gaussian_likelihood_with_lognormal_prior()
        self.mean_module = ConstantMean()
        self.to(dtype=dtype, device=device)
        self._register_held_data(X, train_Y, train_Yvar)
        # Caches (rebuilt from the data whenever a hyperparameter changes).
        # The factor of K + N is [[chol, 0], [tail_S, tail_L]]: a conditioned (fantasy) model
        # shares its parent's ``chol`` and only holds the q new rows, so conditioning never
        # copies the n x n factor. ``update`` (in place) merges them into one factor.
        self.register_buffer("chol", None)  # batch x n0 x n0
        self.register_buffer("tail_S", None)  # batch x t x n0, or None
        self.register_buffer("tail_L", None)  # batch x t x t, or None
        self.register_buffer("alpha", None)  # sample x batch x n, (K + N)^-1 (y - mu)

    # ------------------------------------------------------------------ what the model is

    def hyperparameters(self):
        if self.fixed_noise:  # the likelihood's noise parameter is unused with fixed noise
            return (p for n, p in self.named_parameters() if not n.startswith("likelihood."))
        return self.parameters()

    def log_prior(self) -> Tensor:
        """Log priors of the hyperparameters in use (with fixed noise the likelihood is unused and
        its noise prior is left out, as GPyTorch does for a fixed-noise ``SingleTaskGP``)."""
        modules = [self.covar_module, self.mean_module]
        if not self.fixed_noise:
            modules.append(self.likelihood)
        return sum_log_priors(modules, self.outcome_mean)

    def _train_noise_diag(self) -> Tensor:
        if self.fixed_noise:
            return self.train_noise
        lik = self.likelihood.noise.squeeze(-1).expand(self.train_X.shape[:-1])
        if self.train_noise is not None:  # points given explicit noise (NaN: the likelihood's)
            return torch.where(torch.isnan(self.train_noise), lik, self.train_noise)
        return lik

    def _noise_variance(self, X: Tensor) -> Tensor:
        if self.fixed_noise:  # as BoTorch: the mean training noise at new points
            # batch x 1 (a fantasy model's noise has its own batch): broadcast, do not expand to X.
            return self.train_noise.mean(-1, keepdim=True)
        return self.likelihood.noise.squeeze(-1).expand(X.shape[:-1])

    def _default_fantasy_noise(self) -> Tensor | None:
        if self.fixed_noise:
            # batch x 1 x 1: each batch's own mean (a model conditioned on candidate sets with
            # their own noise), as BoTorch's fantasize takes it
            return self.train_noise.mean(-1, keepdim=True).unsqueeze(-1)
        return None

    # ------------------------------------------------------------------ caches

    def _kernel_plus_noise(self) -> Tensor:
        K = self.covar_module(self.train_X).to_dense()
        return K + torch.diag_embed(self._train_noise_diag())

    def _rebuild_caches(self) -> None:
        self.chol, self.tail_S, self.tail_L = psd_cholesky(self._kernel_plus_noise()), None, None
        self.alpha = self._solve_alpha(self.train_y)

    def _factor_solve(self, B: Tensor) -> Tensor:
        r"""``L^{-1} B`` for the full factor L of K + N; ``B``: ``... x n x k``."""
        if self.tail_S is None:
            return solve_lower(self.chol, B)
        return solve_bordered(self.chol, self.tail_S, self.tail_L, B)

    def _factor_solve_transpose(self, B: Tensor) -> Tensor:
        r"""``L^{-T} B`` for the full factor L of K + N; ``B``: ``... x n x k``."""
        if self.tail_S is None:
            return solve_lower_transpose(self.chol, B)
        return solve_bordered_transpose(self.chol, self.tail_S, self.tail_L, B)

    def _full_factor(self) -> Tensor:
        """The factor of K + N as one ``batch x n x n`` tensor (merges a pending tail)."""
        if self.tail_S is None:
            return self.chol
        n0, t = self.chol.shape[-1], self.tail_L.shape[-1]
        batch = self.tail_S.shape[:-2]
        out = self.chol.new_zeros(*batch, n0 + t, n0 + t)
        out[..., :n0, :n0] = self.chol
        out[..., n0:, :n0] = self.tail_S
        out[..., n0:, n0:] = self.tail_L
        return out

    def _solve_alpha(self, y: Tensor) -> Tensor:
        resid = (y - self.mean_module.constant).unsqueeze(-1)  # sample x batch x n x 1
        return self._factor_solve_transpose(self._factor_solve(resid)).squeeze(-1)

    # ------------------------------------------------------------------ prediction

    def _cross_covariance(self, X: Tensor) -> Tensor:
        r"""``K(X, train_X)``: ``batch x q x n``. A single model folds the batch of ``X`` into rows
        (one ``(batch q) x n`` kernel matrix), so a ``b x 1 x d`` request costs the memory of a
        ``b x d`` one instead of the kernel's per-batch copies of ``train_X``."""
        if self.train_X.dim() == 2 and X.dim() > 2:
            K = self.covar_module(X.reshape(-1, X.shape[-1]), self.train_X).to_dense()
            return K.reshape(*X.shape[:-1], K.shape[-1])
        return self.covar_module(X, self.train_X).to_dense()

    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        if self._shares_parent_factor_with(X):
            return self._latent_posterior_shared(X)
        K_xX = self._cross_covariance(X)  # batch x q x n
        mean = self.mean_module.constant + (K_xX @ self.alpha.unsqueeze(-1)).squeeze(-1)
        V = self._factor_solve(K_xX.transpose(-1, -2))  # batch x n x q
        prior = self.covar_module(X)
        batch = torch.broadcast_shapes(mean.shape[:-1], V.shape[:-2])
        Vt = V.transpose(-1, -2).expand(*batch, *V.shape[-1:], V.shape[-2])
        covar = prior + MatmulLinearOperator(Vt, V.expand(*batch, *V.shape[-2:])) * -1.0
        return MultivariateNormal(mean.expand(*batch, mean.shape[-1]), covar)

    def _shares_parent_factor_with(self, X: Tensor) -> bool:
        r"""Whether the posterior at ``X`` (``batch_X x q x d``) is read through the parent's
        factor and points: this model was conditioned on a batch of point sets (a fantasy model)
        and keeps its parent's unbatched factor ``chol`` plus per-batch rows. Either ``X`` is
        shared by batch elements (``batch_X`` smaller than the model's batch: qNIPV's
        integration points, a posterior mean on a grid), with ``q`` small enough for a dense
        ``q x q`` block, or ``X`` has points of its own for every batch element (qKG's
        ``sample x b x 1 x d``), whose kernel against the parent's points is then one folded
        ``(batch q) x n0`` matrix instead of one against each element's copy of them."""
        if self.tail_S is None or self.chol.dim() != 2:
            return False
        batch = torch.broadcast_shapes(X.shape[:-2], self.batch_shape)
        if torch.Size(X.shape[:-2]).numel() < batch.numel():
            return X.shape[-2] <= _SHARED_FACTOR_MAX_Q
        return True

    def _latent_posterior_shared(self, X: Tensor) -> MultivariateNormal:
        r"""The posterior at ``X`` (``batch_X x q x d``) of a model holding its parent's
        unbatched factor ``L0`` (``n0 x n0``) and per-batch rows ``[S, L22]`` for its ``t`` new
        points: ``L^-1 K_Xx`` is ``V0 = L0^-1 K(x0, X)`` (``n0 x q``, once for every batch
        element) over ``V1 = L22^-1 (K(x1, X) - S V0)`` (``batch x t x q``), so the covariance
        is the shared dense block ``K_XX - V0^T V0`` minus the per-batch ``V1^T V1``. Work and
        memory per batch element are O(n0 t q) instead of the O(n0^2 q) and ``n0 x q`` blocks of
        reading each element's factor in full (b = 512 fantasies, n = 1,000, 128 points: 3.5 GB
        and 74 s before)."""
        n0 = self.chol.shape[-1]
        train_X = self.train_X.reshape(-1, *self.train_X.shape[-2:])
        old_X = train_X[0, :n0]  # n0 x d: the parent's points, the same in every batch element
        K_old = self._cross_covariance_with(X, old_X)  # batch_X x q x n0
        K_new = self.covar_module(X, self.train_X[..., n0:, :]).to_dense()  # batch x q x t
        V0 = solve_lower(self.chol, K_old.transpose(-1, -2))  # batch_X x n0 x q
        # folded: V0 may carry fantasy-sample dims that tail_S (batch x t x n0) lacks
        V1 = solve_lower(self.tail_L, K_new.transpose(-1, -2) - matmul_folded(self.tail_S, V0))
        alpha = self.alpha  # sample x batch x n
        mean = (
            self.mean_module.constant
            + (alpha[..., :n0].unsqueeze(-2) @ K_old.transpose(-1, -2)).squeeze(-2)
            + (K_new @ alpha[..., n0:].unsqueeze(-1)).squeeze(-1)
        )
        q = X.shape[-2]
        batch = torch.broadcast_shapes(mean.shape[:-1], V1.shape[:-2], V0.shape[:-2])
        V1 = V1.expand(*batch, *V1.shape[-2:])
        lazy_V1 = MatmulLinearOperator(V1.transpose(-1, -2), V1) * -1.0
        if torch.Size(X.shape[:-2]).numel() < batch.numel():  # X shared: its block formed once
            shared = self.covar_module(X).to_dense() - V0.transpose(-1, -2) @ V0
            covar = DenseLinearOperator(shared.expand(*batch, q, q)) + lazy_V1
        else:  # points of every batch element's own: lazy, as _latent_posterior
            V0 = V0.expand(*batch, *V0.shape[-2:])
            covar = (
                self.covar_module(X)
                + MatmulLinearOperator(V0.transpose(-1, -2), V0) * -1.0
                + lazy_V1
            )
        return MultivariateNormal(mean.expand(*batch, q), covar)

    def _cross_covariance_with(self, X: Tensor, points: Tensor) -> Tensor:
        r"""``K(X, points)`` for ``points`` (``k x d``): ``batch x q x k``, the batch of ``X``
        folded into rows (one ``(batch q) x k`` kernel matrix), as :meth:`_cross_covariance`."""
        if X.dim() > 2:
            K = self.covar_module(X.reshape(-1, X.shape[-1]), points).to_dense()
            return K.reshape(*X.shape[:-1], K.shape[-1])
        return self.covar_module(X, points).to_dense()

    # ------------------------------------------------------------------ conditioning

    def _new_rows(
        self, X: Tensor, noise: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        r"""The new factor rows ``(S^T, L22)`` for ``X`` (``batch x q x d``), the inputs and the
        noise with ``X`` appended. O(n^2 q); shared by every fantasy sample."""
        point_noise = self._noise_of_points(X, noise)
        batch = torch.broadcast_shapes(self.train_X.shape[:-2], X.shape[:-2])
        old_X = self.train_X.expand(*batch, *self.train_X.shape[-2:])
        B = self.covar_module(old_X, X).to_dense()  # batch x n x q
        C = self.covar_module(X).to_dense() + torch.diag_embed(point_noise)
        S_t = self._factor_solve(B).transpose(-1, -2)  # batch x q x n
        L22 = schur_cholesky(C, S_t.transpose(-1, -2))
        new_X = torch.cat([old_X, X.expand(*batch, *X.shape[-2:])], dim=-2)
        new_noise = None
        if self.fixed_noise:
            old = self.train_noise.expand(*batch, self.train_noise.shape[-1])
            new_noise = torch.cat([old, point_noise.expand(*batch, X.shape[-2])], dim=-1)
        elif noise is not None or self.train_noise is not None:
            # Explicit noise on an inferred-noise model is kept with its points (NaN marks the
            # points that take the likelihood's noise), so rebuilt caches still hold it.
            nan = lambda shape: torch.full(shape, float("nan"), **self._dtype_device)  # noqa: E731
            old = nan(self.train_X.shape[:-1]) if self.train_noise is None else self.train_noise
            new = nan(X.shape[:-1]) if noise is None else noise
            old = old.expand(*batch, old.shape[-1])
            new_noise = torch.cat([old, new.expand(*batch, X.shape[-2])], dim=-1)
        return S_t, L22, new_X, new_noise

    def _condition(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> Self:
        # The factor does not depend on Y: with fantasies (Y: sample x batch x q) it is built once.
        if noise is not None and noise.dim() > X.dim() - 1:
            # Noise carries fantasy sample dims; it is the same for every sample.
            noise = noise[(0,) * (noise.dim() - X.dim() + 1)]  # (reshape fails for q = 0)
        S_t, L22, new_X, new_noise = self._new_rows(X, noise)
        # Y's batch dims broadcast against X's (a batch of q-point sets with one shared Y)
        batch_y = torch.broadcast_shapes(self.train_y.shape[:-1], Y.shape[:-1], X.shape[:-2])
        y = torch.cat(
            [
                self.train_y.expand(*batch_y, self.train_y.shape[-1]),
                Y.expand(*batch_y, Y.shape[-1]),
            ],
            dim=-1,
        )
        new = self._shallow_copy()
        new.train_X, new.train_y, new.train_noise = new_X, y, new_noise
        if self.tail_S is None:  # share this model's factor, keep only the new rows
            new.chol, new.tail_S, new.tail_L = self.chol, S_t, L22
        else:  # conditioning a conditioned model: merge the pending rows first
            new.chol, new.tail_S, new.tail_L = self._full_factor(), S_t, L22
        new.alpha = new._solve_alpha(y)
        new._batch_shape = torch.broadcast_shapes(y.shape[:-1], new_X.shape[:-2])
        return new

    def _update(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        S_t, L22, new_X, new_noise = self._new_rows(X, noise)  # raises before any state changes
        n, q = S_t.shape[-1], L22.shape[-1]
        L = self.chol.new_zeros(n + q, n + q)
        L[:n, :n] = self._full_factor()
        L[n:, :n], L[n:, n:] = S_t, L22
        y = torch.cat([self.train_y, Y], dim=-1)
        self.train_X, self.train_y, self.train_noise = new_X, y, new_noise
        self.chol, self.tail_S, self.tail_L = L, None, None
        self.alpha = self._solve_alpha(y)

    # ------------------------------------------------------------------ hyperparameters

    def marginal_log_likelihood(self, include_priors: bool = True) -> Tensor:
        r"""Exact log p(y | theta) / n on the standardised targets (plus log priors / n), as
        GPyTorch's ``ExactMarginalLogLikelihood``; differentiable in the hyperparameters."""
        L = psd_cholesky(self._kernel_plus_noise())
        resid = (self.train_y - self.mean_module.constant).unsqueeze(-1)
        w = solve_lower(L, resid)
        n = self.num_data
        mll = -0.5 * (
            w.pow(2).sum() + 2 * torch.diagonal(L).log().sum() + n * math.log(2 * math.pi)
        )
        if include_priors:
            mll = mll + self.log_prior()
        return mll / n

    fit_settings_class = ExactFitSettings

    def fit(self, settings: ExactFitSettings | None = None, **overrides: Any) -> Self:
        r"""Maximise the exact marginal likelihood, warm-started from the current values, then
        refactor once.

        Args:
            settings: an :class:`ExactFitSettings` (defaults if omitted).
            **overrides: its fields by name (``method``, ``max_iter``, ``lr``, ``timeout_sec``,
                ``restandardize``), replacing those of ``settings``.
        """
        settings = resolve_settings(ExactFitSettings, settings, overrides)
        if self.batch_shape != torch.Size():
            raise ValueError("fit() is for a single model, not a fantasy/batched one.")
        if settings.restandardize and self.num_data > 1:
            self._restandardize()
        params, bounds = trainable_parameters_and_bounds(
            self, name_filter=lambda n: not (self.fixed_noise and n.startswith("likelihood."))
        )
        with training_mode(self):
            minimize_loss(
                lambda: -self.marginal_log_likelihood(),
                params,
                bounds=bounds,
                settings=settings,
            )
        self.invalidate_caches()
        self.ensure_caches()
        return self
