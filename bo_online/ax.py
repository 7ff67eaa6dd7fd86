r"""Ax integration: every bo_online surrogate as an Ax (Modular BoTorch) surrogate.

Ax 1.x builds the BoTorch model of a ``BoTorchGenerator`` afresh for every trial it generates:
``Cls.construct_inputs(training_data, **model_options)``, then ``Cls(**inputs)`` (with the
``input_transform`` Ax makes), then ``fit_botorch_model(model, ...)``. This module supplies, for
each bo_online model class ``M``, an Ax-facing subclass ``AxM`` (``AxOnlineExactGP``,
``AxWISKI``, ...) that keeps what online surrogates are for inside that loop:

* **Incremental construction.** A small in-process store remembers, per (experiment, model
  class, outcome, features) -- the experiment being the generation strategy's own random
  ``experiment_key`` --, the last model Ax built *and fitted* to generate a trial, with the training data Ax
  handed it (cross-validation folds, into which Ax loads a ``state_dict``, are never
  remembered). When the new training data
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
  path, once ``refit_every`` new observations have arrived since the last fit (``None``: never).
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

import importlib
import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from ax.adapter.transforms.base import Transform
from torch import Tensor

from bo_online.models.base import OnlineModel

__all__ = [
    "DEFAULT_MODEL_PATHS",
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

#: Dotted paths of the bo_online surrogates made available to Ax on import (skipped while absent).
DEFAULT_MODEL_PATHS: tuple[str, ...] = (
    "bo_online.models.OnlineExactGP",
    "bo_online.models.WISKI",
    "bo_online.models.TSVGP",
    "bo_online.models.DecoupledSVGP",
    "bo_online.models.QSGP",
)

#: Default number of new observations between hyperparameter refits on the incremental path.
DEFAULT_REFIT_EVERY = 10

# Relative tolerance when checking that earlier outcomes are an exact affine image of the ones
# the previous model saw (Ax standardises in float64, so agreement is at round-off level).
_AFFINE_RTOL = 1e-9

_AX_CLASSES: dict[type[OnlineModel], type] = {}
_REGISTERED: dict[str, type] = {}
_LOCK = threading.RLock()


# ====================================================================== the per-process store


@dataclass
class _Session:
    """What the last model built for one (class, outcomes, features) key saw."""

    model: OnlineModel
    X: Tensor  # n x d, Ax's training inputs (before the model's input transform)
    Y: Tensor  # n x 1, in the Ax outcome units of that trial
    Yvar: Tensor | None  # n x 1 or None
    fingerprint: Any  # options + input transform, to decide whether reuse is allowed


@dataclass
class _Stats:
    """Counts of what the Ax subclasses did (read by tests and benchmarks)."""

    rebuilds: int = 0
    incremental: int = 0
    refits: int = 0
    reasons: deque[str] = field(default_factory=lambda: deque(maxlen=100))  # latest rebuilds
    construct_seconds: float = 0.0  # wall time in the constructor (rebuild or condition)
    fit_seconds: float = 0.0  # wall time in Ax's fitting step (refits)


class _SessionStore:
    """Bounded LRU map key -> :class:`_Session` (few experiments are live in one process)."""

    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Any, _Session] = OrderedDict()
        self.stats = _Stats()

    def get(self, key: Any) -> _Session | None:
        with _LOCK:
            session = self._items.get(key)
            if session is not None:
                self._items.move_to_end(key)
            return session

    def put(self, key: Any, session: _Session) -> None:
        with _LOCK:
            self._items[key] = session
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with _LOCK:
            self._items.clear()
            self.stats = _Stats()


_SESSIONS = _SessionStore()


def clear_sessions() -> None:
    """Forget every remembered model (the next construction in each experiment rebuilds)."""
    _SESSIONS.clear()


def session_stats() -> _Stats:
    """Counts of rebuilds, incremental constructions and refits since the last clear."""
    return _SESSIONS.stats


# ====================================================================== fingerprints


def _fingerprint(value: Any) -> Any:
    r"""A comparable snapshot of a constructor option: tensors cloned, modules as their type and
    state (taken before any fitting, so a fresh module from the same ``ModelConfig`` matches)."""
    if isinstance(value, Tensor):
        return ("tensor", value.detach().clone())
    if isinstance(value, torch.nn.Module):
        state = {k: v.detach().clone() for k, v in value.state_dict().items()}
        return ("module", type(value).__qualname__, state)
    if isinstance(value, Mapping):
        return ("map", {k: _fingerprint(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return ("seq", [_fingerprint(v) for v in value])
    return ("value", value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (
            isinstance(a, Tensor)
            and isinstance(b, Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # values without a usable equality never match
        return False


# ====================================================================== the reuse decision


def _affine_map(y_old: Tensor, y_new: Tensor) -> tuple[float, float] | None:
    r"""``(a, b)`` with ``y_new = a y_old + b`` exactly (to round-off) and ``a > 0``, else None.

    Identical values give ``(1, 0)``. Otherwise at least three earlier points with distinct values
    are required: with two, every pair of values is an affine image of every other pair, so a
    changed observation could not be told from a change of standardisation.
    """
    if torch.equal(y_old, y_new):
        return 1.0, 0.0
    y_old, y_new = y_old.reshape(-1), y_new.reshape(-1)
    if y_old.numel() < 3:
        return None
    xc = y_old - y_old.mean()
    var = xc.pow(2).sum()
    if var <= 0:
        return None
    a = float((xc * (y_new - y_new.mean())).sum() / var)
    b = float(y_new.mean() - a * y_old.mean())
    if not (a > 0 and math.isfinite(a) and math.isfinite(b)):
        return None
    scale = float(y_new.abs().max()) + abs(b) + 1.0
    if float((a * y_old + b - y_new).abs().max()) > _AFFINE_RTOL * scale:
        return None
    return a, b


def _plan_reuse(
    session: _Session, X: Tensor, Y: Tensor, Yvar: Tensor | None, fingerprint: Any
) -> tuple[float, float] | str:
    """The affine map to reuse ``session.model`` with, or the reason it cannot be reused."""
    n_old = session.X.shape[0]
    if not _same(session.fingerprint, fingerprint):
        return "model options or input transform changed"
    if X.shape[0] < n_old or X.shape[-1] != session.X.shape[-1]:
        return "fewer rows or other features than before"
    if X.dtype != session.X.dtype or X.device != session.X.device:
        return "dtype or device changed"
    if not torch.equal(X[:n_old], session.X):
        return "earlier inputs changed or were reordered"
    if (Yvar is None) != (session.Yvar is None):
        return "observation-noise information appeared or disappeared"
    ab = _affine_map(session.Y, Y[:n_old])
    if ab is None:
        return "earlier outcomes are not an affine image of the previous ones"
    a, _ = ab
    if Yvar is not None:
        expected = session.Yvar * a**2
        tol = _AFFINE_RTOL * (float(expected.abs().max()) + 1e-300)
        if float((Yvar[:n_old] - expected).abs().max()) > tol:
            return "earlier noise variances changed"
    return ab


def _extended_model(
    previous: OnlineModel, a: float, b: float, X_new: Tensor, Y_new: Tensor, Yvar_new: Tensor | None
) -> OnlineModel:
    r"""``previous`` re-expressed in the new Ax units and conditioned on the new rows.

    The model itself keeps the units of the trial at which it was built (its *anchor* units);
    only the affine map from those to Ax's current units, ``(_ax_scale, _ax_shift)``, is
    composed with the new ``y_new = a y_old + b`` on a shallow copy. The Ax subclass applies the
    map in ``posterior`` and inverts it in ``condition_on_observations`` / ``update``, so nothing
    is assumed about how a model stores its statistics. ``previous`` itself is untouched.
    """
    model = previous._shallow_copy()
    model._ax_scale = a * previous._ax_scale
    model._ax_shift = a * previous._ax_shift + b
    if X_new.shape[0] == 0:
        return model
    # BoTorch's convention: Y in (Ax) user units, noise in the model's standardised units,
    # i.e. anchor-unit variances over outcome_std^2.
    noise = None
    if Yvar_new is not None:
        noise = Yvar_new / (model._ax_scale**2 * model.outcome_std.pow(2))
    return model.condition_on_observations(X_new, Y_new, noise=noise)


# ====================================================================== the Ax subclass


class AxOnlineMixin:
    r"""Mixed in before a bo_online model class to make the class Ax builds every trial.

    ``construct_inputs`` accepts the model's own constructor options plus:

    * ``refit_every`` (int or None, default 10): refit hyperparameters once this many new
      observations have been folded in incrementally since the last fit; ``None`` never refits
      after a rebuild; 1 refits whenever data arrive.
    * ``fit_options`` (dict): keyword arguments for the model's ``fit`` (e.g. ``max_iter``).
    * ``incremental`` (bool, default True): False rebuilds and refits every trial, as Ax does for
      its own models.
    * ``experiment_key`` (str): which experiment the model belongs to (set per generation
      strategy by :func:`make_generation_strategy`), so experiments do not share stored models.
    """

    _bo_online_base: type[OnlineModel]

    @classmethod
    def construct_inputs(
        cls,
        training_data: Any,
        refit_every: int | None = DEFAULT_REFIT_EVERY,
        fit_options: dict[str, Any] | None = None,
        incremental: bool = True,
        experiment_key: str | None = None,
        **model_options: Any,
    ) -> dict[str, Any]:
        r"""Constructor arguments from an Ax ``SupervisedDataset`` (``X``: ``n x d``,
        ``Y``: ``n x 1``, ``Yvar``: ``n x 1`` or None) and ``ModelConfig.model_options``."""
        unsupported = [
            k
            for k in ("categorical_features", "fidelity_features", "task_feature")
            if k in model_options
        ]
        if unsupported:
            raise ValueError(
                f"{cls.__name__} models continuous parameters only; the search space has "
                f"{unsupported}. Use Ax's default surrogate for mixed or multi-fidelity problems."
            )
        if refit_every is not None and int(refit_every) < 1:
            raise ValueError(f"refit_every must be a positive integer or None, got {refit_every}.")
        Y = training_data.Y
        if Y.dim() != 2 or Y.shape[-1] != 1:
            raise ValueError(
                f"{cls.__name__} is single-output; got outcomes of shape {tuple(Y.shape)}."
            )
        Yvar = training_data.Yvar
        if Yvar is not None and bool(torch.isnan(Yvar).all()):
            Yvar = None  # Ax marks unknown noise with NaN: infer it
        # The defaults the loops and the CLI give the model for this many inputs (e.g. WISKI's
        # structure above 3 inputs); the user's model_options win.
        defaults = getattr(cls._bo_online_base, "loop_default_options", None)
        if callable(defaults):
            model_options = {**defaults(training_data.X.shape[-1]), **model_options}
        return {
            "train_X": training_data.X,
            "train_Y": Y,
            "train_Yvar": Yvar,
            # The experiment's own key first: two experiments with the same parameter and
            # metric names in one process each keep their own model.
            "ax_key": (
                experiment_key,
                tuple(training_data.outcome_names),
                tuple(training_data.feature_names),
            ),
            "ax_refit_every": None if refit_every is None else int(refit_every),
            "ax_fit_options": dict(fit_options or {}),
            "ax_incremental": bool(incremental),
            **model_options,
        }

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        input_transform: Any | None = None,
        covar_module: Any | None = None,
        likelihood: Any | None = None,
        ax_key: Any = None,
        ax_refit_every: int | None = DEFAULT_REFIT_EVERY,
        ax_fit_options: dict[str, Any] | None = None,
        ax_incremental: bool = True,
        **options: Any,
    ) -> None:
        t0 = time.perf_counter()
        if covar_module is not None:
            options["covar_module"] = covar_module
        if likelihood is not None:
            options["likelihood"] = likelihood
        fingerprint = _fingerprint({"options": options, "input_transform": input_transform})
        key = None if ax_key is None else (type(self).__qualname__, ax_key)
        session = _SESSIONS.get(key) if (key is not None and ax_incremental) else None
        plan: tuple[float, float] | str = "no previous model"
        if session is not None:
            plan = _plan_reuse(session, train_X, train_Y, train_Yvar, fingerprint)
        extended = None
        if isinstance(plan, tuple):
            n_old = session.X.shape[0]
            new_yvar = None if train_Yvar is None else train_Yvar[n_old:]
            try:
                extended = _extended_model(
                    session.model, *plan, train_X[n_old:], train_Y[n_old:], new_yvar
                )
            except Exception as err:  # e.g. a factor update that lost definiteness
                # A rebuild is always correct; input that is truly bad fails there as well.
                plan = f"incremental update failed ({type(err).__name__}: {err}); rebuilt"
        if extended is not None:
            # Become that model: the same thing ``copy.copy`` does to a fresh instance.
            self.__dict__.update(extended.__dict__)
            since = session.model._ax_obs_since_fit  # None: never fitted, so still due
            self._ax_obs_since_fit = None if since is None else since + train_X.shape[0] - n_old
            _SESSIONS.stats.incremental += 1
        else:
            super().__init__(  # type: ignore[call-arg]
                train_X, train_Y, train_Yvar, input_transform=input_transform, **options
            )
            self._ax_obs_since_fit = None  # never fitted
            _SESSIONS.stats.rebuilds += 1
            _SESSIONS.stats.reasons.append(plan)
        self._ax_refit_every = ax_refit_every
        self._ax_fit_options = dict(ax_fit_options or {})
        # Remembered once Ax's fitting step has run (``ax_fit``), and only for the models Ax
        # builds to generate trials: a model that Ax loads a ``state_dict`` into is a
        # cross-validation fold or a warm start on other data, and is never remembered.
        self._ax_pending = None
        if key is not None:
            self._ax_pending = (
                key,
                _Session(
                    model=self,  # type: ignore[arg-type]
                    X=train_X.detach().clone(),
                    Y=train_Y.detach().clone(),
                    Yvar=None if train_Yvar is None else train_Yvar.detach().clone(),
                    fingerprint=fingerprint,
                ),
            )
        _SESSIONS.stats.construct_seconds += time.perf_counter() - t0

    # ------------------------------------------------------------------ Ax units <-> anchor units

    _ax_scale: float = 1.0  # current Ax units = _ax_scale * anchor units + _ax_shift
    _ax_shift: float = 0.0

    def _ax_identity(self) -> bool:
        return self._ax_scale == 1.0 and self._ax_shift == 0.0

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: Any | None = None,
        **kwargs: Any,
    ) -> Any:
        r"""The model's posterior mapped from its anchor units to Ax's current units
        (``observation_noise`` tensors are in the model's standardised units, as BoTorch's)."""
        post = super().posterior(  # type: ignore[misc]
            X, output_indices=output_indices, observation_noise=observation_noise, **kwargs
        )
        if not self._ax_identity():
            from botorch.posteriors.gpytorch import GPyTorchPosterior
            from gpytorch.distributions import MultivariateNormal

            mvn = post.distribution
            post = GPyTorchPosterior(
                MultivariateNormal(
                    mvn.mean * self._ax_scale + self._ax_shift,
                    mvn.lazy_covariance_matrix * (self._ax_scale**2),
                )
            )
        if posterior_transform is not None:
            return posterior_transform(post)
        return post

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> Any:
        r"""``Y`` in Ax's current units (as ``posterior`` speaks them, so ``fantasize`` works);
        ``noise`` in the model's standardised units."""
        if not self._ax_identity():
            Y = (Y - self._ax_shift) / self._ax_scale
        return super().condition_on_observations(X, Y, noise=noise, **kwargs)  # type: ignore[misc]

    def update(self, X: Tensor, Y: Tensor, noise: Tensor | None = None) -> Any:
        r"""``Y`` and ``noise`` (variances) in Ax's current units."""
        if not self._ax_identity():
            Y = (Y - self._ax_shift) / self._ax_scale
            noise = None if noise is None else noise / self._ax_scale**2
        return super().update(X, Y, noise)  # type: ignore[misc]

    # ------------------------------------------------------------------ fitting

    @property
    def refit_due(self) -> bool:
        """Whether Ax's fitting step should refit the hyperparameters now."""
        since = self._ax_obs_since_fit
        if since is None:
            return True
        every = self._ax_refit_every
        return every is not None and since >= every

    def ax_fit(self) -> None:
        """Refit if due (Ax's ``fit_botorch_model`` lands here), else keep the hyperparameters;
        then remember this model for the next trial's construction."""
        if self.refit_due:
            t0 = time.perf_counter()
            self.fit(**self._ax_fit_options)  # type: ignore[attr-defined]
            self._ax_obs_since_fit = 0
            _SESSIONS.stats.refits += 1
            _SESSIONS.stats.fit_seconds += time.perf_counter() - t0
        if self._ax_pending is not None:
            _SESSIONS.put(*self._ax_pending)
            self._ax_pending = None

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        r"""Ax hands a fitted model's ``state_dict`` to warm-start or to skip refitting (e.g. in
        cross-validation folds, which hold other data). Only hyperparameters carry over; this
        model's data, statistics and caches stay its own."""
        names = {n for n, _ in self.named_parameters()}  # type: ignore[attr-defined]
        hyper = {k: v for k, v in state_dict.items() if k in names}
        if strict and set(hyper) != names:
            missing = sorted(names - set(hyper))
            raise KeyError(f"state_dict lacks hyperparameters {missing}.")
        with torch.no_grad():
            for name, param in self.named_parameters():  # type: ignore[attr-defined]
                if name in hyper:
                    param.copy_(hyper[name])
        self._ax_obs_since_fit = 0  # loaded hyperparameters count as fitted
        self._ax_pending = None  # a fold or a warm start: not the experiment's model
        return None


