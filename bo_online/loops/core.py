r"""What every loop shares: the surrogate, the refit schedule, timing, records, checkpoints,
resume and the progress bar.

A loop is an ask/tell object (Trieste's ``AskTellOptimizer`` style): :meth:`OnlineLoop.ask`
proposes a batch, the caller (or :meth:`OnlineLoop.step`) evaluates it, :meth:`OnlineLoop.tell`
folds the result into the surrogate with ``model.update`` (in place) and refits hyperparameters
every ``refit_every`` steps (warm-started, at most ``fit_max_iter`` optimiser iterations; the
exact GP, and t-SVGP and the decoupled SVGP while every point is a basis, are instead rebuilt and
fit from the defaults, as BoTorch's loop does).
:meth:`OnlineLoop.run` is a thin driver over ``step``. Subclasses implement the initial design,
``ask``, the evaluation and the per-step record.

Nothing is written until the initial design has been evaluated and the surrogate built, so a run
that fails on bad options leaves no files behind -- except that :meth:`OnlineLoop.run` first takes
the directory's lock (``.lock``: the holder's pid, host and process start) and probes that it can
write there, so a directory in use or unwritable is refused before any evaluation (a directory it
had to create is removed again if the run fails before its first record).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import hashlib
import inspect
import json
import os
import pickle
import re
import shutil
import signal
import sys
import time
import warnings
from concurrent.futures import BrokenExecutor, Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor

from bo_online.errors import ObjectiveError
from bo_online.loops import history
from bo_online.loops.options import check_options, instantiate
from bo_online.loops.refit_rules import (
    WARM_REFIT_MAX_ITER,
    growth_refit_due,
    has_own_regime_kernel,
    is_exact_gp_on_data,
    refits_from_defaults,
)
from bo_online.models.fitting import standardization
from bo_online.models.registry import get_model_class
from bo_online.models.validation import closest_name_hint, max_abs_output
from bo_online.problems import make_problem
from bo_online.userdata import DataChangedError

__all__ = ["OnlineLoop", "RunDirectoryError", "instantiate"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32}
#: where a refit starts (see OnlineLoop's ``refit_from``)
REFIT_FROM = ("auto", "current")


class RunDirectoryError(ValueError):
    """The output directory already holds a run (resume it, or ask to overwrite)."""


def checked_device(device: str | torch.device, name: str = "--device") -> torch.device:
    r"""``device`` as a ``torch.device`` this machine can compute on (the CPU or an existing
    CUDA device), else a one-line ``ValueError`` saying why (``name``: how the user gave it, for
    the message)."""
    try:
        checked = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"Invalid device {device!r}: {e}") from e
    if checked.type not in ("cpu", "cuda"):  # e.g. meta: no values to compute with
        raise ValueError(
            f"{name} must be cpu or cuda (cuda:N), got {device!r} (device={device!r} in Python)."
        )
    if checked.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available.")
    if checked.type == "cuda" and (checked.index or 0) >= torch.cuda.device_count():
        raise ValueError(
            f"device {device!r} requested but this machine has "
            f"{torch.cuda.device_count()} CUDA device(s) (cuda:0 .. "
            f"cuda:{torch.cuda.device_count() - 1})."
        )
    return checked


class OnlineLoop:
    r"""Base class of the BO, active-learning and streaming loops.

    Args:
        model: registered surrogate name (see :func:`bo_online.models.registry.available_models`).
        model_options: keyword options passed to the surrogate's constructor unchanged.
        q: batch size per step.
        n_init: size of the initial design.
        seed: seed of everything random in the run.
        refit_every: refit hyperparameters after every ``refit_every``-th step (0: never after
            the initial fit), or ``"auto"`` (:meth:`OnlineLoop._refit_due`): every step for
            surrogates whose refit costs the same at every n (WISKI from its statistics, QSGP),
            and for the exact GP, t-SVGP, the decoupled SVGP and a model with a learned input
            projection (:meth:`OnlineLoop._refits_thin_out`) every step while
            n <= ``AUTO_REFIT_SMALL_N``, then whenever n has grown by ``AUTO_REFIT_GROWTH``
            since their last fit.
        fit_max_iter: iteration cap of each refit (warm-started from the current values; a
            refit from the defaults, :meth:`_rebuild_due`, gets
            ``max(fit_max_iter, init_fit_max_iter)``).
        init_fit_max_iter: iteration cap of the fit on the initial design (default:
            ``4 * fit_max_iter``).
        refit_from: where a refit starts. ``"auto"`` (default): from the current
            hyperparameters, except that the exact GP (and t-SVGP and the decoupled SVGP while
            they are the exact GP on their data) is rebuilt and fit from the defaults, as
            BoTorch's loop refits, that t-SVGP, the decoupled SVGP and QSGP also try a fit from
            the defaults while n <= ``AUTO_REFIT_SMALL_N`` (:meth:`_restart_due`), and that a
            learned input projection is re-derived from the data (WISKI above 6 inputs).
            ``"current"``: every refit continues from the current hyperparameters and
            projection (fitted jointly with them), at most ``fit_max_iter`` iterations, on
            every surrogate: with ``refit_every=1, fit_max_iter=1`` the one optimisation step
            per point of the WISKI paper's streaming experiments.
        fit_options: other keyword options of ``model.fit``.
        out_dir: run directory for records and checkpoints (None: keep everything in memory).
        checkpoint_every: write the checkpoint every this many steps (1: every step); None
            (default): by elapsed time, see ``checkpoint_seconds``.
        checkpoint_seconds: with ``checkpoint_every=None``, write the checkpoint after a step
            when at least this many seconds have passed since the last one (0: every step).
            Always written after the initial design, at the end of ``run`` and when ``run`` is
            stopped by SIGINT / SIGTERM (after the step in progress). Records appended after the
            last checkpoint are redone on resume, so records are identical either way. (Both
            pace the steps of ``run`` and ``step``; a ``tell`` called directly, with values the
            loop did not evaluate and a resume could not redo, is checkpointed every time.)
        overwrite: replace an existing run in ``out_dir``.
        quiet: no progress bar.
        device: where the surrogate and acquisition run.
        dtype: in which precision the surrogate and acquisition run.
        executor: a ``concurrent.futures.Executor`` for objective evaluations (None: in-process).
    """

    kind: ClassVar[str] = "loop"
    #: smallest initial design (BO: 0 when it starts from the user's data)
    min_n_init: ClassVar[int] = 1

    def __init__(
        self,
        *,
        model: str = "exact",
        model_options: dict[str, Any] | None = None,
        q: int = 1,
        n_init: int = 10,
        seed: int = 0,
        refit_every: int | str = 10,
        fit_max_iter: int = WARM_REFIT_MAX_ITER,
        init_fit_max_iter: int | None = None,
        fit_options: dict[str, Any] | None = None,
        refit_from: str = "auto",
        out_dir: str | Path | None = None,
        checkpoint_every: int | None = None,
        checkpoint_seconds: float = 30.0,
        overwrite: bool = False,
        quiet: bool = True,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "float64",
        executor: Executor | None = None,
    ) -> None:
        if refit_every != "auto":
            if isinstance(refit_every, str) or int(refit_every) != refit_every or refit_every < 0:
                raise ValueError(
                    f"refit_every must be 'auto' or an integer >= 0, got {refit_every!r}."
                )
        for name, value, low in (
            ("q", q, 1),
            ("n_init", n_init, self.min_n_init),
            ("fit_max_iter", fit_max_iter, 0),
            ("checkpoint_every", 1 if checkpoint_every is None else checkpoint_every, 1),
        ):
            if int(value) != value or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value}.")
        if not checkpoint_seconds >= 0:  # also rejects NaN
            raise ValueError(f"checkpoint_seconds must be >= 0, got {checkpoint_seconds}.")
        if refit_from not in REFIT_FROM:
            raise ValueError(f"refit_from must be one of {list(REFIT_FROM)}, got {refit_from!r}.")
        if init_fit_max_iter is not None and init_fit_max_iter < 0:
            raise ValueError(f"init_fit_max_iter must be >= 0, got {init_fit_max_iter}.")
        self.model_cls = get_model_class(model)  # raises for unknown / unavailable models
        check_options(dict(model_options or {}))  # allow-listed classes only; builds nothing
        if isinstance(dtype, str):
            if dtype not in _DTYPES:
                raise ValueError(
                    f"dtype (--dtype on the command line) must be one of {list(_DTYPES)}, got "
                    f"{dtype!r}."
                )
            dtype = _DTYPES[dtype]
        self.dtype = dtype
        self.device = checked_device(device)
        # Absolute from here on: an objective that changes the working directory must not send
        # the checkpoint and records somewhere else than the lock.
        self.out_dir = (
            None if out_dir is None else Path(os.path.abspath(Path(out_dir).expanduser()))
        )
        if self.out_dir is not None and self.out_dir.exists() and not self.out_dir.is_dir():
            raise RunDirectoryError(f"The output directory {str(self.out_dir)!r} is a file.")
        if self.out_dir is not None and self._holds_other_files(self.out_dir):
            raise RunDirectoryError(
                f"{str(self.out_dir)!r} is not empty and holds no bo-online run (no "
                f"{history.CHECKPOINT_FILE}, no {history.CONFIG_FILE} of a run); its files are "
                "left as they are. Give a new or empty directory for the run."
            )
        self._overwrite = overwrite
        self._refuse_another_run()
        self.config: dict[str, Any] = {
            "kind": self.kind,
            "model": model.lower(),
            "model_options": dict(model_options or {}),
            "q": int(q),
            "n_init": int(n_init),
            "seed": int(seed),
            "refit_every": refit_every if refit_every == "auto" else int(refit_every),
            "fit_max_iter": int(fit_max_iter),
            "init_fit_max_iter": (
                4 * int(fit_max_iter) if init_fit_max_iter is None else int(init_fit_max_iter)
            ),
            "fit_options": dict(fit_options or {}),
            "refit_from": refit_from,
            "checkpoint_every": None if checkpoint_every is None else int(checkpoint_every),
            "checkpoint_seconds": float(checkpoint_seconds),
            "device": str(self.device),
            "dtype": str(dtype).replace("torch.", ""),
        }
        if self.out_dir is not None:
            self._check_storable()
        self.quiet = quiet
        self.executor = executor
        self.model: Any = None
        self.records: list[dict[str, Any]] = []
        self.step_count = 0  # completed steps after the initial design
        self.target_steps: int | None = None
        self.wall_time = 0.0  # summed step times (continues across resume)
        self.elapsed = 0.0  # true wall time in run(), writing included (continues across resume)
        self._last_checkpoint = time.perf_counter()
        self._stop_signal: int | None = None
        self._driving = False  # run() or step() tells, a resume can redo them (see _checkpoint_due)
        self._elapsed_from: tuple[float, float] | None = None
        self._files_started = False
        self._resumed_files_due = False  # run files to rewrite first (see _restore, _commit)
        self._pending: dict[str, Any] | None = None
        self._lock = None if self.out_dir is None else history.RunLock(self.out_dir)
        # the run files as this loop last wrote or loaded them (see _retake_directory)
        self._stamp: tuple[Any, ...] | None = None
        self._checkpoint_steps: int | None = None  # step_count of the last checkpoint written
        self._n_last_fit: int | None = None  # data size at the last fit ("auto" schedule)
        #: whether the surrogate was the exact GP on its data at the last fit
        #: (:meth:`_left_exact_regime`)
        self._exact_at_last_fit = False
        # targets the surrogate sees: (y - shift) / scale, in float64, then cast to its dtype
        # (see _set_target_scaling); identity unless the surrogate runs below float64
        self.target_shift, self.target_scale = 0.0, 1.0

    def _refuse_another_run(self) -> None:
        r"""Refuse an ``out_dir`` that holds a run (its checkpoint) unless ``overwrite``: checked
        when the loop is built and again, under the directory's lock, before it writes there
        (another run may have been started and finished there in between)."""
        if self.out_dir is None or self._overwrite or not self._holds_run(self.out_dir):
            return
        if not (self.out_dir / history.CHECKPOINT_FILE).exists():
            raise RunDirectoryError(
                f"{str(self.out_dir)!r} holds the records of a run up to step "
                f"{history.last_recorded_step(self.out_dir)} but no checkpoint (it was removed), "
                "so that run cannot be resumed; start the new run in another directory, or "
                "replace those records with --overwrite (overwrite=True in Python)."
            )
        raise RunDirectoryError(
            f"{str(self.out_dir)!r} already holds a run; resume it (CLI: "
            f"{history.resume_command(self.out_dir)}, with --objective for your own objective; "
            f"Python: load_loop({str(self.out_dir)!r}, problem=...) for a problem built in "
            "Python) or start it afresh (--overwrite on the CLI, overwrite=True in Python)."
        )

    def _check_storable(self) -> None:
        """With ``out_dir``, the config must be JSON (it is written once the initial design has
        been evaluated): check now, before any evaluation, so a bad option costs nothing."""

        try:
            json.dumps(history.to_jsonable(self.config))
        except (TypeError, ValueError) as e:
            raise ValueError(
                "With out_dir, every model/fit option must be JSON (the run's config is stored "
                "for resume); give an object option as a spec {'__class__': "
                "'package.module.Class', 'args': [...], 'kwargs': {...}} (on the CLI: "
                f"key=package.module.Class(args)), or run without out_dir ({e})."
            ) from e
        instantiate(self.config["model_options"])  # the specs import and build (or raise)

    # ------------------------------------------------------------------ subclass hooks

    def _initial_design(self) -> dict[str, Any]:
        """Evaluate the initial design, build and fit the model; return the step-0 record."""
        raise NotImplementedError

    def ask(self) -> Tensor:
        raise NotImplementedError

    def _evaluate_pending(self) -> dict[str, Any]:
        """Evaluate the batch proposed by the last ``ask``; keyword arguments of ``tell``."""
        raise NotImplementedError

    def tell(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _state(self) -> dict[str, Any]:
        """Loop-specific state for the checkpoint (data seen, generators, ...)."""
        raise NotImplementedError

    def _restore_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _problem_spec(self) -> dict[str, Any] | None:
        raise NotImplementedError

    @functools.cached_property
    def _problem_digest(self) -> str:
        """:func:`problem_digest` of this run's problem (hashed once: pools can be large)."""
        return problem_digest(self.problem)

    def _status(self) -> str:
        """One short phrase for the progress bar (e.g. the best value so far)."""
        return ""

    def default_steps(self) -> int | None:
        """Steps ``run()`` takes when none are given (streaming: to the end of the stream)."""
        return None

    def max_steps(self) -> int | None:
        """The most steps after the initial design the loop's data allow (a stream's rows, an
        unlabelled pool), or None where there is no such limit. ``run`` refuses more."""
        return None

    # ------------------------------------------------------------------ shared machinery

    @property
    def tkwargs(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "device": self.device}

    @property
    def initialized(self) -> bool:
        return self.model is not None

    @property
    def wrote_run_files(self) -> bool:
        r"""Whether this loop has written its run files into ``out_dir`` (its first record, or
        a resumed run's): before that, a checkpoint found there belongs to another run (one
        that ``overwrite`` would have replaced), which nothing of this loop can continue."""
        return self._files_started

    def initialize(self) -> dict[str, Any]:
        """Run the initial design (once); writes the first record and checkpoint."""
        if self.initialized:
            raise RuntimeError("The loop is already initialised.")
        t0 = time.perf_counter()
        try:
            with self._seeded("init"):
                record = self._initial_design()
        except (RuntimeError, IndexError) as e:
            error = self._option_error(e)
            if error is e:  # not ``raise e from e``: an error its own cause hangs Dask (below)
                raise
            raise error from e
        # the initial design's whole time, less its test scoring (timed apart, ``time_test``)
        record.setdefault("time_step", time.perf_counter() - t0 - record.get("time_test", 0.0))
        self.wall_time += record["time_step"]
        record["wall_time"] = self.wall_time
        return self._commit(record)

    def _option_error(self, error: Exception) -> Exception:
        r"""What a failure of the initial design (building and first fit of the surrogate)
        becomes: where model options build objects (a kernel, a likelihood), a ``ValueError``
        naming them, since GPyTorch reports an object unfit for the data (a kernel with
        ``ard_num_dims`` for another number of inputs) only when first evaluated; anything
        else (no such options, a failing objective) as it was, which the caller raises as it
        is: raised ``from`` itself it would be its own ``__cause__``, a cycle that a Dask
        worker reporting the error of a task follows forever, its memory growing without
        bound."""
        from bo_online.errors import ObjectiveError

        built = [
            key
            for key, value in self.config["model_options"].items()
            if isinstance(value, dict) and "__class__" in value
        ]
        if not built or isinstance(error, ObjectiveError):
            return error
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return ValueError(
            f"Model {self.config['model']!r} failed on the initial design with its option(s) "
            f"{', '.join(built)} ({type(error).__name__}: {first}); check that they fit the "
            f"inputs the model gives them (the problem has {self.problem.dim}; e.g. "
            "ard_num_dims, active_dims)."
        )

    def _model_options(self) -> dict[str, Any]:
        options = instantiate(self.config["model_options"])
        if getattr(self.model_cls, "refits_on_update", False):
            options.setdefault("refit_max_iter", self.config["fit_max_iter"])
        return options

    def _scales_targets(self) -> bool:
        r"""Whether the loop centres and scales targets before they reach the surrogate
        (:meth:`_set_target_scaling`): where the surrogate runs below float64 and standardises
        real-valued targets itself (not with ``standardize=False`` or a likelihood on labels or
        counts, whose targets must arrive as given)."""
        if self.dtype == torch.float64:
            return False
        options = self._model_options()
        if options.get("standardize", True) is False:
            return False
        likelihood = options.get("likelihood")
        if likelihood is None:
            return True
        if isinstance(likelihood, str):  # QSGP's names: only "logistic" takes labels
            return likelihood.lower() != "logistic"
        if hasattr(likelihood, "standardizable"):
            return bool(likelihood.standardizable)
        from gpytorch.likelihoods import GaussianLikelihood

        return isinstance(likelihood, GaussianLikelihood)

    def _set_target_scaling(self, y: Tensor) -> None:
        r"""Fix, from the initial targets ``y`` (the model's sense, any shape), the affine map
        :meth:`_model_targets` applies for the whole run: ``(y - mean) / std`` computed in
        float64 (as the surrogates' own standardisation, a zero or undefined deviation being
        1), where :meth:`_scales_targets`; the identity otherwise (float64 runs are unchanged).

        The surrogates standardise targets themselves, but in their own dtype: cast to float32
        first, targets 1e8 + O(1) (the float32 spacing there is 8) arrive as one constant and
        the model learns nothing. Centred and scaled in float64 first, they reach it as O(1)
        values, and its own standardisation is then close to the identity. Kept in the
        checkpoint (``target_scaling``), so a resumed run feeds its model the same numbers."""
        if not self._scales_targets():
            self.target_shift, self.target_scale = 0.0, 1.0
            return
        mean, std = standardization(y.detach().to(device="cpu", dtype=torch.float64).reshape(-1))
        self.target_shift, self.target_scale = float(mean), float(std)

    def _model_targets(self, y: Tensor) -> Tensor:
        r"""Targets ``y`` (``n`` or ``n x 1``, the model's sense, user units) as the surrogate
        takes them: ``n x 1`` in its dtype and device, through the run's target scaling
        (centred and scaled in float64 before the cast; see :meth:`_set_target_scaling`)."""
        Y = y.reshape(-1, 1)
        if self.target_shift != 0.0 or self.target_scale != 1.0:
            Y = (Y.to(dtype=torch.float64) - self.target_shift) / self.target_scale
        return Y.to(**self.tkwargs)

    def _outgrows_target_scaling(self, y: Tensor) -> bool:
        r"""Whether new targets ``y`` (the model's sense, user units), through the run's target
        scaling (fixed from the initial design: :meth:`_set_target_scaling`), reach the
        magnitude a surrogate below float64 refuses. That happens when the initial values barely
        vary and a later one lies very far away (spread 1e-6, then a value 1e10 away: 1.4e16
        after the scaling, beyond float32's 1.8e15); the model's advice to rescale Y would not
        help the user, since the loop did the scaling."""
        if self.target_shift == 0.0 and self.target_scale == 1.0:  # no scaling (float64 runs)
            return False  # (then the model's own advice to rescale Y is right)
        return bool(self._model_targets(y).abs().max() >= max_abs_output(self.dtype))

    def _rebuild_rescaled(self, X: Tensor, y: Tensor, num_new: int) -> None:
        r"""Re-derive the target scaling from every target so far and the new ones (``y``:
        the model's sense, user units, the last ``num_new`` new; ``X``: their inputs, unit
        cube) and rebuild the surrogate on all of them (fit by the caller, from the defaults).
        Nothing changes if the build fails."""
        old = (self.target_shift, self.target_scale)
        y = y.detach().to(device="cpu", dtype=torch.float64).reshape(-1)
        self._set_target_scaling(y)
        try:
            model = self._build_model(X, self._model_targets(y))
        except BaseException:
            self.target_shift, self.target_scale = old
            raise
        far = float((y[-num_new:] - old[0]).abs().max()) / old[1]
        dtype = str(self.dtype).replace("torch.", "")
        warnings.warn(
            f"Step {self.step_count + 1}'s values lie {far:.3g} initial-design standard "
            f"deviations away; the loop's {dtype} target scaling was re-derived from all "
            f"{y.numel()} values and the surrogate rebuilt and refit.",
            RuntimeWarning,
            stacklevel=3,
        )
        self.model = model

    def _build_model(self, X: Tensor, Y: Tensor) -> Any:
        r"""The surrogate on ``X`` (``n x d``, unit cube) and ``Y`` (``n x 1``)."""
        options = self._model_options()
        defaults = getattr(self.model_cls, "loop_default_options", None)  # e.g. WISKI, d > 3
        if callable(defaults):
            options = {**defaults(X.shape[-1], options), **options}
        try:
            model = self.model_cls(X.to(**self.tkwargs), Y.to(**self.tkwargs), **options)
        except TypeError as e:  # unknown option names: say which model rejected them
            raise ValueError(
                f"Model {self.config['model']!r} rejected its options "
                f"{self.config['model_options']}: {e}{_closest_option_hint(self.model_cls, e)}"
            ) from e
        return model.to(**self.tkwargs)

    def _training_data(self) -> tuple[Tensor, Tensor] | None:
        r"""Every observation the surrogate holds: ``n x d`` inputs in its space (the unit cube)
        and ``n x 1`` outcomes as it sees them (:meth:`_model_targets`); None where the loop
        keeps no raw data."""
        return None

    def _initial_costs(self, t_fit: float, t_eval: float, t_update: float) -> dict[str, Any]:
        r"""The cost fields of the initial design's record (step 0: no acquisition)."""
        return {
            "refit": self.config["init_fit_max_iter"] > 0,
            "time_fit": t_fit,
            "time_acquisition": 0.0,
            "time_evaluation": t_eval,
            "time_update": t_update,
        }

    def _fit(self, max_iter: int) -> float:
        r"""Refit the surrogate (warm-started, at most ``max_iter`` iterations; where
        :meth:`_rebuild_due` it is rebuilt instead: :meth:`_refit_from_defaults`).

        A surrogate with a learned input map whose statistics depend on it (duck-typed: a
        ``projection`` attribute and a ``fit_projection(X, Y, ...)`` method, as WISKI on d > 3)
        cannot learn that map from its statistics alone; the loop keeps every observation, so it
        refits through ``fit_projection`` on them (map and hyperparameters jointly, statistics
        rebuilt). ``fit_options`` that ``fit_projection`` accepts are passed on; its optimiser
        defaults to L-BFGS here (bounded by ``max_iter``, like ``fit``). Not while the surrogate
        is the exact GP of a kernel of its own on the data it holds (WISKI above 6 inputs with
        ``regime_kernel="ard"``): that GP does not use the map, which is derived when it leaves
        the regime (:meth:`_left_exact_regime`), with the initial fit's budget at least (its
        SKI part starts from its defaults).
        """
        leaving_own_kernel = self._left_own_regime_kernel()
        if leaving_own_kernel:
            max_iter = max(max_iter, self.config["init_fit_max_iter"])
        if max_iter <= 0 and not leaving_own_kernel:
            if has_own_regime_kernel(self.model):  # so that its leaving the regime is seen
                self._exact_at_last_fit = is_exact_gp_on_data(self.model)
            return 0.0
        # (leaving it with no fit budget at all, fit_projection below still derives the map
        # from the data and rebuilds the statistics on it, fitting nothing: a map never derived
        # is random, and the constructor derives it outside that regime whatever the budget)
        self._n_last_fit = self._num_data()
        t0 = self._now()
        fit_projection = getattr(self.model, "fit_projection", None)
        data = self._training_data()
        from_current = self.config.get("refit_from", "auto") == "current"
        in_regime = is_exact_gp_on_data(self.model)
        if self._refits_projection() and data is not None and not in_regime:
            # from the current map: the joint gradient fit (re-deriving the map from the data
            # fits an exact GP on up to 400 points, seconds per refit whatever max_iter says)
            # (the initial fit derives the map from the data either way)
            joint = from_current and self.step_count > 0
            options = {"method": "lbfgs", "joint": joint, **self.config["fit_options"]}
            options = _accepted_options(fit_projection, self.model, "fit_projection", options)
            fit_projection(*data, max_iter=max_iter, **options)
        elif data is not None and self.step_count > 0 and not from_current and self._rebuild_due():
            self._refit_from_defaults(data, max_iter)  # (the initial fit starts there anyway)
        else:
            self.model.fit(max_iter=max_iter, **self._fit_options(self.model))
            if (
                data is not None
                and self.step_count > 0
                and not from_current
                and self._restart_due(data[0].shape[0])
            ):
                self._restart_from_defaults(data)
        self._exact_at_last_fit = is_exact_gp_on_data(self.model)
        return self._now() - t0

    def _refit_needed(self) -> bool:
        r"""Whether to refit after the step just told: when the schedule says so
        (:meth:`_refit_due`) or when the surrogate has left the exact-GP regime it was fitted
        in (:meth:`_left_exact_regime`)."""
        return self._refit_due() or self._left_exact_regime()

    def _left_exact_regime(self) -> bool:
        r"""Whether the surrogate was the exact GP on its data at the last fit and is not any
        more (duck-typed ``is_exact_gp_on_data()``: QSGP past ``exact_max_n``, t-SVGP and the
        decoupled SVGP past their bases), unless refits are off (``refit_every=0`` or
        ``fit_max_iter=0``). Its hyperparameters then maximise the exact GP's evidence, which
        is not what the model now predicts with: QSGP's weight-space posterior with the
        kernel's hyperparameters at n near m is confident and wrong (held-out NLL 3.0 against
        0.64 with its own evidence, 8 inputs, n = 300, m = 512), until the next refit; a stream
        refits every 50 points or 10%."""
        if self._left_own_regime_kernel():
            return True  # (whatever the schedule: its first fit, :meth:`_left_own_regime_kernel`)
        if self.config["refit_every"] == 0 or self.config["fit_max_iter"] == 0:
            return False
        return self._exact_at_last_fit and not is_exact_gp_on_data(self.model)

    def _left_own_regime_kernel(self) -> bool:
        r"""Whether the surrogate has just left an exact regime that used a kernel of its own
        (duck-typed ``regime_kernel == "ard"``: WISKI above 6 inputs), so that what it now
        predicts with (SKI, and its learned map) was never derived or fitted. It then gets that
        first fit even with ``refit_every=0``, with the initial fit's budget (``fit_max_iter=0``
        too: it is part of the initial fit). With no budget at all (``init_fit_max_iter=0`` as
        well) its map is still derived from the data, and nothing is fitted."""
        return (
            self._exact_at_last_fit
            and has_own_regime_kernel(self.model)
            and not is_exact_gp_on_data(self.model)
        )

    def _refit_from_defaults(self, data: tuple[Tensor, Tensor], max_iter: int) -> None:
        r"""Replace the surrogate by one built afresh on all data (``n x d``, ``n x 1``) and fit
        from the default hyperparameters with at most ``max(max_iter, init_fit_max_iter)``
        iterations (a start from the defaults needs the initial fit's budget): BoTorch's refit,
        where :meth:`_rebuild_due`. The online update that preceded it in this step is
        superseded.

        Not "keep the higher marginal likelihood": with few points the warm-started fit can
        follow the data into a near-interpolating mode (tiny noise, one very short lengthscale)
        whose likelihood is higher but whose BO stalls. Measured on Levy 3-D (q = 3, seed 10,
        36 points): warm lengthscales 0.052 / 0.34 / 6.9, noise 0.0049, -1.163 per point; from
        the defaults 0.51 / 0.44 / 2.3, noise 0.22, -1.339 per point (BoTorch's fit). Keeping
        the former, the loop never improved on its initial design in 90 evaluations (regret
        8.76); refitting from the defaults it reached 0.097."""
        fresh = self._build_model(*data)
        budget = max(max_iter, self.config["init_fit_max_iter"])
        fresh.fit(max_iter=budget, **self._fit_options(fresh))
        self.model = fresh

    def _fit_options(self, model: Any) -> dict[str, Any]:
        r"""``fit_options`` for ``model.fit``: all of them (a name it does not take is refused
        there), except for a model that the loop otherwise refits through ``fit_projection``
        (:meth:`_refits_projection`; ``fit`` only in WISKI's exact regime of its own kernel) and
        declares the settings ``fit`` takes (``fit_settings_class``), which gets those ``fit``
        takes, as ``fit_projection`` gets those it takes: ``joint`` made such a run (above 6
        inputs) fail at its first fit."""
        options = dict(self.config["fit_options"])
        if not self._refits_projection(model) or getattr(model, "fit_settings_class", None) is None:
            return options
        return _accepted_options(model.fit, model, "fit", options)

    def _rebuild_due(self) -> bool:
        r"""Whether a refit rebuilds the surrogate from its defaults
        (:meth:`_refit_from_defaults`) instead of warm-starting it: always for a surrogate whose
        fit cost grows with n (the exact GP: the rebuild costs what its refit costs anyway), and
        for one that says it is the exact GP on the data it holds (duck-typed
        ``is_exact_gp_on_data()``: t-SVGP and the decoupled SVGP with a Gaussian likelihood
        while every point is an inducing input / covariance basis, n <= 128 by default; QSGP
        while it predicts with its kernel's exact GP, n <= 512 by default), where the exact
        GP's reason holds; beyond that their refits are warm-started."""
        return refits_from_defaults(self.model, self._fit_cost_grows_with_n())

    def _restart_due(self, n: int) -> bool:
        r"""Whether a warm-started refit also tries a fit from the defaults
        (:meth:`_restart_from_defaults`): for a surrogate that declares
        ``restart_fit_from_defaults`` (QSGP; t-SVGP and the decoupled SVGP where they are not the
        exact GP: a non-Gaussian likelihood or fewer inducing / covariance bases than points; a
        rebuild from all data is O(n)) while n <= ``AUTO_REFIT_SMALL_N``, where a warm start's
        basin matters most and a second small fit costs little. (Where :meth:`_rebuild_due` the
        surrogate is not warm-started at all.)"""
        return bool(getattr(self.model_cls, "restart_fit_from_defaults", False)) and (
            n <= self.AUTO_REFIT_SMALL_N
        )

    def _restart_from_defaults(self, data: tuple[Tensor, Tensor]) -> None:
        r"""Also fit a model built afresh on all data (default hyperparameters, the initial
        fit's iteration budget) and keep whichever has the higher marginal likelihood.

        A warm-started refit stays in the basin of the previous hyperparameters; with few points
        that basin is often a poor one (measured on Styblinski-Tang 4-D after 20 steps: warm log
        marginal likelihood -1.36 per point against -0.91 from the defaults, lengthscales
        0.19/0.07/0.03/2.5 against 1.5/0.6/0.24/0.14), which is the gap to BoTorch's
        refit-from-defaults loop. For the surrogates of :meth:`_restart_due`: the rebuilt
        model is the same posterior family on the same data, and both are compared by the
        model's own fit objective (``marginal_log_likelihood``, per point)."""
        mll = getattr(self.model, "marginal_log_likelihood", None)
        if not callable(mll):
            return
        fresh = self._build_model(*data)
        fresh.fit(max_iter=self.config["init_fit_max_iter"], **self.config["fit_options"])
        with torch.no_grad():
            if float(fresh.marginal_log_likelihood()) > float(mll()):
                self.model = fresh

    #: "auto" schedule of a surrogate whose fit cost grows with n: refit every step up to this n,
    AUTO_REFIT_SMALL_N: ClassVar[int] = 100
    #: then whenever n has grown by this fraction since the last fit.
    AUTO_REFIT_GROWTH: ClassVar[float] = 0.1
    #: registry names whose fit cost grows with n, for classes that do not declare
    #: ``fit_cost_grows_with_n`` themselves (the exact GP: O(n^3) per marginal likelihood).
    FIT_COST_GROWS_WITH_N: ClassVar[frozenset[str]] = frozenset({"exact"})

    def _fit_cost_grows_with_n(self) -> bool:
        declared = getattr(self.model_cls, "fit_cost_grows_with_n", None)
        if declared is not None:
            return bool(declared)
        return self.config["model"] in self.FIT_COST_GROWS_WITH_N

    def _refits_thin_out(self) -> bool:
        r"""Whether the ``"auto"`` schedule spaces this surrogate's refits geometrically in n:
        where its fit cost grows with n (the exact GP) and where a warm-started refit visits
        every point held: a class declaring ``refit_visits_every_point`` (t-SVGP and the
        decoupled SVGP, whose bound sums over all rows), and a model with a learned input
        projection, which :meth:`_fit` refits with ``fit_projection`` on all raw data held
        (WISKI above its all-pairs dimensions)."""
        return bool(
            self._fit_cost_grows_with_n()
            or getattr(self.model_cls, "refit_visits_every_point", False)
            or self._refits_projection()
        )

    def _refits_projection(self, model: Any = None) -> bool:
        r"""Whether the surrogate has a learned input map that :meth:`_fit` refits through its
        ``fit_projection`` (duck-typed: a ``projection`` attribute that is set and a
        ``fit_projection`` method), where the loop keeps the raw data; ``model``: another
        surrogate than the loop's (a rebuilt one) asked the same."""
        model = self.model if model is None else model
        return getattr(model, "projection", None) is not None and callable(
            getattr(model, "fit_projection", None)
        )

    def _num_data(self) -> int | None:
        data = self._training_data()
        if data is not None:
            return int(data[0].shape[0])
        n = getattr(self.model, "num_data", None)
        return None if n is None else int(n)

    def _refit_due(self) -> bool:
        r"""Whether to refit after the step just told.

        ``refit_every = k``: every k-th step. ``"auto"``: every step when a refit costs the
        same at every n (WISKI from its statistics, QSGP: a warm-started refit of at most
        ``fit_max_iter`` iterations); for an exact GP (O(n^3) per iteration), for t-SVGP and
        the decoupled SVGP (a warm-started refit sums their bound over every point held, O(n)
        per iteration) and for a model with a learned input projection (refit through
        ``fit_projection`` on all raw data held; :meth:`_refits_thin_out`) every step while n <=
        ``AUTO_REFIT_SMALL_N``, then only once n has grown by ``AUTO_REFIT_GROWTH`` (10%) since
        the last fit, so the total refit cost stays within a constant factor of one fit at the
        final n (geometric series) while the hyperparameters never lag more than 10% of the
        data. (On the long campaign's Levy runs with a refit every step, t-SVGP's fit grew
        from 0.24 s per step at n <= 455 to 0.51 s at n = 908-1,355.)
        """
        k = self.config["refit_every"]
        if getattr(self.model_cls, "refits_on_update", False) or k == 0:
            return False
        if self.config["fit_max_iter"] == 0:
            return False  # a refit of no iterations would be recorded but not happen
        if k != "auto":
            return self.step_count % k == 0
        if not self._refits_thin_out():
            return True
        n = self._num_data()
        if n is None or n <= self.AUTO_REFIT_SMALL_N:
            return True
        if self._n_last_fit is None:
            self._n_last_fit = self._last_fit_n_from_records()
        return growth_refit_due(
            n, self._n_last_fit, self.AUTO_REFIT_SMALL_N, self.AUTO_REFIT_GROWTH
        )

    def _last_fit_n_from_records(self) -> int | None:
        """Data size at the last refit, from the records (after a resume)."""
        for record in reversed(self.records):
            if record.get("refit") and record.get("n") is not None:
                return int(record["n"])
        return None

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _seeded(self, phase: str) -> contextlib.AbstractContextManager:
        return history.seeded(self.config["seed"], self.step_count, phase, self.device)

    def evaluate_batch(self, fn: Any, X: Tensor) -> Tensor:
        r"""``fn`` at each row of ``X`` (``q x d``, CPU float64) -> ``q``, one executor task per
        row when an executor was given (results gathered in order), else one in-process call."""
        X = X.detach().to(device="cpu", dtype=torch.float64)
        if self.executor is None:
            return fn(X).reshape(-1)
        # Rows go to and values come back as lists, and a process pool gets the objective
        # pickled by plain pickle (its tensors, e.g. the box, by value): a tensor crossing to a
        # worker process otherwise goes through torch's file-descriptor sharing, whose server
        # thread printed an EOFError traceback when the pool was shut down mid-transfer (a run
        # stopped by a failing objective).
        if isinstance(self.executor, ProcessPoolExecutor):
            fn = pickle.dumps(fn)
        futures = [
            self.executor.submit(_evaluate_rows, fn, X[i : i + 1].tolist())
            for i in range(X.shape[0])
        ]
        try:
            return torch.cat(
                [torch.as_tensor(f.result(), dtype=torch.float64).reshape(-1) for f in futures]
            )
        except BrokenExecutor as e:
            # A worker process died mid-evaluation (a crash in compiled code, os._exit, the
            # out-of-memory killer): the objective's failure, not a traceback from the pool.
            from bo_online.errors import ObjectiveError

            name = getattr(getattr(self, "problem", None), "name", "objective")
            raise ObjectiveError(
                f"Objective {name!r}: the worker process evaluating it died ({type(e).__name__}: "
                f"{e} -- a crash, os._exit or the out-of-memory killer)",
                name,
            ) from e

    def step(self) -> dict[str, Any]:
        """One ask -> evaluate -> tell round; returns its record."""
        if not self.initialized:
            self.initialize()
        if self._files_started:  # refused before evaluating: a stale loop writes nothing
            self._retake_directory()
        self.ask()
        driving, self._driving = self._driving, True
        try:
            return self.tell(**self._evaluate_pending())
        finally:
            self._driving = driving

    def run(
        self, steps: int | None = None, callback: Callable[[dict[str, Any]], None] | None = None
    ) -> list[dict[str, Any]]:
        r"""Run until ``steps`` steps after the initial design are done (a resumed loop
        continues where it stopped). ``callback(record)`` is called after each step's record
        and checkpoint are written. Returns all records."""
        if steps is None:
            steps = self.target_steps if self.target_steps is not None else self.default_steps()
        if steps is None:
            limit = self.max_steps()
            raise ValueError(
                f"{type(self).__name__}.run() needs the number of steps, e.g. run(30)"
                + ("" if limit is None else f" (the data allow at most {limit})")
                + "; only a stream runs to its end by default."
            )
        if int(steps) != steps or steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {steps}.")
        if steps < self.step_count:  # it ran nothing and lowered the run's target
            raise ValueError(
                f"steps={steps} is below the {self.step_count} steps this run has already done; "
                "pass a larger number to extend it, or leave it out to finish the run's target."
            )
        limit = self.max_steps()
        if limit is not None and steps > limit:  # refused before anything is evaluated
            raise ValueError(
                f"steps={steps} exceeds the {limit} steps the data hold "
                f"({self.config['n_init']} initial points, then {self.config['q']} per step)."
            )
        self.target_steps = int(steps)
        created = self._claim_directory()
        start, base = time.perf_counter(), self.elapsed
        self._last_checkpoint = start
        self._elapsed_from = (start, base)
        driving, self._driving = self._driving, True
        try:
            with self._stop_on_signals():
                if not self.initialized:
                    # Before the progress bar: a failure here (bad model options, ...) prints
                    # nothing else.
                    record = self.initialize()
                    if callback is not None:
                        callback(record)
                try:
                    self._run_steps(callback)
                except ObjectiveError:
                    self._checkpoint_before_failure()
                    raise
                if self._stop_signal is not None and self.out_dir is not None and self.initialized:
                    self.save_checkpoint()  # the state after the last whole step
        finally:
            self.elapsed = base + time.perf_counter() - start
            self._elapsed_from = None
            self._driving = driving
            self._release_directory(created)
        if self._stop_signal is not None:
            self._stop_now()
        return self.records

    def _stop_now(self) -> None:
        r"""Act on the stop signal :meth:`run` received (``_stop_signal``, cleared): raise
        ``KeyboardInterrupt`` for SIGINT, else ``SystemExit(128 + signum)``."""
        signum, self._stop_signal = self._stop_signal, None
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def _checkpoint_before_failure(self) -> None:
        r"""The user's objective raised mid-step: checkpoint the state after the last whole step
        (the failed step changed nothing a checkpoint holds: its proposal is redone, from the
        same seed, by a resume), so that a resume once the objective is fixed evaluates only the
        failed step again, not every step since the last periodic checkpoint (each a costly
        evaluation, or a lab's). A checkpoint that cannot be written leaves the objective's
        error to be reported, and the last one stands."""
        if self.out_dir is None or not self.initialized or not self._files_started:
            return
        with contextlib.suppress(Exception):
            self.save_checkpoint()

    def _run_steps(self, callback: Callable[[dict[str, Any]], None] | None) -> None:
        r"""The steps of :meth:`run` after the initial design, until ``target_steps`` or a stop
        signal (``_stop_signal``); :meth:`run` claims the directory, handles the signals and
        writes the checkpoint around it."""
        with self._progress() as advance:
            while self.step_count < self.target_steps and self._stop_signal is None:
                record = self.step()
                advance()
                if callback is not None:
                    callback(record)

    def _claim_directory(self) -> bool:
        r"""Lock ``out_dir`` (refused if another live process holds it), remove temp files of an
        interrupted write, and probe that it is writable; True if the directory was created."""
        if self.out_dir is None or self._lock is None:
            return False
        created = not self.out_dir.exists()
        history.probe_writable(self.out_dir)
        try:
            self._retake_directory()
            if not self._files_started:  # a new run: none may have appeared since it was built
                self._refuse_another_run()
            history.remove_orphans(self.out_dir)
            self._sync_resumed_files()
        except BaseException:
            self._release_directory(created)
            raise
        return created

    def _release_directory(self, created: bool) -> None:
        if self._lock is not None:
            self._lock.release()
        if created and not self._files_started and self.out_dir is not None:
            with contextlib.suppress(OSError):
                self.out_dir.rmdir()  # only if still empty

    def _files_stamp(self) -> tuple[Any, ...]:
        r"""Size, modification time and inode of the records file and the checkpoint (None for
        one absent): any write there (an append, an atomic replace, a removal) changes it."""
        assert self.out_dir is not None
        stamp = []
        for name in (history.RECORDS_FILE, history.CHECKPOINT_FILE):
            try:
                st = (self.out_dir / name).stat()
            except FileNotFoundError:
                stamp.append(None)
            else:
                stamp.append((st.st_size, st.st_mtime_ns, st.st_ino))
        return tuple(stamp)

    def _retake_directory(self) -> None:
        r"""Before this loop writes to ``out_dir``: hold its lock (taken again by a loop stepped
        or run after :meth:`run` returned and released it; refused if another process holds it),
        and check that the run files are as this loop last wrote or loaded them. If they
        changed (another process, or another loop of this one, continued the run there; they
        were removed), this loop's state is behind them and writing would interleave two runs'
        records: refused, the lock given up."""
        if self._lock is None:
            return
        self._lock.acquire()
        if self._stamp is None or self._files_stamp() == self._stamp:
            return
        self._lock.release()  # the file stays while another loop of this process holds it
        raise RunDirectoryError(
            f"The run files in {str(self.out_dir)!r} have changed since this loop last wrote or "
            "loaded them (the run went on elsewhere, e.g. resumed by another process or loop, "
            "or they were removed), so this loop no longer matches them and writes nothing; "
            f"load the run again (load_loop({str(self.out_dir)!r}, ...)) to continue from its "
            "files."
        )

    def _note_files(self) -> None:
        """Remember the run files as this loop has just written them (see _retake_directory)."""
        if self.out_dir is not None:
            self._stamp = self._files_stamp()

    @contextlib.contextmanager
    def _stop_on_signals(self):
        r"""While ``run`` runs (in the main thread): SIGINT / SIGTERM let the step in progress
        finish, then ``run`` writes the checkpoint and raises ``KeyboardInterrupt`` (SIGINT) or
        ``SystemExit(128 + signum)``. A second signal acts at once (the default handlers are back).
        """
        import threading

        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def handler(signum: int, frame: Any) -> None:
            self._stop_signal = signum
            for s, h in previous.items():
                signal.signal(s, h)
            # Say so: the step in progress (an objective, a fit) can take long, and a first
            # Ctrl-C that seems ignored invites a second one, which stops without a checkpoint.
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            saving = " and saving a checkpoint" if self.out_dir is not None else ""
            sys.stderr.write(
                f"bo-online: {name} received: stopping after the step in progress{saving} "
                "(send it again to stop at once).\n"
            )
            sys.stderr.flush()

        for s in previous:
            signal.signal(s, handler)
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _finish_record(self, record: dict[str, Any]) -> dict[str, Any]:
        times = [
            record.get(k, 0.0)
            for k in ("time_fit", "time_acquisition", "time_evaluation", "time_update")
        ]
        record["time_step"] = float(sum(times))
        self.wall_time += record["time_step"]
        record["wall_time"] = self.wall_time
        return self._commit(record)

    def _commit(self, record: dict[str, Any]) -> dict[str, Any]:
        record = history.to_jsonable(record)  # in memory exactly what the JSONL file holds
        if self._files_started:
            self._retake_directory()
        self.records.append(record)
        if self.out_dir is None:
            return record
        if not self._files_started:
            self._start_files()
        try:
            self._sync_resumed_files(self.records[:-1])  # the records before this one, if resumed
            history.append_record(self.out_dir / history.RECORDS_FILE, record)
        except BaseException:
            # The step is done but the file may lack its record or hold part of it (a full
            # disk): rewritten whole from memory before this loop writes again (a retry).
            self._resumed_files_due = True
            raise
        finally:  # also after a failed write (full disk): its part is this loop's own
            self._note_files()
        last = self.target_steps is not None and self.step_count >= self.target_steps
        if self._checkpoint_due() or last:
            self.save_checkpoint()
        return record

    def _checkpoint_due(self) -> bool:
        r"""Every ``checkpoint_every`` steps when set; otherwise by elapsed time (at most every
        ``checkpoint_seconds``), and always after the initial design and after a ``tell`` the
        user called (not through :meth:`run` or :meth:`step`): its values (a lab measurement,
        a pool row of the user's choice) may exist nowhere else, and a resume, which drops the
        records after the checkpoint to redo them, could not redo it."""
        if not self._driving:
            return True
        every = self.config["checkpoint_every"]
        if every is not None:
            return self.step_count % every == 0
        elapsed = time.perf_counter() - self._last_checkpoint
        return self.step_count == 0 or elapsed >= self.config["checkpoint_seconds"]

    def _start_files(self) -> None:
        assert self.out_dir is not None and self._lock is not None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()  # a no-op under run(); held to exit when driven by step()
        try:  # driven by step(), nothing has checked under the lock yet
            self._refuse_another_run()
        except RunDirectoryError:
            self._lock.release()
            raise
        if self._overwrite:
            for name in (history.RECORDS_FILE, history.CHECKPOINT_FILE, history.CONFIG_FILE):
                (self.out_dir / name).unlink(missing_ok=True)
            shutil.rmtree(self.out_dir / "plots", ignore_errors=True)
        history.write_json(
            self.out_dir / history.CONFIG_FILE,
            {**self.config, "problem": self._problem_spec()},
        )
        history.rewrite_records(self.out_dir / history.RECORDS_FILE, self.records[:-1])
        self._files_started = True
        self._note_files()

    @staticmethod
    def _holds_other_files(out_dir: Path) -> bool:
        r"""Whether ``out_dir`` exists, is not empty (bar the lock files) and holds neither a run
        (its checkpoint) nor what a run leaves before its first checkpoint (a configuration
        naming a loop kind): a user's folder, whose files a run would overwrite."""
        if not out_dir.is_dir():
            return False
        names = {
            p.name
            for p in out_dir.iterdir()
            if p.name != history.LOCK_FILE
            and not any(fnmatch.fnmatchcase(p.name, o) for o in history.ORPHAN_PATTERNS)
        }  # a run's own leftovers (lock, temp files of a write it was killed in) are not a user's
        if not names or history.CHECKPOINT_FILE in names:
            return False
        try:
            config = json.loads((out_dir / history.CONFIG_FILE).read_text())
        except (OSError, ValueError):
            return True
        return not (isinstance(config, dict) and "kind" in config and "model" in config)

    @staticmethod
    def _holds_run(out_dir: Path) -> bool:
        r"""A run is held once its first checkpoint exists; records without one are left by a
        run killed before (or during) its first checkpoint, which is simply started again --
        unless they go past step 0 (:func:`history.last_recorded_step`): that run's checkpoint
        was removed, and its records are results that only ``overwrite`` may replace."""
        if (out_dir / history.CHECKPOINT_FILE).exists():
            return True
        last = history.last_recorded_step(out_dir)
        return last is not None and last > 0

    # ------------------------------------------------------------------ checkpoint / resume

    def checkpoint(self) -> dict[str, Any]:
        """Everything needed to continue this run exactly."""
        return {
            "format": 1,
            "kind": self.kind,
            "config": self.config,
            "problem": self._problem_spec(),
            "problem_digest": self._problem_digest,
            "step_count": self.step_count,
            "target_steps": self.target_steps,
            "wall_time": self.wall_time,
            "elapsed": self._elapsed_now(),
            "records": self.records,
            "model_state": {
                k: v.detach().cpu() if torch.is_tensor(v) else v
                for k, v in self.model.state_dict().items()
            },
            "state": self._state(),
            "target_scaling": [self.target_shift, self.target_scale],
            # loop state the refit rule reads (_left_exact_regime): not derivable from the model
            "exact_at_last_fit": self._exact_at_last_fit,
        }

    def _elapsed_now(self) -> float:
        """True wall time of the run so far (``elapsed``, live while ``run`` runs)."""
        if self._elapsed_from is None:
            return self.elapsed
        start, base = self._elapsed_from
        return base + time.perf_counter() - start

    def save_checkpoint(self) -> None:
        if self.out_dir is None:
            raise ValueError("This loop has no out_dir to checkpoint to.")
        if self._files_started:
            self._retake_directory()
        try:
            history.save_checkpoint(self.out_dir / history.CHECKPOINT_FILE, self.checkpoint())
            self._checkpoint_steps = self.step_count
        finally:
            self._note_files()
        self._last_checkpoint = time.perf_counter()

    @property
    def finished_on_disk(self) -> bool:
        r"""Whether ``out_dir`` holds this run finished: its checkpoint, written by this loop
        and unchanged since, holds every step of the run's target (``target_steps``), so a
        resume would have nothing to do (a stop signal that arrived while it was written, or
        after, stopped nothing)."""
        if self.out_dir is None or self.target_steps is None or self._checkpoint_steps is None:
            return False
        if self._checkpoint_steps < self.target_steps:
            return False
        return self._files_stamp() == self._stamp  # no one wrote or removed them since

    def _restore(self, ckpt: dict[str, Any], init_X: Tensor, init_y: Tensor) -> None:
        r"""Rebuild the model on the initial data (``init_y``: targets in the model's sense, user
        units), load its saved state, restore the rest."""
        # a checkpoint written before the loops scaled targets fed its model the raw targets
        self.target_shift, self.target_scale = (
            float(v) for v in ckpt.get("target_scaling", (0.0, 1.0))
        )
        self.model = self._build_model(init_X, self._model_targets(init_y))
        try:
            self.model.load_state_dict(
                {
                    k: v.to(self.device) if torch.is_tensor(v) else v
                    for k, v in ckpt["model_state"].items()
                }
            )
        except (RuntimeError, KeyError, TypeError, AttributeError) as e:
            raise history.RunFileError(
                f"The checkpoint in {str(self.out_dir)!r} does not match its own configuration "
                f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); start "
                "the run again with --overwrite."
            ) from e
        self.model.eval()
        self.step_count = int(ckpt["step_count"])
        self.target_steps = ckpt["target_steps"]
        self.wall_time = float(ckpt["wall_time"])
        self.elapsed = float(ckpt.get("elapsed", self.wall_time))  # absent in older checkpoints
        self.records = list(ckpt["records"])
        # absent in checkpoints written before the loops refit on leaving the exact regime
        self._exact_at_last_fit = bool(ckpt.get("exact_at_last_fit", False))
        if self.out_dir is not None:
            # the checkpoint on disk holds these steps (finished_on_disk: a resume of a finished
            # run writes none, and a stop during its summary said to resume it again)
            if (self.out_dir / history.CHECKPOINT_FILE).is_file():
                self._checkpoint_steps = self.step_count
            self._files_started = True
            # written once the run goes on (_sync_resumed_files): a resume refused before
            # (steps beyond the data) leaves the files as they were
            self._resumed_files_due = True
            self._note_files()

    def _sync_resumed_files(self, records: list[dict[str, Any]] | None = None) -> None:
        r"""Once a resumed run goes on (:meth:`run`, or its next record): rewrite the records
        file from the checkpoint, dropping records appended after it (those steps are redone),
        and the configuration file, derived from the checkpoint (a damaged or hand-edited copy
        cannot outlive a resume). Likewise after a record's append failed (see :meth:`_commit`):
        the records file is rewritten from the records in memory. ``records``: those to write
        (default all; a record being committed, which is then appended, is not among them)."""
        if not self._resumed_files_due or self.out_dir is None:
            return
        try:
            history.rewrite_records(
                self.out_dir / history.RECORDS_FILE, self.records if records is None else records
            )
            history.write_json(
                self.out_dir / history.CONFIG_FILE,
                {**self.config, "problem": self._problem_spec()},
            )
            self._resumed_files_due = False
        finally:  # also after a failed write (the configuration's, on a full disk, after the
            # records were rewritten): the files are this loop's own, and a retry goes on
            self._note_files()

    # ------------------------------------------------------------------ progress bar

    @contextlib.contextmanager
    def _progress(self):
        if self.quiet:
            yield lambda: None
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        total = (self.target_steps or 0) + 1
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=Console(stderr=True),
            transient=False,
        )
        done = self.step_count + (1 if self.initialized else 0)
        with progress:
            task = progress.add_task(
                f"{self.kind} {self.config['model']}", total=total, completed=done, status=""
            )

            def advance() -> None:
                last = self.records[-1] if self.records else {}
                per_step = last.get("time_step", float("nan"))
                progress.update(task, advance=1, status=f"{self._status()}  {per_step:.3f} s/step")

            yield advance


