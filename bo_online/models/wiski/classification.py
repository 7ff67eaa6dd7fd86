r"""Dirichlet-based GP classification (Milios et al., 2018) on WISKI.

Classification becomes C independent fixed-noise regressions (docs/math.md §1, Stanton et al.,
"Kernel Interpolation for Scalable Online Gaussian Processes", 2021, arXiv:2103.01454, App. A.5):
for a label y_i and class c, ``alpha_ic = 1[y_i = c] + alpha_eps``; the regression target is
``log alpha_ic - sigma_ic^2 / 2`` with fixed noise ``sigma_ic^2 = log(1 + 1/alpha_ic)``. Each class
is a :class:`bo_online.models.WISKI` with fixed heteroscedastic noise, so updates stay O(m^2 q) per
class whatever n is. Class probabilities are the Monte-Carlo average of ``softmax(f)`` over the
latent posteriors (Milios et al., Eq. 8); predictions are the argmax of the posterior means.

Use it for streaming classification of low-dimensional inputs (or more through a projection,
shared by none of the classes here: give each class model its own via ``projection_factory``).
"""

from __future__ import annotations

import copy
import math
import numbers
from typing import Any, Callable, Mapping

import torch
from botorch.models.model import ModelList
from torch import Tensor, nn
from typing_extensions import Self

from bo_online.models.validation import whole_number
from bo_online.models.wiski.model import WISKI

__all__ = ["dirichlet_targets", "WISKIDirichletClassifier"]


def dirichlet_targets(
    labels: Tensor, num_classes: int, alpha_eps: float = 0.01, dtype: torch.dtype = torch.float64
) -> tuple[Tensor, Tensor]:
    r"""Milios et al.'s regression targets and noise variances.

    Args:
        labels: ``n`` integer class labels in ``[0, num_classes)``.
        num_classes: C.
        alpha_eps: the Dirichlet concentration of the wrong classes (finite, > 0).

    Returns:
        ``(targets, noise)``, both ``n x C``.
    """
    _check_alpha_eps(alpha_eps)
    if not isinstance(labels, Tensor) or labels.dim() != 1:
        raise ValueError(
            f"labels must be a 1-D tensor of class indices, got {getattr(labels, 'shape', labels)}."
        )
    if labels.dtype.is_floating_point:
        if not bool((labels == labels.round()).all()):
            raise ValueError("labels must be integers (class indices).")
        labels = labels.long()
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"labels must lie in [0, {num_classes}); got values in [{int(labels.min())}, "
            f"{int(labels.max())}]."
        )
    alpha = torch.nn.functional.one_hot(labels, num_classes).to(dtype) + alpha_eps
    noise = torch.log1p(1.0 / alpha)
    return alpha.log() - noise / 2, noise


def _check_alpha_eps(alpha_eps: float) -> None:
    # alpha_eps = 0 makes the wrong classes' targets log(0) = -inf (reported downstream as
    # non-finite Y, which the user never passed); a negative one makes them NaN.
    if not (isinstance(alpha_eps, numbers.Real) and math.isfinite(alpha_eps) and alpha_eps > 0):
        raise ValueError(
            f"alpha_eps must be a finite number > 0 (the Dirichlet concentration of the wrong "
            f"classes; 0.01 as in the paper), got {alpha_eps!r}."
        )


def check_num_samples(num_samples: int) -> int:
    r"""``num_samples`` as an int >= 1 (Monte-Carlo samples of :meth:`predict_proba`), else a
    ValueError: no samples would average to NaN probabilities."""
    return whole_number("num_samples", num_samples, 1)


