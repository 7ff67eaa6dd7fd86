r"""A ready Sobol -> bo_online ``GenerationStrategy``, and the outcome transform that keeps
generation going when an outcome is not finite."""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from ax.adapter.transforms.base import Transform

from bo_online.acquisition import check_optimizer_counts
from bo_online.ax.registration import register_model_class
from bo_online.ax.surrogate import DEFAULT_REFIT_EVERY, _checked_refit_every
from bo_online.models.base import OnlineModel
from bo_online.models.validation import closest_name_hint, require_bool


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
    from ax.storage.transform_registry import (
        REVERSE_TRANSFORM_REGISTRY,
        TRANSFORM_REGISTRY,
    )

    TRANSFORM_REGISTRY.add(DropNonFiniteY)
    REVERSE_TRANSFORM_REGISTRY[DropNonFiniteY.__name__] = DropNonFiniteY


def _check_option_names(
    ax_cls: type, model_options: dict[str, Any], fit_options: dict[str, Any] | None
) -> None:
    r"""Refuse model or fit options the model does not take, with a ``ValueError`` naming the
    accepted ones: Ax builds the model only once the Sobol trials are done, so a misspelt name
    failed there, after as many evaluations."""
    import dataclasses

    from bo_online.models.fitting import resolve_settings

    def named(fn: Any) -> set[str]:
        params = inspect.signature(fn).parameters.values()
        return {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}

    base = ax_cls._bo_online_base
    settings_class = getattr(base, "fit_settings_class", None)
    accepted: set[str] | None = (named(base.__init__) | named(ax_cls.construct_inputs)) - {
        "self",
        "train_X",
        "train_Y",
        "train_Yvar",
        "training_data",
    }
    init = inspect.signature(base.__init__).parameters.values()
    var_keyword = next((p.name for p in init if p.kind is p.VAR_KEYWORD), None)
    if var_keyword == "fit_options" and settings_class is not None:
        # its keywords are fit defaults (QSGP's ``**fit_options``)
        accepted |= {f.name for f in dataclasses.fields(settings_class)}
    elif var_keyword is not None:  # takes any keyword (a subclass forwarding to its parent)
        accepted = None
    unknown = [] if accepted is None else sorted(set(model_options) - accepted)
    if unknown:
        raise ValueError(
            f"Unknown model option(s) {', '.join(map(repr, unknown))} for {base.__name__}; "
            f"accepted: {', '.join(sorted(accepted))}."
        )
    if fit_options and settings_class is not None:  # ``settings``: a whole settings object
        overrides = {k: v for k, v in fit_options.items() if k != "settings"}
        resolve_settings(settings_class, fit_options.get("settings"), overrides)


#: options the Ax subclass takes itself (not the model's constructor)
_AX_OWN_OPTIONS = ("refit_every", "incremental", "experiment_key", "fit_options")

#: input dimensions the option-value probe builds the model at, cheapest first: an option
#: that fails at every one of them fails at any dimension (a structure such as WISKI's
#: ``projection="none"`` is refused above 3 inputs, ``"all-pairs"`` below 2).
_PROBE_DIMS = (1, 2, 6)


def _is_plain_value(value: Any) -> bool:
    r"""Whether a model option is a plain value (a number, a string, a bool or None), whose
    validity does not depend on the number of inputs; tensors, sequences and modules
    (``bounds``, ``grid_size=[..]``, ``covar_module``) are sized for the search space."""
    return value is None or isinstance(value, (str, bool, numbers.Number))


def _probe_error(base: type[OnlineModel], options: dict[str, Any]) -> Exception | None:
    r"""The error the model's constructor raises for ``options`` at every probe dimension
    (built on 8 points of the unit cube, with the loops' defaults for that many inputs, as Ax
    gets them), or None if it takes them at one. Nothing is fitted; warnings are muted."""
    defaults = getattr(base, "loop_default_options", None)
    error: Exception | None = None
    for dim in _PROBE_DIMS:
        gen = torch.Generator().manual_seed(0)
        X = torch.rand(8, dim, dtype=torch.float64, generator=gen)  # 8 x dim
        Y = torch.sin(6.0 * X).sum(-1, keepdim=True)  # 8 x 1
        built = {**defaults(dim, options), **options} if callable(defaults) else dict(options)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                base(X, Y, **built)
        except Exception as err:  # the model's own check (or a failure deep inside it)
            if error is None:
                error = err
                err.bo_online_probe_dim = dim  # type: ignore[attr-defined]  # for the message
            continue
        return None
    return error


