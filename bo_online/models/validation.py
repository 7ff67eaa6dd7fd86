r"""Input checks shared by every surrogate.

Every public entry point of a model validates its arguments here *before* any state changes, so
bad input raises a clear ``ValueError`` and the model is left exactly as it was.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_finite(name: str, value: Tensor) -> None:
    """Raise ``ValueError`` if ``value`` holds NaN or inf."""
    if not bool(torch.isfinite(value).all()):
        bad = int((~torch.isfinite(value)).sum())
        raise ValueError(
            f"{name} contains {bad} NaN/inf value(s); remove or impute them before passing data "
            "to the model."
        )


def check_inputs(
    X: Tensor,
    dim: int,
    bounds: Tensor | None = None,
    name: str = "X",
) -> None:
    r"""Check a ``... x q x d`` input tensor: at least 2-D, width ``dim``, finite, within bounds.

    Args:
        X: ``batch x q x d`` inputs.
        dim: the model's input dimension d.
        bounds: optional ``2 x d`` box (lower row, upper row) the inputs must lie in.
        name: how the tensor is called in the error message.
    """
    if not isinstance(X, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(X).__name__}.")
    if X.dim() < 2:
        raise ValueError(f"{name} must have shape ... x q x {dim}, got {tuple(X.shape)}.")
    if X.shape[-1] != dim:
        raise ValueError(
            f"{name} has {X.shape[-1]} columns but the model was built for {dim} input "
            f"dimensions (expected shape ... x q x {dim}, got {tuple(X.shape)})."
        )
    check_finite(name, X)
    if bounds is not None and X.numel() > 0:
        lower, upper = bounds[0].to(X), bounds[1].to(X)
        # A relative tolerance of a few ulps so points exactly on the boundary pass.
        tol = 1e-9 * (upper - lower)
        outside = (X < lower - tol) | (X > upper + tol)
        if bool(outside.any()):
            idx = outside.nonzero()[0].tolist()
            raise ValueError(
                f"{name} has {int(outside.any(-1).sum())} point(s) outside the model's input "
                f"bounds (first at index {idx}: value {float(X[tuple(idx)]):.6g}, allowed "
                f"[{float(lower[idx[-1]]):.6g}, {float(upper[idx[-1]]):.6g}]). Map inputs to the "
                "model's domain (loops use the unit cube) or build the model with wider bounds."
            )


def check_observations(
    X: Tensor,
    Y: Tensor,
    noise: Tensor | None,
    dim: int,
    num_outputs: int = 1,
    bounds: Tensor | None = None,
) -> None:
    r"""Check new training data ``X`` (``batch x q x d``), ``Y`` (``sample x batch x q x m``) and
    optional ``noise`` (same shape as ``Y`` or broadcastable to it, variances >= 0)."""
    check_inputs(X, dim=dim, bounds=bounds)
    if not isinstance(Y, Tensor):
        raise ValueError(f"Y must be a torch.Tensor, got {type(Y).__name__}.")
    if Y.dim() < 2 or Y.shape[-1] != num_outputs:
        raise ValueError(
            f"Y must have shape ... x q x {num_outputs} (one column per output), got "
            f"{tuple(Y.shape)}."
        )
    if Y.shape[-2] != X.shape[-2]:
        raise ValueError(
            f"X has {X.shape[-2]} rows but Y has {Y.shape[-2]}; they must match "
            f"(X {tuple(X.shape)}, Y {tuple(Y.shape)})."
        )
    try:
        torch.broadcast_shapes(X.shape[:-2], Y.shape[:-2])
    except RuntimeError as e:
        raise ValueError(
            f"Batch shapes of X {tuple(X.shape)} and Y {tuple(Y.shape)} do not broadcast."
        ) from e
    check_finite("Y", Y)
    if noise is not None:
        check_noise(noise, Y.shape)


def check_noise(noise: Tensor, shape: torch.Size) -> None:
    """Noise variances: finite, >= 0, broadcastable to ``shape``."""
    if not isinstance(noise, Tensor):
        raise ValueError(f"noise must be a torch.Tensor, got {type(noise).__name__}.")
    check_finite("noise", noise)
    if bool((noise < 0).any()):
        raise ValueError(
            f"noise holds {int((noise < 0).sum())} negative variance(s) (min "
            f"{float(noise.min()):.3g}); observation noise variances must be >= 0."
        )
    try:
        torch.broadcast_shapes(noise.shape, shape)
    except RuntimeError as e:
        raise ValueError(
            f"noise of shape {tuple(noise.shape)} does not broadcast to Y's shape {tuple(shape)}."
        ) from e
