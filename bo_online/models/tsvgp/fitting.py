r"""Fitting t-SVGP: variational EM with typed settings.

E-steps move the sites by natural gradients (:meth:`~TSVGPSitesMixin.e_step`); M-steps maximise
the tighter bound (sites frozen per point, q rebuilt with the new hyperparameters; Adam, Chang,
Khan & Solin, "Dual Parameterization of Sparse Variational Gaussian Processes", NeurIPS 2021,
arXiv:2111.03412, Eq. 15) plus log priors with BoTorch's L-BFGS-B or Adam
(:func:`bo_online.models.fitting.minimize_loss`). For a Gaussian likelihood the E-step is exact and
one M-step on the collapsed bound is the whole fit; while every data point fits among the inducing
inputs that bound is the exact marginal likelihood, which the fit then optimises directly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor
from typing_extensions import Self

from bo_online.models.fitting import (
    OptimizerSettings,
    minimize_loss,
    remap_standardized,
    resolve_settings,
    standardization,
    trainable_parameters_and_bounds,
    training_mode,
)
from bo_online.models.tsvgp.inducing import select_inducing_points
from bo_online.models.validation import whole_number

__all__ = ["TSVGPFitMixin", "TSVGPFitSettings"]


@dataclasses.dataclass(frozen=True)
class TSVGPFitSettings(OptimizerSettings):
    r"""Settings of :meth:`TSVGP.fit <bo_online.models.tsvgp.TSVGP.fit>` (variational EM).

    Attributes:
        method: M-step optimiser, ``"lbfgs"`` (SciPy L-BFGS-B through BoTorch) or ``"adam"``.
        max_iter: iterations per M-step (L-BFGS ``maxiter`` or the number of Adam steps).
        lr: Adam learning rate (unused by L-BFGS).
        timeout_sec: optional wall-clock limit on each M-step's optimiser.
        num_em_iters: EM iterations (E-steps then one M-step) for a non-Gaussian likelihood; a
            Gaussian likelihood's E-step is exact, so its fit is one M-step.
        num_e_steps: natural-gradient E-steps before each M-step and after the last one.
        rho: E-step size in (0, 1] (1: the sites jump to their fixed point).
        batch_size: minibatch E-steps with this many points (``None``: full batch).
        learn_inducing_points: move the inducing inputs in the M-step; ``None``: not while the
            inducing points can hold every data point (Gaussian likelihood and ``n <= m``), yes
            otherwise.
        reinit_inducing: re-select the inducing points (greedy variance reduction on the data
            held, Sobol fill) before fitting; ``None``: yes for a Gaussian likelihood with
            ``n <= m``.
        restandardize: recompute the outcome scaling from all data held (Gaussian likelihoods,
            whose sites are exact; other likelihoods keep their initial scaling because their
            sites are tied to it).
        include_priors: add the hyperparameters' log priors to the M-step objective.
    """

    max_iter: int = 100
    num_em_iters: int = 3
    num_e_steps: int = 5
    rho: float = 1.0
    batch_size: int | None = None
    learn_inducing_points: bool | None = None
    reinit_inducing: bool | None = None
    restandardize: bool = True
    include_priors: bool = True


class TSVGPFitMixin:
    r"""``fit`` (variational EM), the M-step and outcome restandardisation of
    :class:`~bo_online.models.tsvgp.TSVGP`."""

    fit_settings_class = TSVGPFitSettings

    def fit(self, settings: TSVGPFitSettings | None = None, **overrides: Any) -> Self:
        r"""Variational EM: ``num_em_iters`` x (``num_e_steps`` E-steps, one M-step), then
        ``num_e_steps`` final E-steps.

        The M-step maximises the tighter bound (:meth:`elbo`, sites frozen per point, q rebuilt
        with the new hyperparameters) plus log priors, over the kernel, the constant mean, the
        likelihood's parameters and (with ``learn_inducing_points``) the inducing inputs, by
        L-BFGS-B (``max_iter`` iterations) or Adam (``max_iter`` steps at ``lr``). For a Gaussian
        likelihood one M-step on the collapsed bound is the whole fit.

        Args:
            settings: a :class:`TSVGPFitSettings` (defaults if omitted).
            **overrides: its fields by name (``method``, ``max_iter``, ``lr``, ``num_em_iters``,
                ``num_e_steps``, ``rho``, ``batch_size``, ``learn_inducing_points``,
                ``reinit_inducing``, ``restandardize``, ``include_priors``, ``timeout_sec``),
                replacing those of ``settings``; the defaults and the meaning of each are
                documented on :class:`TSVGPFitSettings`.

        The inducing-point defaults:
            learn_inducing_points: move the inducing inputs in the M-step. Default (None): not
                while the inducing points can hold every data point (Gaussian likelihood and
                ``n <= m``, see ``reinit_inducing``), yes otherwise.
            reinit_inducing: re-select the inducing points (greedy variance reduction on the
                data held, Sobol fill) before fitting; the per-point sites re-project exactly.
                Default (None): yes for a Gaussian likelihood with ``n <= m``. The selection
                then keeps every (distinct) data point, so the collapsed bound is the exact
                marginal likelihood (Titsias, 2009: ``Q_XX = K_XX`` when ``X`` is among the
                inducing inputs) and the fit reaches an exact GP's hyperparameters; moving
                ``m x d`` inducing inputs there only slows L-BFGS down and lets the bound drift
                from the exact one as points arrive between fits (measured in a BO loop on
                Styblinski-Tang 4-D: lengthscales up to 4x off an exact GP's fit on the same
                data, fit time 1.0-1.4 s against 0.1-0.3 s).
        """
        settings = resolve_settings(TSVGPFitSettings, settings, overrides)
        if settings.method not in ("lbfgs", "adam"):  # before any state changes
            raise ValueError(f"Unknown fit method {settings.method!r}; use 'lbfgs' or 'adam'.")
        restandardize, reinit_inducing = settings.restandardize, settings.reinit_inducing
        learn_inducing_points = settings.learn_inducing_points
        rho, batch_size = settings.rho, settings.batch_size
        # Checked before any state changes (e_step checks rho and batch_size too, but only after
        # an inducing re-selection); negative counts ran no E- or M-step, silently.
        num_em_iters = whole_number("num_em_iters", settings.num_em_iters, 0)
        num_e_steps = whole_number("num_e_steps", settings.num_e_steps, 0)
        if batch_size is not None:
            batch_size = whole_number("batch_size", batch_size, 1)
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1], got {rho}.")
        if self.batch_shape != torch.Size():
            raise ValueError("fit() is for a single model, not a fantasy/batched one.")
        if restandardize and self.likelihood.conjugate and self._n > 1:
            self._restandardize()
        exact_regime = self.is_exact_gp_on_data()
        if reinit_inducing is None:
            reinit_inducing = exact_regime
        if learn_inducing_points is None:
            learn_inducing_points = not exact_regime
        if reinit_inducing:
            with torch.no_grad():
                Z = select_inducing_points(
                    self.train_X,
                    self._selection_kernel(),
                    self.num_inducing,
                    bounds=self.input_bounds,
                )
                self.inducing_points.copy_(Z)
            self.invalidate_caches()
        conjugate = self.likelihood.conjugate
        # Every data point among the inducing inputs (or covered by them) and Z fixed: the
        # collapsed bound is the exact marginal likelihood, which costs O(n^3) per iteration
        # instead of O(n m^2 + m^3); at n = 35, m = 128 a fit from the defaults takes a third
        # of the time. One output only (several share Z but not hyperparameters).
        exact_objective = exact_regime and reinit_inducing and not learn_inducing_points
        exact_objective = exact_objective and not self._out
        iters = 1 if conjugate else num_em_iters
        for _ in range(iters):
            if not conjugate:
                for _ in range(num_e_steps):
                    self.e_step(rho=rho, batch_size=batch_size)
            self._m_step(settings, learn_inducing_points, exact_objective)
        if not conjugate:
            for _ in range(num_e_steps):
                self.e_step(rho=rho, batch_size=batch_size)
        return self

    def _m_step(
        self, settings: TSVGPFitSettings, learn_z: bool, exact_objective: bool = False
    ) -> None:
        r"""One M-step: ``settings``' optimiser on ``-(bound + log priors) / n`` over the
        hyperparameters (the likelihood's only without fixed noise) and, with ``learn_z``, the
        inducing inputs; the bound is :meth:`exact_log_marginal` with ``exact_objective``, else
        :meth:`elbo` (sites frozen)."""

        def trainable(name: str) -> bool:
            if name == "inducing_points":
                return learn_z
            return not (self.fixed_noise and name.startswith("likelihood."))

        # Constraints without a transform (BoTorch's noise constraint) are enforced as
        # optimiser bounds, as fit_gpytorch_mll does.
        params, bounds = trainable_parameters_and_bounds(self, name_filter=trainable)
        if "inducing_points" in params:  # last in the optimiser's vector, after the modules'
            params["inducing_points"] = params.pop("inducing_points")
        n = self._n

        def loss() -> Tensor:
            obj = self.exact_log_marginal() if exact_objective else self.elbo()
            if settings.include_priors:
                obj = obj + self.log_prior()
            return -obj / n

        with training_mode(self):
            minimize_loss(loss, params, bounds=bounds, settings=settings)
        self.ensure_caches()

    def _restandardize(self) -> None:
        r"""Re-standardise on all held targets (``(m x) n``, the base data's), per output."""
        self._change_outcome_scaling(*standardization(self._user_units(self.train_y)))

    def _rescale_to_outcome_scaling(self, old_mean: Tensor, old_std: Tensor, ratio: Tensor) -> None:
        r"""The held targets and per-point noise (the ``(m x) n`` prefixes of ``_y`` and
        ``_noise``) to the new outcome scaling, in place (see
        :meth:`OnlineModel._rescale_to_outcome_scaling`)."""
        n = self._n
        col = (lambda t: t.unsqueeze(-1)) if self._out else (lambda t: t)
        if self._noise is not None:
            self._noise[..., :n] = self._noise[..., :n] * col(ratio) ** 2
        new_mean, new_std = col(self.outcome_mean), col(self.outcome_std)
        self._y[..., :n] = remap_standardized(
            self._y[..., :n], col(old_mean), col(old_std), new_mean, new_std
        )