def _check_option_values(ax_cls: type, model_options: dict[str, Any]) -> None:
    r"""Refuse model option values the model's constructor refuses, before any trial.

    Ax builds the model only once the Sobol trials have data, so a value such as
    ``inducing_points=0`` or ``grid_size="x"`` failed there, after those evaluations, with an
    error from inside the model. The check is the model's own (its constructor, as the sweep's
    ``_check_options`` builds the loop's model before a cluster starts), run on a few points:
    the plain values (numbers, strings, bools, None) are given to the model alone, at each of
    :data:`_PROBE_DIMS` inputs; where it refuses them at every one, each is tried alone to name
    the one at fault. Options sized for the search space (tensors, sequences, modules) are
    not probed (the number of inputs is not known yet); the model checks them at its first fit.

    Raises:
        ValueError: one line naming the option, its value, and what the model allows (its
            message, or the constructor's annotation where the message does not name it).
    """
    base = ax_cls._bo_online_base
    plain = {
        k: v for k, v in model_options.items() if k not in _AX_OWN_OPTIONS and _is_plain_value(v)
    }
    if not plain or _probe_error(base, plain) is None:
        return
    sized = [k for k in model_options if k not in _AX_OWN_OPTIONS and k not in plain]
    culprits = {k: err for k in plain if (err := _probe_error(base, {k: plain[k]})) is not None}
    if not culprits:
        if sized:  # the plain values may need the sized options with them: leave it to the fit
            return
        culprits = {", ".join(plain): _probe_error(base, plain)}
    params = inspect.signature(base.__init__).parameters
    name, err = next(iter(culprits.items()))
    lines = str(err).strip().splitlines()
    reason = f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": .")
    # the model's sizes in the message are the probe's, not the search space's
    dim = getattr(err, "bo_online_probe_dim", None)
    reason = reason if dim is None else f"built on a {dim}-input probe: {reason}"
    shown = (
        f"{name}={plain[name]!r}"
        if name in plain
        else "{" + ", ".join(f"{k}={v!r}" for k, v in plain.items()) + "} together"
    )
    allowed = ""
    if name in params and name not in str(err):
        annotation = params[name].annotation
        if annotation is not inspect.Parameter.empty:
            allowed = f"; {base.__name__} takes {name}: {annotation}"
    raise ValueError(
        f"Model option {shown} is not valid for {base.__name__} ({reason}{allowed}); fix it in "
        "model_options (checked before any trial)."
    )


def _check_optimizer_counts(optimizer_options: Mapping[str, Any] | None) -> None:
    r"""Refuse bad values of ``optimize_acqf``'s counts in ``optimizer_options`` before any trial:
    ``num_restarts`` and ``raw_samples`` whole numbers >= 1, and at least as many raw samples as
    restarts (the restarts are chosen among them). ``num_restarts=-1`` failed at the first
    model-based trial, after the Sobol evaluations. So did a misspelt name (``num_restart``: a
    ``TypeError`` from BoTorch): a name that none of the optimisers Ax may pick takes is refused
    too (:func:`_optimizer_argument_names`); the others are Ax's and BoTorch's to check."""
    if optimizer_options is None:
        return
    if not isinstance(optimizer_options, Mapping):
        raise ValueError(
            f"optimizer_options must be a dict of optimize_acqf arguments, got "
            f"{type(optimizer_options).__name__}."
        )
    known = _optimizer_argument_names()
    unknown = sorted(set(map(str, optimizer_options)) - known)
    if unknown:
        hints = [f"{name!r}{closest_name_hint(name, known)}" for name in unknown]
        raise ValueError(
            f"optimizer_options {', '.join(hints)}: no optimiser Ax may use takes "
            f"{'it' if len(unknown) == 1 else 'them'}; known: {', '.join(sorted(known))} "
            "(checked before any trial)."
        )
    # the top-level counts (Ax nests maxiter and batch_limit under "options")
    check_optimizer_counts(optimizer_options, "optimizer_options ")