def ax_model_class(model_class: type[OnlineModel] | str) -> type:
    r"""The Ax-facing subclass ``Ax<Name>`` of a bo_online model class (made once, cached).

    The subclass lives in this module under its name, so it is importable and picklable, and is
    what ``ModelConfig(botorch_model_class=...)`` should name.
    """
    cls = _resolve(model_class)
    with _LOCK:
        if cls in _AX_CLASSES:
            return _AX_CLASSES[cls]
        if isinstance(cls, type) and issubclass(cls, AxOnlineMixin):
            return cls
        name = f"Ax{cls.__name__}"
        ax_cls = type(
            name,
            (AxOnlineMixin, cls),
            {
                "__module__": __name__,
                "__qualname__": name,
                "_bo_online_base": cls,
                "__doc__": (
                    f"Ax-facing :class:`{cls.__module__}.{cls.__name__}`: incremental "
                    "construction between trials and scheduled refits "
                    "(see :class:`bo_online.ax.AxOnlineMixin`)."
                ),
            },
        )
        _AX_CLASSES[cls] = ax_cls
        globals()[name] = ax_cls
        return ax_cls


def _resolve(model_class: type[OnlineModel] | str) -> type[OnlineModel]:
    if isinstance(model_class, str):
        if "." not in model_class:
            model_class = f"bo_online.models.{model_class}"
        module_name, _, attr = model_class.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(
                f"No bo_online model {model_class!r} (available: {sorted(available_models())})."
            ) from err
    else:
        cls = model_class
    if not (isinstance(cls, type) and issubclass(cls, OnlineModel)):
        raise ValueError(f"{cls!r} is not a subclass of bo_online.models.base.OnlineModel.")
    return cls


