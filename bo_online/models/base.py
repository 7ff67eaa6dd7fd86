r"""The contract every bo_online surrogate implements.

An :class:`OnlineModel` is a BoTorch ``Model`` (and ``FantasizeMixin``) whose state is a set of
sufficient statistics and caches that absorb new observations at a cost independent of how many
it already holds. Subclasses implement a handful of hooks; this class does everything the models
share:

* input validation before any state changes (NaN/inf, shapes, bounds, negative noise);
* outcome standardisation kept inside the model (``y_std = (y - outcome_mean) / outcome_std``,
  exactly BoTorch's ``Standardize`` in eval mode), undone in :meth:`posterior`;
* the posterior as a ``GPyTorchPosterior`` with observation noise and posterior transforms;
* ``condition_on_observations`` (new model, shared hyperparameter modules) and ``update``
  (in place, what loops call every step);
* one cache-invalidation mechanism: caches are tied to a snapshot of the hyperparameter values
  and rebuilt (through :meth:`_rebuild_caches`) whenever the values differ;
* ``state_dict`` / ``load_state_dict`` that carry the caches, including buffers that grow;
* ``custom_fit``, BoTorch's hook, so ``fit_gpytorch_mll`` and Ax call the model's own ``fit``.

Units: ``update(X, Y, noise)`` takes ``Y`` and ``noise`` (variances) in the user's units.
``condition_on_observations`` and ``posterior(..., observation_noise=<Tensor>)`` follow BoTorch's
convention for models with an outcome transform: ``Y`` in the user's units, a ``noise`` tensor in
the model's standardised units (``noise_user / outcome_std**2``), which is what ``fantasize``
passes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import types
import warnings
import weakref
from abc import ABC, abstractmethod
from typing import Any, Iterator, Mapping

import torch
from botorch import settings
from botorch.acquisition.objective import PosteriorTransform, ScalarizedPosteriorTransform
from botorch.models.model import FantasizeMixin, Model
from botorch.models.transforms.input import ChainedInputTransform
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.sampling.base import MCSampler
from gpytorch import settings as gpytorch_settings
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.models import GP
from gpytorch.utils.warnings import NumericalWarning
from linear_operator.operators import DenseLinearOperator, DiagLinearOperator, LinearOperator
from torch import Tensor
from typing_extensions import Self

from bo_online.models.fitting import remap_standardized, standardization, sum_log_priors
from bo_online.models.validation import (
    check_inputs,
    check_noise,
    check_observations,
    detached,
    floor_noise,
    train_noise_floor,
    warn_if_offset_hides_signal,
    warn_if_rounding_hides_new_targets,
)

__all__ = ["OnlineModel", "HeldDataMixin"]


class OnlineModel(Model, GP, FantasizeMixin, ABC):
    r"""Abstract online surrogate (single output; a subclass may hold ``m > 1`` independent
    outputs by setting ``_num_outputs`` and using the layout of :meth:`_to_internal`).

    It is also a GPyTorch ``GP`` (as BoTorch's own models are), so GPyTorch's marginal-likelihood
    wrappers accept it and ``fit_gpytorch_mll`` dispatches to :meth:`custom_fit`.

    Subclasses implement:

    * :meth:`_latent_posterior` -- the latent ``MultivariateNormal`` at transformed inputs, in
      standardised outcome units;
    * :meth:`_noise_variance` -- the observation-noise variance at inputs (standardised units);
    * :meth:`_condition` -- a new model holding the extra data (batched over fantasy samples);
    * :meth:`_update` -- the same, in place, for a single (non-batched) model;
    * :meth:`_rebuild_caches` -- recompute every hyperparameter-dependent cache;
    * :meth:`fit` -- refit hyperparameters from the model's own statistics.

    Args:
        dim: input dimension d.
        bounds: optional ``2 x d`` box the (transformed) inputs must lie in.
        input_transform: optional BoTorch ``InputTransform`` applied to every X. It must be
            fixed: one with trainable parameters (``Warp``) raises ``ValueError``.
        dtype: floating-point dtype of the model's buffers (a subclass passes its
            ``train_X.dtype``); default ``torch.float64``.
        device: device of the model's buffers (a subclass passes its ``train_X.device``).
        outcome_transform: ``None`` or ``Standardize(m=1)`` (the same: outcomes are
            standardised internally); any other outcome transform is refused.
    """

    _num_outputs: int = 1

    #: ``posterior`` evaluates query points outside ``input_bounds`` at the nearest point of the
    #: box instead of raising ``ValueError`` (off: a query outside the domain is a user's error).
    clamps_queries_to_bounds: bool = False

    def __init__(
        self,
        dim: int,
        bounds: Tensor | None = None,
        input_transform: Any | None = None,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
        outcome_transform: Any | None = None,
    ) -> None:
        super().__init__()
        self._hook_without_a_cycle()
        _check_outcome_transform(outcome_transform)
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}.")
        if not dtype.is_floating_point:
            raise ValueError(
                f"train_X must be floating point (it sets the model's dtype), got {dtype}; "
                "convert it with .double()."
            )
        self.dim = int(dim)
        if bounds is not None:
            bounds = torch.as_tensor(bounds, dtype=dtype, device=device)
            if bounds.shape != (2, self.dim):
                raise ValueError(
                    f"bounds must be 2 x {self.dim} (a lower and an upper row for the model's "
                    f"{self.dim} inputs), got shape {tuple(bounds.shape)}."
                )
            if not bool(torch.isfinite(bounds).all()) or not bool((bounds[1] > bounds[0]).all()):
                raise ValueError(
                    f"bounds need finite lower < upper in every column, got {bounds.tolist()}."
                )
        self.register_buffer("input_bounds", bounds)
        self.register_buffer("outcome_mean", torch.zeros(1, dtype=dtype, device=device))
        self.register_buffer("outcome_std", torch.ones(1, dtype=dtype, device=device))
        if input_transform is not None:
            _check_fixed_transform(input_transform)
            self.input_transform = input_transform
        self._batch_shape = torch.Size()
        self._cache_key: list[Tensor] | None = None

    def _apply(self, fn: Any, recurse: bool = True) -> Self:
        r"""``Module._apply``, skipped when ``fn`` returns every parameter and buffer unchanged.

        BoTorch's analytic acquisition functions call ``self.to(X)`` on every evaluation, and
        ``Module._apply`` walks and re-registers every submodule even when nothing moves: for
        WISKI's additive model (about 100 modules) about 0.7 ms of each acquisition evaluation.
        ``Tensor.to`` returns the tensor itself when it is already on the device and dtype, so
        ``fn(t) is t`` for all of them means the walk would change nothing. (An in-place ``fn``,
        such as ``share_memory_``, has then been applied to each of them here.) This assumes,
        as holds for every module the surrogates hold, that no submodule's own ``_apply``
        converts tensors that are not parameters, gradients or buffers."""
        if recurse and all(fn(t) is t for t in self._tensors_apply_converts()):
            return self
        before = self.outcome_mean.dtype
        self._stop_sharing_modules()
        self._before_apply()
        super()._apply(fn, recurse)
        self._after_apply()
        if self.outcome_mean.dtype != before:
            # In a new dtype the caches are rebuilt in it. Converted, a float32 model's caches
            # made float64 kept their float32 rounding (a factor updated point by point in
            # float32 drifts from the statistics, and float64 factors are never refactored) as
            # valid, the hyperparameters being unchanged. (Made float32, the cache key, of the
            # float64 values, already failed to match the rounded hyperparameters but where
            # they are exact in float32.)
            self.invalidate_caches()
        return self

    def _stop_sharing_modules(self) -> None:
        r"""Before a conversion: take copies of the hyperparameter modules (and the model's own
        parameters) that this model shares with other live models (the models conditioned on
        it, or the one it was conditioned on), so that converting it converts no other model.
        ``Module._apply`` converts parameters in place and walks every submodule: a fantasy
        model's ``.to(float32)`` made its parent's hyperparameters float32 (the parent then
        failed, or predicted with rounded values). The models stop sharing: a later refit of
        one no longer moves the other's hyperparameters."""
        sharers = self.__dict__.get("_module_sharers")
        self.__dict__["_module_sharers"] = None
        if sharers is None:
            return
        sharers.discard(self)
        if not sharers:
            return
        memo: dict[int, Any] = {}  # one memo: modules referring to each other stay so
        self._modules = {k: copy.deepcopy(v, memo) for k, v in self._modules.items()}
        self._parameters = {k: copy.deepcopy(v, memo) for k, v in self._parameters.items()}

    def _before_apply(self) -> None:
        r"""Hook: fold caches held outside buffers into buffers before a conversion (``.to``,
        ``.double()``, ...) actually moves them."""

    def _after_apply(self) -> None:
        r"""Hook: drop caches held outside buffers after a conversion (they would keep the old
        dtype or device; they are rebuilt from the converted buffers on demand)."""

    def _tensors_apply_converts(self) -> Iterator[Tensor]:
        """Every parameter, its gradient if any, and every buffer: what ``Module._apply``
        passes to its ``fn``."""
        for p in self.parameters():
            yield p
            if p.grad is not None:
                yield p.grad
        yield from self.buffers()

    @staticmethod
    def transformed_dim(train_X: Tensor, input_transform: Any | None) -> int:
        r"""The input dimension d a model works in: the width of ``train_X`` (``n x d_raw``) after
        ``input_transform``, which may add or drop columns (BoTorch's ``InteractionFeatures``,
        ``FilterFeatures``). Kernels, bounds and input checks all see transformed inputs, so
        constructors pass this, not ``train_X.shape[-1]``, as ``dim``. The transform runs on a copy,
        so one that learns from what it sees (``Normalize`` with learned bounds) is left as it was.
        """
        if input_transform is None:
            return int(train_X.shape[-1])
        with torch.no_grad():
            return int(copy.deepcopy(input_transform)(train_X).shape[-1])

    # ------------------------------------------------------------------ properties BoTorch reads

    @property
    def num_outputs(self) -> int:
        return self._num_outputs

    @property
    def batch_shape(self) -> torch.Size:
        r"""Batch shape of the model: ``sample_shape x X-batch`` for fantasy models, else ``[]``."""
        return self._batch_shape

    def forward(self, X: Tensor) -> MultivariateNormal:
        r"""Not a GPyTorch training path: ``model(X)`` with a hand-written marginal-likelihood
        loop raised a bare ``NotImplementedError``. Say what to use instead."""
        raise NotImplementedError(
            f"{type(self).__name__} is not trained or queried through model(X): use "
            "model.posterior(X) for predictions (latent by default, observation_noise=True for "
            "new observations) and model.fit() to fit its hyperparameters (botorch's "
            "fit_gpytorch_mll(mll) dispatches to it)."
        )

    def subset_output(self, idcs: list[int]) -> Self:
        r"""The model of outputs ``idcs``: of a single-output model, its only output (``[0]`` or
        ``[-1]``) is a copy of the model, as ``SingleTaskGP.subset_output([0])`` is. Other
        subsets (of a multi-output t-SVGP) are not supported: build a model of those outputs."""
        if self.num_outputs == 1 and list(idcs) in ([0], [-1]):
            return copy.deepcopy(self)
        raise NotImplementedError(
            f"{type(self).__name__} with {self.num_outputs} output(s) cannot be subset to outputs "
            f"{list(idcs)}; build a model on those outputs' data instead."
        )

    @property
    def _dtype_device(self) -> dict[str, Any]:
        return {"dtype": self.outcome_mean.dtype, "device": self.outcome_mean.device}

    # ------------------------------------------------------------------ hooks for subclasses

    @abstractmethod
    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        r"""Latent posterior of f at ``X`` (``batch x q x d``, transformed, validated), standardised
        units; batch shape is ``broadcast(X batch, model batch)``. Covariance may be lazy."""

    @abstractmethod
    def _noise_variance(self, X: Tensor) -> Tensor:
        r"""Observation-noise variance at ``X`` (``batch x q x d``) in standardised units,
        broadcastable to ``batch x q``."""

    @abstractmethod
    def _condition(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> Self:
        r"""New model with ``(X, Y, noise)`` added. ``X``: ``batch x q x d``; ``Y``:
        ``sample x batch x q`` (standardised); ``noise``: broadcastable to ``Y`` or None."""

    @abstractmethod
    def _update(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        r"""Add ``X`` (``q x d``), ``Y`` (``q``, standardised), ``noise`` (``q`` or None) in place.
        Must not leave the model half-updated if it raises."""

    @abstractmethod
    def _rebuild_caches(self) -> None:
        """Recompute every cache that depends on hyperparameters (called by ``ensure_caches``)."""

    @abstractmethod
    def fit(self, **kwargs: Any) -> Self:
        """Refit hyperparameters from the model's sufficient statistics (warm-started)."""

    def fit_state_to_hyperparameters(self) -> None:
        r"""Hook: after the hyperparameters were set from another model (Ax's cross-validation
        folds load the fitted model's), set whatever else a ``fit`` leaves for them -- a
        variational posterior, a fitted constant mean -- to its value for these hyperparameters
        on the data held, without moving them. Default: nothing, as every other state is a
        cache rebuilt from the hyperparameters (:meth:`ensure_caches`)."""

    def _noise_of_points(self, X: Tensor, noise: Tensor | None) -> Tensor:
        r"""Per-point noise variances (standardised, ``batch x q``) of new points ``X``
        (``batch x q x d``): ``noise`` if given, else the likelihood's homoscedastic noise.

        A model built with known per-point noise (``fixed_noise``) has no noise of its own to
        fall back on, so new points must bring theirs."""
        if noise is not None:
            return noise
        if getattr(self, "fixed_noise", False):
            raise ValueError(
                f"This {type(self).__name__} has fixed per-point noise: pass `noise` (variances) "
                "with every new observation."
            )
        return self.likelihood.noise.squeeze(-1).expand(X.shape[:-1])

    def _default_fantasy_noise(self) -> Tensor | None:
        r"""Noise for ``fantasize`` when none is given (standardised, ``batch x 1 x 1``); None
        means the likelihood's own noise. Fixed-noise models return each batch's mean training
        noise, as BoTorch."""
        return None

    def hyperparameters(self) -> Iterator[Tensor]:
        """Tensors whose values the caches depend on; by default every parameter."""
        return self.parameters()

    def log_prior(self) -> Tensor:
        """Sum of the log densities of every GPyTorch prior on the hyperparameter modules (as
        GPyTorch's marginal likelihoods add them)."""
        return sum_log_priors([self], self.outcome_mean)

    # ------------------------------------------------------------------ the cache mechanism

    def _current_key(self) -> list[Tensor]:
        return [p.detach().clone() for p in self.hyperparameters()]

    def _caches_valid(self) -> bool:
        key = self._cache_key
        if key is None:
            return False
        params = list(self.hyperparameters())
        return len(params) == len(key) and all(
            p.shape == k.shape and torch.equal(p.detach(), k) for p, k in zip(params, key)
        )

    def ensure_caches(self) -> None:
        """Rebuild the caches if any hyperparameter changed since they were built."""
        if not self._caches_valid():
            with torch.no_grad():
                self._rebuild_caches()
            self._cache_key = self._current_key()

    def invalidate_caches(self) -> None:
        """Force a rebuild at the next use (e.g. after editing statistics by hand)."""
        self._cache_key = None

    # ------------------------------------------------------------------ input transforms

    def _set_transformed_inputs(self) -> None:
        r"""No-op: training inputs are transformed once, when they arrive, and stored transformed.

        BoTorch's ``Model.eval()`` would otherwise re-transform ``train_inputs`` through
        ``set_train_data`` (a GPyTorch ``ExactGP`` method these models do not have)."""

    def _revert_to_original_inputs(self) -> None:
        r"""No-op counterpart of :meth:`_set_transformed_inputs` (called by ``Model.train()``)."""

    @property
    def _has_transformed_inputs(self) -> bool:
        r"""BoTorch's flag that ``train_inputs`` are transformed: they are whenever the model has
        an input transform (they are held as they arrive, transformed), in either mode. BoTorch's
        ``get_X_baseline`` (``optimize_acqf``'s ``sample_around_best``, the spray points of
        ``optimize_acqf_mixed_alternating``) then reads :attr:`_original_train_inputs`."""
        return getattr(self, "input_transform", None) is not None

    @property
    def _original_train_inputs(self) -> Tensor | None:
        r"""``train_inputs[0]`` (``batch x n x d_raw``) in the user's input space, as BoTorch's
        models keep it while their ``train_inputs`` are transformed; None without an input
        transform (``train_inputs`` are the originals then). The held inputs are mapped back
        through the transform's ``untransform``, for each part of it that transformed the
        training data (``transform_on_train``).

        Raises:
            AttributeError: the model holds no ``train_inputs`` (WISKI), or the transform is not
                invertible (``FilterFeatures``, ``InteractionFeatures``): BoTorch then uses no
                training points rather than transformed ones taken as originals.
        """
        transform = getattr(self, "input_transform", None)
        if transform is None:
            return None
        X = self.train_inputs[0]
        try:
            return _untransform_training_inputs(transform, X)
        except NotImplementedError as e:
            raise AttributeError(
                f"The original training inputs cannot be recovered: {type(transform).__name__} "
                f"is not invertible ({e})"
            ) from e

    # ------------------------------------------------------------------ outcome scaling

    def _set_outcome_scaling(self, train_Y: Tensor, like: Tensor) -> None:
        r"""Outcome scaling from the initial targets ``train_Y`` (``n x m``), as BoTorch's
        ``Standardize``: ``outcome_mean`` and ``outcome_std`` of shape ``(m,)``, on ``like``'s
        dtype and device. Integer targets (counts) are taken as numbers of ``like``'s dtype, as
        ``update`` takes them."""
        if not train_Y.is_floating_point():
            train_Y = train_Y.to(like)
        mean, std = standardization(train_Y.transpose(-1, -2))
        warn_if_offset_hides_signal(train_Y, like.dtype)
        self.outcome_mean, self.outcome_std = mean.to(like), std.to(like)

    def _change_outcome_scaling(self, mean: Tensor, std: Tensor) -> None:
        r"""Move to the outcome scaling ``mean``, ``std`` (``(m,)``, as :func:`standardization`
        returns them): re-standardisation before a refit.

        Sets ``outcome_mean`` and ``outcome_std``, then lets :meth:`_rescale_to_outcome_scaling`
        re-express what the model stores in standardised units (held targets and noise keep
        their values in the user's units; which hyperparameters or variational parameters follow
        is each family's choice), and invalidates the caches.
        """
        old_mean, old_std = self.outcome_mean, self.outcome_std
        ratio = old_std / std
        self.outcome_mean, self.outcome_std = mean, std
        self._rescale_to_outcome_scaling(old_mean, old_std, ratio)
        self.invalidate_caches()

    def _rescale_to_outcome_scaling(self, old_mean: Tensor, old_std: Tensor, ratio: Tensor) -> None:
        r"""Hook of :meth:`_change_outcome_scaling`: bring what the model stores in standardised
        units from the old scaling (``old_mean``, ``old_std``: ``(m,)``) to the one just set.
        ``ratio = old_std / outcome_std`` (``(m,)``) is the factor on standardised deviations
        (targets' deviations, latent values), ``ratio**2`` the one on variances; values with a
        level (targets, a constant mean) map through :func:`remap_standardized`. Default: no
        state in standardised units."""

    def _standardize(self, Y: Tensor) -> Tensor:
        return (Y - self.outcome_mean) / self.outcome_std

    def _unstandardize_mvn(
        self, mvn: MultivariateNormal, output_indices: list[int] | None = None
    ) -> MultivariateNormal:
        r"""Back to the user's units. For ``m > 1`` outputs the internal ``batch x m x q`` MVN
        (independent outputs as a batch dimension) becomes a ``MultitaskMultivariateNormal``
        (``batch x q x m``) over ``output_indices`` (a plain MVN if only one is asked for)."""
        if self.num_outputs == 1:
            mean = mvn.mean * self.outcome_std + self.outcome_mean
            scale = self.outcome_std.pow(2).squeeze()
            covar = _dense_or_lazy(mvn) * scale
            return UnitsMultivariateNormal(mean, _as_operator(covar), variance_scale=scale)
        idx = list(range(self.num_outputs)) if output_indices is None else list(output_indices)
        mean, covar = mvn.mean, _as_operator(mvn.lazy_covariance_matrix)
        if idx != list(range(self.num_outputs)):
            mean, covar = mean[..., idx, :], _as_operator(covar.to_dense()[..., idx, :, :])
        std, mu = self.outcome_std[idx], self.outcome_mean[idx]
        mean = mean * std.unsqueeze(-1) + mu.unsqueeze(-1)
        covar = covar * std.pow(2).unsqueeze(-1).unsqueeze(-1)
        if len(idx) == 1:
            return UnitsMultivariateNormal(
                mean.squeeze(-2), covar.squeeze(-3), variance_scale=std.pow(2).squeeze()
            )
        mtmvn = UnitsMultitaskMultivariateNormal.from_batch_mvn(
            MultivariateNormal(mean, covar), task_dim=-1
        )
        mtmvn.variance_scale = std.pow(2)
        return mtmvn

    def _to_internal(self, Y: Tensor) -> Tensor:
        r"""``... x q x m`` (BoTorch's layout) -> the subclass's layout: ``... x q`` for one
        output, ``... x m x q`` (outputs as a batch dimension) for ``m > 1``."""
        return Y.squeeze(-1) if self.num_outputs == 1 else Y.transpose(-1, -2)

    # ------------------------------------------------------------------ the BoTorch API

    def _transform_and_check(
        self, X: Tensor, new_observations: bool = False, clamp_to_bounds: bool = False
    ) -> Tensor:
        r"""``X`` (``... x d`` raw inputs) validated, cast to the model's dtype and device and
        through the input transform: ``... x d'`` transformed inputs.

        ``new_observations``: ``X`` are points to add to the training data (``update``,
        ``condition_on_observations``). They go through the transform as training data without
        learning from them (BoTorch's ``preprocess_transform``): a transform that learns its
        coefficients (``Normalize`` without bounds) learns them from the data at construction
        only, whatever mode the model is in.
        ``clamp_to_bounds``: query points outside ``input_bounds`` are moved onto the box
        instead of refused (see :attr:`clamps_queries_to_bounds`).
        """
        check_inputs(X, dim=self.dim if not hasattr(self, "input_transform") else X.shape[-1])
        # Cast to the model's dtype/device as BoTorch models do (float32 or int64 inputs into a
        # float64 model), before any arithmetic with the model's tensors.
        if X.dtype != self.outcome_mean.dtype or X.device != self.outcome_mean.device:
            X = X.to(**self._dtype_device)
        transform = getattr(self, "input_transform", None)
        if new_observations and transform is not None:
            X = transform.to(X).preprocess_transform(X)
        else:
            if transform is not None and transform.training and not self.training:
                # The transform may be in training mode while this model is not (queries: see
                # ``posterior``): it is shared with the models conditioned on this one, and
                # ``child.train()`` reaches it. A ``Normalize`` that learns its bounds then
                # learned them again from the query points, silently changing this model.
                transform.eval()
            X = self.transform_inputs(X)
        if clamp_to_bounds and self.input_bounds is not None:
            X = X.clamp(self.input_bounds[0].to(X), self.input_bounds[1].to(X))
        check_inputs(X, dim=self.dim, bounds=self.input_bounds)
        self._check_batch_broadcasts(X.shape[:-2], "X")
        return X

    def _check_batch_broadcasts(self, batch: torch.Size, name: str) -> None:
        r"""Raise ``ValueError`` unless the batch shape ``batch`` of ``name`` (``X``: ``batch x q x
        d``, ``Y``: ``batch x q x m``) broadcasts with this model's :attr:`batch_shape`."""
        try:
            torch.broadcast_shapes(batch, self.batch_shape)
        except RuntimeError:
            raise ValueError(
                f"{name} has batch shape {tuple(batch)}, which does not broadcast with this "
                f"batched model's {tuple(self.batch_shape)} (a fantasy or conditioned model): give "
                f"{name} batch dims that do (e.g. {' x '.join(map(str, self.batch_shape))} x q x "
                "..., or none)."
            ) from None

    def _checked_training_data(
        self, train_X: Tensor, train_Y: Tensor, train_Yvar: Tensor | None
    ) -> Tensor:
        r"""Validate a single-output model's initial data (``n x d``, ``n x 1``, optional
        ``n x 1`` noise; n >= 1) and return the transformed inputs ``n x d``."""
        if isinstance(train_X, Tensor) and not train_X.dtype.is_floating_point:
            raise ValueError(
                f"train_X must be floating point (it sets the model's dtype), got {train_X.dtype}; "
                "convert it with .double()."
            )
        X = self._transform_and_check(train_X)
        check_observations(X, train_Y, train_Yvar, dim=self.dim, bounds=self.input_bounds)
        if train_Y.dim() != 2 or X.shape[0] < 1:
            raise ValueError("train_Y must be n x 1 with n >= 1.")
        return X

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
        **kwargs: Any,
    ) -> GPyTorchPosterior:
        r"""Posterior at ``X`` (``batch x q x d``) in the user's outcome units.

        Args:
            X: ``batch x q x d`` inputs (a ``q x d`` tensor is a single batch).
            output_indices: outputs to return (None = all; ``m = 1``: only ``[0]``).
            observation_noise: False (latent f), True (add the likelihood's noise), or a tensor
                ``batch x q x 1`` of noise variances in standardised units (BoTorch convention).
            posterior_transform: optional BoTorch posterior transform applied last.
        """
        m = self.num_outputs
        if output_indices is not None and (
            len(output_indices) == 0 or any(not 0 <= int(i) < m for i in output_indices)
        ):
            raise ValueError(f"output_indices must be a non-empty list of indices in [0, {m}).")
        if self.training:  # Module.eval() walks every submodule: only when needed
            self.eval()
        X = self._transform_and_check(X, clamp_to_bounds=self.clamps_queries_to_bounds)
        if X.shape[-2] == 0 or torch.broadcast_shapes(X.shape[:-2], self.batch_shape).numel() == 0:
            # no points (q = 0 or an empty batch): an empty posterior, without touching the model
            return self._empty_posterior(X, output_indices, posterior_transform)
        self.ensure_caches()
        mvn = self._latent_posterior(X)
        if observation_noise is not False:
            if isinstance(observation_noise, Tensor):
                # Per model batch too (a fantasy model's, e.g. its mean noise in fantasize).
                batch = torch.broadcast_shapes(X.shape[:-2], self.batch_shape)
                shape = batch + X.shape[-2:-1] + torch.Size([m])
                check_noise(observation_noise, shape, posterior=True)
                noise = self._to_internal(floor_noise(observation_noise.to(X)).expand(shape))
            else:
                noise = self._noise_variance(X)
            noise = noise.expand(mvn.mean.shape)
            covar = _dense_or_lazy(mvn)
            if isinstance(covar, Tensor):  # small dense covariance: add the noise densely
                covar = covar + torch.diag_embed(noise)
            else:
                covar = _as_operator(covar) + DiagLinearOperator(noise)
            mvn = MultivariateNormal(mvn.mean, _as_operator(covar))
        mvn = self._unstandardize_mvn(mvn, output_indices)
        posterior = GPyTorchPosterior(mvn)
        if posterior_transform is not None:
            return _scalarized_in_units(posterior_transform, posterior)
        return posterior

    def _empty_posterior(
        self, X: Tensor, output_indices: list[int] | None, posterior_transform: Any
    ) -> GPyTorchPosterior:
        r"""The posterior at no points, ``X``: ``batch x q x d`` with ``q = 0`` or an empty
        (broadcast) batch: a ``batch x q`` mean (``batch x q x m`` for m > 1) with no elements,
        differentiable in ``X`` (a zero gradient), as BoTorch's models answer."""
        batch = torch.broadcast_shapes(X.shape[:-2], self.batch_shape)
        m = self.num_outputs if output_indices is None else len(output_indices)
        shape = batch + ((m,) if m > 1 else ())
        q = X.shape[-2]
        zero = X.sum() * 0  # a 0-d zero tied to X (X has no elements)
        mvn = MultivariateNormal(
            zero.expand(*shape, q), DenseLinearOperator(zero.expand(*shape, q, q))
        )
        if m > 1:
            mvn = MultitaskMultivariateNormal.from_batch_mvn(mvn, task_dim=-1)
        posterior = GPyTorchPosterior(mvn)
        return posterior if posterior_transform is None else posterior_transform(posterior)

    def _floor_train_Yvar(self, train_Y: Tensor, train_Yvar: Tensor | None) -> Tensor | None:
        r"""Initial fixed-noise variances (user units) raised to the noise floor (see
        :data:`bo_online.models.validation.NOISE_FLOOR`), with a warning if any were below;
        a variance that broadcasts (e.g. ``1 x 1``) is given to every point (``n x 1``)."""
        if train_Yvar is None:
            return None
        train_Yvar = train_Yvar.to(train_Y).expand(train_Y.shape).clone()
        return floor_noise(train_Yvar, train_noise_floor(train_Y.to(train_Yvar)), "standardised")

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> Self:
        r"""A new model that also holds ``(X, Y)``; this model is untouched.

        Args:
            X: ``batch x q x d`` inputs.
            Y: ``sample x batch x q x 1`` observations in the user's units (fantasies carry the
                leading sample dims).
            noise: optional noise variances broadcastable to ``Y``, standardised units (BoTorch's
                convention for models with an outcome transform).

        Returns:
            A model of the same class with batch shape ``broadcast(sample x batch, self.batch)``,
            sharing this model's hyperparameter modules. Cost independent of n where the model
            allows it.
        """
        X = self._transform_and_check(X, new_observations=True)
        check_observations(
            X, Y, noise, dim=self.dim, num_outputs=self.num_outputs, bounds=self.input_bounds
        )
        self._check_batch_broadcasts(Y.shape[:-2], "Y")
        warn_if_rounding_hides_new_targets(Y, X.dtype, self.outcome_std)
        self.ensure_caches()
        # Conditioned on data that need no gradient (new observations, an Ax trial), the child's
        # caches hold no graph at all: one to the hyperparameters made a second backward through
        # the child fail, deepcopy refuse it, and a chain of conditionings (an Ax experiment's
        # trials) grow it until the next fit. Where X / noise need gradients (qKG differentiates
        # fantasies in X) the graph is kept, hyperparameters included, as before. Y's own graph
        # counts only under BoTorch's ``propagate_grads``, as GPyTorch's test caches: otherwise it
        # is the graph of values drawn from this model's posterior (``fantasize`` at X without a
        # gradient, a Kriging believer's posterior mean) to the hyperparameters, not data to
        # differentiate, and keeping it made a second backward through the child fail.
        wanted = any(t is not None and t.requires_grad for t in (X, noise)) or (
            Y.requires_grad and settings.propagate_grads.on()
        )
        with torch.set_grad_enabled(torch.is_grad_enabled() and wanted):
            Ys = self._to_internal(self._standardize(Y.to(X)))
            if noise is not None:
                noise = self._to_internal(floor_noise(noise.to(X)).expand(Y.shape))
                X = self._expand_to_varying_noise(X, noise)
            return self._condition(X, Ys, noise)

    def _expand_to_varying_noise(self, X: Tensor, noise: Tensor) -> Tensor:
        r"""``X`` (``batch x q x d``) expanded to the batch dims of ``noise`` (internal layout,
        ``lead x batch' x q``, or ``lead x batch' x m x q``) that it lacks or has as size 1,
        where the noise differs along them.

        ``_condition`` builds the Y-independent factors once over ``X``'s batch and takes the
        noise along other dims (fantasy samples; the batch of a conditioned model) to be the
        same for all, using the first. Noise that differs along them (each fantasy sample, or
        each candidate set of a conditioned model, its own) needs a factor per element: ``X``
        carrying those dims gives it one."""
        tail = 1 if self.num_outputs == 1 else 2
        batch = torch.broadcast_shapes(noise.shape[:-tail], X.shape[:-2])
        # both batches right-aligned to `batch`: narrow the noise to its first element along
        # every dim X lacks or has as size 1
        noise = noise.reshape(*(1,) * (len(batch) + tail - noise.dim()), *noise.shape)
        x_batch = (1,) * (len(batch) + 2 - X.dim()) + tuple(X.shape[:-2])
        first = noise
        for i, (nx, nn) in enumerate(zip(x_batch, noise.shape)):
            if nx == 1 and nn > 1:
                first = first.narrow(i, 0, 1)
        if first.shape == noise.shape or bool((noise == first).all()):
            return X  # the same for every element: one factor, shared
        return X.expand(*batch, *X.shape[-2:])

    def update(self, X: Tensor, Y: Tensor, noise: Tensor | None = None) -> Self:
        r"""Fold ``q`` new observations into this model in place and return it.

        Args:
            X: ``q x d`` inputs (untransformed, in the model's domain).
            Y: ``q x m`` (or ``q`` for one output) observations, user's units.
            noise: optional ``q x m`` (or ``q``) observation-noise variances, user's units.
        """
        X, Y, noise = detached(X, Y, noise)  # data: no graph to keep (standardised below)
        X, Y, noise = self._checked_observations(X, Y, noise, "update()")
        if X.shape[-2] == 0:  # nothing to fold in (every surrogate treats it alike)
            return self
        self.ensure_caches()
        Ys = self._to_internal(self._standardize(Y.to(X)))
        noise_s = self._standardized_noise(noise, X, Y.shape)
        # In place: caches must not carry an autograd graph (hyperparameters -> factor), which
        # every later update would extend, keeping all previous caches alive.
        with torch.no_grad():
            self._update(X, Ys, noise_s)
        return self

    def _checked_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None, caller: str
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        r"""Validate new observations for an in-place addition to a single (non-batched) model.

        Args:
            X: ``q x d`` inputs (untransformed, in the model's domain).
            Y: ``q x m`` (or ``q`` for one output) observations, user's units.
            noise: optional ``q x m`` (or ``q``) noise variances, user's units.
            caller: the public method's name, for the error messages (e.g. ``"update()"``).

        Returns:
            ``(X, Y, noise)``: ``X`` transformed and cast to the model's dtype (``q x d``), ``Y``
            and ``noise`` made 2-D (``q x m``, on their own dtype). Raises ``ValueError`` on a
            batched model or bad data, before any state changes.
        """
        if self.batch_shape != torch.Size():
            raise ValueError(
                f"{caller} is for a single model; fantasy/batched models are read-only."
            )
        if isinstance(Y, Tensor) and Y.dim() == 1:
            Y = Y.unsqueeze(-1)
        if isinstance(noise, Tensor) and noise.dim() == 1:
            noise = noise.unsqueeze(-1)
        if isinstance(noise, Tensor) and noise.dim() == 0 and isinstance(Y, Tensor):
            noise = noise.expand(Y.shape)  # one variance for every new observation
        if isinstance(X, Tensor) and X.dim() != 2:
            raise ValueError(f"{caller} takes X of shape q x {self.dim}, got {tuple(X.shape)}.")
        X = self._transform_and_check(X, new_observations=True)
        check_observations(
            X, Y, noise, dim=self.dim, num_outputs=self.num_outputs, bounds=self.input_bounds
        )
        warn_if_rounding_hides_new_targets(Y, X.dtype, self.outcome_std)
        if Y.dim() != 2 or (noise is not None and noise.dim() != 2):
            raise ValueError(
                f"{caller} takes Y and noise of shape q x m (no batch dimensions), got Y "
                f"{tuple(Y.shape)}"
                + ("" if noise is None else f" and noise {tuple(noise.shape)}")
                + "."
            )
        return X, Y, noise

    def _standardized_noise(
        self, noise: Tensor | None, like: Tensor, shape: torch.Size
    ) -> Tensor | None:
        r"""New points' noise variances in standardised units and the internal layout.

        Args:
            noise: ``q x m`` variances in the user's units (broadcastable to ``shape``), or None.
            like: a tensor whose dtype and device the result takes (the transformed inputs).
            shape: ``q x m``, the shape of the new observations ``Y``.

        Returns:
            ``noise / outcome_std^2`` with values below the noise floor raised to it (see
            :func:`~bo_online.models.validation.floor_noise`), in :meth:`_to_internal`'s layout
            (``q`` for one output, ``m x q`` otherwise); None if ``noise`` is None.
        """
        if noise is None:
            return None
        return self._to_internal(
            floor_noise(noise.to(like) / self.outcome_std.pow(2)).expand(shape)
        )

    def fantasize(
        self,
        X: Tensor,
        sampler: MCSampler,
        observation_noise: Tensor | None = None,
        **kwargs: Any,
    ) -> Self:
        r"""BoTorch's fantasize (sample at X, condition on the samples). Y-independent parts of
        the conditioning (covariance caches) are computed once and shared across samples by each
        model's :meth:`_condition`."""
        if observation_noise is None:
            observation_noise = self._default_fantasy_noise()
        return super().fantasize(X, sampler, observation_noise=observation_noise, **kwargs)

    def custom_fit(self, mll: Any = None, **kwargs: Any) -> Any:
        """BoTorch's hook: ``fit_gpytorch_mll(mll)`` ends up here and runs :meth:`fit`."""
        fit_kwargs = {k: v for k, v in kwargs.items() if k in self._fit_kwarg_names()}
        self.fit(**fit_kwargs)
        if mll is not None:
            mll.eval()
        return mll

    #: The dataclass of this model's fit settings (a subclass of
    #: :class:`bo_online.models.fitting.OptimizerSettings`); ``fit(settings=None, **overrides)``
    #: takes an instance or its field names as keywords. ``None``: ``fit``'s own keywords.
    fit_settings_class: type | None = None

    def _fit_kwarg_names(self) -> set[str]:
        if self.fit_settings_class is not None:
            names = {f.name for f in dataclasses.fields(self.fit_settings_class)}
            return names | {"settings"}
        return set(inspect.signature(self.fit).parameters)

    # ------------------------------------------------------------------ copying and state

    def _shallow_copy(self) -> Self:
        r"""A new module object sharing every tensor and submodule with this one.

        Subclasses then replace the buffers that change. Hyperparameter modules (kernel,
        likelihood, mean) stay shared, as the contract requires; no data-sized tensor is copied.
        """
        new = copy.copy(self)
        new._parameters = dict(self._parameters)
        new._buffers = dict(self._buffers)
        new._modules = dict(self._modules)
        new._non_persistent_buffers_set = set(self._non_persistent_buffers_set)
        new._hooks_rebound_from(self)
        sharers = self.__dict__.get("_module_sharers")
        if sharers is None or self not in sharers:
            sharers = _ModuleSharers([self])
            self.__dict__["_module_sharers"] = sharers
        sharers.add(new)
        new.__dict__["_module_sharers"] = sharers
        return new

    def __setstate__(self, state: dict[str, Any]) -> None:
        r"""As ``Module.__setstate__`` (a deep copy or an unpickled model); the model then joins
        its (copied) set of sharers, so that models copied together, which share their modules
        in the copy, still take copies of them before a conversion (see
        :meth:`_stop_sharing_modules`)."""
        super().__setstate__(state)
        sharers = self.__dict__.get("_module_sharers")
        if sharers is not None:
            sharers.add(self)

    def _hook_without_a_cycle(self) -> None:
        r"""GPyTorch registers its ``load_state_dict`` pre-hook as a method bound to the module,
        a reference cycle: a model dropped (Ax builds one every trial) then waits, with all its
        caches, for Python's cyclic garbage collection, which counts objects, not bytes, and
        seldom runs in a long session. The same hook, held by torch with a weak reference to
        the module instead, lets reference counting free the model at once."""
        hooks = self._load_state_dict_pre_hooks
        for key, hook in list(hooks.items()):
            fn = getattr(hook, "hook", None)
            if isinstance(fn, types.MethodType) and fn.__self__ is self:
                del hooks[key]
                self.register_load_state_dict_pre_hook(fn.__func__)

    def _hooks_rebound_from(self, source: torch.nn.Module) -> None:
        r"""Give this module, a copy of ``source``'s ``__dict__``, hook dicts of its own whose
        hooks bound to ``source`` are bound to this module instead. A copy sharing them (GPyTorch
        registers its ``load_state_dict`` pre-hook as a bound method) kept ``source``, with all
        its caches, alive as long as the copy lived, and ran ``source``'s hook for the copy."""
        for name, hooks in list(vars(source).items()):
            if name.endswith("_hooks") and isinstance(hooks, dict):
                self.__dict__[name] = type(hooks)(
                    (key, _rebound(hook, source, self)) for key, hook in hooks.items()
                )

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The state including fresh caches, so ``load_state_dict`` restores the model exactly."""
        if self.batch_shape == torch.Size():
            self.ensure_caches()
        return super().state_dict(*args, **kwargs)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        r"""Load a state, resizing buffers that grew (data, factors) to the saved shapes.

        The loaded caches are trusted to match the loaded hyperparameters (``state_dict`` always
        saves fresh caches), so no refactorisation happens here. A partial state (keys missing,
        ``strict=False``: say only some hyperparameters) carries no caches for what it changed,
        so the caches are rebuilt at the next use, as after setting those values directly. A
        state that does not fit raises torch's ``RuntimeError`` and leaves the model as it was.
        """
        # Restored if loading fails (torch copies what matches before reporting what does not).
        saved_buffers = [(module, dict(module._buffers)) for module in self.modules()]
        saved_params = [(p, p.detach().clone()) for p in self.parameters()]
        like = self._floating_tensor()
        try:
            for name, value in state_dict.items():
                module, _, leaf = self._locate(name)
                if module is not None and leaf in module._buffers:
                    # Always a fresh buffer (not only when it grew): models made by
                    # condition_on_observations share this model's buffers, and loading into
                    # them in place would silently change those models too.
                    module._buffers[leaf] = _fresh_buffer(
                        module._buffers[leaf], value, like, _held_dtype(module, leaf)
                    )
            if strict:
                # torch's state_dict leaves out None buffers (a cache or pending conditioning
                # the saved model did not have): clear them, so that an earlier state loads into
                # a model that has them since.
                for prefix, module in self.named_modules():
                    for leaf, buf in module._buffers.items():
                        key = f"{prefix}.{leaf}" if prefix else leaf
                        if (
                            buf is not None
                            and key not in state_dict
                            and leaf not in module._non_persistent_buffers_set
                        ):
                            module._buffers[leaf] = None
            result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        except Exception:
            for module, buffers in saved_buffers:
                module._buffers.clear()
                module._buffers.update(buffers)
            with torch.no_grad():
                for p, value in saved_params:
                    p.copy_(value)
            raise
        self._after_load()
        # A complete state brought its own caches; a partial one left this model's, which were
        # built for the hyperparameters it had before (and may not hold the ones it loaded).
        # Caches saved in a less precise dtype than this model's (a float32 model's state
        # loaded into a float64 model) hold that dtype's rounding: rebuilt, as after .double().
        rounded = like is not None and _less_precise_than(state_dict, like.dtype)
        self._cache_key = None if result.missing_keys or rounded else self._current_key()
        return result

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        # Also when a parent module's load reaches this one (torch's recursion, not
        # ``load_state_dict`` above): a fresh tensor for every saved buffer, so that buffers that
        # grew, or are None here (a cache this model has not built), take the saved values.
        like = self._floating_tensor()
        for name in self._buffers:
            key = prefix + name
            if key in state_dict and isinstance(state_dict[key], Tensor):
                self._buffers[name] = _fresh_buffer(
                    self._buffers[name], state_dict[key], like, self._held_buffer_dtype(name)
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _held_buffer_dtype(self, name: str) -> torch.dtype | None:
        r"""The dtype the buffer ``name`` is held in where it differs from the model's (e.g. a
        float32 model's statistics kept in float64), so that a load does not round it; ``None``:
        the model's dtype."""
        return None

    def _floating_tensor(self) -> Tensor | None:
        r"""A floating-point parameter (or buffer) of this model: its dtype and device are the
        model's (``None`` if it has none)."""
        for t in (*self.parameters(), *self.buffers()):
            if t.is_floating_point():
                return t
        return None

    def _after_load(self) -> None:
        """Hook: derive any non-buffer attributes from freshly loaded buffers."""

    def _locate(self, name: str) -> tuple[torch.nn.Module | None, str, str]:
        parts = name.split(".")
        module: torch.nn.Module | None = self
        for part in parts[:-1]:
            module = module._modules.get(part) if module is not None else None
        return module, ".".join(parts[:-1]), parts[-1]


def _less_precise_than(state_dict: Mapping[str, Any], dtype: torch.dtype) -> bool:
    r"""Whether some floating-point tensor of ``state_dict`` has a coarser dtype than ``dtype``
    (a larger machine epsilon: float32 or half for a float64 model)."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return any(
        isinstance(v, Tensor) and v.is_floating_point() and torch.finfo(v.dtype).eps > eps
        for v in state_dict.values()
    )


class _ModuleSharers(weakref.WeakSet):
    r"""The live models holding the same hyperparameter modules (a model and the models made
    from it by :meth:`OnlineModel._shallow_copy`), by weak reference.

    A deep copy or an unpickled copy of a set starts empty, and each copied model holding it
    joins it (:meth:`OnlineModel.__setstate__`): copied alone, a model shares with no one;
    models copied together (``copy.deepcopy((parent, child))``, one pickle holding both), whose
    copies share their modules as the originals did, share one new set (one object per copy
    or pickle, both memoise it), so they still know each other."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _ModuleSharers:
        return _ModuleSharers()

    def __reduce__(self) -> tuple[Any, tuple]:
        return _ModuleSharers, ()


def _no_sharers() -> None:
    r"""What a :class:`_ModuleSharers` pickled before copies kept their sharers unpickles as:
    ``None`` (the model holding it shares with no one)."""
    return None


def _check_outcome_transform(outcome_transform: Any) -> None:
    r"""Take ``outcome_transform=Standardize(m=1)`` (what BoTorch's ``SingleTaskGP`` applies by
    default) as a no-op, since every surrogate standardises its outcomes itself (``outcome_mean``,
    ``outcome_std``), and refuse any other outcome transform with a ``ValueError`` saying what to
    do instead."""
    if outcome_transform is None:
        return
    from botorch.models.transforms.outcome import Standardize

    if (
        type(outcome_transform) is Standardize
        and outcome_transform._m == 1
        and not outcome_transform._batch_shape
        and not outcome_transform._outputs
    ):
        return
    raise ValueError(
        f"outcome_transform={type(outcome_transform).__name__}(...) is not supported: the online "
        "surrogates standardise their outcomes themselves (as Standardize(m=1) would; passing "
        "that is accepted and changes nothing), and keep statistics of the standardised values, "
        "so no other outcome transform can be applied inside the model. Transform Y before "
        "passing it (e.g. Y.log()) and map predictions back, or use BoTorch's SingleTaskGP."
    )


def _check_fixed_transform(input_transform: Any) -> None:
    r"""Refuse an input transform with trainable parameters (any that requires a gradient, such
    as the concentrations of BoTorch's ``Warp``) with a ``ValueError``.

    The surrogates transform inputs once, as they arrive, and keep them (or statistics and caches
    of them) in that form, so a transform whose parameters a fit moves would leave the model
    describing the old one, silently; and ``fit`` works from those statistics, so it cannot learn
    the transform either. Transforms with fixed coefficients (``Normalize``, whose bounds are
    buffers, or a ``Warp`` frozen with ``requires_grad_(False)``) are taken."""
    if not isinstance(input_transform, torch.nn.Module):
        return
    trainable = [name for name, p in input_transform.named_parameters() if p.requires_grad]
    if trainable:
        raise ValueError(
            f"The input transform {type(input_transform).__name__} has trainable parameters "
            f"({', '.join(trainable)}), which online surrogates cannot learn from their data: "
            "they hold their inputs transformed once, as they arrive. Freeze it with "
            "`input_transform.requires_grad_(False)` (its parameters fixed at the values you "
            "want), or use BoTorch's SingleTaskGP for a learned transform (a learned warping)."
        )


def _untransform_training_inputs(transform: Any, X: Tensor) -> Tensor:
    r"""Training inputs ``X`` (``batch x n x d``, as held: through ``preprocess_transform``)
    back in the user's space: each transform that applied to training data
    (``transform_on_train``) undone with ``untransform``, a chain's last first."""
    if isinstance(transform, ChainedInputTransform):
        for part in reversed(list(transform.values())):
            X = _untransform_training_inputs(part, X)
        return X
    if not getattr(transform, "transform_on_train", True):
        return X
    with torch.no_grad():
        return transform.untransform(X)


def _held_dtype(module: torch.nn.Module, name: str) -> torch.dtype | None:
    r""":meth:`OnlineModel._held_buffer_dtype` of ``module`` (``None`` for other modules)."""
    held = getattr(module, "_held_buffer_dtype", None)
    return held(name) if held is not None else None


def _fresh_buffer(
    current: Tensor | None, value: Tensor, model: Tensor | None, held: torch.dtype | None = None
) -> Tensor:
    r"""An uninitialised tensor of the saved ``value``'s shape to load it into, of the
    ``current`` buffer's dtype (floating point) and device -- where the buffer is None here, the
    dtype the model holds it in (``held``) or the model's (``model``: one of its floating
    tensors) --, as torch's ``load_state_dict`` keeps a module's own: a float64 state loads into
    a float32 model as float32, except buffers the model keeps in float64."""
    like = current if isinstance(current, Tensor) else model
    if like is None:
        return torch.empty_like(value)
    floating = like.is_floating_point() and value.is_floating_point()
    dtype = like.dtype if floating else value.dtype
    if floating and not isinstance(current, Tensor) and held is not None:
        dtype = held
    return torch.empty_like(value, dtype=dtype, device=like.device)


class HeldDataMixin:
    r"""For surrogates that keep their training data (``train_X``: ``batch x n x d`` transformed
    inputs, ``train_y``: ``sample x batch x n`` standardised targets) as buffers: what BoTorch and
    Ax read about the data."""

    @property
    def num_data(self) -> int:
        return int(self.train_X.shape[-2])

    @property
    def train_inputs(self) -> tuple[Tensor]:
        return (self.train_X,)

    @property
    def train_targets(self) -> Tensor:
        """Training targets in the user's units (``sample x batch x n``)."""
        return self.train_y * self.outcome_std + self.outcome_mean

    def _restandardize(self) -> None:
        r"""Re-standardise on all held targets (BoTorch's ``Standardize`` refitted on the data so
        far), through :meth:`OnlineModel._change_outcome_scaling`."""
        self._change_outcome_scaling(*standardization(self.train_targets))

    def _rescale_to_outcome_scaling(self, old_mean: Tensor, old_std: Tensor, ratio: Tensor) -> None:
        r"""The held targets ``train_y`` (``n``) and per-point noise ``train_noise`` (``n`` or
        None) to the new outcome scaling (see :meth:`OnlineModel._rescale_to_outcome_scaling`)."""
        if self.train_noise is not None:
            self.train_noise = self.train_noise * ratio**2
        self.train_y = remap_standardized(
            self.train_y, old_mean, old_std, self.outcome_mean, self.outcome_std
        )

    def _register_held_data(self, X: Tensor, train_Y: Tensor, train_Yvar: Tensor | None) -> None:
        r"""Hold the (transformed) inputs ``X`` (``n x d``), the standardised targets
        (``train_Y``: ``n x 1``, user units) and the per-point noise in standardised units
        (``train_Yvar``: ``n x 1`` or None) as the buffers ``train_X``, ``train_y``,
        ``train_noise``."""
        self.register_buffer("train_X", X)
        self.register_buffer("train_y", self._standardize(train_Y.to(X)).squeeze(-1))
        self.register_buffer(
            "train_noise",
            None if train_Yvar is None else (train_Yvar.to(X) / self.outcome_std**2).squeeze(-1),
        )


class UnitsMultivariateNormal(MultivariateNormal):
    r"""A ``MultivariateNormal`` in the user's outcome units whose ``variance`` is floored in the
    model's standardised units.

    GPyTorch raises every variance below ``settings.min_variance`` (1e-10 in float64, 1e-6 in
    float32) to that value, in whatever units the distribution is in. A model on targets of sd
    1e-6 (posterior variances about 1e-13 in those units) then reported 1e-10 (float64) or 1e-6
    (float32) everywhere, warning of negative variances that were not there, and qNIPV, which
    integrates that variance, was flat. Here the floor is ``min_variance * variance_scale``
    (``variance_scale``: ``outcome_std**2``, the factor from standardised to user units), so a
    variance is raised only where it is below the floor in the units the model computed it in.

    Args:
        mean: ``batch x q`` mean (user units).
        covariance_matrix: ``batch x q x q`` covariance (user units).
        variance_scale: scalar tensor, the user-unit variance of one standardised unit; None:
            GPyTorch's floor (e.g. a distribution derived by ``expand`` or indexing).
    """

    def __init__(
        self,
        mean: Tensor,
        covariance_matrix: Tensor | LinearOperator,
        validate_args: bool = False,
        variance_scale: Tensor | None = None,
    ) -> None:
        super().__init__(mean, covariance_matrix, validate_args=validate_args)
        self.variance_scale = variance_scale

    @property
    def variance(self) -> Tensor:
        r"""``batch x q`` marginal variances (user units), floored in standardised units."""
        if self.variance_scale is None:
            return super().variance
        with _without_gpytorch_floor():
            variance = super().variance
        return _floored_in_standardized_units(variance, self.variance_scale)


class UnitsMultitaskMultivariateNormal(MultitaskMultivariateNormal):
    r"""A ``MultitaskMultivariateNormal`` in the user's units (``batch x q x m``) whose
    ``variance`` is floored in each output's standardised units, as
    :class:`UnitsMultivariateNormal`. ``variance_scale`` (``(m,)``, ``outcome_std**2``) is set
    after construction; None (e.g. a distribution derived by indexing): GPyTorch's floor."""

    variance_scale: Tensor | None = None

    @property
    def variance(self) -> Tensor:
        r"""``batch x q x m`` marginal variances (user units), floored in standardised units."""
        if self.variance_scale is None:
            return super().variance
        with _without_gpytorch_floor():
            variance = super().variance
        return _floored_in_standardized_units(variance, self.variance_scale)


#: the smallest normal number of each dtype: GPyTorch's variance floor while it is lowered
_TINY = {t: torch.finfo(t).tiny for t in (torch.float16, torch.float32, torch.float64)}


@contextlib.contextmanager
def _without_gpytorch_floor() -> Iterator[None]:
    r"""GPyTorch's ``variance`` with its user-unit floor lowered to the smallest normal number
    (its public ``min_variance`` setting), and its warning silenced: the caller floors in
    standardised units and warns itself (:func:`_floored_in_standardized_units`)."""
    with (
        warnings.catch_warnings(),
        gpytorch_settings.min_variance(
            float_value=_TINY[torch.float32],
            double_value=_TINY[torch.float64],
            half_value=_TINY[torch.float16],
        ),
    ):
        warnings.simplefilter("ignore", NumericalWarning)
        yield


def _floored_in_standardized_units(variance: Tensor, scale: Tensor) -> Tensor:
    r"""``variance`` (user units, ``... x q`` or ``... x q x m``) raised to GPyTorch's
    ``min_variance`` times ``scale`` (``outcome_std**2``: scalar, or ``(m,)`` per output), with
    GPyTorch's warning where any value was below."""
    floor = gpytorch_settings.min_variance.value(variance.dtype) * scale.to(variance)
    if bool((variance < floor).any()):
        warnings.warn(
            "Negative variance values detected. This is likely due to numerical instabilities. "
            f"Rounding negative variances up to {floor.min().item():.3g} (GPyTorch's "
            "min_variance in the model's standardised units).",
            NumericalWarning,
            stacklevel=3,
        )
        variance = torch.maximum(variance, floor)
    return variance


def _scalarized_in_units(
    transform: PosteriorTransform, posterior: GPyTorchPosterior
) -> GPyTorchPosterior:
    r"""``transform(posterior)``, with the variance floor of :class:`UnitsMultivariateNormal`
    kept through BoTorch's ``ScalarizedPosteriorTransform``, which builds a plain
    ``MultivariateNormal`` (``batch x q``) and so GPyTorch's floor in user units.

    The scalarized variance ``sum_i w_i^2 var_i`` (independent outputs) is floored at
    ``min_variance * sum_i w_i^2 outcome_std_i^2``: for one output, the floor of ``w * f``.
    Any other transform's result is returned as it is.
    """
    result = transform(posterior)
    scale = getattr(posterior.distribution, "variance_scale", None)
    dist = getattr(result, "distribution", None)
    if (
        scale is None
        or not isinstance(transform, ScalarizedPosteriorTransform)
        or type(dist) is not MultivariateNormal
    ):
        return result
    weights = transform.weights.to(scale)
    return GPyTorchPosterior(
        UnitsMultivariateNormal(
            dist.mean,
            _as_operator(dist.lazy_covariance_matrix),
            variance_scale=(weights.pow(2) * scale).sum(),
        )
    )


def _dense_or_lazy(mvn: MultivariateNormal) -> Tensor | LinearOperator:
    r"""The covariance as a plain tensor if the model built it densely (cheap arithmetic, no
    operator bookkeeping), else the lazy operator."""
    covar = mvn.lazy_covariance_matrix
    return covar.tensor if isinstance(covar, DenseLinearOperator) else covar


def _as_operator(covar: Tensor | LinearOperator) -> LinearOperator:
    r"""A linear operator (a plain tensor is wrapped: GPyTorch's ``MultivariateNormal`` would
    otherwise factorise a tensor covariance eagerly in ``torch.distributions``)."""
    from linear_operator import to_linear_operator

    return to_linear_operator(covar)


def _rebound(hook: Any, source: torch.nn.Module, target: torch.nn.Module) -> Any:
    r"""``hook`` (a function, a bound method or torch's wrapper of one that also holds a weak
    reference to its module) with ``source`` replaced by ``target`` wherever it is bound."""
    if isinstance(hook, types.MethodType) and hook.__self__ is source:
        return types.MethodType(hook.__func__, target)
    inner = getattr(hook, "hook", None)
    module = getattr(hook, "module", None)
    tied = getattr(hook, "with_module", False) and callable(module) and module() is source
    if inner is None or (_rebound(inner, source, target) is inner and not tied):
        return hook
    new = copy.copy(hook)
    new.hook = _rebound(inner, source, target)
    if tied:
        new.module = weakref.ref(target)
    return new
