r"""The Ax-facing subclass of each bo_online model class (``AxOnlineExactGP``, ``AxWISKI``,
...): Ax constructs it every trial; it reuses the stored model incrementally where the data
allow, maps outcomes between Ax's moving standardisation and the model's anchor units, and
refits on a schedule."""

from __future__ import annotations

import contextlib
import copy
import importlib
import math
import numbers
import sys
import time
import warnings
from typing import Any, Iterator, Mapping

import torch
from torch import Tensor

from bo_online.ax.store import (
    _LOCK,
    _SESSIONS,
    _extended_model,
    _fingerprint,
    _plan_reuse,
    _Session,
)
from bo_online.models.base import OnlineModel
from bo_online.models.validation import require_bool, train_noise_floor

#: Default refit schedule on the incremental path: ``"auto"`` (see :class:`AxOnlineMixin`).
DEFAULT_REFIT_EVERY: int | str | None = "auto"

#: the package the Ax subclasses live in (importable and picklable under their names there)
_PACKAGE = __name__.rpartition(".")[0]

_AX_CLASSES: dict[type[OnlineModel], type] = {}


class AxOnlineMixin:
    r"""Mixed in before a bo_online model class to make the class Ax builds every trial.

    ``construct_inputs`` accepts the model's own constructor options plus:

    * ``refit_every`` (``"auto"``, int or None; default ``"auto"``): when to refit the
      hyperparameters on the incremental path. ``"auto"`` is the BO loops' schedule
      (:meth:`bo_online.loops.core.OnlineLoop._refit_due`): at every trial that brought new
      observations, except for a model whose refit cost grows with n (the exact GP, t-SVGP, the
      decoupled SVGP), which refits at every trial up to 100 observations and then once they
      have grown by 10% since its last fit (unlike the loops, WISKI with a learned projection
      refits its kernel, not the projection, at every trial). Where such a refit is due and
      the model is one a BoTorch user would refit from the defaults -- the exact GP, or
      t-SVGP / the decoupled SVGP / QSGP while they are the exact GP on their data
      (``is_exact_gp_on_data()``) -- the model is rebuilt on all data and fitted from the
      defaults, as Ax does for its own models; otherwise the refit is warm-started.
      An integer k refits (warm-started) once k new observations have arrived since the last
      fit (the default was 10, which stalled early BO in the loops); ``None`` never refits
      after a rebuild.
    * ``fit_options`` (dict): keyword arguments for the model's ``fit`` (e.g. ``max_iter``).
    * ``incremental`` (bool, default True): False rebuilds and refits every trial, as Ax does for
      its own models.
    * ``experiment_key`` (str): which experiment the model belongs to (set per generation
      strategy by :func:`make_generation_strategy`), so experiments do not share stored models.
    """

    _bo_online_base: type[OnlineModel]

    # Ax's search space is the model's box, so only BoTorch's own heuristics query outside it:
    # with outcome constraints and no feasible observation yet, qLogNEI estimates the
    # infeasible cost at random points of the data's bounding box widened by 10%. A model with
    # a bounded domain (WISKI's grid) refused them, and every later trial failed to generate.
    clamps_queries_to_bounds = True

    @classmethod
    def construct_inputs(
        cls,
        training_data: Any,
        refit_every: int | str | None = DEFAULT_REFIT_EVERY,
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
        refit_every = _checked_refit_every(refit_every)
        Y = training_data.Y
        if Y.dim() != 2 or Y.shape[-1] != 1:
            raise ValueError(
                f"{cls.__name__} is single-output; got outcomes of shape {tuple(Y.shape)}."
            )
        Yvar = training_data.Yvar
        if Yvar is not None and bool(torch.isnan(Yvar).all()):
            Yvar = None  # Ax marks unknown noise with NaN: infer it
        elif Yvar is not None and bool(torch.isnan(Yvar).any()):
            # Some trials reported an SEM and some not: the model's check said "remove or impute
            # them before passing data to the model", data the user never passes.
            missing = int(torch.isnan(Yvar).sum())
            raise ValueError(
                f"{missing} of the {Yvar.shape[0]} observations of "
                f"{', '.join(map(repr, training_data.outcome_names))} have no SEM and the others "
                "have one; report an SEM with every observation of a metric (raw_data={name: "
                "(mean, sem)}) or with none (its noise is then inferred)."
            )
        # The defaults the loops and the CLI give the model for this many inputs (e.g. WISKI's
        # structure above 3 inputs); the user's model_options win.
        defaults = getattr(cls._bo_online_base, "loop_default_options", None)
        if callable(defaults):
            model_options = {**defaults(training_data.X.shape[-1], model_options), **model_options}
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
            "ax_refit_every": refit_every,
            "ax_fit_options": dict(fit_options or {}),
            "ax_incremental": require_bool(incremental, "incremental"),
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
        ax_refit_every: int | str | None = DEFAULT_REFIT_EVERY,
        ax_fit_options: dict[str, Any] | None = None,
        ax_incremental: bool = True,
        **options: Any,
    ) -> None:
        t0 = time.perf_counter()
        input_transform = _bounds_covering_the_box(input_transform, train_X.dtype)
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
        # The stored session keeps Ax's variances as given (so zeros compare as zeros); the model
        # gets noise-free observations at the noise floor.
        model_Yvar = _noise_free_at_floor(train_Yvar, train_Y)
        with _floor_warnings_silenced(model_Yvar is not train_Yvar):
            if isinstance(plan, tuple):
                n_old = session.X.shape[0]
                new_yvar = None if model_Yvar is None else model_Yvar[n_old:]
                try:
                    extended = _extended_model(
                        session.model, *plan, train_X[n_old:], train_Y[n_old:], new_yvar
                    )
                except Exception as err:  # e.g. a factor update that lost definiteness
                    # A rebuild is always correct; input that is truly bad fails there as well.
                    plan = f"incremental update failed ({type(err).__name__}: {err}); rebuilt"
            if extended is not None and _left_own_regime_kernel(session.model, extended):
                extended = None
                plan = "left the exact regime of its own kernel (SKI derived from all data)"
            if extended is not None and ax_refit_every == "auto":
                since = session.model._ax_obs_since_fit
                since = None if since is None else since + train_X.shape[0] - n_old
                due = _auto_refit_due(extended, train_X.shape[0], session.model._ax_n_at_fit, since)
                if due and _refits_from_defaults(extended):
                    extended = None
                    plan = "refit from the defaults due (refit_every='auto')"
            if extended is not None:
                # Become that model: the same thing ``copy.copy`` does to a fresh instance.
                self.__dict__.update(extended.__dict__)
                self._hooks_rebound_from(extended)  # else this model keeps ``extended`` alive
                since = session.model._ax_obs_since_fit  # None: never fitted, so still due
                self._ax_obs_since_fit = None if since is None else since + train_X.shape[0] - n_old
                _SESSIONS.stats.incremental += 1
            else:
                super().__init__(  # type: ignore[call-arg]
                    train_X, train_Y, model_Yvar, input_transform=input_transform, **options
                )
                self._ax_obs_since_fit = None  # never fitted
                self._ax_n_at_fit = None
                _SESSIONS.stats.rebuilds += 1
                _SESSIONS.stats.reasons.append(plan)
        self._ax_refit_every = ax_refit_every
        self._ax_num_obs = int(train_X.shape[0])
        self._ax_train_Y = train_Y.detach()  # what ``train_targets`` gives a model without them
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

    _ax_n_at_fit: int | None = None  # observations held at the last fit (None: never fitted)
    _ax_exact_at_fit: bool = False  # the model was the exact GP on its data at the last fit
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
        if every is not None and since >= 1 and self._ax_left_exact_regime():
            return True
        if every == "auto":
            return _auto_refit_due(self, self._ax_num_obs, self._ax_n_at_fit, since)
        return every is not None and since >= every

    def _ax_left_exact_regime(self) -> bool:
        r"""Whether the model was the exact GP on its data at the last fit and is not any more
        (QSGP past ``exact_max_n``, t-SVGP / the decoupled SVGP past their bases): its
        hyperparameters then maximise the exact GP's evidence, not that of what it now predicts
        with, so a refit is due whatever the schedule (as in the loops,
        ``OnlineLoop._left_exact_regime``)."""
        from bo_online.loops.refit_rules import is_exact_gp_on_data

        return self._ax_exact_at_fit and not is_exact_gp_on_data(self)

    def ax_fit(self) -> None:
        """Refit if due (Ax's ``fit_botorch_model`` lands here), else keep the hyperparameters;
        then remember this model for the next trial's construction."""
        if self.refit_due:
            t0 = time.perf_counter()
            from bo_online.loops.refit_rules import WARM_REFIT_MAX_ITER

            options = dict(self._ax_fit_options)
            if self._ax_obs_since_fit is not None:  # fitted before: warm-started, as in the loops
                options.setdefault("max_iter", WARM_REFIT_MAX_ITER)
            # A model conditioned on the stored one shares its hyperparameter modules: a fit
            # that fails midway (a numerical error, an interrupt) moved the stored model's
            # hyperparameters too, and the next trial went on from them. Put them back.
            params = list(self.parameters())  # type: ignore[attr-defined]
            saved = [p.detach().clone() for p in params]
            try:
                self.fit(**options)  # type: ignore[attr-defined]
            except BaseException:
                with torch.no_grad():
                    for param, value in zip(params, saved):
                        param.copy_(value)
                raise
            self._ax_obs_since_fit = 0
            self._ax_n_at_fit = self._ax_num_obs
            from bo_online.loops.refit_rules import is_exact_gp_on_data

            self._ax_exact_at_fit = is_exact_gp_on_data(self)
            _SESSIONS.stats.refits += 1
            _SESSIONS.stats.fit_seconds += time.perf_counter() - t0
        if self._ax_pending is not None:
            _SESSIONS.put(*self._ax_pending)
            self._ax_pending = None

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        r"""Ax hands a fitted model's ``state_dict`` to a new model (e.g. a cross-validation fold,
        which holds other data), then either uses it as it is (``refit=False``: Ax does not call
        the fit) or refits it warm-started from these values (``refit=True``, e.g.
        ``refit_on_cv``: Ax's fit lands in :meth:`ax_fit`, which refits as the schedule says; a
        new model has never been fitted, so it refits). Only hyperparameters carry over; this
        model's data, statistics and caches stay its own."""
        names = {n for n, _ in self.named_parameters()}  # type: ignore[attr-defined]
        hyper = {k: v for k, v in state_dict.items() if k in names}
        if strict and set(hyper) != names:
            missing = sorted(names - set(hyper))
            raise KeyError(f"state_dict lacks hyperparameters {missing}.")
        # Built incrementally, this model shares its hyperparameter modules with the stored
        # model it was conditioned on: loading into them in place set the stored model's
        # hyperparameters to the loaded ones for the next trial. This model takes copies.
        self._stop_sharing_modules()  # type: ignore[attr-defined]
        with torch.no_grad():
            for name, param in self.named_parameters():  # type: ignore[attr-defined]
                if name in hyper:
                    param.copy_(hyper[name])
        # The state a fit sets for the hyperparameters (the decoupled SVGP's ``a, B``, QSGP's
        # q(w)) was built for the defaults: set it for the loaded ones on this model's data, or
        # the folds of those models predicted far off (every fit judged poor by Ax).
        self.fit_state_to_hyperparameters()  # type: ignore[attr-defined]
        # Loaded hyperparameters do not count as a fit on this model's data: where Ax asks for a
        # refit after loading them, it must happen (it was skipped, so ``refit_on_cv=True``
        # cross-validated the loaded hyperparameters instead of the folds' own).
        self._ax_pending = None  # a fold or a warm start: not the experiment's model
        return None