# ====================================================================== registration with Ax


def _register_fitting() -> None:
    """Teach Ax's ``fit_botorch_model`` dispatcher to fit :class:`OnlineModel` s (once)."""
    from ax.generators.torch.botorch_modular.utils import fit_botorch_model

    if "bo_online" in getattr(fit_botorch_model, "_bo_online_marker", ""):
        return

    @fit_botorch_model.register(OnlineModel)
    def _fit_online_model(
        model: OnlineModel, mll_class: Any = None, mll_options: dict[str, Any] | None = None
    ) -> None:
        # The model's objective is its own (exact MLL or ELBO from its statistics), so Ax's
        # ``mll_class`` is not used; ``mll_options`` are passed to ``fit`` where it takes them.
        if isinstance(model, AxOnlineMixin):
            model.ax_fit()
        else:
            model.custom_fit(None, **(mll_options or {}))

    fit_botorch_model._bo_online_marker = "bo_online"  # type: ignore[attr-defined]


def register_model_class(model_class: type[OnlineModel] | str) -> type:
    r"""Make one bo_online model class usable by Ax and storable in JSON: registers the class and
    its Ax subclass with Ax's storage registries and returns the Ax subclass."""
    from ax.storage.botorch_modular_registry import register_model

    cls = _resolve(model_class)
    ax_cls = ax_model_class(cls)
    with _LOCK:
        _register_fitting()
        for c in (cls, ax_cls):
            register_model(c)
            _REGISTERED[c.__name__] = c
    return ax_cls


