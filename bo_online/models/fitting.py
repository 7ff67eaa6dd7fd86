r"""Hyperparameter optimisation shared by every surrogate.

Each model supplies a scalar loss (a negative marginal likelihood or ELBO computed from its own
sufficient statistics) and the parameters to move; this module runs BoTorch's L-BFGS-B
(``scipy_minimize``) or Adam (``torch_minimize``) on it, so the optimiser settings users know
from ``fit_gpytorch_mll`` apply unchanged.
"""

from __future__ import annotations

from typing import Callable, Literal

import torch
from botorch.optim.closures import ForwardBackwardClosure
from botorch.optim.core import OptimizationResult, scipy_minimize, torch_minimize
from botorch.optim.utils.model_utils import get_parameters_and_bounds
from torch import Tensor
from torch.nn import Module

Bounds = dict[str, tuple[float | None, float | None]]


def trainable_parameters_and_bounds(
    model: Module, name_filter: Callable[[str], bool] | None = None
) -> tuple[dict[str, Tensor], Bounds]:
    r"""Trainable parameters of ``model`` and the optimiser bounds implied by GPyTorch constraints.

    GPyTorch constraints with ``transform=None`` (BoTorch's default noise constraint, for one) are
    enforced only through these bounds, so every fit must pass them on.
    """
    return get_parameters_and_bounds(model, requires_grad=True, name_filter=name_filter)


def minimize_loss(
    loss: Callable[[], Tensor],
    parameters: dict[str, Tensor],
    method: Literal["lbfgs", "adam"] = "lbfgs",
    max_iter: int = 200,
    lr: float = 0.05,
    timeout_sec: float | None = None,
    bounds: Bounds | None = None,
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

    Returns:
        BoTorch's ``OptimizationResult`` (final loss, step count, status).
    """
    if not parameters:
        raise ValueError("No hyperparameters to optimise (all frozen?).")
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