#: the tensors that define a problem for :func:`problem_digest` (those it has)
_PROBLEM_TENSORS = ("bounds", "X_pool", "y_pool", "X_stream", "y_stream", "X_test", "y_test")


def problem_digest(problem: Any) -> str:
    r"""SHA-256 of what defines a problem: its box, direction and, for pool and stream problems,
    every row (in float64), so that a run resumed with ``problem=`` can refuse other data. A
    user callable's code is not hashed (only its box and direction)."""
    header = {k: getattr(problem, k, None) for k in ("maximize", "noise_std", "task")}
    digest = hashlib.sha256(repr(sorted(header.items())).encode())
    for name in _PROBLEM_TENSORS:
        value = getattr(problem, name, None)
        if value is None:
            continue
        # flattened: y as n or n x 1, bounds as a tensor or a list, are the same problem
        values = torch.as_tensor(value).detach().to(device="cpu", dtype=torch.float64)
        width = values.shape[-1] if name.startswith("X") and values.dim() > 1 else 1
        values = values.reshape(-1).contiguous()
        digest.update(f"{name}:{values.numel()}x{width}".encode())
        digest.update(values.numpy().tobytes())
    return digest.hexdigest()


def check_resumed_problem(ckpt: dict[str, Any], problem: Any) -> None:
    r"""Refuse a problem passed to a resume whose data differ from the run's (checkpoints from
    before the digest was stored are not checked)."""
    expected = ckpt.get("problem_digest")
    if expected is not None and problem_digest(problem) != expected:
        raise DataChangedError(
            "The problem passed to resume is not the one this run started on (its box, "
            "direction or data rows differ); pass the same problem, or start a new run in "
            "another directory."
        )
    # A run of an --objective file: the digest covers the box and direction, not the function,
    # so the spec is compared too (as bo-online resume --objective compares it).
    stored = (ckpt.get("config") or {}).get("objective")
    given = getattr(problem, "objective_spec", None)
    if isinstance(stored, dict) and isinstance(given, dict):
        from bo_online.objectives import canonical_spec

        if canonical_spec(given["objective"]) != canonical_spec(stored["objective"]):
            raise DataChangedError(
                f"The problem passed to resume optimises {given['objective']!r}, this run "
                f"{stored['objective']!r}; a run resumes only with the objective it started with."
            )


