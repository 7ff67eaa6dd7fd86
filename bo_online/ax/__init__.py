r"""Ax integration: every bo_online surrogate as an Ax (Modular BoTorch) surrogate.

Ax 1.x builds the BoTorch model of a ``BoTorchGenerator`` afresh for every trial it generates:
``Cls.construct_inputs(training_data, **model_options)``, then ``Cls(**inputs)`` (with the
``input_transform`` Ax makes), then ``fit_botorch_model(model, ...)``. This module supplies, for
each bo_online model class ``M``, an Ax-facing subclass ``AxM`` (``AxOnlineExactGP``,
``AxWISKI``, ...) that keeps what online surrogates are for inside that loop:

* **Incremental construction.** A small in-process store remembers, per (experiment, model
  class, outcome, features) -- the experiment being the generation strategy's own random
  ``experiment_key`` --, the last model Ax built *and fitted* to generate a trial, with the
  training data Ax handed it (cross-validation folds, into which Ax loads a ``state_dict``, are
  never remembered). When the new training data
  *extends* those data (identical earlier inputs, earlier outcomes equal up to the positive affine
  map Ax's ``StandardizeY`` introduces as its statistics move), the new model is the previous one
  conditioned on the new rows only (``condition_on_observations``) -- not a rebuild. Anything else
  (rows changed, reordered or removed, other options, another input transform, a nonlinear
  outcome transform such as ``Winsorize`` moving earlier values) rebuilds from scratch.
* **Exact under changing standardisation.** Ax standardises outcomes with the statistics of the
  data it currently holds, so the same raw value arrives as a different number every trial. The
  map between the old and the new Ax units is affine, ``y_new = a y_old + b`` (``a > 0``);
  ``a, b`` are recovered from the earlier rows by least squares and the fit is checked to
  round-off (no exact fit, no reuse). The model keeps the units of the trial it was built at
  ("anchor" units) and the Ax subclass carries the composed map from anchor to current Ax
  units: posteriors are mapped out (``mean a + b``, covariance ``a^2``), new observations are
  mapped in (``(y - b) / a``, variances ``/ a^2``). That is exactly the model of the same data,
  whatever the model stores internally.
* **Refit on a schedule.** Hyperparameters are refit after a rebuild and, on the incremental
  path, on the ``refit_every`` schedule: ``"auto"`` (default) is the BO loops' (every trial with
  new data; the exact GP, t-SVGP and the decoupled SVGP beyond 100 observations once they have
  grown by 10%; rebuilt and fitted from the defaults where the loops rebuild; unlike the
  loops, WISKI with a learned projection refits its kernel, not the projection, every trial),
  an integer k every k new observations, ``None`` never.
* **Non-finite outcomes.** An ``inf`` or NaN outcome is dropped with a warning
  (:class:`DropNonFiniteY`, the first outcome transform), so later trials can still be generated;
  without it Ax's standardisation turns every outcome into NaN and generation stops for good.
* **Storage.** Every bo_online class and its Ax subclass are registered with Ax's JSON/SQA
  registries, and ``fit_botorch_model`` is taught to fit :class:`OnlineModel` s.

Everything is registered on import (:func:`register_all`); :func:`register_model_class` adds a
class explicitly. :func:`make_generation_strategy` returns a ready Sobol -> bo_online strategy.

Use from Ax::

    import bo_online.ax as boax
    client.set_generation_strategy(boax.make_generation_strategy("OnlineExactGP"))

The store lives in this process; a client loaded from JSON starts with a rebuild, then goes on
incrementally. :func:`clear_sessions` empties it.
"""

from __future__ import annotations

from bo_online.ax.generation import (
    DropNonFiniteY,
    _register_transform,
    make_generation_strategy,
)
from bo_online.ax.registration import (
    DEFAULT_MODEL_PATHS,
    register_all,
    register_model_class,
)
from bo_online.ax.store import clear_sessions, session_stats
from bo_online.ax.surrogate import (
    DEFAULT_REFIT_EVERY,
    AxOnlineMixin,
    available_models,
    ax_model_class,
)

__all__ = [
    "DEFAULT_MODEL_PATHS",
    "DEFAULT_REFIT_EVERY",
    "AxOnlineMixin",
    "ax_model_class",
    "register_model_class",
    "register_all",
    "available_models",
    "make_generation_strategy",
    "clear_sessions",
    "session_stats",
    "DropNonFiniteY",
]

register_all()  # also sets AxOnlineExactGP, AxWISKI, ... as attributes of this package
_register_transform()
