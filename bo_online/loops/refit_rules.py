r"""The refit rules the BO loops (:class:`bo_online.loops.core.OnlineLoop`) and the Ax
integration (:mod:`bo_online.ax`) share: when a refit rebuilds the surrogate from its defaults
instead of warm-starting it, and when a model whose fit cost grows with n is due a refit."""

from __future__ import annotations

from typing import Any

__all__ = [
    "WARM_REFIT_MAX_ITER",
    "growth_refit_due",
    "has_own_regime_kernel",
    "is_exact_gp_on_data",
    "refits_from_defaults",
]

#: Iteration cap of a warm-started refit (the loops' ``fit_max_iter``, Ax's refits of a model it
#: has fitted before); a fit from the defaults gets four times as many. Warm starts begin near
#: an optimum, and over-parameterised surrogates (WISKI's 47 hyperparameters at 6 inputs) can
#: otherwise spend the whole default budget of 200 wandering along flat directions: measured in
#: Ax on Hartmann6 at 15 trials, 200 iterations, 16 s per warm refit.
WARM_REFIT_MAX_ITER = 50


def refits_from_defaults(model: Any, fit_cost_grows_with_n: bool) -> bool:
    r"""Whether a due refit of ``model`` rebuilds it on all data and fits from the defaults, as
    BoTorch refits its exact GP: always where the fit cost grows with n (the exact GP: the
    rebuild costs what its refit costs anyway), and for a model that says it is the exact GP on
    the data it holds (duck-typed ``is_exact_gp_on_data()``: t-SVGP and the decoupled SVGP with a
    Gaussian likelihood while every point is an inducing input / covariance basis, QSGP while it
    predicts with its kernel's exact GP)."""
    return fit_cost_grows_with_n or is_exact_gp_on_data(model)


def is_exact_gp_on_data(model: Any) -> bool:
    r"""What ``model.is_exact_gp_on_data()`` says (duck-typed; False for a model without it)."""
    is_exact = getattr(model, "is_exact_gp_on_data", None)
    return callable(is_exact) and bool(is_exact())


def has_own_regime_kernel(model: Any) -> bool:
    r"""Whether ``model``'s exact regime uses a kernel of its own (duck-typed
    ``regime_kernel == "ard"``: WISKI above 6 inputs), so that what it predicts with once it
    leaves the regime (SKI, a learned map) was never fitted there and needs a first fit."""
    return getattr(model, "regime_kernel", "ski") == "ard"


def growth_refit_due(n: int | None, n_last_fit: int | None, small_n: int, growth: float) -> bool:
    r"""The ``"auto"`` rule for a model whose fit cost grows with n: every time while
    ``n <= small_n`` (or n or the last fit's n is unknown), then once n has grown by the
    fraction ``growth`` since the last fit, so that all refits together cost a constant factor
    of one fit at the final n (a geometric series). The comparison allows for rounding: in
    floating point ``(1 + 0.1) * 100`` is 110.00000000000001, and n = 110 after a fit at 100
    has grown by 10%."""
    if n is None or n <= small_n or n_last_fit is None:
        return True
    return n - n_last_fit >= growth * n_last_fit * (1 - 1e-9)
