r"""The QSGP model class: construction, the fitted posterior, prediction and state.

The weight-space GP of Evans & Nair, "Quadruply Stochastic Gaussian Processes" (2018,
arXiv:1812.03010) as a BoTorch model; :class:`QSGP` composes the mixins of this package
(``q(w)`` and its moments, conditioning, evidence, fitting, SGD, sample paths).
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

import torch
from botorch.models.transforms.input import Normalize
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.likelihoods import LaplaceLikelihood
from linear_operator.operators import (
    DenseLinearOperator,
    DiagLinearOperator,
    MatmulLinearOperator,
)
from torch import Tensor

from bo_online.linalg import LowRankUpdatedCholesky, broadcast_shapes, solve_lower
from bo_online.models.base import HeldDataMixin, OnlineModel
from bo_online.models.qsgp.bases import InducingBasis, QSGPBasis, RFFBasis, RVMBasis
from bo_online.models.qsgp.conditioning import ZERO_NOISE, QSGPConditioningMixin
from bo_online.models.qsgp.evidence import QSGPEvidenceMixin
from bo_online.models.qsgp.fitting import QSGPFitMixin
from bo_online.models.qsgp.kernel_regime import QSGPKernelRegimeMixin
from bo_online.models.qsgp.sample_paths import QSGPSamplePathsMixin
from bo_online.models.qsgp.sgd import QSGPSGDMixin
from bo_online.models.qsgp.variational import QSGPVariationalMixin
from bo_online.models.validation import detached, warn_unless_unit_scaled, whole_number
from bo_online.models.wiski.covariance import RootDifferenceLinearOperator

#: Largest basis whose closed-form posterior on the data is set at construction (an m x m
#: Cholesky; beyond it the prior is kept until ``fit``).
_CLOSED_FORM_AT_CONSTRUCTION = 2048

__all__ = ["QSGP"]


class QSGP(
    QSGPKernelRegimeMixin,
    QSGPVariationalMixin,
    QSGPConditioningMixin,
    QSGPEvidenceMixin,
    QSGPFitMixin,
    QSGPSGDMixin,
    QSGPSamplePathsMixin,
    HeldDataMixin,
    OnlineModel,
):
    r"""Weight-space GP with QSGP stochastic variational inference.

    Args:
        train_X: ``n x d`` inputs (unit cube for BO).
        train_Y: ``n x 1`` targets (``{-1, 1}`` or ``{0, 1}`` labels for ``likelihood="logistic"``).
        train_Yvar: optional ``n x 1`` fixed noise variances (Gaussian likelihood only).
        num_features: ``m`` for ``basis="rff"`` (ignored for ``"inducing"``/``"rvm"``, where
            ``m = n`` with centres at the training inputs).
        basis: ``"rff"`` | ``"inducing"`` | ``"rvm"`` or a :class:`QSGPBasis` instance.
        family: ``"mean_field"`` | ``"chevron"`` | ``"full"``; default ``"full"`` for an RFF basis
            with ``m <= 2048`` (exact inference, good variances for BO), else ``"mean_field"``.
        num_dense_columns: ``k`` for the chevron family (default 10).
        likelihood: ``"gaussian"`` | ``"laplace"`` | ``"logistic"``.
        kernel: GPyTorch kernel; for RFF a ``ScaleKernel(RBFKernel(ard))`` (default: BoTorch's
            dimension-scaled lengthscale prior inside a ``ScaleKernel`` whose outputscale is
            fixed at 1, as ``SingleTaskGP``'s on standardised outcomes).
        bounds: optional ``2 x d`` input box.
        standardize: standardise regression targets (not for logistic).
        augment_variance: Prop. 4 predictive-variance augmentation (default: on for the inducing
            basis, where ``Phi = K``; it is only defined there).
        seed: seed of the RFF dictionary, of the SGD samplers (when the SGD settings' ``seed``
            is None) and of the closed-form fit's random row subset (``hyper_rows``).
        input_transform: optional BoTorch input transform.
        outcome_transform: ``None`` or ``Standardize(m=1)`` (the same: outcomes are
            standardised internally); any other outcome transform is refused.
        constant_mean: the closed-form fit (Gaussian likelihood, standardised targets) also
            chooses a constant prior mean ``f(x) = c + phi(x)^T w`` (its evidence maximised over
            ``c``, as ``SingleTaskGP``'s ``ConstantMean``), kept in the buffer ``mean_constant``
            (standardised units); False keeps ``c = 0``, the data's mean. The SGD fit keeps
            ``c`` as it is.
        exact_max_n: while the model holds at most this many points (fitted and conditioned
            on), an RFF basis with a Gaussian likelihood predicts with the exact GP of its
            kernel, and its fits maximise that GP's evidence (:meth:`is_exact_gp_on_data`;
            :mod:`~bo_online.models.qsgp.kernel_regime`); beyond, with the weight-space
            posterior ``q(w)``. Default: ``m``, at most 2,048 (up to ``m`` points the exact GP
            costs no more than the weight space); 0: always the weight space.
        **fit_options: defaults for :meth:`fit`, by the field names of
            :class:`~bo_online.models.qsgp.fitting.QSGPFitSettings` (e.g. ``num_rows``,
            ``num_cols``, ``cv_rank``); a misspelt name raises ``TypeError`` listing them.

    Fit defaults: ``**fit_options`` are the only constructor arguments that are fit settings.
    They are kept in ``fit_options`` and every :meth:`fit` starts from
    ``QSGPFitSettings(**fit_options)`` (a ``settings`` object passed to ``fit`` replaces them,
    its keywords override them); ``fit`` hands the SGD and closed-form fields on as
    :meth:`~QSGPFitSettings.sgd_settings` / :meth:`~QSGPFitSettings.closed_form_settings`, and
    :meth:`marginal_log_likelihood` reads ``hyper_evidence`` from them. :meth:`fit_sgd` and
    :meth:`fit_closed_form` called directly take their own settings (class defaults) and do not
    read them. ``seed`` and ``constant_mean`` are model state that the fits read, not settings.
    """

    #: a BO loop's refit at small n also fits a model rebuilt from its defaults and keeps the
    #: one with the higher ``marginal_log_likelihood`` (see ``OnlineLoop._restart_due``)
    restart_fit_from_defaults = True
    #: ``condition_on_observations`` and ``update`` keep the new rows apart from the training
    #: rows (``cond_X``, conditioned on in closed form through ``q(w)``); ``num_data`` and
    #: ``train_inputs`` count them, and ``fit`` absorbs them into the training rows. False all
    #: the same, so an incremental Ax model takes ``update`` (one dense factor): a chain of
    #: conditioned children would grow a low-rank term with every trial until the next fit
    conditioned_rows_held = False

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        num_features: int = 512,
        basis: str | QSGPBasis = "rff",
        family: Literal["mean_field", "chevron", "full"] | None = None,
        num_dense_columns: int | None = None,
        likelihood: Literal["gaussian", "laplace", "logistic"] = "gaussian",
        kernel: Kernel | None = None,
        bounds: Tensor | None = None,
        standardize: bool = True,
        augment_variance: bool | None = None,
        seed: int = 0,
        input_transform: Any | None = None,
        outcome_transform: Any | None = None,
        constant_mean: bool = True,
        exact_max_n: int | None = None,
        **fit_options: Any,
    ) -> None:
        if not isinstance(train_X, Tensor) or train_X.dim() != 2:
            shape = getattr(train_X, "shape", None)
            raise ValueError(f"train_X must be an n x d tensor, got {shape}.")
        dtype, device = train_X.dtype, train_X.device
        dim = OnlineModel.transformed_dim(train_X, input_transform)  # after the transform
        if input_transform is None and bounds is None and train_X.shape[0] > 1:
            lo, hi = train_X.min(dim=0).values, train_X.max(dim=0).values
            if bool((lo < 0).any() or (hi > 1).any()):
                # Inputs outside the unit cube: the kernel's lengthscale prior (BoTorch's
                # dimension-scaled one) assumes unit-cube inputs, and the evidence of a finite
                # RFF basis then picks short lengthscales and near-zero noise (an interpolating
                # fit that every later conditioning makes worse). Map the data's box onto the
                # unit cube, as BoTorch's Normalize does.
                input_transform = Normalize(
                    d=dim, bounds=torch.stack([lo, torch.where(hi > lo, hi, lo + 1)]).to(train_X)
                )
        super().__init__(dim, bounds, input_transform, dtype, device, outcome_transform)
        train_X, train_Y, train_Yvar = detached(train_X, train_Y, train_Yvar)
        X = self._checked_training_data(train_X, train_Y, train_Yvar)
        if train_Yvar is not None and bool((train_Yvar <= 0).any()):
            raise ValueError(ZERO_NOISE)
        train_Yvar = self._floor_train_Yvar(train_Y, train_Yvar)  # noise floor, with a warning
        if likelihood not in ("gaussian", "laplace", "logistic"):
            raise ValueError(
                f"likelihood must be 'gaussian', 'laplace' or 'logistic', got {likelihood!r}."
            )
        if train_Yvar is not None and likelihood != "gaussian":
            raise ValueError(
                "train_Yvar (fixed noise) is only meaningful for the Gaussian likelihood."
            )
        if family is None:  # exact inference when affordable (BO with small n), QSGP-0 beyond
            family = "full" if (basis in ("rff",) and num_features <= 2048) else "mean_field"
        if family not in ("mean_field", "chevron", "full"):
            raise ValueError(f"family must be 'mean_field', 'chevron' or 'full', got {family!r}.")
        self.likelihood_name = likelihood
        Y = train_Y.to(X)
        if likelihood == "logistic":
            if not bool(((Y == 1) | (Y == -1) | (Y == 0)).all()):
                raise ValueError("Logistic likelihood needs labels in {-1, 1} (or {0, 1}).")
            Y = torch.where(Y == 0, -torch.ones_like(Y), Y)
            standardize = False
        if standardize:  # one point too: centred on it, as BoTorch's Standardize
            self._set_outcome_scaling(Y, X)
        self.standardize = standardize
        self.fixed_noise = train_Yvar is not None
        unknown = sorted(set(fit_options) - self._fit_option_names())
        if unknown:  # a typo must not silently fall back to a default
            init = inspect.signature(type(self).__init__).parameters
            named = [k for k, p in init.items() if k != "self" and p.kind is not p.VAR_KEYWORD]
            raise TypeError(
                f"QSGP got unknown options {unknown}; its arguments are {named} and its fit "
                f"options {sorted(self._fit_option_names())}."
            )
        self.fit_options = dict(fit_options)
        self.seed = whole_number("seed", seed, -(2**63))  # 2.5 was cut to 2
        self.constant_mean = bool(constant_mean)
        self._exact_max_n = (
            None if exact_max_n is None else whole_number("exact_max_n", exact_max_n, 0)
        )

        # ---- basis dictionary
        if isinstance(basis, QSGPBasis):
            self.basis = basis
        elif basis == "rff":
            if kernel is None:
                warn_unless_unit_scaled(X, type(self).__name__)
                kernel = _default_rff_kernel(dim)
            self.basis = RFFBasis(dim, num_features, kernel=kernel, seed=seed)
        elif basis in ("inducing", "rvm"):
            if kernel is None:
                warn_unless_unit_scaled(X, type(self).__name__)
                kernel = ScaleKernel(get_covar_module_with_dim_scaled_prior(ard_num_dims=dim))
            cls = InducingBasis if basis == "inducing" else RVMBasis
            self.basis = cls(X.clone(), kernel)
        else:
            raise ValueError(
                f"basis must be 'rff', 'inducing', 'rvm' or a QSGPBasis, got {basis!r}."
            )
        m = self.basis.num_features
        self.family = family
        k = {"mean_field": 0, "full": m}.get(
            family, min(m, 10 if num_dense_columns is None else int(num_dense_columns))
        )
        if family == "chevron" and k < 0:
            raise ValueError("num_dense_columns must be >= 0.")
        self.num_dense = k
        self.augment_variance = (
            isinstance(self.basis, InducingBasis) if augment_variance is None else augment_variance
        )
        if self.augment_variance and not isinstance(self.basis, (InducingBasis, RVMBasis)):
            raise ValueError("Prop. 4 augmentation needs Phi = K (basis='inducing' or 'rvm').")

        # ---- likelihood hyperparameters
        if likelihood == "gaussian":
            self.likelihood = get_gaussian_likelihood_with_lognormal_prior()
        elif likelihood == "laplace":
            self.likelihood = LaplaceLikelihood()
        else:
            self.likelihood = None
        self.to(dtype=dtype, device=device)

        # ---- data and variational state (buffers; state_dict carries them)
        self.register_buffer("train_X", X)
        self.register_buffer("train_y", self._standardize(Y).squeeze(-1))
        # the constant prior mean c (standardised units): f(x) = c + phi(x)^T w
        self.register_buffer("mean_constant", torch.zeros((), dtype=dtype, device=device))
        self.register_buffer(
            "train_noise",
            None if train_Yvar is None else (train_Yvar.to(X) / self.outcome_std**2).squeeze(-1),
        )
        prior_prec = self._prior_diag_all()
        self.register_buffer("var_mean", torch.zeros(m, dtype=dtype, device=device))
        self.register_buffer("var_log_diag", -0.5 * prior_prec.log())
        self.register_buffer("var_cols", torch.zeros(m, k, dtype=dtype, device=device))
        # Conditioning data held since the last fit (docs/math.md §5) and its caches.
        self.register_buffer("cond_X", None)  # batch x p x d
        self.register_buffer("cond_y", None)  # sample x batch x p (standardised)
        self.register_buffer("cond_noise", None)  # batch x p
        # The conditioned posterior is kept in weight space (docs/math.md §5), so its cost does
        # not grow with the number p of points conditioned on: with A_c = Phi_c C (p x m) and
        # E = N + augmentation (diagonal), P = I + A_c^T E^-1 A_c (m x m) and
        # r = A_c^T E^-1 (y_c - Phi_c mu); then mean(x) = phi_x^T mu + a_x^T P^-1 r and
        # cov(x, x') = a_x^T P^-1 a_x' (+ the augmentation on the diagonal), a_x = C^T phi_x.
        self.register_buffer("cond_L", None)  # batch x m x m, chol(P)
        self.register_buffer("cond_r", None)  # sample x batch x m
        self.register_buffer("cond_u", None)  # sample x batch x m, P^-1 r
        #: a conditioned (fantasy) model's P as its parent's factor plus a low-rank term
        self._cond_factor: LowRankUpdatedCholesky | None = None
        # The kernel regime's factor of K_HH + N_H and z (kernel_regime.py), set by state_dict
        # so that a loaded model predicts bit for bit; the live caches are `_kernel_cache`.
        self.register_buffer("kernel_L", None)  # batch x N x N
        self.register_buffer("kernel_z", None)  # sample x batch x N
        #: the trainable hyperparameters at construction (see ``reset_hyperparameters``)
        self._initial_hypers = {k: v.detach().clone() for k, v in self._trainable_hypers().items()}
        if likelihood == "gaussian" and m <= _CLOSED_FORM_AT_CONSTRUCTION:
            # The posterior on the data under the initial hyperparameters, as every other
            # surrogate holds from construction (O(n m^2 + m^3)); larger bases keep the prior
            # until fit(), which is what sets their state.
            with torch.no_grad():
                self.set_optimal_variational()

    # ------------------------------------------------------------------ basic properties

    @property
    def num_features(self) -> int:
        return self.basis.num_features

    @property
    def exact_max_n(self) -> int:
        r"""Up to this many held points the model is the exact GP of its kernel (RFF basis,
        Gaussian likelihood; see :meth:`is_exact_gp_on_data`)."""
        if self._exact_max_n is not None:
            return self._exact_max_n
        return min(self.num_features, _CLOSED_FORM_AT_CONSTRUCTION)

    # What BoTorch and Ax read about the data (``get_X_baseline``, proximal acquisition,
    # ``sample_around_best``, the loops' refit schedule): the training rows plus the rows
    # conditioned on since the last fit (``cond_X``, which ``fit`` absorbs). The fits work on
    # the training rows alone (``_num_train_rows``), after absorbing.

    @property
    def _num_train_rows(self) -> int:
        return int(self.train_X.shape[-2])

    @property
    def num_data(self) -> int:
        held = 0 if self.cond_X is None else int(self.cond_X.shape[-2])
        return self._num_train_rows + held

    @property
    def train_inputs(self) -> tuple[Tensor]:
        r"""``(batch x n x d,)``: the (transformed) training inputs, then the conditioned ones."""
        if self.cond_X is None:
            return (self.train_X,)
        batch = self.cond_X.shape[:-2]
        return (torch.cat([self.train_X.expand(*batch, *self.train_X.shape), self.cond_X], -2),)

    @property
    def train_targets(self) -> Tensor:
        r"""``sample x batch x n`` targets in the user's units, in the order of
        :attr:`train_inputs`."""
        y = self.train_y
        if self.cond_y is not None:
            y = torch.cat([y.expand(*self.cond_y.shape[:-1], y.shape[-1]), self.cond_y], -1)
        return y * self.outcome_std + self.outcome_mean

    def hyperparameters(self):
        r"""Tensors the caches depend on: hyperparameters and the variational parameters."""
        for name, p in self.named_parameters():
            if self.fixed_noise and name.startswith("likelihood."):
                continue
            yield p
        yield self.var_mean
        yield self.var_log_diag
        yield self.var_cols
        yield self.mean_constant

    # ------------------------------------------------------------------ noise

    def _gauss_noise(self) -> Tensor:
        # Not OnlineModel._noise_of_points: the Gaussian-equivalent variance of any likelihood
        # (a Laplace(b) as 2 b^2, 0 for others), a scalar; not new points' noise.
        if self.likelihood_name == "gaussian":
            return self.likelihood.noise.squeeze(-1).reshape(())
        if self.likelihood_name == "laplace":  # variance of a Laplace(b) variable
            return (2.0 * self.likelihood.noise.pow(2)).reshape(())
        return torch.zeros((), **self._dtype_device)

    def _row_noise(self, rows: Tensor | None = None) -> Tensor:
        r"""Per-row noise variances of the training data (``n`` or ``|rows|``)."""
        # Not OnlineModel._noise_of_points: held rows, whose fixed noise is stored (no error).
        if self.fixed_noise:
            return self.train_noise if rows is None else self.train_noise[rows]
        size = self._num_train_rows if rows is None else rows.numel()
        return self._gauss_noise().expand(size)

    def _noise_variance(self, X: Tensor) -> Tensor:
        if self.fixed_noise:  # as BoTorch: the mean training noise at new points
            mean = self._mean_fixed_noise()  # batch x 1
            return mean.expand(*torch.broadcast_shapes(X.shape[:-2], mean.shape[:-1]), X.shape[-2])
        return self._gauss_noise().expand(X.shape[:-1])

    def _default_fantasy_noise(self) -> Tensor | None:
        if self.fixed_noise:
            return self._mean_fixed_noise().unsqueeze(-1)  # batch x 1 x 1
        return None

    def _mean_fixed_noise(self) -> Tensor:
        r"""The mean per-point noise (standardised) of a fixed-noise model over all the points it
        holds: the fitted rows and those conditioned on or added since the last fit
        (``cond_noise``), as BoTorch's conditioned models have it: ``batch x 1``."""
        total, count = self.train_noise.sum(-1, keepdim=True), self.train_noise.shape[-1]
        if self.cond_noise is not None:
            total = total + self.cond_noise.sum(-1, keepdim=True)
            count = count + self.cond_noise.shape[-1]
        return total / count

    def _augmentation(self, X: Tensor) -> Tensor:
        r"""Prop. 4: ``sigma^2 k(x,x)^2 / (k(x)^T k(x) + sigma^2 k(x,x))`` per point
        (``... x q``)."""
        kxx = self.basis.kernel_diag(X)
        kk = torch.zeros_like(kxx)
        for idx in self._chunks():
            kk = kk + self.basis.features(X, idx).pow(2).sum(-1)
        s2 = self._noise_variance(X)
        return s2 * kxx.pow(2) / (kk + s2 * kxx)

    def _base_joint(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Mean and covariance of the fitted (unconditioned) posterior at ``X``, with the Prop. 4
        augmentation on the diagonal when enabled."""
        mean, cov = self._moments(X, cov=True)
        if self.augment_variance:
            cov = cov + torch.diag_embed(self._augmentation(X))
        return mean, cov

    #: Up to this many points the posterior covariance is a dense ``q x q`` tensor; beyond it a
    #: lazy operator kept as its roots (:meth:`_lazy_posterior_due`), so e.g. ``.variance`` at
    #: thousands of points never forms ``q x q``.
    dense_posterior_max_q: int = 512

    def _lazy_posterior_due(self, q: int) -> bool:
        r"""Whether the posterior at ``q`` points keeps its covariance as roots: above
        ``dense_posterior_max_q`` points, and, for a model not conditioned since its fit, only
        while ``q`` exceeds the number of features ``m``. The roots are ``q x m``; the
        unconditioned dense path sums ``q x q`` over feature blocks of 4,096 and never holds
        ``q x m``, so with more features than points it needs less memory (a conditioned model
        forms ``q x m`` either way)."""
        if q <= self.dense_posterior_max_q:
            return False
        return self.cond_X is not None or q > self.num_features

    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        if self.is_exact_gp_on_data():
            q = X.shape[-2]
            mean, cov = self._kernel_moments(X, lazy=q > self.dense_posterior_max_q)
            if isinstance(cov, Tensor):
                cov = _psd(cov)
            batch = broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
            return MultivariateNormal(mean.expand(*batch, q), cov.expand(*batch, q, q))
        if self._lazy_posterior_due(X.shape[-2]):
            return self._lazy_latent_posterior(X)
        if self.cond_X is None:
            mean, cov = self._base_joint(X)
            return MultivariateNormal(mean, _psd(cov))
        # docs/math.md §5 in weight space: O(q m^2) per batch element, independent of the number
        # of points conditioned on, and memory linear in the batch of X.
        mean, A = self._features_times_C(X)
        At = A.transpose(-1, -2)  # batch x m x q
        if self._cond_factor is not None:
            Z, H = self._cond_factor.whiten(At)
        else:
            Z, H = solve_lower(self.cond_L, At), None
        cov = Z.transpose(-1, -2) @ Z
        if self.augment_variance:
            cov = cov + torch.diag_embed(self._augmentation(X))
        mean = mean + (A @ self.cond_u.unsqueeze(-1)).squeeze(-1)
        q = X.shape[-2]
        if H is not None:
            out_batch = broadcast_shapes(mean.shape[:-1], cov.shape[:-2], H.shape[:-2])
            if cov.shape[:-2].numel() < out_batch.numel():
                # Points shared by the batch of a fantasy model (qNIPV's integration points):
                # the shared block once, each element's low-rank term lazily, so that .variance
                # forms no batch x q x q tensor (b = 512, 256 points: 268 MB each).
                Hb = H.expand(*out_batch, *H.shape[-2:])
                covar = _psd(cov).expand(*out_batch, q, q) + (
                    MatmulLinearOperator(Hb.transpose(-1, -2), Hb) * -1.0
                )
                return MultivariateNormal(mean.expand(*out_batch, q), covar)
            cov = cov - H.transpose(-1, -2) @ H
        out_batch = torch.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
        return MultivariateNormal(mean.expand(*out_batch, q), _psd(cov.expand(*out_batch, q, q)))

    def _lazy_latent_posterior(self, X: Tensor) -> MultivariateNormal:
        r"""The posterior at many points (``batch x q x d``) with covariance ``P P^T - Q Q^T
        (+ diag)`` kept as its roots: ``P = Phi_X C`` (``q x m``) before any conditioning, and
        after it ``P = (L^-1 (Phi_X C)^T)^T`` (``q x m``) with ``Q = H^T`` (``q x r``) from the
        Woodbury form that ``condition_on_observations`` / ``fantasize`` keep (width 0 after an
        in-place ``update``), the same algebra as the dense path (docs/math.md §5)."""
        mean, A = self._features_times_C(X)  # ... x q, ... x q x m
        if self.cond_X is None:
            P, Q = A, A.new_zeros(*A.shape[:-1], 0)
        else:
            At = A.transpose(-1, -2)
            if self._cond_factor is not None:
                Z, H = self._cond_factor.whiten(At)
            else:
                Z, H = solve_lower(self.cond_L, At), None
            P = Z.transpose(-1, -2)
            Q = P.new_zeros(*P.shape[:-1], 0) if H is None else H.transpose(-1, -2)
            mean = mean + (A @ self.cond_u.unsqueeze(-1)).squeeze(-1)
        q = X.shape[-2]
        batch = broadcast_shapes(mean.shape[:-1], P.shape[:-2], Q.shape[:-2])
        covar = RootDifferenceLinearOperator(P, Q, batch_shape=tuple(batch))
        if self.augment_variance:
            covar = covar + DiagLinearOperator(self._augmentation(X).expand(*batch, q))
        return MultivariateNormal(mean.expand(*batch, q), covar)

    @torch.no_grad()
    def predict(
        self, X: Tensor, observation_noise: bool = False, batch_size: int = 1024
    ) -> tuple[Tensor, Tensor]:
        r"""Marginal predictive mean and variance at many points, user units (``n* x d`` ->
        two ``n*`` tensors), in blocks of rows and basis columns: no ``n* x n*`` covariance."""
        if self.training:  # as posterior: a fixed input transform (no bounds learned from X)
            self.eval()
        means, variances = [], []
        for start in range(0, X.shape[-2], batch_size):
            Xb = self._transform_and_check(X[..., start : start + batch_size, :])
            self.ensure_caches()
            if self.cond_X is None and not self.is_exact_gp_on_data():
                mean, var = self._moments(Xb, cov=False)
                if self.augment_variance:
                    var = var + self._augmentation(Xb)
            else:
                mvn = self._latent_posterior(Xb.unsqueeze(-2))  # q = 1 per point
                mean, var = mvn.mean.squeeze(-1), mvn.variance.squeeze(-1)
            if observation_noise:
                var = var + self._noise_variance(Xb)
            means.append(mean * self.outcome_std + self.outcome_mean)
            variances.append(var * self.outcome_std**2)
        return torch.cat(means, -1), torch.cat(variances, -1)

    # ------------------------------------------------------------------ state

    def _before_apply(self) -> None:
        # A conditioned model's low-rank term is not a buffer, so .to() would skip it. (The
        # constructor converts before the attribute exists.)
        if getattr(self, "_cond_factor", None) is not None:
            self._materialize_cond_factor()

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The state with a conditioned model's factor whole (``cond_L``; see
        :meth:`_materialize_cond_factor`), so a load restores its covariance."""
        self._materialize_cond_factor()
        self._kernel_state_to_buffers()
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """As :meth:`OnlineModel.load_state_dict`; a complete state's kernel-regime factor is
        adopted as the caches (a partial one's caches are rebuilt at the next use)."""
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self.__dict__["_kernel_cache"] = None
        if self._cache_key is not None and "kernel_L" in state_dict:
            self._kernel_state_from_buffers()
        return result

    def _after_load(self) -> None:
        self._cond_factor = None  # the loaded cond_L is whole (state_dict folds the term in)
        self.num_dense = int(self.var_cols.shape[-1])
        if self.mean_constant is None:  # a state saved before the constant mean existed
            self.mean_constant = torch.zeros((), **self._dtype_device)


def _default_rff_kernel(dim: int) -> ScaleKernel:
    r"""BoTorch's ``SingleTaskGP`` default kernel (RBF-ARD with the dimension-scaled lengthscale
    prior, unit prior variance on standardised outcomes) in the ``ScaleKernel`` the RFF basis
    expects, its outputscale fixed at 1.

    A free outputscale (no prior) is not what BoTorch fits: in a BO loop on Branin it grew to
    2-2.5 over 20 steps, inflating the posterior variance away from the data, and LogEI then
    sampled the corners of the box where an exact GP on the same points did not."""
    kernel = ScaleKernel(get_covar_module_with_dim_scaled_prior(ard_num_dims=dim))
    kernel.outputscale = 1.0
    kernel.raw_outputscale.requires_grad_(False)
    return kernel


def _psd(cov: Tensor) -> DenseLinearOperator:
    r"""Symmetrised covariance as a lazy operator: a finite basis gives covariances of rank at most
    ``m`` over many points, which linear_operator factorises with jitter (a dense tensor would make
    torch's ``MultivariateNormal`` demand strict positive definiteness)."""
    return DenseLinearOperator(0.5 * (cov + cov.transpose(-1, -2)))
