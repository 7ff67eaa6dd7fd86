r"""Input checks shared by every surrogate.

Every public entry point of a model validates its arguments here *before* any state changes, so
bad input raises a clear ``ValueError`` and the model is left exactly as it was.
"""

from __future__ import annotations

import difflib
import math
import numbers
import sys
import warnings
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

#: smallest observation-noise variance, in standardised units (variance / outcome_std**2):
#: GPyTorch's ``FixedGaussianNoise`` rounds smaller values up to the same 1e-6 (after BoTorch
#: standardises Y), because below it the Cholesky / Woodbury solves lose all precision (WISKI gave
#: NaN at 1e-300).
NOISE_FLOOR = 1e-6


def detached(*values):
    r"""Each tensor of ``values`` detached from any autograd graph (others as they are).

    A model's training data are data: a ``train_Y`` that still carries the graph that computed it
    (an objective built on a torch model) would make every fit's backward pass run through that
    graph again and fail.
    """
    return tuple(v.detach() if isinstance(v, Tensor) else v for v in values)


def require_modules(covar_module: Any = None, likelihood: Any = None) -> None:
    r"""Refuse a ``covar_module`` that is no GPyTorch ``Kernel`` or a ``likelihood`` that is no
    GPyTorch Gaussian likelihood, the only kind the exact-regression models take (a name from
    ``--model-option covar_module=rbf`` was kept and failed in the first fit, with a traceback).
    A ``TypeError``, which the loops report as an option the model rejects."""
    from gpytorch.kernels import Kernel
    from gpytorch.likelihoods import FixedNoiseGaussianLikelihood, GaussianLikelihood

    if covar_module is not None and not isinstance(covar_module, Kernel):
        raise TypeError(
            f"covar_module must be a GPyTorch Kernel, got {covar_module!r} (e.g. "
            "covar_module='gpytorch.kernels.MaternKernel(nu=2.5)')."
        )
    gaussian = (GaussianLikelihood, FixedNoiseGaussianLikelihood)
    if likelihood is not None and not isinstance(likelihood, gaussian):
        raise TypeError(
            f"likelihood must be a GPyTorch GaussianLikelihood, got {likelihood!r} (a "
            "non-Gaussian likelihood needs the tsvgp model, e.g. likelihood="
            "'bo_online.likelihoods.StudentT()')."
        )


def require_bool(value: Any, name: str) -> bool:
    r"""``value`` if it is a boolean (Python or NumPy), else a ``TypeError``: a string such as
    ``--model-option standardize=maybe`` would otherwise be read as true."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def is_complex(value: Any) -> bool:
    r"""Whether ``value`` (a tensor, an array, a number or a nested list) holds complex numbers,
    which ``torch.as_tensor(value, dtype=float64)`` cuts to their real part with only a warning."""
    if isinstance(value, Tensor):
        return value.is_complex()
    if isinstance(value, (list, tuple)):  # may hold tensors (with autograd, on a GPU)
        return any(is_complex(v) for v in value)
    return bool(np.iscomplexobj(value))


def real_float64(value: Any, what: str) -> Tensor:
    r"""``value`` as a detached float64 tensor (a new one only where a conversion needs it).

    Raises:
        ValueError: naming ``what`` if ``value`` holds complex numbers, or anything that is not
            a number (text, None for a failed measurement, ragged rows), which torch reported
            without naming it (``too many dimensions 'str'``, ``must be real number, not
            NoneType``).
    """
    if is_complex(value):
        raise ValueError(f"{what} holds complex values; pass real numbers.")
    try:
        return torch.as_tensor(value, dtype=torch.float64).detach()
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(
            f"{what} must hold real numbers only (a tensor, array or list of them), got "
            f"{type(value).__name__} {_preview(value)} ({e}); leave out points that have no "
            "value (a failed measurement) and convert text to numbers."
        ) from e


def _preview(value: Any, width: int = 60) -> str:
    """``repr(value)`` cut to ``width`` characters."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def max_abs_output(dtype: torch.dtype) -> float:
    r"""Largest |y| accepted: 1e-4 x sqrt(largest float), so sums of squares over many points and
    standardisation cannot overflow (float64: ~1.3e150; float32: ~1.8e15)."""
    return 1e-4 * math.sqrt(torch.finfo(dtype).max)