def _optimizer_argument_names() -> set[str]:
    r"""The argument names of every BoTorch optimiser Ax's ``optimizer_argparse`` may pass
    ``optimizer_options`` to (which one depends on the search space), and of BoTorch's initial
    condition generator, which ``optimize_acqf`` hands its extra arguments to."""
    from botorch.optim import optimize as botorch_optimize
    from botorch.optim.initializers import gen_batch_initial_conditions
    from botorch.optim.optimize_homotopy import optimize_acqf_homotopy
    from botorch.optim.optimize_mixed import optimize_acqf_mixed_alternating

    functions = [
        botorch_optimize.optimize_acqf,
        botorch_optimize.optimize_acqf_mixed,
        botorch_optimize.optimize_acqf_discrete,
        botorch_optimize.optimize_acqf_discrete_local_search,
        optimize_acqf_homotopy,
        optimize_acqf_mixed_alternating,
        gen_batch_initial_conditions,
    ]
    return {
        name
        for function in functions
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    }


def make_generation_strategy(
    model: type[OnlineModel] | str = "OnlineExactGP",
    botorch_acqf_class: type | None = None,
    num_initial_trials: int = 5,
    model_options: dict[str, Any] | None = None,
    acquisition_options: dict[str, Any] | None = None,
    optimizer_options: dict[str, Any] | None = None,
    refit_every: int | str | None = DEFAULT_REFIT_EVERY,
    fit_options: dict[str, Any] | None = None,
    winsorize: bool = False,
    seed: int | None = None,
    torch_device: str | None = None,
) -> Any:
    r"""A Sobol -> bo_online ``GenerationStrategy`` for ``Client.set_generation_strategy``.

    Args:
        model: a bo_online model class or its name (``"OnlineExactGP"``, ``"WISKI"``, ...,
            or the CLI's ``"exact"``, ``"wiski"``, ``"tsvgp"``, ``"decoupled"``, ``"qsgp"``).
        botorch_acqf_class: BoTorch acquisition function class (the class itself, not its
            name); default ``qLogNoisyExpectedImprovement`` (Ax's choice for single objectives).
        num_initial_trials: Sobol trials before the model takes over (at least 2).
        model_options: constructor options of the model (``ModelConfig.model_options``); a
            ``refit_every`` here is used where the ``refit_every`` argument is left at its
            default.
        acquisition_options: keyword arguments for the acquisition function (Ax's
            ``acquisition_options``), e.g. ``{"beta": 2.0}`` for UCB.
        optimizer_options: keyword arguments for ``optimize_acqf`` (e.g. ``num_restarts``,
            ``raw_samples``).
        refit_every: the refit schedule, "auto" (default), an integer or None (see
            :class:`AxOnlineMixin`).
        fit_options: keyword arguments for the model's ``fit``.
        winsorize: keep Ax's ``Winsorize`` outcome transform. It is off by default: it moves
            earlier outcomes nonlinearly as data grow, which forces a rebuild every trial.
        seed: Sobol seed.
        torch_device: device for the model (default: Ax's).

    Returns:
        A ``GenerationStrategy`` with a Sobol node and a ``BOTORCH_MODULAR`` node whose surrogate
        is the Ax subclass of ``model``.
    """
    from ax.adapter.registry import Generators, MBM_X_trans
    from ax.adapter.transforms.derelativize import Derelativize
    from ax.adapter.transforms.standardize_y import StandardizeY
    from ax.adapter.transforms.winsorize import Winsorize
    from ax.core.trial_status import TrialStatus
    from ax.generation_strategy.generation_strategy import (
        GenerationNode,
        GenerationStrategy,
    )
    from ax.generation_strategy.generator_spec import GeneratorSpec
    from ax.generation_strategy.transition_criterion import MinTrials
    from ax.generators.torch.botorch_modular.surrogate import ModelConfig, SurrogateSpec
    from botorch.acquisition.acquisition import AcquisitionFunction
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement

    count = num_initial_trials
    if isinstance(count, numbers.Real) and not isinstance(count, (bool, numbers.Integral)):
        count = int(count) if math.isfinite(count) and float(count).is_integer() else None
    if not isinstance(count, numbers.Integral) or isinstance(count, bool) or count < 2:
        # 5.5 was taken as Ax's threshold (6 Sobol trials); "5" failed with a comparison error
        raise ValueError(
            "num_initial_trials must be an integer >= 2 (the model needs data to start from), "
            f"got {num_initial_trials!r}."
        )
    num_initial_trials = int(count)
    import uuid

    ax_cls = register_model_class(model)
    options = dict(model_options or {})
    every = _checked_refit_every(refit_every)  # now, not after the Sobol trials
    if "refit_every" in options:
        # Given in model_options (where ModelConfig takes it): it wins over the default argument
        # (it was silently replaced by "auto"); two different explicit values are an error.
        own = _checked_refit_every(options["refit_every"])
        if every != DEFAULT_REFIT_EVERY and every != own:
            raise ValueError(
                f"refit_every given twice: {refit_every!r} and model_options['refit_every'] = "
                f"{options['refit_every']!r}; give one."
            )
        every = own
    options["refit_every"] = every
    if "incremental" in options:  # a string such as "no" was read as true
        options["incremental"] = require_bool(options["incremental"], "incremental")
    if "fit_options" in options:
        # Given in model_options (where ModelConfig takes it): checked like the argument (a
        # misspelt name failed after the Sobol trials) and not silently replaced by it.
        own_fit = options.pop("fit_options")
        if fit_options is not None and own_fit is not None and own_fit != fit_options:
            raise ValueError(
                f"fit_options given twice: {fit_options!r} and model_options['fit_options'] = "
                f"{own_fit!r}; give one."
            )
        fit_options = own_fit if fit_options is None else fit_options
    if fit_options is not None and not isinstance(fit_options, dict):
        raise ValueError(
            f"fit_options must be a dict of keyword arguments for the model's fit, got "
            f"{fit_options!r}."
        )
    _check_option_names(ax_cls, options, fit_options)  # now, not after the Sobol trials
    _check_option_values(ax_cls, options)  # ... and their values
    # One key per strategy, i.e. per experiment (a strategy drives one experiment); it is stored
    # with the strategy, so a client reloaded from JSON goes on with its own models.
    options.setdefault("experiment_key", uuid.uuid4().hex)
    if fit_options:
        options["fit_options"] = dict(fit_options)
    acqf = botorch_acqf_class or qLogNoisyExpectedImprovement
    if not (isinstance(acqf, type) and issubclass(acqf, AcquisitionFunction)):
        # A name or an instance failed here with "'str' object has no attribute '__name__'".
        raise ValueError(
            "botorch_acqf_class must be a BoTorch acquisition function class, e.g. "
            f"botorch.acquisition.logei.qLogExpectedImprovement (the class, not its name or "
            f"an instance); got {botorch_acqf_class!r}."
        )
    y_transforms = (
        [DropNonFiniteY, Derelativize, Winsorize, StandardizeY]
        if require_bool(winsorize, "winsorize")
        else [
            DropNonFiniteY,
            Derelativize,
            StandardizeY,
        ]
    )
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
    _check_optimizer_counts(optimizer_options)  # now, not after the Sobol trials
    if optimizer_options:
        generator_kwargs["default_model_gen_options"] = {
            "optimizer_kwargs": dict(optimizer_options)
        }
    if torch_device is not None:
        # "cuda" on a machine without it failed at the first model-based trial, after the
        # Sobol evaluations (AssertionError: Torch not compiled with CUDA enabled)
        from bo_online.loops.core import checked_device

        generator_kwargs["torch_device"] = checked_device(torch_device, "torch_device")
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