@contextlib.contextmanager
def _floor_warnings_silenced(silence: bool) -> Iterator[None]:
    r"""Where noise-free observations were raised to the floor (said once, by
    :func:`_noise_free_at_floor`), the models' own floor warnings would say it again, with the
    rounding of their units; other warnings pass."""
    with warnings.catch_warnings():
        if silence:
            warnings.filterwarnings("ignore", message=".*below the floor of")
        yield


def _noise_free_at_floor(Yvar: Tensor | None, Y: Tensor) -> Tensor | None:
    r"""``Yvar`` with exact zeros (Ax's ``sem = 0``: a noise-free observation) raised to the
    noise floor in the units of ``Y``, as GPyTorch raises Ax's own fixed-noise models' variances
    to its minimum: WISKI, the decoupled SVGP and QSGP weigh observations by 1/noise and refuse a
    zero variance."""
    if Yvar is None or not bool((Yvar == 0).any()):
        return Yvar
    floor = train_noise_floor(Y.detach()).to(Yvar)
    warnings.warn(
        f"{int((Yvar == 0).sum())} noise-free observation(s) (sem = 0) are given to the model "
        f"with the noise floor as their variance ({float(floor.min()):.3g} in Ax's units).",
        RuntimeWarning,
        stacklevel=3,
    )
    return torch.where(Yvar == 0, floor.expand_as(Yvar), Yvar)


