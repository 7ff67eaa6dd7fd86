r"""The :class:`DecoupledSVGP` model class: constructor, noise handling and state loading; the
rest of its behaviour is composed from the mixins of this package (bases, statistics, prediction,
conditioning, objectives, fitting)."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood, Likelihood
from gpytorch.means import ConstantMean
from torch import Tensor

from bo_online.models.base import HeldDataMixin, OnlineModel
from bo_online.models.decoupled.bases import DecoupledBasesMixin, median_lengthscale
from bo_online.models.decoupled.conditioning import DecoupledConditioningMixin
from bo_online.models.decoupled.fitting import DecoupledFitMixin
from bo_online.models.decoupled.objectives import DecoupledObjectivesMixin
from bo_online.models.decoupled.prediction import DecoupledPredictionMixin
from bo_online.models.decoupled.statistics import DecoupledStatisticsMixin, site_dtype
from bo_online.models.validation import (
    detached,
    require_bool,
    warn_unless_unit_scaled,
    whole_number,
)

__all__ = ["DecoupledSVGP"]

_FOLD_FACTOR_BUFFERS = ("fold_chol_K", "fold_chol_A", "fold_chol_C")
_SAVED_ONLY_BUFFERS = ("generator_state", *_FOLD_FACTOR_BUFFERS)
#: held in ``site_dtype`` of the model's dtype (float64 for a float32 model), see ``_apply``
_SITE_BUFFERS = ("site_Q", "site_s")


class DecoupledSVGP(
    DecoupledFitMixin,
    DecoupledConditioningMixin,
    DecoupledObjectivesMixin,
    DecoupledPredictionMixin,
    DecoupledStatisticsMixin,
    DecoupledBasesMixin,
    HeldDataMixin,
    OnlineModel,
):
    r"""Decoupled SVGP with exact O(M_beta^2 q + M_alpha q) Gaussian conditioning.

    Args:
        train_X: ``n x d`` initial inputs (n >= 1), kept (with ``train_Y``) for refits.
        train_Y: ``n x 1`` initial observations.
        train_Yvar: optional ``n x 1`` fixed noise variances (user units); if given, every later
            ``update`` must pass ``noise``.
        num_mean_bases: cap ``M_alpha`` on the mean bases (including the shared covariance bases).
        num_cov_bases: cap ``M_beta`` on the covariance bases (``<= num_mean_bases``). The
            default 128 is a trade-off measured on a 1,500-point pol stream (26 inputs): test NLL
            3.86 against 4.02 with 64 (an exact GP on 600 rows in hindsight: 3.77), for 1.1-1.5x
            the update time (an update is ``O(M_beta^2 q)``).
        covar_module: GPyTorch kernel; default BoTorch's RBF with dimension-scaled priors, its
            lengthscales initialised as ``lengthscale_init`` says.
        likelihood: GPyTorch likelihood; default BoTorch's ``GaussianLikelihood``. Non-Gaussian
            likelihoods are trained with Gauss-Hermite expected log likelihoods but cannot be
            conditioned in closed form.
        bounds: optional ``2 x d`` input box.
        standardize: standardise outcomes with the initial data's mean and std (Gaussian
            likelihoods only; labels or counts for other likelihoods are used as given).
        input_transform: optional BoTorch input transform.
        outcome_transform: ``None`` or ``Standardize(m=1)`` (the same: outcomes are
            standardised internally); any other outcome transform is refused.
        seed: seed for the random choices (basis seeding, minibatches).
        warm_start_points: data points the closed-form warm start of ``a, B`` uses.
        max_basis_growth: covariance bases conditioning may add beyond the cap before a fit
            compresses them.
        exact_fit_points: size of the random subset whose exact marginal likelihood the default
            fit maximises (all held points when n is smaller); beyond it the hyperparameters
            are refined on the collapsed bound of the bases while the mean bases are fewer than
            this many (see :meth:`~bo_online.models.decoupled.DecoupledSVGP.fit`).
        hyperparameter_refit_growth: once the default fit's objective sees a random subset of
            fixed size (n above ``exact_fit_points``, or above 2,048 when it refines on the
            bound), retrain the hyperparameters only when n has grown by this factor since they
            were last trained; the fits in between keep them, re-select the bases and re-solve
            ``a, B`` on all held data. 1 (default): retrain at every fit. A long stream's
            default is 2 (``StreamingLoop.STREAM_MODEL_DEFAULTS``): a fresh subset of the same
            size adds no information on an unchanging stream.
        lengthscale_init: starting lengthscales of the default kernel. ``"prior"`` (default):
            BoTorch's (the mode of the dimension-scaled prior), where ``SingleTaskGP`` and
            :class:`~bo_online.models.exact.OnlineExactGP` start, so the default fit on small
            data (the exact marginal likelihood by L-BFGS) reaches the exact GP's optimum rather
            than another local one (Branin, 5 points: the median start ended 0.022 nats per
            point lower). ``"median"``: the median heuristic of Cheng & Boots (2017,
            arXiv:1711.10127, Appendix C.2), for the paper's Adam training from scratch.

    The bases are seeded from the data: if ``n <= num_cov_bases`` then ``beta = train_X``, no
    mean-only bases, ``a = (K + N)^{-1} (y - c)`` and ``L = N^{-1/2}`` -- exactly the exact GP.
    Otherwise ``num_cov_bases`` random data points seed ``beta`` and up to ``num_mean_bases -
    num_cov_bases`` others seed ``alpha``, with the closed-form Gaussian optimum of ``a`` and ``B``
    on a data subsample as the starting point.

    Example:
        >>> model = DecoupledSVGP(train_X, train_Y, num_mean_bases=512, num_cov_bases=64)
        >>> model.fit(max_iter=200)
        >>> model.update(new_X, new_Y)      # exact, O(M_beta^2 q + M_alpha q), in place
        >>> post = model.posterior(test_X)
    """

    #: a BO loop's warm-started refit at small n, where the model is not the exact GP
    #: (:meth:`is_exact_gp_on_data`), also fits a model rebuilt from its defaults and keeps the
    #: one with the higher ``marginal_log_likelihood`` (see ``OnlineLoop._restart_due``)
    restart_fit_from_defaults = True
    #: a warm-started refit evaluates the bound over every point held (its sums run over all
    #: rows, O(n) per iteration): the "auto" schedules thin these refits out as n grows, like
    #: the exact GP's, but keep them warm-started (see ``OnlineLoop._refit_due``)
    refit_visits_every_point = True

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        num_mean_bases: int = 256,
        num_cov_bases: int = 128,
        covar_module: Kernel | None = None,
        likelihood: Likelihood | None = None,
        bounds: Tensor | None = None,
        standardize: bool = True,
        input_transform: Any | None = None,
        outcome_transform: Any | None = None,
        seed: int = 0,
        warm_start_points: int = 1024,
        max_basis_growth: int = 128,
        exact_fit_points: int = 512,
        lengthscale_init: Literal["prior", "median"] = "prior",
        hyperparameter_refit_growth: float = 1.0,
    ) -> None:
        dtype, device = train_X.dtype, train_X.device
        if lengthscale_init not in ("prior", "median"):
            raise ValueError(
                f"lengthscale_init must be 'prior' or 'median', got {lengthscale_init!r}."
            )
        if not isinstance(train_X, Tensor) or train_X.dim() != 2:
            shape = getattr(train_X, "shape", train_X)
            raise ValueError(f"train_X must be an n x d tensor, got {shape}.")
        # A float such as 2.5 was cut to 2 and a string failed in a comparison; whole numbers of
        # any type pass (the checks below say how they relate).
        num_mean_bases = whole_number("num_mean_bases", num_mean_bases, 1)
        num_cov_bases = whole_number("num_cov_bases", num_cov_bases, 1)
        warm_start_points = whole_number("warm_start_points", warm_start_points, 0)
        max_basis_growth = whole_number("max_basis_growth", max_basis_growth, 0)
        exact_fit_points = whole_number("exact_fit_points", exact_fit_points, 1)
        if num_cov_bases < 1 or num_mean_bases < num_cov_bases:
            raise ValueError(
                f"Need 1 <= num_cov_bases <= num_mean_bases, got num_cov_bases={num_cov_bases}, "
                f"num_mean_bases={num_mean_bases}."
            )
        dim = OnlineModel.transformed_dim(train_X, input_transform)  # after the transform
        super().__init__(dim, bounds, input_transform, dtype, device, outcome_transform)
        train_X, train_Y, train_Yvar = detached(train_X, train_Y, train_Yvar)
        X = self._checked_training_data(train_X, train_Y, train_Yvar)
        if train_Yvar is not None and bool((train_Yvar <= 0).any()):
            raise ValueError(
                "train_Yvar must be > 0: the decoupled model's conditioning adds "
                "precisions 1/noise, so zero noise is not representable."
            )
        train_Yvar = self._floor_train_Yvar(train_Y, train_Yvar)  # noise floor, with a warning
        if likelihood is not None and not isinstance(likelihood, Likelihood):
            # a name from --model-option likelihood=... failed later with an AttributeError
            raise ValueError(
                "DecoupledSVGP's likelihood must be a GPyTorch Likelihood (e.g. "
                f"gpytorch.likelihoods.BernoulliLikelihood()), got {likelihood!r}; build it in "
                "Python."
            )
        gaussian = likelihood is None or isinstance(likelihood, GaussianLikelihood)
        # labels/counts stay as given; one point too, as Standardize
        if require_bool(standardize, "standardize") and gaussian:
            self._set_outcome_scaling(train_Y, X)
        self.num_mean_bases = int(num_mean_bases)
        self.num_cov_bases = int(num_cov_bases)
        self.warm_start_points = int(warm_start_points)
        if max_basis_growth < 0 or exact_fit_points < 1:
            raise ValueError(
                f"Need max_basis_growth >= 0 and exact_fit_points >= 1, got {max_basis_growth} "
                f"and {exact_fit_points}."
            )
        growth = hyperparameter_refit_growth
        if isinstance(growth, bool) or not isinstance(growth, (int, float)) or not growth >= 1:
            raise ValueError(
                f"hyperparameter_refit_growth must be a number >= 1 (1: retrain the "
                f"hyperparameters at every fit), got {growth!r}."
            )
        if not math.isfinite(growth):
            raise ValueError(f"hyperparameter_refit_growth must be finite, got {growth!r}.")
        self.hyperparameter_refit_growth = float(growth)
        self.max_basis_growth = int(max_basis_growth)
        self.exact_fit_points = int(exact_fit_points)
        self.seed = whole_number("seed", seed, -(2**63))  # any int a Generator takes
        self._generator = torch.Generator().manual_seed(self.seed)
        self.fixed_noise = train_Yvar is not None
        if self.fixed_noise and likelihood is not None:
            raise ValueError("Pass either train_Yvar (fixed noise) or a likelihood, not both.")
        if covar_module is None:
            warn_unless_unit_scaled(X, type(self).__name__)
            covar_module = get_covar_module_with_dim_scaled_prior(ard_num_dims=dim)
        if covar_module is not None and lengthscale_init == "median":
            with torch.no_grad():  # the paper's median heuristic (Appendix C.2)
                covar_module.lengthscale = (
                    median_lengthscale(X, generator=self._generator)
                    .to(covar_module.lengthscale)
                    .expand_as(covar_module.lengthscale)
                    .clamp_min(0.05)
                )
        self.covar_module = covar_module
        self.likelihood = likelihood or get_gaussian_likelihood_with_lognormal_prior()
        self.mean_module = ConstantMean()
        self.to(dtype=dtype, device=device)
        self._register_held_data(X, train_Y, train_Yvar)
        # Variational state (buffers; fit() turns copies into leaves and writes them back).
        self.register_buffer("beta_points", None)  # batch x M_beta x d
        self.register_buffer("L", None)  # batch x M_beta x M_beta, B = L L^T
        self.register_buffer("a_beta", None)  # sample x batch x M_beta
        self.register_buffer("alpha_points", None)  # (M_alpha - M_beta) x d, mean-only bases
        self.register_buffer("a_alpha", None)  # (M_alpha - M_beta)
        # Cache: lower Cholesky factor of H = I + L^T K_beta L.
        self.register_buffer("chol_H", None)
        # Site statistics of the held data on the mean basis Z = [beta; alpha] (fold mode, see
        # _fold): Q = K_ZX N^{-1} K_XZ (M_alpha x M_alpha), s = K_ZX N^{-1} (y - c) (M_alpha).
        # Set once the hyperparameters were refined on the collapsed bound (see _fit_auto).
        self.register_buffer("collapsed_fit", None)
        # n when the default fit last trained the hyperparameters (see _hyperparameters_due)
        self.register_buffer("hyperparameters_fit_n", None)
        self.register_buffer("site_Q", None)
        self.register_buffer("site_s", None)
        # Set only while state_dict or load_state_dict runs (see _save_to_state_dict):
        # the generator's state and the fold factors chol(K_j), chol(K_Z + Q), chol(K_j + P~).
        self.register_buffer("generator_state", None)
        for name in _FOLD_FACTOR_BUFFERS:
            self.register_buffer(name, None)
        self._seed_bases()

    def hyperparameters(self):
        if self.fixed_noise or not isinstance(self.likelihood, GaussianLikelihood):
            return (p for n, p in self.named_parameters() if not n.startswith("likelihood."))
        return self.parameters()

    def _gaussian(self) -> bool:
        return self.fixed_noise or isinstance(self.likelihood, GaussianLikelihood)

    def is_exact_gp_on_data(self) -> bool:
        r"""Whether this model, rebuilt from its defaults on the data it holds, is the exact GP:
        a Gaussian likelihood and ``n <= num_cov_bases``, so that every data point is a
        covariance basis (class docstring). A BO loop then refits it as BoTorch refits its exact
        GP (``OnlineLoop._rebuild_due``)."""
        return self._gaussian() and self.num_data <= self.num_cov_bases

    def _noise_of_points(self, X: Tensor, noise: Tensor | None) -> Tensor:
        r"""Positive per-point noise (``batch x q``) for new points, given or the likelihood's
        (:meth:`OnlineModel._noise_of_points`), for a Gaussian likelihood only."""
        if not self._gaussian():
            raise ValueError(
                "Closed-form conditioning of DecoupledSVGP needs a Gaussian likelihood; refit with "
                "the new data (append it to train_X/train_y and call fit) instead."
            )
        noise = super()._noise_of_points(X, noise)  # given, else the likelihood's
        if bool((noise <= 0).any()):
            raise ValueError(
                "DecoupledSVGP conditioning adds the precisions 1/noise of the new points, so the "
                "noise variances must be > 0 (got a zero); pass a small positive noise instead."
            )
        return noise

    def _noise_variance(self, X: Tensor) -> Tensor:
        if self.fixed_noise:  # batch x 1 (a fantasy model's noise has its own batch)
            mean = self.train_noise.mean(-1, keepdim=True)
            return mean.expand(*torch.broadcast_shapes(X.shape[:-2], mean.shape[:-1]), X.shape[-2])
        if not isinstance(self.likelihood, GaussianLikelihood):
            raise ValueError("observation_noise=True needs a Gaussian likelihood.")
        return self.likelihood.noise.squeeze(-1).expand(X.shape[:-1])

    def _default_fantasy_noise(self) -> Tensor | None:
        if self.fixed_noise:
            # batch x 1 x 1: each batch's own mean (a model conditioned on candidate sets with
            # their own noise), as BoTorch's fantasize takes it
            return self.train_noise.mean(-1, keepdim=True).unsqueeze(-1)
        return None

    def _train_noise_diag(self, idx: Tensor | None = None) -> Tensor:
        r"""Per-point noise of held data; for a non-Gaussian likelihood a unit pseudo-noise, used
        only to initialise ``a`` and ``L``."""
        if self.fixed_noise:
            return self.train_noise if idx is None else self.train_noise[idx]
        n = self.num_data if idx is None else idx.shape[0]
        if not self._gaussian():
            return torch.ones(n, **self._dtype_device)
        return self.likelihood.noise.squeeze(-1).expand(n)

    # ------------------------------------------------------------------ L and chol_H, formed lazily
    # Fold mode (``_fold``) keeps only the factors it predicts with, and a fantasy (batched)
    # model its parent's blocks plus the new rows (``conditioning.BorderedState``); the buffers
    # ``L`` and ``chol_H`` are then formed on their first read. torch's Module resolves
    # buffers through ``__getattr__``, so that is where the read is seen; every route that
    # copies or saves buffers directly (``state_dict``, ``to``) forms them first.

    def __getattr__(self, name: str) -> Any:
        if name in ("L", "chol_H") and self.__dict__.get("_covariance_pending", False):
            self._materialise_covariance()
        return super().__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "L":  # a new covariance state replaces whatever was left pending
            self.__dict__["_covariance_pending"] = False
            self.__dict__.pop("_bordered", None)
        super().__setattr__(name, value)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        if self.__dict__.get("_covariance_pending", False):
            self._materialise_covariance()
        # Saved so that a loaded model goes on bit for bit as this one would (a resumed stream
        # repeats the uninterrupted one): the generator refits draw subsets from, and the
        # factors the folds keep up to date (factorised afresh they differ in the last bits).
        self._buffers["generator_state"] = self._generator.get_state()
        kept = self.__dict__.get("_kept_fold_factors")
        valid = kept is not None and self.site_Q is not None and kept[0] is self.site_Q
        for name, factor in zip(_FOLD_FACTOR_BUFFERS, kept[1:] if valid else (None,) * 3):
            self._buffers[name] = factor
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in _SAVED_ONLY_BUFFERS:  # not held between saves
            self._buffers[name] = None

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        r"""As ``Module._apply``, except that the site statistics (and the fold factors kept for
        them) follow the model's device but stay in :func:`site_dtype` of its new dtype:
        converted with the rest, a float32 model's float64 sites would be rounded, which the
        folds cannot afford (``statistics.site_dtype``)."""
        sites = {name: self._buffers.get(name) for name in _SITE_BUFFERS}
        others = (
            t for t in self._tensors_apply_converts() if all(t is not s for s in sites.values())
        )
        # BoTorch calls ``to`` on every analytic acquisition evaluation: form nothing when
        # ``fn`` leaves every other tensor as it is and the sites are in their dtype already.
        if (
            recurse
            and all(fn(t) is t for t in others)
            and all(t is None or t.dtype == self._site_dtype() for t in sites.values())
        ):
            return self
        if self.__dict__.get("_covariance_pending", False):
            self._materialise_covariance()
        if all(t is None for t in sites.values()):  # no sites (and no fold factors) held
            return super()._apply(fn, recurse)
        kept = self.__dict__.get("_kept_fold_factors")
        for name in _SITE_BUFFERS:
            self._buffers[name] = None
        try:
            super()._apply(fn, recurse)
        finally:
            where = dict(device=self._reference_tensor().device, dtype=self._site_dtype())
            moved = {n: None if t is None else t.to(**where) for n, t in sites.items()}
            self._buffers.update(moved)
            if kept is not None and kept[0] is sites["site_Q"]:
                factors = tuple(f.to(**where) for f in kept[1:])
                self.__dict__["_kept_fold_factors"] = (moved["site_Q"], *factors)
        return self

    def _site_dtype(self) -> torch.dtype:
        """The dtype the site statistics are held in (:func:`site_dtype` of the model's)."""
        return site_dtype(self._reference_tensor().dtype)

    def _held_buffer_dtype(self, name: str) -> torch.dtype | None:
        r"""The site statistics and their saved factors are held in :meth:`_site_dtype` (float64
        for a float32 model), so a load into a model that has none yet does not round them."""
        return self._site_dtype() if name in (*_SITE_BUFFERS, *_FOLD_FACTOR_BUFFERS) else None

    def _reference_tensor(self) -> Tensor:
        """A tensor in the model's dtype and on its device (the bases, or a parameter where a
        failed load left none)."""
        return self.beta_points if self.beta_points is not None else next(self.parameters())

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        r"""As :meth:`OnlineModel.load_state_dict`; a saved state without site statistics (not in
        fold mode) leaves this model without them too. A load that fails leaves the model as it
        was."""
        if self.__dict__.get("_covariance_pending", False):
            # Formed now: a pending formation would overwrite the loaded L and chol_H, and a
            # failed load restores a complete state.
            self._materialise_covariance()
        names = ("site_Q", "site_s", "collapsed_fit", "hyperparameters_fit_n")
        before = {name: self._buffers[name] for name in names}
        generator = self._generator.get_state()
        kept = self.__dict__.get("_kept_fold_factors")
        for name in names:
            if name not in state_dict:
                self._buffers[name] = None
        try:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        except Exception:
            self._buffers.update(before)
            self._generator.set_state(generator)
            self.__dict__["_kept_fold_factors"] = kept
            raise

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        # The saved-only buffers are loaded like any other (``OnlineModel`` gives each a tensor
        # to load into), then taken over and cleared; here, not in ``_after_load``, so that a
        # parent module's load takes them over too.
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        loaded = {name: self._buffers[name] for name in _SAVED_ONLY_BUFFERS}
        for name in _SAVED_ONLY_BUFFERS:
            self._buffers[name] = None
        if error_msgs:
            return
        # Continue the saved generator, and keep the saved fold factors for the loaded sites
        # where their shapes fit them (a mismatched set is dropped: refactorised on demand).
        if loaded["generator_state"] is not None:
            self._generator.set_state(loaded["generator_state"].to("cpu", torch.uint8))
        # Sites saved in the model's float32 (a state cast by hand, or saved before they were
        # held in float64) are held in site_dtype from here on, like every later fold.
        wd = self._site_dtype()
        for name in _SITE_BUFFERS:
            if self._buffers.get(name) is not None:
                self._buffers[name] = self._buffers[name].to(wd)
        factors = [
            None if f is None else f.to(wd) for f in (loaded[n] for n in _FOLD_FACTOR_BUFFERS)
        ]
        self.__dict__["_kept_fold_factors"] = None
        if self.site_Q is not None and all(f is not None for f in factors):
            mb, m = self.beta_points.shape[-2], self.site_Q.shape[-1]
            if [tuple(f.shape) for f in factors] == [(mb, mb), (m, m), (mb, mb)]:
                self.__dict__["_kept_fold_factors"] = (self.site_Q, *factors)