def register_all(paths: Sequence[str] = DEFAULT_MODEL_PATHS) -> dict[str, type]:
    r"""Register every importable class in ``paths`` (dotted); absent ones are skipped.

    Returns:
        ``{base class name: Ax subclass}`` for the classes now available.
    """
    out: dict[str, type] = {}
    for path in paths:
        module_name, _, attr = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError):
            continue
        out[cls.__name__] = register_model_class(cls)
    return out


def available_models() -> dict[str, type]:
    """``{name: Ax subclass}`` of the bo_online models registered so far."""
    return {base.__name__: ax for base, ax in _AX_CLASSES.items()}


# ====================================================================== generation strategy


class DropNonFiniteY(Transform):
    r"""Ax outcome transform: ``inf`` / ``-inf`` outcome means become NaN, which Ax treats as
    missing (the observation is left out of the model), with a warning. NaN outcomes are
    already missing to Ax.

    Why not Winsorize (Ax's default, which clips them): it also moves earlier outcomes as data
    grow, which makes every bo_online model rebuild (see :func:`make_generation_strategy`). Ax has
    no transform that only drops non-finite values, so this one does.
    """

    requires_data_for_initialization: bool = False

    @staticmethod
    def _warn(count: int) -> None:
        if count:
            warnings.warn(
                f"bo_online.ax: {count} non-finite outcome value(s) (inf) are left out of the "
                "model; check the evaluation that produced them.",
                RuntimeWarning,
                stacklevel=3,
            )

    def _transform_observation_data(self, observation_data: list[Any]) -> list[Any]:
        count = 0
        for obsd in observation_data:
            bad = np.isinf(obsd.means)
            if bad.any():
                count += int(bad.sum())
                obsd.means = np.where(bad, np.nan, obsd.means)
        self._warn(count)
        return observation_data

    def transform_experiment_data(self, experiment_data: Any) -> Any:
        from ax.adapter.data_utils import ExperimentData

        obs = experiment_data.observation_data
        if "mean" not in obs.columns.get_level_values(0):
            return experiment_data
        means = obs["mean"]
        bad = np.isinf(means.to_numpy(dtype=float))
        if not bad.any():
            return experiment_data
        obs = obs.copy()
        for j, metric in enumerate(means.columns):
            if bad[:, j].any():
                col = obs["mean", metric].to_numpy(dtype=float)
                obs["mean", metric] = np.where(bad[:, j], np.nan, col)
        self._warn(int(bad.sum()))
        return ExperimentData(arm_data=experiment_data.arm_data, observation_data=obs)