def closest_name_hint(name: str, names: Iterable[str]) -> str:
    r"""``" (did you mean 'grid_size'?)"`` for a misspelt ``name`` (``"gridsize"``) when one of
    ``names`` is close to it (``difflib``'s closeness); else ``""``."""
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def whole_number(name: str, value: Any, low: int) -> int:
    r"""``value`` as an ``int >= low`` (any integral number, a real number with a whole value
    -- NumPy's float32 included -- or a 0-d tensor / array of either), else a ``ValueError``
    naming ``name``; booleans, NaN and inf are refused."""
    if isinstance(value, (Tensor, np.ndarray)) and value.ndim == 0:
        value = value.item()  # WISKI's grid_size takes these too
    whole = isinstance(value, numbers.Integral) or (
        isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer()
    )
    if isinstance(value, bool) or not whole or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
    return int(value)


def check_magnitude(name: str, value: Tensor, dtype: torch.dtype) -> None:
    r"""Raise ``ValueError`` if ``|value|`` reaches :func:`max_abs_output` of ``dtype``."""
    limit = max_abs_output(dtype)
    if value.numel() and bool((value.abs() >= limit).any()):
        raise ValueError(
            f"{name} holds values of magnitude up to {float(value.abs().max()):.3g}; a "
            f"{str(dtype).replace('torch.', '')} model accepts |{name}| < {limit:.3g} (beyond it "
            f"standardisation overflows). Rescale {name} (e.g. divide by a constant) first."
        )


#: below float64, targets whose spread is under this many rounding steps at their level (the
#: dtype's epsilon times |mean|) are reported: the model sees at most a coarse copy of them
_MIN_STEPS_PER_SPREAD = 1e3


#: How far (in units of the unit cube) training inputs may stray from it before
#: :func:`warn_unless_unit_scaled` warns (BoTorch's ``check_min_max_scaling`` tolerance).
UNIT_CUBE_ATOL = 1e-2


def warn_unless_unit_scaled(X: Tensor, model: str) -> None:
    r"""Warn (BoTorch's ``InputDataWarning``) when the transformed training inputs ``X``
    (``n x d``) stray from the unit cube, for which the default kernel's lengthscale prior
    (BoTorch's dimension-scaled one) is made: BoTorch's ``SingleTaskGP`` warns there too. On
    Styblinski-Tang 8-D in its own box [-5, 5]^8 with 17 points, an exact GP's fit left every
    lengthscale at its start (0.58: each pair of points looks unrelated, the evidence is flat),
    where the same data in the unit cube fit lengthscales of 0.17-2.1."""
    from botorch.exceptions.warnings import InputDataWarning

    if X.numel() == 0:
        return
    lo, hi = float(X.detach().min()), float(X.detach().max())
    if lo >= -UNIT_CUBE_ATOL and hi <= 1 + UNIT_CUBE_ATOL:
        return
    warnings.warn(
        f"{model}: the training inputs span [{lo:.3g}, {hi:.3g}], outside the unit cube that "
        "its default kernel's lengthscale prior is made for (with few points in many "
        "dimensions the fit may not move the lengthscales at all). Map the inputs to [0, 1]^d: "
        "pass input_transform=Normalize(d, bounds=...) (botorch.models.transforms.input), as "
        "the loops do, or a kernel of your own.",
        InputDataWarning,
        stacklevel=_stacklevel_outside_models(),
    )


def _stacklevel_outside_models() -> int:
    r"""The ``stacklevel`` for a warning raised in this module's caller that names the first
    frame outside ``bo_online.models``: the line that built the model, also where a subclass
    (``TSVGPClassifier``) or a model built inside another (a WISKI classifier's class models)
    called the constructor that warns."""
    frame, level = sys._getframe(2), 2  # level 2: the function that calls warnings.warn
    while frame is not None and frame.f_globals.get("__name__", "").startswith("bo_online.models"):
        frame, level = frame.f_back, level + 1
    return level


