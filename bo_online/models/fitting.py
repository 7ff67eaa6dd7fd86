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
from torch import Tensor


def minimize_loss(
    loss: Callable[[], Tensor],
    parameters: dict[str, Tensor],
    method: Literal["lbfgs", "adam"] = "lbfgs",
    max_iter: int = 200,
    lr: float = 0.05,
    timeout_sec: float | None = None,
    bounds: dict[str, tuple[float | None, float | None]] | None = None,
) -> OptimizationResult:
    r"""Minimise ``loss()`` over ``parameters`` in place.

    Args:
        loss: closure returning a scalar tensor differentiable in ``parameters``.
        parameters: name -> leaf tensor (``requires_grad=True``) to optimise.
        method: ``"lbfgs"`` (SciPy L-BFGS-B through BoTorch) or ``"adam"``.
        max_iter: iteration cap (L-BFGS ``maxiter`` or number of Adam steps).
        lr: Adam learning rate.
        timeout_sec: optional wall-clock limit.
        bounds: optional name -> (lower, upper) box for parameters (BoTorch's GPyTorch modules
            use constraints with ``transform=None``, which are enforced only through these
            bounds; see ``botorch.optim.utils.get_parameters_and_bounds``).

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
            optimizer=lambda params: torch.optim.Adam(params, lr=lr),
            bounds=bounds,
            step_limit=max_iter,
            timeout_sec=timeout_sec,
        )
    raise ValueError(f"Unknown fit method {method!r}; use 'lbfgs' or 'adam'.")
