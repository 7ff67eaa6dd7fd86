r"""The classical baseline: BoTorch's ``SingleTaskGP`` rebuilt and refit from scratch every step.

``RefitSingleTaskGP`` gives a plain ``SingleTaskGP`` (RBF kernel with BoTorch's default priors,
``Standardize`` outcome transform) the loops' surrogate interface -- constructed from
``(train_X, train_Y, train_Yvar=None, **options)``, ``fit(max_iter=...)``, ``update(X, Y)``,
``state_dict``/``load_state_dict`` -- but each ``update`` does what a textbook BO loop does: build
a new ``SingleTaskGP`` on all data seen so far and refit its hyperparameters from their defaults
(O(n^3) per step). It is the yardstick the online surrogates are compared against, and a BoTorch
``Model`` itself (posterior, conditioning and fantasies are the wrapped model's).
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import torch
from botorch.exceptions.warnings import InputDataWarning
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.models.transforms.outcome import Standardize
from botorch.posteriors import Posterior
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor

from bo_online.models.validation import require_modules

__all__ = ["RefitSingleTaskGP"]


class RefitSingleTaskGP(Model):
    r"""``SingleTaskGP`` refit from scratch on every update (the classical baseline).

    Args:
        train_X: ``n x d`` initial inputs (the loops pass points in the unit cube).
        train_Y: ``n x 1`` initial observations.
        train_Yvar: optional ``n x 1`` fixed noise variances; later updates must pass ``noise``.
        refit_max_iter: L-BFGS iteration cap of the refit each ``update`` runs (None: BoTorch's
            default).
        **singletaskgp_kwargs: passed to ``SingleTaskGP`` (e.g. ``covar_module``).
    """

    #: loops skip their scheduled refits: every update already refits from scratch.
    refits_on_update = True

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        refit_max_iter: int | None = None,
        **singletaskgp_kwargs: Any,
    ) -> None:
        super().__init__()
        if train_X.dim() != 2 or train_Y.dim() != 2 or train_Y.shape[-1] != 1:
            raise ValueError("train_X must be n x d and train_Y n x 1.")
        self.register_buffer("train_X", train_X)
        self.register_buffer("train_Y", train_Y)
        self.register_buffer("train_Yvar", train_Yvar)
        require_modules(  # not names from --model-option
            singletaskgp_kwargs.get("covar_module"), singletaskgp_kwargs.get("likelihood")
        )
        self.refit_max_iter = refit_max_iter
        self._kwargs = singletaskgp_kwargs
        self.model = self._build()

    def _build(self) -> SingleTaskGP:
        r"""A ``SingleTaskGP`` on the data held. Each piece of BoTorch's advice on the data
        (``InputDataWarning``: float32 inputs, outcomes it finds unscaled) is shown once per
        model: every update rebuilds, and BoTorch's fit resets Python's show-once registry, so a
        60-step stream printed the same advice 61 times. New advice (other data) still shows."""
        shown: set[str] = self.__dict__.setdefault("_advice_shown", set())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", InputDataWarning)
            model = SingleTaskGP(
                self.train_X,
                self.train_Y,
                train_Yvar=self.train_Yvar,
                outcome_transform=Standardize(m=1),
                **self._kwargs,
            )
        for w in caught:  # re-issued outside, under the caller's filters
            text = str(w.message)
            if issubclass(w.category, InputDataWarning):
                if text in shown:
                    continue
                shown.add(text)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        model.eval()
        return model

    # -------------------------------------------------------------- BoTorch Model API (delegated)

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        return self.model.batch_shape

    def posterior(self, X: Tensor, *args: Any, **kwargs: Any) -> Posterior:
        return self.model.posterior(X, *args, **kwargs)

    def condition_on_observations(self, X: Tensor, Y: Tensor, **kwargs: Any) -> Model:
        return self.model.condition_on_observations(X, Y, **kwargs)

    def fantasize(self, *args: Any, **kwargs: Any) -> Model:
        return self.model.fantasize(*args, **kwargs)

    # -------------------------------------------------------------- the loop interface

    @property
    def num_data(self) -> int:
        return int(self.train_X.shape[0])

    def fit(self, max_iter: int | None = None, **kwargs: Any) -> "RefitSingleTaskGP":
        r"""Maximise the exact marginal likelihood with BoTorch's ``fit_gpytorch_mll``."""
        max_iter = self.refit_max_iter if max_iter is None else max_iter
        optimizer_kwargs = {} if max_iter is None else {"options": {"maxiter": int(max_iter)}}
        mll = ExactMarginalLogLikelihood(self.model.likelihood, self.model)
        fit_gpytorch_mll(mll, optimizer_kwargs=optimizer_kwargs, **kwargs)
        self.model.eval()
        return self

    def update(self, X: Tensor, Y: Tensor, noise: Tensor | None = None) -> "RefitSingleTaskGP":
        r"""Append ``X`` (``q x d``), ``Y`` (``q x 1``), rebuild the ``SingleTaskGP`` on all data
        and refit it from its default hyperparameters (O(n^3))."""
        Y = Y.reshape(-1, 1) if Y.dim() == 1 else Y
        if X.dim() != 2 or X.shape[-1] != self.train_X.shape[-1] or Y.shape != (X.shape[0], 1):
            raise ValueError(
                f"update() takes X of shape q x {self.train_X.shape[-1]} and Y of shape q x 1, "
                f"got {tuple(X.shape)} and {tuple(Y.shape)}."
            )
        if not (torch.isfinite(X).all() and torch.isfinite(Y).all()):
            raise ValueError("update() got NaN/inf in X or Y.")
        if (self.train_Yvar is None) != (noise is None):
            raise ValueError("Pass noise with every update exactly when train_Yvar was given.")
        if X.shape[0] == 0:  # no new points: nothing to rebuild or refit, as for the surrogates
            return self
        new_X = torch.cat([self.train_X, X.to(self.train_X)])
        new_Y = torch.cat([self.train_Y, Y.to(self.train_Y)])
        new_Yvar = None
        if noise is not None:
            new_Yvar = torch.cat([self.train_Yvar, noise.reshape(-1, 1).to(self.train_Yvar)])
        self.train_X, self.train_Y, self.train_Yvar = new_X, new_Y, new_Yvar
        self.model = self._build()
        self.fit()
        return self

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        r"""Load a state saved after any number of updates: the data buffers are resized, the
        ``SingleTaskGP`` rebuilt on them, then its hyperparameters loaded.

        The data take this model's dtype and device, as torch's ``load_state_dict`` keeps a
        module's own (a float64 state made a float32 model float64 throughout). A state that
        does not fit raises torch's ``RuntimeError`` and leaves the model as it was (it kept the
        state's data, and a ``SingleTaskGP`` on them with its default hyperparameters)."""
        like = self.train_X
        before = (self.train_X, self.train_Y, self.train_Yvar, self.model)
        try:
            self.train_X = state_dict["train_X"].to(like, copy=True)
            self.train_Y = state_dict["train_Y"].to(like, copy=True)
            if state_dict.get("train_Yvar") is not None:
                self.train_Yvar = state_dict["train_Yvar"].to(like, copy=True)
            self.model = self._build()
            result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        except Exception:
            self.train_X, self.train_Y, self.train_Yvar, self.model = before
            raise
        self.model.eval()
        return result