def _evaluate_rows(fn: Callable[[Tensor], Tensor] | bytes, rows: list[list[float]]) -> list[float]:
    r"""``fn`` (or ``fn`` pickled) on ``rows`` (``q x d`` as lists), its values as a list: what
    an executor's worker runs for :meth:`OnlineLoop.evaluate_batch` (plain data both ways;
    float64 round-trips exactly through Python floats)."""
    if isinstance(fn, bytes):
        fn = pickle.loads(fn)
    return fn(torch.tensor(rows, dtype=torch.float64)).reshape(-1).tolist()


def _closest_option_hint(model_cls: type, error: TypeError) -> str:
    r"""``" (did you mean 'grid_size'?)"`` when ``error`` is Python's ``unexpected keyword
    argument 'gridsize'`` and the constructor takes a name close to it; else ``""``."""
    found = re.search(r"unexpected keyword argument '([^']+)'", str(error))
    if found is None:
        return ""
    try:
        names = inspect.signature(model_cls.__init__).parameters
    except (TypeError, ValueError):
        return ""
    return closest_name_hint(found.group(1), names)


def _accepted_options(
    method: Callable[..., Any], model: Any, name: str, options: dict[str, Any]
) -> dict[str, Any]:
    r"""The ``options`` that ``model``'s ``method`` (its ``name``) takes by name: its own
    parameters and, where the model has a settings class for it (``fit_settings_class``,
    ``fit_projection_settings_class``: ``method(..., settings, **overrides)``), that class's
    fields."""
    import inspect

    accepted = set(inspect.signature(method).parameters)
    settings_class = getattr(model, f"{name}_settings_class", None)
    if settings_class is not None:
        accepted |= {f.name for f in dataclasses.fields(settings_class)}
    return {k: v for k, v in options.items() if k in accepted}