class WISKIDirichletClassifier(nn.Module):
    r"""C WISKI fixed-noise regressions on Dirichlet-transformed labels.

    Args:
        train_X: ``n x d`` inputs; labels: ``n`` class indices; num_classes: C.
        alpha_eps: Dirichlet concentration of the wrong classes (0.01 as in the paper).
        projection_factory: optional zero-argument callable giving each class model its own
            projection (d > 3).
        **wiski_options: passed to every :class:`WISKI` (``grid_size``, ``covar_module`` is not
            shared: pass ``covar_factory`` for per-class kernels).
    """

    def __init__(
        self,
        train_X: Tensor,
        labels: Tensor,
        num_classes: int,
        alpha_eps: float = 0.01,
        projection_factory: Callable[[], nn.Module] | None = None,
        covar_factory: Callable[[], Any] | None = None,
        **wiski_options: Any,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}.")
        self.num_classes, self.alpha_eps = int(num_classes), float(alpha_eps)
        targets, noise = dirichlet_targets(labels, num_classes, alpha_eps, dtype=train_X.dtype)
        models = []
        # A map given as a module: each class gets its own copy, taken before any class model
        # initialises it on its data. The class statistics are features of their own map;
        # refitting one shared map class by class left the earlier classes' statistics on a
        # map that had since moved.
        given = wiski_options.get("projection")
        pristine = copy.deepcopy(given) if isinstance(given, nn.Module) else None
        for c in range(num_classes):
            opts = dict(wiski_options)
            if projection_factory is not None:
                opts["projection"] = projection_factory()
            elif pristine is not None and c > 0:
                opts["projection"] = copy.deepcopy(pristine)
            if covar_factory is not None:
                opts["covar_module"] = covar_factory()
            models.append(WISKI(train_X, targets[:, c : c + 1], noise[:, c : c + 1], **opts))
        self.models = nn.ModuleList(models)

    @classmethod
    def loop_default_options(
        cls, dim: int, user_options: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        r"""The class models' structure above 3 inputs, as the loops give :class:`WISKI`
        (:meth:`WISKI.loop_default_options`): a classification stream of 4 inputs failed with
        the message that names that default. Not the exact regime (``exact_max_n``): the class
        models stay SKI from the first point (the regime is not measured on classification)."""
        options = WISKI.loop_default_options(dim, user_options)
        options.pop("exact_max_n", None)
        options.pop("regime_kernel", None)
        return options

    #: :meth:`fit_projection` takes the class models' projection-fit settings by name
    fit_projection_settings_class = WISKI.fit_projection_settings_class

    @property
    def projection(self) -> nn.Module | None:
        r"""The first class model's learned input map (each class model has its own), or None
        without one. The loops duck-type it: a classifier with learned maps is refit through
        :meth:`fit_projection` on every labelled point they keep, as WISKI regression is."""
        return getattr(self.models[0], "projection", None)

    def fit_projection(self, X: Tensor, labels: Tensor, **options: Any) -> Self:
        r"""Learn every class model's input map jointly with its hyperparameters
        (:meth:`WISKI.fit_projection` on that class's Dirichlet targets and fixed noise) and
        rebuild its statistics from ``(X, labels)``: pass every labelled point the classifier
        should hold. Without it a classifier above the all-pairs dimensions kept the maps of its
        initial design for the whole stream, whatever it saw later.

        Args:
            X: ``n x d`` inputs; labels: ``n`` class indices.
            **options: :class:`~bo_online.models.wiski.fitting.WISKIProjectionFitSettings`
                fields (``max_iter``, ``method``, ``joint``, ...), the same for every class.
        """
        if self.projection is None:
            raise ValueError("This classifier's class models have no projection; use fit().")
        targets, noise = dirichlet_targets(labels, self.num_classes, self.alpha_eps, dtype=X.dtype)
        for c, model in enumerate(self.models):
            model.fit_projection(X, targets[:, c : c + 1], noise[:, c : c + 1], **options)
        return self

    def as_model_list(self) -> ModelList:
        """The class models as a BoTorch ``ModelList`` (for acquisition functions)."""
        return ModelList(*self.models)

    def update(self, X: Tensor, labels: Tensor) -> "WISKIDirichletClassifier":
        r"""Fold ``q`` labelled points into every class model, O(C m^2 q). Validates first."""
        targets, noise = dirichlet_targets(labels, self.num_classes, self.alpha_eps, dtype=X.dtype)
        first = self.models[0]
        checked = (
            first._transform_and_check(X, new_observations=True) if isinstance(X, Tensor) else X
        )
        if checked.dim() != 2 or checked.shape[0] != targets.shape[0]:
            raise ValueError(
                f"X must be q x {first.dim} with one row per label, got {tuple(X.shape)} and "
                f"{targets.shape[0]} labels."
            )
        for c, model in enumerate(self.models):
            model.update(X, targets[:, c : c + 1], noise=noise[:, c : c + 1])
        return self

    def fit(self, **kwargs: Any) -> "WISKIDirichletClassifier":
        """Refit every class model's hyperparameters (see :meth:`WISKI.fit`)."""
        for model in self.models:
            model.fit(**kwargs)
        return self

    def latent(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Latent means and variances, ``... x n x C`` each, in the target units."""
        means, variances = [], []
        with torch.no_grad():
            for model in self.models:
                post = model.posterior(X)
                means.append(post.mean.squeeze(-1))
                variances.append(post.variance.squeeze(-1))
        return torch.stack(means, -1), torch.stack(variances, -1)

    def predict_proba(self, X: Tensor, num_samples: int = 256, seed: int | None = 0) -> Tensor:
        r"""Class probabilities ``... x n x C``: MC average of softmax over ``num_samples`` (>= 1)
        latent samples."""
        num_samples = check_num_samples(num_samples)
        mean, var = self.latent(X)
        g = None if seed is None else torch.Generator(device=mean.device).manual_seed(seed)
        eps = torch.randn(
            num_samples, *mean.shape, generator=g, dtype=mean.dtype, device=mean.device
        )
        f = mean + var.clamp_min(0).sqrt() * eps
        return torch.softmax(f, dim=-1).mean(0)

    def predict(self, X: Tensor) -> Tensor:
        r"""Most probable class (argmax of the latent means), ``... x n``."""
        return self.latent(X)[0].argmax(-1)