def warn_if_offset_hides_signal(train_Y: Tensor, dtype: torch.dtype) -> None:
    r"""Warn when ``train_Y`` (``n x m``) cast to ``dtype`` (below float64) varies so little
    around its level that the rounding there is a sizeable part of the variation (``1e8 + O(1)``
    in float32, where the spacing is 8), or not at all where ``train_Y`` did: the model cannot
    learn what the cast removed. Targets that are constant as given are not reported. Nothing
    is changed."""
    if dtype == torch.float64 or train_Y.shape[-2] < 2:
        return
    given = train_Y.detach()
    Y = given.to(dtype)
    level = Y.mean(dim=-2).abs()
    spread = Y.std(dim=-2)
    step = torch.finfo(dtype).eps * level
    coarse = (spread > 0) & (spread < _MIN_STEPS_PER_SPREAD * step)
    lost = (spread == 0) & (given.std(dim=-2) > 0)
    hidden = coarse | lost
    if bool(hidden.any()):
        j = int(torch.nonzero(hidden.reshape(-1))[0])
        name = str(dtype).replace("torch.", "")
        centre = float(Y.mean(dim=-2).reshape(-1)[j])
        warnings.warn(
            f"train_Y varies by {float(spread.reshape(-1)[j]):.3g} around {centre:.6g}, where "
            f"{name} resolves steps of {float(step.reshape(-1)[j]):.3g}: little of the signal "
            "survives the cast. Subtract the offset (e.g. y - y.mean()) in float64 before "
            "casting, or use float64 (bo_online's loops centre and scale targets before the "
            "cast themselves).",
            UserWarning,
            stacklevel=4,
        )


def warn_if_rounding_hides_new_targets(Y: Tensor, dtype: torch.dtype, outcome_std: Tensor) -> None:
    r"""Warn when new targets ``Y`` (``... x q x m``) in ``dtype`` (below float64) lie at a level
    where its rounding steps exceed a thousandth of the model's outcome standard deviation
    (``(m,)``): 1e8-level targets given to a float32 model built on O(1) ones lose their
    variation in the cast, as at construction (:func:`warn_if_offset_hides_signal`)."""
    if dtype == torch.float64 or Y.numel() == 0:
        return
    step = torch.finfo(dtype).eps * Y.detach().abs().amax(dim=tuple(range(Y.dim() - 1)))
    if bool((step > outcome_std.detach().to(step) / _MIN_STEPS_PER_SPREAD).any()):
        warnings.warn(
            f"new targets reach {float(Y.detach().abs().max()):.6g}, where "
            f"{str(dtype).replace('torch.', '')} resolves steps of {float(step.max()):.3g} "
            f"against the model's outcome sd {float(outcome_std.min()):.3g}: little of their "
            "variation survives the cast. Subtract the offset in float64 first, or use float64.",
            UserWarning,
            stacklevel=4,
        )


#: Relative distance below the floor that counts as rounding, not as a smaller noise.
_FLOOR_ROUNDING = 1e-6


def floor_noise(
    noise: Tensor, floor: Tensor | float = NOISE_FLOOR, units: str = "standardised"
) -> Tensor:
    r"""``noise`` (variances) with every positive value below ``floor`` (broadcastable) raised to
    it, with a ``NumericalWarning``; returned unchanged otherwise. Zeros (noise-free) are kept."""
    floor = torch.as_tensor(floor, dtype=noise.dtype, device=noise.device)
    # Exact zeros mean "noise-free" and are left to the model (which accepts or refuses them).
    low = (noise < floor) & (noise > 0)
    if not bool(low.any()):
        return noise
    from gpytorch.utils.warnings import NumericalWarning

    # Values at the floor but for rounding (a noise set to the floor in other units, then
    # rescaled, e.g. by a refit's re-standardisation) are raised without a word: the message
    # would report the floor itself as "below the floor" on every refit.
    if bool(((noise < floor * (1 - _FLOOR_ROUNDING)) & (noise > 0)).any()):
        warnings.warn(
            f"{int(low.sum())} observation-noise variance(s) below the floor of "
            f"{NOISE_FLOOR:g} ({units} units) were raised to it (smallest given: "
            f"{float(noise.min()):.3g}).",
            NumericalWarning,
            stacklevel=3,
        )
    return torch.where(low, floor.expand_as(noise) if floor.dim() else floor, noise)


def train_noise_floor(train_Y: Tensor) -> Tensor:
    r""":data:`NOISE_FLOOR` in the user's units of the initial outcomes ``train_Y`` (``n x m``):
    ``NOISE_FLOOR * var(train_Y)`` per output (variance 1 where it is 0 or n = 1), i.e. the
    standardised floor under the model's standardisation."""
    var = train_Y.var(dim=-2) if train_Y.shape[-2] > 1 else torch.ones_like(train_Y[..., 0, :])
    return NOISE_FLOOR * torch.where(var > 0, var, torch.ones_like(var))


def check_finite(name: str, value: Tensor) -> None:
    """Raise ``ValueError`` if ``value`` holds NaN or inf."""
    if not bool(torch.isfinite(value).all()):
        bad = int((~torch.isfinite(value)).sum())
        raise ValueError(
            f"{name} contains {bad} NaN/inf value(s); remove or impute them before passing data "
            "to the model."
        )


