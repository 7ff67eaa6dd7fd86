r"""Hyperparameter optimisation shared by every surrogate.

Each model supplies a scalar loss (a negative marginal likelihood or ELBO computed from its own
sufficient statistics) and the parameters to move; this module runs BoTorch's L-BFGS-B
(``scipy_minimize``) or Adam (``torch_minimize``) on it, so the optimiser settings users know
from ``fit_gpytorch_mll`` apply unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable, Literal, TypeVar

import torch
from botorch.optim.closures import ForwardBackwardClosure
from botorch.optim.core import (
    OptimizationResult,
    OptimizationStatus,
    scipy_minimize,
    torch_minimize,
)
from botorch.optim.utils.model_utils import get_parameters_and_bounds
from torch import Tensor
from torch.nn import Module

from bo_online.models.validation import whole_number

Bounds = dict[str, tuple[float | None, float | None]]
SettingsT = TypeVar("SettingsT")


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    r"""How a hyperparameter fit runs its optimiser (the fields every surrogate's fit shares).

    Each surrogate's fit settings subclass this with their own extra fields and defaults, and
    ``fit(settings=None, **overrides)`` accepts either a settings object or its field names as
    keywords (so ``fit_options={"method": "adam"}`` in the loops keeps working).

    Attributes:
        method: ``"lbfgs"`` (SciPy L-BFGS-B through BoTorch) or ``"adam"``.
        max_iter: iteration cap (L-BFGS ``maxiter`` or the number of Adam steps).
        lr: Adam learning rate (unused by L-BFGS).
        timeout_sec: optional wall-clock limit on the optimiser.
    """

    method: str = "lbfgs"
    max_iter: int = 200
    lr: float = 0.05
    timeout_sec: float | None = None

    def __post_init__(self) -> None:
        r"""Refuse optimiser settings no fit can run with, when the settings are made: a
        ``max_iter`` of -5 and a ``timeout_sec`` of -1 were taken (the fit ran anyway), a
        ``max_iter`` of "10" failed inside the optimiser with a ``TypeError``, and in Ax (whose
        fit options are checked when the generation strategy is made) such values surfaced
        only after the Sobol trials, or never. ``None`` keeps a field's meaning where a
        subclass allows it (QSGP's ``max_iter``, the decoupled SVGP's ``lr``)."""
        if self.max_iter is not None:
            max_iter = whole_number("max_iter", self.max_iter, 0)
            object.__setattr__(self, "max_iter", max_iter)  # 50.0 -> 50 (a frozen dataclass)
        if self.lr is not None:
            lr = self.lr
            bad = isinstance(lr, bool) or not isinstance(lr, numbers.Real)
            if bad or not (lr > 0 and math.isfinite(lr)):
                raise ValueError(f"lr must be a positive number, got {lr!r}.")
        timeout = self.timeout_sec
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout >= 0
        ):
            raise ValueError(
                f"timeout_sec must be a number of seconds >= 0 or None, got {timeout!r}."
            )


def resolve_settings(
    settings_class: type[SettingsT],
    settings: SettingsT | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SettingsT:
    r"""``settings`` (or ``settings_class()``) with the keyword ``overrides`` applied.

    Unknown names are refused with the accepted ones listed, so a misspelt fit option fails
    before any hyperparameter moves.

    Args:
        settings_class: a dataclass type (for example a subclass of :class:`OptimizerSettings`).
        settings: a ready instance, or ``None`` for the class defaults.
        overrides: field name -> value; ``None`` values keep the setting's own value.
    """
    base = settings_class() if settings is None else settings
    if not isinstance(base, settings_class):
        raise ValueError(
            f"settings must be a {settings_class.__name__}, got {type(base).__name__}."
        )
    overrides = dict(overrides or {})
    names = {f.name for f in dataclasses.fields(settings_class)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(
            f"Unknown fit option(s) {', '.join(map(repr, unknown))} for "
            f"{settings_class.__name__}; accepted: {', '.join(sorted(names))}."
        )
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(base, **overrides) if overrides else base


def sum_log_priors(
    modules: Iterable[Module | None], reference: Tensor, skip: Callable[[str], bool] | None = None
) -> Tensor:
    r"""Sum of the log densities of every GPyTorch prior registered on ``modules``.

    This is the prior term GPyTorch's marginal likelihoods add to the evidence; every surrogate's
    fit objective adds it the same way.

    Args:
        modules: GPyTorch modules (kernel, mean, likelihood, ...); ``None`` or modules without
            priors are skipped.
        reference: a tensor whose dtype and device the (scalar) result takes.
        skip: optional predicate on the prior's name within its module (for example a fixed-noise
            model leaves out the likelihood's noise prior).

    Returns:
        A scalar tensor.
    """
    total = torch.zeros((), dtype=reference.dtype, device=reference.device)
    for module in modules:
        if module is None or not hasattr(module, "named_priors"):
            continue
        for name, prior_module, prior, closure, _ in module.named_priors():
            if skip is not None and skip(name):
                continue
            total = total + prior.log_prob(closure(prior_module)).sum()
    return total


def standardization(y: Tensor) -> tuple[Tensor, Tensor]:
    r"""Mean and standard deviation of ``y`` (``(m x) n``) over its last dimension, as BoTorch's
    ``Standardize`` computes them (unbiased; a zero deviation, from constant or single outcomes,
    becomes 1). Returns two tensors of shape ``(m,)`` (``(1,)`` for a 1-D ``y``)."""
    mean = y.mean(-1).reshape(-1)
    if y.shape[-1] < 2:  # one value: deviation 1 (an unbiased std of one value is undefined)
        return mean, torch.ones_like(mean)
    return mean, nonzero_std(y.std(-1).reshape(-1))


def nonzero_std(std: Tensor) -> Tensor:
    r"""``std`` (any shape) with its zero entries replaced by 1, as BoTorch's ``Standardize``
    treats the deviation of constant (or single) outcomes."""
    return torch.where(std > 0, std, torch.ones_like(std))


def remap_standardized(
    values: Tensor, old_mean: Tensor, old_std: Tensor, new_mean: Tensor, new_std: Tensor
) -> Tensor:
    r"""Values standardised with ``(old_mean, old_std)`` re-expressed with ``(new_mean, new_std)``:
    ``(values * old_std + old_mean - new_mean) / new_std``, the same numbers in the user's units.

    Used for held targets and for a constant prior mean when a model's outcome scaling changes.
    All arguments broadcast together (for ``m`` outputs held as ``m x n``, pass the scalings as
    ``m x 1``).
    """
    return (values * old_std + old_mean - new_mean) / new_std


@torch.no_grad()
def remap_constant_mean(
    mean_module: Module, old_mean: Tensor, old_std: Tensor, new_mean: Tensor, new_std: Tensor
) -> None:
    r"""Keep a GPyTorch ``ConstantMean``'s level in the user's units across a change of outcome
    scaling: its ``constant`` (standardised with ``(old_mean, old_std)``, ``(1,)`` each) is set in
    place to :func:`remap_standardized` of itself, keeping its shape."""
    constant = mean_module.constant
    remapped = remap_standardized(constant, old_mean, old_std, new_mean, new_std)
    constant.copy_(remapped.reshape(constant.shape))


def trainable_parameters_and_bounds(
    model: Module, name_filter: Callable[[str], bool] | None = None
) -> tuple[dict[str, Tensor], Bounds]:
    r"""Trainable parameters of ``model`` and the optimiser bounds implied by GPyTorch constraints.

    GPyTorch constraints with ``transform=None`` (BoTorch's default noise constraint, for one) are
    enforced only through these bounds, so every fit must pass them on.
    """
    return get_parameters_and_bounds(model, requires_grad=True, name_filter=name_filter)


@torch.no_grad()
def project_to_bounds(parameters: Mapping[str, Tensor], bounds: Bounds) -> None:
    r"""Clamp ``parameters`` in place into ``bounds`` (as :func:`trainable_parameters_and_bounds`
    returns them: name -> (lower, upper), ``None`` for no bound), the projection after each step
    of an optimiser that does not take bounds itself (projected Adam). Names in ``bounds`` must
    be in ``parameters``."""
    for name, (lower, upper) in bounds.items():
        parameters[name].clamp_(min=lower, max=upper)


@contextlib.contextmanager
def training_mode(module: Module) -> Iterator[Module]:
    r"""Put ``module`` in training mode for a fit and back in evaluation mode afterwards, also
    when the optimiser raises (the posterior's caches are built in evaluation mode)."""
    module.train()
    try:
        yield module
    finally:
        module.eval()


def minimize_loss(
    loss: Callable[[], Tensor],
    parameters: dict[str, Tensor],
    method: Literal["lbfgs", "adam"] = "lbfgs",
    max_iter: int = 200,
    lr: float = 0.05,
    timeout_sec: float | None = None,
    bounds: Bounds | None = None,
    settings: OptimizerSettings | None = None,
) -> OptimizationResult:
    r"""Minimise ``loss()`` over ``parameters`` in place.

    Args:
        loss: closure returning a scalar tensor differentiable in ``parameters``.
        parameters: name -> leaf tensor (``requires_grad=True``) to optimise.
        method: ``"lbfgs"`` (SciPy L-BFGS-B through BoTorch) or ``"adam"``.
        max_iter: iteration cap (L-BFGS ``maxiter`` or number of Adam steps).
        lr: Adam learning rate.
        timeout_sec: optional wall-clock limit.
        bounds: name -> (lower, upper) box for the raw values (see
            :func:`trainable_parameters_and_bounds`).
        settings: if given, its ``method``, ``max_iter``, ``lr`` and ``timeout_sec`` replace the
            keyword arguments of the same names.

    Returns:
        BoTorch's ``OptimizationResult`` (final loss, step count, status). With ``max_iter=0``
        nothing moves (SciPy's L-BFGS-B with ``maxiter=0`` still takes a step).
    """
    if settings is not None:
        method, max_iter, lr = settings.method, settings.max_iter, settings.lr
        timeout_sec = settings.timeout_sec
    if not parameters:
        raise ValueError("No hyperparameters to optimise (all frozen?).")
    if max_iter == 0:
        with torch.no_grad():
            fval = float(loss())
        return OptimizationResult(step=0, fval=fval, status=OptimizationStatus.STOPPED)
    closure = ForwardBackwardClosure(forward=loss, parameters=parameters)
    if method == "lbfgs":
        return scipy_minimize(
            closure=closure,
            parameters=parameters,
            bounds=bounds,
            options={"maxiter": max_iter},
            timeout_sec=timeout_sec,
        )
    if method == "adam":
        return torch_minimize(
            closure=closure,
            parameters=parameters,
            bounds=bounds,
            optimizer=lambda params: torch.optim.Adam(params, lr=lr),
            step_limit=max_iter,
            timeout_sec=timeout_sec,
        )
    raise ValueError(f"Unknown fit method {method!r}; use 'lbfgs' or 'adam'.")
