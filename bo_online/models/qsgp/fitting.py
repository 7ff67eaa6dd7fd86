r"""Fitting QSGP: typed settings, the closed-form evidence fit, absorbing conditioning data.

:meth:`QSGPFitMixin.fit` first moves the data held since the last fit into the training set
(restandardising the outcomes and rescaling ``q(w)`` to the new units), then either

* maximises an exact evidence over the hyperparameters with L-BFGS-B and sets ``q(w)`` to the
  ELBO optimum within its family (``method="closed_form"``; Gaussian likelihood), or
* runs the quadruply stochastic procedure of Evans & Nair, "Quadruply Stochastic Gaussian
  Processes" (2018, arXiv:1812.03010) (``method="sgd"``, :mod:`bo_online.models.qsgp.sgd`).

Its options are a :class:`QSGPFitSettings`; :meth:`~bo_online.models.qsgp.sgd.QSGPSGDMixin.fit_sgd`
takes a :class:`QSGPSGDSettings` and :meth:`QSGPFitMixin.fit_closed_form` a
:class:`QSGPClosedFormSettings` (the same field names). All accept their field names as keywords
instead.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor
from typing_extensions import Self

from bo_online.linalg import cholesky_solve, psd_cholesky, solve_lower
from bo_online.models.fitting import (
    Bounds,
    OptimizerSettings,
    minimize_loss,
    remap_standardized,
    resolve_settings,
    trainable_parameters_and_bounds,
    training_mode,
)
from bo_online.models.qsgp.bases import RFFBasis

__all__ = [
    "FIT_FROM_DEFAULTS_N",
    "QSGPClosedFormSettings",
    "QSGPFitMixin",
    "QSGPFitSettings",
    "QSGPSGDSettings",
    "QSGPStepSettings",
]

#: Closed-form fits of a model holding at most this many points start the hyperparameters from
#: their values at construction, as a BoTorch loop that rebuilds ``SingleTaskGP`` every step
#: (in the kernel regime, n <= m by default, the fit's objective is the same exact-kernel
#: evidence, so QSGP then gets the same hyperparameters; beyond, the basis's evidence from the
#: same starting point). Warm
#: starts kept the basin of an earlier fit: in the BO suite (Ackley 5-D, 4 seeds) a warm fit often
#: reached a higher evidence than the fit from the defaults with an interpolating, near-noiseless
#: model (noise 0.007 against 0.09-0.12 on standardised outcomes) that the acquisition then
#: trusted. Such fits cost O(n^3) (kernel evidence) or O(n^2 m) (basis) on at most 100 points.
FIT_FROM_DEFAULTS_N = 100


@dataclasses.dataclass(frozen=True)
class QSGPStepSettings:
    r"""What one step of QSGP's stochastic procedure samples and how it moves (the fields
    :class:`QSGPSGDSettings` and :class:`QSGPFitSettings` share).

    Attributes:
        num_rows: ``n~``, training rows sampled per step.
        num_cols: ``m~``, basis functions in each of the two basis samples ``i`` and ``j``.
        num_diag_cols: ``m_r`` diagonal columns of ``C`` per step (None: ``m~``).
        num_dense_cols: dense columns of ``C`` per step (None: all ``k``).
        cv_rank: ``n_bar`` support rows of the control variates (0 disables them).
        lr_hyper: Adam learning rate of the hyperparameters.
        lr_decay_final: both learning rates decay exponentially to this fraction at the last
            step.
        freeze_iters: hyperparameters frozen for the first steps (None: a tenth of the steps).
        train_hypers: learn the hyperparameters (empirical Bayes) at all.
        use_priors: add the hyperparameters' log priors to the objective.
        seed: sampler seed (None: the model's seed).
        callback: called as ``callback(step, loss)`` after every step.
        replace_cols: draw the basis samples ``i``, ``j`` with replacement (the paper) or
            without (same scale factors, less column noise; ``m~ = m`` removes it, see
            :func:`~bo_online.models.qsgp.estimators.sample_indices`).
    """

    num_rows: int = 500
    num_cols: int = 1000
    num_diag_cols: int | None = None
    num_dense_cols: int | None = None
    cv_rank: int = 300
    lr_hyper: float = 1e-2
    lr_decay_final: float = 0.1
    freeze_iters: int | None = None
    train_hypers: bool = True
    use_priors: bool = True
    seed: int | None = None
    callback: Callable[[int, float], None] | None = None
    replace_cols: bool = True


@dataclasses.dataclass(frozen=True)
class QSGPSGDSettings(QSGPStepSettings):
    r"""Settings of :meth:`QSGP.fit_sgd` (the fields of :class:`QSGPStepSettings` and these).

    Attributes:
        max_iter: number of SGD steps.
        lr: AdaGrad learning rate of the variational parameters (sparse updates).
        timeout_sec: optional wall-clock limit; the run stops after the step that passes it.
    """

    max_iter: int = 2000
    lr: float = 0.1
    timeout_sec: float | None = None


@dataclasses.dataclass(frozen=True)
class QSGPClosedFormSettings:
    r"""Settings of :meth:`QSGP.fit_closed_form` (the closed-form fields of
    :class:`QSGPFitSettings`, by the same names).

    Attributes:
        max_iter: L-BFGS-B iterations over the hyperparameters (0: keep them and only set
            ``q(w)``).
        hyper_evidence: the evidence maximised: ``"auto"``, ``"basis"`` or ``"kernel"`` (see
            :meth:`QSGP.fit_closed_form`).
        hyper_rows: the basis evidence uses a random subset of this many rows when there are
            more (None: all rows); ``q(w)`` is set on all rows.
        timeout_sec: optional wall-clock limit of the L-BFGS-B run.
    """

    max_iter: int = 200
    hyper_evidence: str = "auto"
    hyper_rows: int | None = 2048
    timeout_sec: float | None = None


@dataclasses.dataclass(frozen=True)
class QSGPFitSettings(OptimizerSettings, QSGPStepSettings):
    r"""Settings of :meth:`QSGP.fit` (the SGD fields of :class:`QSGPStepSettings` and these).

    A model's constructor takes these names as keywords too (the defaults of its ``fit``).

    Attributes:
        method: ``"closed_form"`` (Gaussian likelihood, moderate ``n m``), ``"sgd"`` (the
            paper's quadruply stochastic procedure) or ``"auto"`` (closed form when
            ``m <= 4096`` and ``n m <= 4e7``, for the Gaussian likelihood).
        max_iter: L-BFGS iterations (closed form) or SGD steps; None: 200 or 2000.
        lr: SGD: AdaGrad learning rate of the variational parameters.
        timeout_sec: optional wall-clock limit of the L-BFGS run or of the SGD steps.
        restandardize: recompute the outcome scaling from all data first (q(w) is rescaled).
        hyper_evidence: closed form: ``"auto"``, ``"basis"`` or ``"kernel"`` (see
            :meth:`QSGP.fit_closed_form`).
        hyper_rows: closed form: the basis evidence uses a random subset of this many rows
            when there are more (None: all rows).
        fit_from_defaults_n: closed form: while the model holds at most this many points the
            hyperparameters start from their values at construction
            (:meth:`QSGP.reset_hyperparameters`) instead of the last fit's; 0 always
            warm-starts.
    """

    method: str = "auto"
    max_iter: int | None = None
    lr: float = 0.1
    restandardize: bool = True
    hyper_evidence: str = "auto"
    hyper_rows: int | None = 2048
    fit_from_defaults_n: int = FIT_FROM_DEFAULTS_N

    def sgd_settings(self) -> QSGPSGDSettings:
        r"""The :class:`QSGPSGDSettings` these settings give ``fit_sgd`` (2000 steps if
        ``max_iter`` is None)."""
        names = [f.name for f in dataclasses.fields(QSGPSGDSettings)]
        values = {name: getattr(self, name) for name in names}
        values["max_iter"] = 2000 if self.max_iter is None else self.max_iter
        return QSGPSGDSettings(**values)

    def closed_form_settings(self) -> QSGPClosedFormSettings:
        r"""The :class:`QSGPClosedFormSettings` these settings give ``fit_closed_form`` (200
        L-BFGS-B iterations if ``max_iter`` is None)."""
        return QSGPClosedFormSettings(
            max_iter=200 if self.max_iter is None else self.max_iter,
            hyper_evidence=self.hyper_evidence,
            hyper_rows=self.hyper_rows,
            timeout_sec=self.timeout_sec,
        )


#: Fields for which an explicit ``None`` is a value (``hyper_rows=None``: all rows), not "keep
#: the default" as :func:`~bo_online.models.fitting.resolve_settings` reads it.
_NONE_IS_A_VALUE = frozenset(
    f.name for f in dataclasses.fields(QSGPFitSettings) if f.default is None
) | {"hyper_rows"}

#: Keywords :meth:`QSGPFitMixin.fit_closed_form` took before it took a
#: :class:`QSGPClosedFormSettings`, whose field has another name: old name -> field.
_CLOSED_FORM_RENAMED = {"evidence": "hyper_evidence"}


def resolve_fit_settings(
    settings: QSGPFitSettings | None,
    overrides: Mapping[str, Any],
    defaults: Mapping[str, Any] | None = None,
) -> QSGPFitSettings:
    r"""``settings`` (or ``QSGPFitSettings(**defaults)``, the constructor's fit options) with
    the keyword ``overrides`` applied; unknown names raise ``ValueError`` listing the accepted
    ones. An explicit ``None`` keeps its meaning for the fields that take one (``hyper_rows``,
    ``max_iter``, ``seed``, ...), as the keyword arguments of ``fit`` did."""
    if settings is None:
        settings = QSGPFitSettings(**(defaults or {}))
    settings = resolve_settings(QSGPFitSettings, settings, overrides)
    nones = {k: None for k, v in overrides.items() if v is None and k in _NONE_IS_A_VALUE}
    return dataclasses.replace(settings, **nones) if nones else settings


def resolve_closed_form_settings(
    settings: QSGPClosedFormSettings | None, overrides: Mapping[str, Any]
) -> QSGPClosedFormSettings:
    r"""``settings`` (or the defaults) with the keyword ``overrides`` applied, as
    :meth:`QSGPFitMixin.fit_closed_form` reads them: the old keyword ``evidence`` is accepted
    for ``hyper_evidence`` with a ``DeprecationWarning`` (both at once raise ``ValueError``), an
    explicit ``hyper_rows=None`` means all rows, ``max_iter=None`` keeps the setting's value,
    unknown names raise ``ValueError`` listing the accepted ones."""
    overrides = dict(overrides)
    for old, new in _CLOSED_FORM_RENAMED.items():
        if old in overrides:
            warnings.warn(
                f"fit_closed_form's keyword `{old}` is deprecated; use `{new}`.",
                DeprecationWarning,
                stacklevel=3,
            )
            if new in overrides:
                raise ValueError(f"Pass `{new}` once (`{old}` is its deprecated name).")
            overrides[new] = overrides.pop(old)
    resolved = resolve_settings(QSGPClosedFormSettings, settings, overrides)
    if "hyper_rows" in overrides and overrides["hyper_rows"] is None:
        resolved = dataclasses.replace(resolved, hyper_rows=None)
    return resolved


class QSGPFitMixin:
    r"""``fit``, the closed-form fit and the optimal ``q(w)`` (a mixin of :class:`QSGP`)."""

    fit_settings_class = QSGPFitSettings

    @classmethod
    def _fit_option_names(cls) -> set[str]:
        """Names :meth:`fit` accepts as options (and the constructor as their defaults)."""
        return {f.name for f in dataclasses.fields(QSGPFitSettings)}

    def _is_fitted_hyperparameter(self, name: str) -> bool:
        r"""Whether the parameter ``name`` is a hyperparameter the fits move (not the noise of
        a fixed-noise or logistic model, not a basis kept fixed)."""
        if name.startswith("likelihood.") and (self.fixed_noise or self.likelihood is None):
            return False
        return not (name.startswith("basis.") and not self.basis.trainable)

    def _trainable_hypers_and_bounds(self) -> tuple[dict[str, Tensor], Bounds]:
        r"""The hyperparameters the fits move and their optimiser bounds (from the GPyTorch
        constraints; an untransformed noise constraint is enforced only through them)."""
        return trainable_parameters_and_bounds(self, name_filter=self._is_fitted_hyperparameter)

    def _trainable_hypers(self) -> dict[str, Tensor]:
        return self._trainable_hypers_and_bounds()[0]

    def fit(self, settings: QSGPFitSettings | None = None, **overrides: Any) -> Self:
        r"""Absorb held conditioning data, then fit hyperparameters and ``q(w)``.

        Args:
            settings: a :class:`QSGPFitSettings` (default: the class defaults updated by the
                fit options given to the constructor).
            **overrides: its fields by name (``method``, ``max_iter``, the SGD settings,
                ``restandardize``, ``hyper_evidence``, ``hyper_rows``, ``fit_from_defaults_n``
                ...), replacing those of ``settings``. An unknown name raises ``ValueError``
                before anything changes.
        """
        settings = resolve_fit_settings(settings, overrides, self.fit_options)
        if settings.method not in ("auto", "closed_form", "sgd"):
            raise ValueError(
                f"Unknown fit method {settings.method!r}; use 'auto', 'closed_form' or 'sgd'."
            )
        if self.batch_shape != torch.Size():
            raise ValueError("fit() is for a single model, not a fantasy/batched one.")
        self._absorb(restandardize=settings.restandardize)
        method = settings.method
        if method == "auto":
            small = self.num_features <= 4096 and self._num_train_rows * self.num_features <= 4e7
            method = "closed_form" if small and self.likelihood_name == "gaussian" else "sgd"
        if method == "closed_form":
            if self._num_train_rows <= int(settings.fit_from_defaults_n):
                self.reset_hyperparameters()
            self.fit_closed_form(settings.closed_form_settings())
        else:
            self.fit_sgd(settings.sgd_settings())
        self.invalidate_caches()
        self.ensure_caches()
        return self

    def fit_state_to_hyperparameters(self) -> None:
        r"""``q(w)`` (and the fitted constant mean) at their optimum for the current
        hyperparameters on the held rows, the hyperparameters kept: ``fit_closed_form`` with no
        L-BFGS iteration (Gaussian likelihood; SGD without training them otherwise). ``q(w)``
        built at construction was that of the default hyperparameters, so a model that loaded
        others predicted with a mismatched ``q(w)``."""
        self._absorb(restandardize=False)
        if self.likelihood_name == "gaussian":
            self.fit_closed_form(max_iter=0)
        else:
            self.fit_sgd(train_hypers=False)
        self.invalidate_caches()
        self.ensure_caches()

    @torch.no_grad()
    def reset_hyperparameters(self) -> None:
        r"""Set the trainable hyperparameters back to their values at construction (the starting
        point a model rebuilt from its defaults would fit from)."""
        params = dict(self.named_parameters())
        for name, value in self._initial_hypers.items():
            if name in params:
                params[name].copy_(value)
        self.invalidate_caches()

    def _absorb(self, restandardize: bool) -> None:
        r"""Move the conditioning data into the training set (the refit will absorb them)."""
        if self.cond_X is not None:
            Xc = self.cond_X.reshape(-1, self.dim)
            self.train_X = torch.cat([self.train_X, Xc], dim=0)
            self.train_y = torch.cat([self.train_y, self.cond_y.reshape(-1)], dim=0)
            if self.fixed_noise:
                self.train_noise = torch.cat([self.train_noise, self.cond_noise.reshape(-1)])
            self.cond_X = self.cond_y = self.cond_noise = None
            self.cond_L = self.cond_r = self.cond_u = None
            self._cond_factor = None
        if restandardize and self.standardize and self._num_train_rows > 1:
            self._restandardize()
        self.invalidate_caches()

    def _rescale_to_outcome_scaling(self, old_mean: Tensor, old_std: Tensor, ratio: Tensor) -> None:
        r"""Held data (:class:`HeldDataMixin`), the constant mean ``c`` (kept at its level in the
        user's units) and ``q(w)`` to the new outcome scaling (see
        :meth:`OnlineModel._rescale_to_outcome_scaling`)."""
        super()._rescale_to_outcome_scaling(old_mean, old_std, ratio)
        if self.constant_mean:
            self.mean_constant = remap_standardized(
                self.mean_constant, old_mean, old_std, self.outcome_mean, self.outcome_std
            ).reshape(())
        # Warm start: rescale q(w) to the new units (the shift is left to the refit).
        self.var_mean = self.var_mean * ratio
        self.var_log_diag = self.var_log_diag + ratio.log()
        self.var_cols = self.var_cols * ratio

    def fit_closed_form(
        self, settings: QSGPClosedFormSettings | None = None, **overrides: Any
    ) -> Self:
        r"""Maximise an evidence over the hyperparameters (L-BFGS), then set ``q(w)`` to the
        Eq. 2 optimum within the family. Gaussian likelihood only.

        Args:
            settings: a :class:`QSGPClosedFormSettings` (defaults if omitted): ``max_iter``,
                ``hyper_evidence``, ``hyper_rows``, ``timeout_sec`` (the names of
                :class:`QSGPFitSettings`).
            **overrides: its fields by name, replacing those of ``settings``; ``evidence`` is
                the deprecated name of ``hyper_evidence`` (``DeprecationWarning``). An unknown
                name raises ``ValueError`` before anything changes.

        ``hyper_evidence="basis"``: the exact evidence of the finite-basis model (what Eq. 2
        reaches over the full family). ``"kernel"`` (RFF basis): the exact GP evidence of the
        kernel the features approximate, O(n^3) per iteration; the features' approximation error
        then does not move the hyperparameters. ``"auto"`` (default): ``"kernel"`` for the RFF
        basis while the model predicts with the kernel's exact GP (``n <= exact_max_n``, default
        m: :meth:`QSGP.is_exact_gp_on_data`), where it is ``SingleTaskGP``'s fit, and in weight
        space while ``n <= m / 8``
        (:data:`~bo_online.models.qsgp.evidence.KERNEL_EVIDENCE_MAX_N_PER_FEATURE`);
        ``"basis"`` beyond: nearer ``n = m`` the kernel's hyperparameters make the m-feature
        weight-space model overconfident (held-out NLL 3.0 against 0.64 at n = 300, m = 512, 8
        inputs). In the BO suite (q = 1, 30 LogEI steps, 16 seeds) the
        two evidences gave mean final regrets within two standard errors of each other on
        Hartmann6, Ackley 5-D and Branin.

        ``hyper_rows``: the basis evidence is that of a random subset of this many training rows
        when there are more (None: all); ``q(w)`` is still set on all rows. Each evidence costs
        O(rows m^2) and a stream refits every few dozen points, so the evidence of all n rows
        made the refits' total grow as n^2 (5,000-point UCI stream: about an hour per set).

        ``timeout_sec``: optional wall-clock limit of the L-BFGS run."""
        settings = resolve_closed_form_settings(settings, overrides)
        max_iter, hyper_rows = settings.max_iter, settings.hyper_rows
        if self.likelihood_name != "gaussian":
            raise ValueError("fit_closed_form() needs the Gaussian likelihood; use method='sgd'.")
        evidence = self._resolve_evidence(settings.hyper_evidence)
        if evidence == "kernel" and not isinstance(self.basis, RFFBasis):
            raise ValueError("hyper_evidence='kernel' needs the RFF basis.")
        params, bounds = self._trainable_hypers_and_bounds()
        if params and max_iter > 0:
            rows = None
            if (
                evidence != "kernel"
                and hyper_rows is not None
                and self._num_train_rows > hyper_rows
            ):
                gen = torch.Generator().manual_seed(self.seed + 7919 * self._num_train_rows)
                rows = torch.randperm(self._num_train_rows, generator=gen)[:hyper_rows]
            size = self._num_train_rows if rows is None else rows.numel()
            cm = self._fits_constant_mean()

            def objective() -> Tensor:
                if evidence == "kernel":
                    return self._kernel_log_marginal(constant_mean=cm)
                return self.exact_log_marginal(rows, constant_mean=cm)

            def loss() -> Tensor:
                return -(objective() + self.log_prior()) / size

            # L-BFGS-B with the constraints' bounds (untransformed noise must stay > 0)
            with training_mode(self):
                minimize_loss(
                    loss,
                    params,
                    method="lbfgs",
                    max_iter=max_iter,
                    timeout_sec=settings.timeout_sec,
                    bounds=bounds,
                )
        with torch.no_grad():
            if self._fits_constant_mean():
                self._fit_constant_mean(evidence)
            self.set_optimal_variational()
        return self

    def _fit_constant_mean(self, evidence: str) -> None:
        r"""Set ``mean_constant`` to the best constant prior mean at the fitted hyperparameters
        (all rows; the maximiser of the evidence the fit used).

        With a zero mean on standardised outcomes the posterior far from the data reverts to the
        data's mean. Where a few observations are extreme (noisy Levy 3-D: the best constant was
        1-1.5 standard deviations below the mean) that level is far too optimistic, so an
        acquisition sends the loop to unexplored corners, and the evidence compensates with
        other lengthscales than an exact GP with a constant mean (``SingleTaskGP``) fits."""
        y = self.train_y - self.mean_constant
        if evidence == "kernel":
            G = self._kernel_gram()[0]
        else:
            Phi = self.basis.features(self.train_X)
            idx = self.basis.all_indices()
            S = self.basis.prior_precision_block(idx, idx)
            w = 1.0 / self._row_noise()
            A = S + Phi.transpose(-1, -2) @ (w.unsqueeze(-1) * Phi)
            R = torch.stack([y, torch.ones_like(y)], dim=-1)
            B = solve_lower(psd_cholesky(A), Phi.transpose(-1, -2) @ (w.unsqueeze(-1) * R))
            G = R.transpose(-1, -2) @ (w.unsqueeze(-1) * R) - B.transpose(-1, -2) @ B
        c = self._best_constant(G)[0]
        if bool(torch.isfinite(c)):
            self.mean_constant = (self.mean_constant + c).detach().reshape(())

    @torch.no_grad()
    def set_optimal_variational(self) -> None:
        r"""``mu* = A^-1 Phi^T W y`` and the optimal ``C`` within the family,
        ``A = S + Phi^T W Phi`` (full: ``chol(A^-1)``; diagonal column r: ``c_rr = A_rr^-1/2``
        (Prop. 1); dense chevron column r: ``c = A_sub^-1 e_1 / sqrt(e_1^T A_sub^-1 e_1)`` with
        ``A_sub = A[r:, r:]``)."""
        Phi = self.basis.features(self.train_X)
        idx = self.basis.all_indices()
        S = self.basis.prior_precision_block(idx, idx)
        w = 1.0 / self._row_noise()
        A = S + Phi.transpose(-1, -2) @ (w.unsqueeze(-1) * Phi)
        L_A = psd_cholesky(A)
        b = Phi.transpose(-1, -2) @ (w * (self.train_y - self.mean_constant))
        self.var_mean = cholesky_solve(L_A, b.unsqueeze(-1)).squeeze(-1)
        m, k = self.num_features, self.num_dense
        log_diag = -0.5 * torch.diagonal(A).log()
        cols = torch.zeros(m, k, **self._dtype_device)
        if self.family == "full":
            C = psd_cholesky(torch.cholesky_inverse(L_A))
            log_diag, cols = torch.diagonal(C).log(), torch.tril(C, -1)
        else:
            for r in range(k):
                sub = A[r:, r:]
                e = torch.zeros(m - r, 1, **self._dtype_device)
                e[0] = 1.0
                v = cholesky_solve(psd_cholesky(sub), e).squeeze(-1)
                c = v / v[0].sqrt()
                log_diag[r] = c[0].log()
                cols[r + 1 :, r] = c[1:]
        self.var_log_diag, self.var_cols = log_diag.clone(), cols