class Outside(NamedTuple):
    r"""Where a tensor leaves a box: see :func:`first_outside`."""

    #: full index (one entry per dimension of ``X``) of the first entry outside, row-major.
    index: list[int]
    #: number of points (rows along the last dimension) with at least one entry outside.
    count: int


def first_outside(X: Tensor, lower: Tensor | float, upper: Tensor | float) -> Outside | None:
    r"""The first entry of ``X`` outside the box ``[lower, upper]`` and how many points leave it.

    One comparison pass and one reduction; the index and count are only computed when some entry
    is outside, so this is cheap enough for hot paths (e.g. the WISKI grid's interpolation).

    Args:
        X: ``... x n x d`` points.
        lower: lower corner, broadcastable to ``X`` (e.g. ``d`` or a scalar); any tolerance is
            the caller's (pass ``lower - tol``).
        upper: upper corner, broadcastable to ``X``.

    Returns:
        ``None`` if every entry satisfies ``lower <= X <= upper``, else :class:`Outside`
        (``index``: the first offending entry in row-major order; ``count``: the number of
        points, along the last dimension, with some entry outside). NaN entries count as outside.
    """
    outside = ~((X >= lower) & (X <= upper))  # NaN fails both comparisons
    if not bool(outside.any()):
        return None
    return Outside(index=outside.nonzero()[0].tolist(), count=int(outside.any(-1).sum()))


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
    if X.is_complex():  # a cast to the model's dtype would keep only the real part
        raise ValueError(
            f"{name} must hold real numbers, got a {X.dtype} tensor ({name}.real if the "
            "imaginary parts are zero)."
        )
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
        # Points on the boundary pass, and so do those a few ulps of X's own dtype beyond it
        # (rounding in float32 is ~1e-7, far above the relative 1e-9).
        eps = torch.finfo(X.dtype).eps
        tol = torch.maximum(1e-9 * (upper - lower), 4 * eps * (lower.abs() + upper.abs()))
        # A NaN bound (lower - tol or upper + tol) limits nothing on its side, as it always has.
        low = torch.nan_to_num(lower - tol, nan=-math.inf)
        high = torch.nan_to_num(upper + tol, nan=math.inf)
        outside = first_outside(X, low, high)
        if outside is not None:
            idx = outside.index
            raise ValueError(
                f"{name} has {outside.count} point(s) outside the model's input "
                f"bounds (first at index {idx}: value {float(X[tuple(idx)]):.10g}, allowed "
                f"[{float(lower[idx[-1]]):.10g}, {float(upper[idx[-1]]):.10g}]). Map inputs to the "
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
    if Y.dtype == torch.bool or Y.is_complex():
        raise ValueError(
            f"Y must hold real numbers, got a {str(Y.dtype).replace('torch.', '')} tensor; "
            "convert it first (e.g. Y.double(): labels True/False become 1.0/0.0)."
        )
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
    check_magnitude("Y", Y, X.dtype if X.dtype.is_floating_point else torch.float64)
    if noise is not None:
        check_noise(noise, Y.shape)


def check_noise(noise: Tensor, shape: torch.Size, posterior: bool = False) -> None:
    """Noise variances: finite, >= 0, broadcastable to ``shape`` (the observations ``Y``'s, or
    with ``posterior`` a posterior's ``batch x q x m``) without enlarging it."""
    if not isinstance(noise, Tensor):
        raise ValueError(f"noise must be a torch.Tensor, got {type(noise).__name__}.")
    if noise.is_complex():
        raise ValueError(f"noise must hold real numbers (variances), got a {noise.dtype} tensor.")
    check_finite("noise", noise)
    if bool((noise < 0).any()):
        raise ValueError(
            f"noise holds {int((noise < 0).sum())} negative variance(s) (min "
            f"{float(noise.min()):.3g}); observation noise variances must be >= 0."
        )
    try:
        fits = torch.broadcast_shapes(noise.shape, shape) == shape
    except RuntimeError:
        fits = False
    if not fits:  # e.g. n variances against n x 1 observations would broadcast to n x n
        if posterior:
            raise ValueError(
                f"observation_noise of shape {tuple(noise.shape)} does not broadcast to the "
                f"posterior's shape {tuple(shape)} (batch x q x outputs); give one variance per "
                "point and output (e.g. q x 1 for one output)."
            )
        raise ValueError(
            f"noise of shape {tuple(noise.shape)} does not broadcast to Y's shape {tuple(shape)}; "
            "give one variance per observation in Y's shape (e.g. n x 1: noise.unsqueeze(-1))."
        )