def _bounds_covering_the_box(input_transform: Any, dtype: torch.dtype) -> Any:
    r"""A ``Normalize`` with fixed bounds stored in a coarser dtype than the data (Ax builds it
    from the search space in float32), as a ``dtype`` copy whose bounds are widened by a few
    ulps of that coarse dtype; anything else unchanged.

    Rounded to float32, a bound such as 0.9 moves inside the box (0.89999998), so a trial on
    it maps 6e-8 outside the unit cube, and a model that checks its domain (WISKI's grid)
    refuses it at every later trial. Widened by one rounding step of each bound (and of the
    range), every point of the box maps inside ``[0, 1]``; the map moves by that step relative
    to the range (1e-7 for a box of unit size, 0.15% for [1.7e9, 1.7e9 + 86400]).
    Deterministic, so the stored model's fingerprint stays the same each trial.
    """
    from botorch.models.transforms.input import Normalize

    if (
        not isinstance(input_transform, Normalize)
        or input_transform.learn_bounds
        or input_transform.center != 0.5
        or not input_transform._offset.dtype.is_floating_point
        or torch.finfo(input_transform._offset.dtype).eps <= torch.finfo(dtype).eps
    ):
        return input_transform
    offset, coefficient = input_transform._offset, input_transform._coefficient
    lower = offset.to(dtype)
    upper = lower + coefficient.to(dtype)
    # Each bound may sit up to one spacing of its coarse dtype inside the true one, and the
    # upper bound is offset + range, whose range was rounded too.
    widened = copy.deepcopy(input_transform).to(dtype)
    widened._offset = lower - _spacing(offset).to(dtype)
    top = upper + _spacing(offset + coefficient).to(dtype) + _spacing(coefficient).to(dtype)
    widened._coefficient = top - widened._offset
    return widened