def _register_transform() -> None:
    from ax.storage.transform_registry import REVERSE_TRANSFORM_REGISTRY, TRANSFORM_REGISTRY

    TRANSFORM_REGISTRY.add(DropNonFiniteY)
    REVERSE_TRANSFORM_REGISTRY[DropNonFiniteY.__name__] = DropNonFiniteY


def make_generation_strategy(
    model: type[OnlineModel] | str = "OnlineExactGP",
    botorch_acqf_class: type | None = None,
    num_initial_trials: int = 5,
    model_options: dict[str, Any] | None = None,
    acquisition_options: dict[str, Any] | None = None,
    optimizer_options: dict[str, Any] | None = None,
    refit_every: int | None = DEFAULT_REFIT_EVERY,
    fit_options: dict[str, Any] | None = None,
    winsorize: bool = False,
    seed: int | None = None,
    torch_device: str | None = None,
) -> Any:
    r"""A Sobol -> bo_online ``GenerationStrategy`` for ``Client.set_generation_strategy``.

    Args:
        model: a bo_online model class or its name (``"OnlineExactGP"``, ``"WISKI"``, ...).
        botorch_acqf_class: BoTorch acquisition function class; default
            ``qLogNoisyExpectedImprovement`` (Ax's choice for single objectives).
        num_initial_trials: Sobol trials before the model takes over (at least 2).
        model_options: constructor options of the model (``ModelConfig.model_options``).
        acquisition_options: keyword arguments for the acquisition function (Ax's
            ``acquisition_options``), e.g. ``{"beta": 2.0}`` for UCB.
        optimizer_options: keyword arguments for ``optimize_acqf`` (e.g. ``num_restarts``,
            ``raw_samples``).
        refit_every: new observations between hyperparameter refits (see :class:`AxOnlineMixin`).
        fit_options: keyword arguments for the model's ``fit``.
        winsorize: keep Ax's ``Winsorize`` outcome transform. It is off by default: it moves
            earlier outcomes nonlinearly as data grow, which forces a rebuild every trial.
        seed: Sobol seed.
        torch_device: device for the model (default: Ax's).

    Returns:
        A ``GenerationStrategy`` with a Sobol node and a ``BOTORCH_MODULAR`` node whose surrogate
        is the Ax subclass of ``model``.
    """
    from ax.adapter.registry import MBM_X_trans, Generators
    from ax.adapter.transforms.derelativize import Derelativize
    from ax.adapter.transforms.standardize_y import StandardizeY
    from ax.adapter.transforms.winsorize import Winsorize
    from ax.core.trial_status import TrialStatus
    from ax.generation_strategy.generation_strategy import GenerationNode, GenerationStrategy
    from ax.generation_strategy.generator_spec import GeneratorSpec
    from ax.generation_strategy.transition_criterion import MinTrials
    from ax.generators.torch.botorch_modular.surrogate import ModelConfig, SurrogateSpec
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement

    if num_initial_trials < 2:
        raise ValueError("num_initial_trials must be >= 2 (the model needs data to start from).")
    import uuid

    ax_cls = register_model_class(model)
    options = dict(model_options or {})
    options["refit_every"] = refit_every
    # One key per strategy, i.e. per experiment (a strategy drives one experiment); it is stored
    # with the strategy, so a client reloaded from JSON goes on with its own models.
    options.setdefault("experiment_key", uuid.uuid4().hex)
    if fit_options:
        options["fit_options"] = dict(fit_options)
    acqf = botorch_acqf_class or qLogNoisyExpectedImprovement
    y_transforms = [DropNonFiniteY, Derelativize, Winsorize, StandardizeY] if winsorize else [
        DropNonFiniteY,
        Derelativize,
        StandardizeY,
    ]
    generator_kwargs: dict[str, Any] = {
        "surrogate_spec": SurrogateSpec(
            model_configs=[
                ModelConfig(
                    botorch_model_class=ax_cls,
                    model_options=options,
                    name=ax_cls._bo_online_base.__name__,
                )
            ]
        ),
        "botorch_acqf_class": acqf,
        "transforms": [*MBM_X_trans, *y_transforms],
    }
    if acquisition_options:
        generator_kwargs["acquisition_options"] = dict(acquisition_options)
    if optimizer_options:
        generator_kwargs["default_model_gen_options"] = {
            "optimizer_kwargs": dict(optimizer_options)
        }
    if torch_device is not None:
        generator_kwargs["torch_device"] = torch.device(torch_device)
    name = ax_cls._bo_online_base.__name__
    return GenerationStrategy(
        name=f"Sobol+{name}+{acqf.__name__}",
        nodes=[
            GenerationNode(
                name="Sobol",
                generator_specs=[
                    GeneratorSpec(generator_enum=Generators.SOBOL, generator_kwargs={"seed": seed})
                ],
                transition_criteria=[
                    # Trials attached by hand count towards the start as well ...
                    MinTrials(
                        threshold=num_initial_trials,
                        transition_to=name,
                        use_all_trials_in_exp=True,
                    ),
                    MinTrials(  # ... and their data are in before the model is asked
                        threshold=num_initial_trials,
                        transition_to=name,
                        only_in_statuses=[TrialStatus.COMPLETED],
                        count_only_trials_with_data=True,
                        use_all_trials_in_exp=True,
                    ),
                ],
                should_deduplicate=True,
            ),
            GenerationNode(
                name=name,
                generator_specs=[
                    GeneratorSpec(
                        generator_enum=Generators.BOTORCH_MODULAR,
                        generator_kwargs=generator_kwargs,
                    )
                ],
                should_deduplicate=True,
            ),
        ],
    )


register_all()
_register_transform()