def resume_in_python_advice(what: str, out_dir: str | Path | None, kind: str | None) -> str:
    r"""Why a run whose problem was made in Python (``what``: "objective is a Python callable",
    "pool was built in Python", ...) cannot be resumed without it, and the Python call that
    resumes it (:func:`bo_online.loops.resume` with ``problem=``; an asynchronous run also
    needs its ``client=``)."""
    where = repr(str(out_dir)) if out_dir is not None else "RUN_DIR"
    client = ", client=client" if kind == "bo_async" else ""
    return (
        f"This run's {what}, which its directory does not hold, so `bo-online resume` (or a "
        "resume without problem=) cannot rebuild it. Resume it from Python with the problem "
        f"it started with: bo_online.loops.resume({where}, problem=problem{client}) "
        f"(or bo_online.loops.load_loop({where}, problem=problem{client}) to step it yourself)."
    )


def problem_from_checkpoint(
    ckpt: dict[str, Any],
    problem: Any,
    kind: str,
    data_dir: str | None = None,
    out_dir: str | Path | None = None,
) -> Any:
    r"""The problem a checkpointed run resumes on: ``problem`` if given (and holding the run's
    data), else rebuilt from the spec the checkpoint holds; a ``kind`` (pool, stream) built by
    hand has none, so it must be passed again."""
    if problem is not None:
        check_resumed_problem(ckpt, problem)
        return problem
    if ckpt["problem"] is None:
        raise ValueError(
            resume_in_python_advice(f"{kind} was built in Python", out_dir, ckpt.get("kind"))
        )
    rebuilt = make_problem(ckpt["problem"], data_dir=data_dir)
    # A shared data set is read again from the data directory, which may hold another version
    # of it (another --data-dir, a replaced file): its rows must be the run's.
    expected = ckpt.get("problem_digest")
    if expected is not None and problem_digest(rebuilt) != expected:
        from bo_online.datasets import resolve_data_dir

        raise DataChangedError(
            f"The {getattr(rebuilt, 'name', kind)!r} data read from the data directory "
            f"{str(resolve_data_dir(data_dir))!r} differ from the rows this run started on; "
            "point --data-dir (or $BO_ONLINE_DATA_DIR) at the data the run started with, or "
            "start a new run (--overwrite)."
        )
    return rebuilt


def _shared_kwargs(cfg: dict[str, Any]) -> dict[str, Any]:
    """The shared constructor options stored in a checkpoint's config."""
    keys = (
        "model",
        "model_options",
        "q",
        "n_init",
        "seed",
        "refit_every",
        "fit_max_iter",
        "init_fit_max_iter",
        "fit_options",
        "checkpoint_every",
        "device",
        "dtype",
    )
    kwargs = {k: cfg[k] for k in keys}
    kwargs["refit_from"] = cfg.get("refit_from", "auto")  # older checkpoints: absent
    kwargs["checkpoint_seconds"] = cfg.get("checkpoint_seconds", 30.0)  # older checkpoints: absent
    return kwargs