def _spacing(x: Tensor) -> Tensor:
    r"""The gap from ``|x|`` to the next larger number of ``x``'s dtype (its rounding step)."""
    return torch.nextafter(x.abs(), torch.full_like(x, math.inf)) - x.abs()


def _checked_refit_every(refit_every: Any) -> int | str | None:
    r"""``refit_every`` as stored: ``"auto"``, a positive integer (any integral type, an
    integral float or a string of digits) or None; else a one-line error that says what is
    accepted."""
    if refit_every is None or refit_every == "auto":
        return refit_every
    every = refit_every
    if isinstance(every, str) and every.strip().isdecimal():
        every = int(every.strip())
    elif isinstance(every, numbers.Real) and not isinstance(every, (bool, numbers.Integral)):
        every = int(every) if math.isfinite(every) and float(every).is_integer() else None
    if isinstance(every, numbers.Integral) and not isinstance(every, bool) and every >= 1:
        return int(every)
    raise ValueError(
        f"refit_every must be 'auto', a positive integer or None, got {refit_every!r}."
    )


def _fit_cost_grows_with_n(model: Any) -> bool:
    """Whether a refit of ``model`` costs more as its data grow (the exact GP: O(n^3))."""
    return bool(getattr(model, "fit_cost_grows_with_n", False))


def _refits_from_defaults(model: Any) -> bool:
    r"""Whether a due refit of ``model`` rebuilds it and fits from the defaults (the loops'
    rule, :func:`bo_online.loops.refit_rules.refits_from_defaults`)."""
    from bo_online.loops.refit_rules import refits_from_defaults

    return refits_from_defaults(model, _fit_cost_grows_with_n(model))


def _left_own_regime_kernel(stored: Any, extended: Any) -> bool:
    r"""Whether the incremental update took WISKI out of an exact regime with a kernel of its
    own (``regime_kernel="ard"``, the default above 6 inputs): its SKI part, learned map
    included, was never derived or fitted, so it is rebuilt on all data (the constructor derives
    the map; Ax's fit then fits SKI), as the loops refit it through ``fit_projection``."""
    from bo_online.loops.refit_rules import has_own_regime_kernel, is_exact_gp_on_data

    return (
        has_own_regime_kernel(extended)
        and is_exact_gp_on_data(stored)
        and not is_exact_gp_on_data(extended)
    )


def _auto_refit_due(model: Any, n: int, n_at_fit: int | None, since: int | None) -> bool:
    r"""The ``"auto"`` schedule (``OnlineLoop._refit_due``): due once anything arrived since
    the last fit (``since``: observations since then, None if never fitted); for a model whose
    fit cost grows with n or whose warm-started refit visits every point held
    (``refit_visits_every_point``), beyond the loops' ``AUTO_REFIT_SMALL_N`` observations only
    once they have grown by ``AUTO_REFIT_GROWTH`` since its last fit (``n_at_fit``)."""
    from bo_online.loops.core import OnlineLoop
    from bo_online.loops.refit_rules import growth_refit_due

    if since is None or n_at_fit is None:
        return True
    if since < 1:
        return False
    if not (_fit_cost_grows_with_n(model) or getattr(model, "refit_visits_every_point", False)):
        return True
    return growth_refit_due(
        n, n_at_fit, OnlineLoop.AUTO_REFIT_SMALL_N, OnlineLoop.AUTO_REFIT_GROWTH
    )


def _train_targets_fallback(self: Any, name: str) -> Any:
    r"""``__getattr__`` of an Ax class whose model has no ``train_targets`` of its own (WISKI
    keeps statistics instead): the ``n`` targets Ax gave it this trial (its current units).
    BoTorch's input constructors of ``qNegIntegratedPosteriorVariance`` and
    ``qJointEntropySearch`` read them for their dtype and device. A fallback, not a property:
    targets a model sets itself (an attribute or a buffer) stay as they are. Only such classes
    get it: every ``nn.Module`` attribute lookup (parameters, submodules) passes through it."""
    try:
        return super(AxOnlineMixin, self).__getattr__(name)
    except AttributeError:
        if name == "train_targets" and "_ax_train_Y" in self.__dict__:
            return self.__dict__["_ax_train_Y"].squeeze(-1)
        raise


def ax_model_class(model_class: type[OnlineModel] | str) -> type:
    r"""The Ax-facing subclass ``Ax<Name>`` of a bo_online model class (made once, cached).

    The subclass lives in :mod:`bo_online.ax` under its name, so it is importable and picklable,
    and is what ``ModelConfig(botorch_model_class=...)`` should name.
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
                "__module__": _PACKAGE,
                "__qualname__": name,
                "_bo_online_base": cls,
                "__doc__": (
                    f"Ax-facing :class:`{cls.__module__}.{cls.__name__}`: incremental "
                    "construction between trials and scheduled refits "
                    "(see :class:`bo_online.ax.AxOnlineMixin`)."
                ),
                # no cost on the attribute lookups of models that have train_targets
                **(
                    {}
                    if hasattr(cls, "train_targets")
                    else {"__getattr__": _train_targets_fallback}
                ),
            },
        )
        _AX_CLASSES[cls] = ax_cls
        setattr(sys.modules[_PACKAGE], name, ax_cls)
        return ax_cls


def _resolve(model_class: type[OnlineModel] | str) -> type[OnlineModel]:
    r"""The bo_online class named by ``model_class``: a class, its name (``"WISKI"``), a
    dotted path, or the short name the CLI and the loops use (``"exact"``, ``"wiski"``,
    ``"tsvgp"``, ``"decoupled"``, ``"qsgp"``; case-insensitive)."""
    from bo_online.models.registry import MODEL_PATHS, get_model_class

    if isinstance(model_class, str) and model_class.lower() in MODEL_PATHS:
        # "exact" resolved to the module bo_online.models.exact ("<module ...> is not a subclass
        # of OnlineModel"), "tsvgp" to a package: the loops' names did not work here.
        model_class = get_model_class(model_class)
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
        raise ValueError(
            f"{model_class!r} is not a subclass of bo_online.models.base.OnlineModel; bo_online "
            f"models available: {sorted(available_models())}, or "
            f"the loops' names {_online_short_names()}."
        )
    return cls


def _online_short_names() -> list[str]:
    r"""The loops' model names (``bo_online.models.registry``) that name an :class:`OnlineModel`
    (not ``"singletaskgp"``, BoTorch's GP refit every step: Ax's default surrogate is that)."""
    from bo_online.models.registry import MODEL_PATHS, get_model_class

    names = []
    for name in MODEL_PATHS:
        try:
            cls = get_model_class(name)
        except ValueError:
            continue
        if isinstance(cls, type) and issubclass(cls, OnlineModel):
            names.append(name)
    return names


def available_models() -> dict[str, type]:
    """``{name: Ax subclass}`` of the bo_online models registered so far."""
    return {base.__name__: ax for base, ax in _AX_CLASSES.items()}
