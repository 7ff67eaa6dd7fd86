r"""Bayesian optimisation with an online surrogate, in the ask/tell style.

Per step: build the acquisition (qUCB with a beta schedule, LogEI/EI, qLogNEI, or Thompson
sampling), maximise it with BoTorch's ``optimize_acqf`` over the unit cube, evaluate the batch
(through the user's executor), fold it into the surrogate with ``model.update`` (in place) and
refit hyperparameters on the schedule. The initial design is a scrambled Sobol sequence.

Examples:
    >>> from bo_online.problems import synthetic_problem
    >>> loop = BayesOptLoop(synthetic_problem("branin"), model="exact", acq="logei", seed=0)
    >>> records = loop.run(steps=30)
    >>> records[-1]["best_value"], records[-1]["regret"]
"""

from __future__ import annotations

import logging
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.quasirandom import SobolEngine

from bo_online.acquisition import (
    ACQUISITIONS,
    build_acquisition,
    check_acq_options,
    known_acq_options,
    optimizer_kwargs,
    propose,
    thompson_sample,
)
from bo_online.loops.core import (
    OnlineLoop,
    _shared_kwargs,
    check_resumed_problem,
    resume_in_python_advice,
)
from bo_online.models.validation import real_float64
from bo_online.problems import Problem, from_unit, make_problem, to_unit

__all__ = ["BayesOptLoop", "default_n_init"]


def default_n_init(dim: int) -> int:
    """The initial Sobol design's size when ``n_init`` is not given: ``max(5, 2 d)``."""
    return max(5, 2 * dim)


def check_sendable(problem: Problem, executor: Any) -> None:
    r"""Raise a ``ValueError`` before anything is evaluated or written when ``problem`` (which
    every evaluation task carries, objective included) cannot be sent to the worker processes
    of ``executor``: a ``concurrent.futures.ProcessPoolExecutor`` pickles it, a Dask
    ``distributed.Client`` pickles it with a cloudpickle fallback. Otherwise the first
    evaluation fails deep inside the executor with a serialisation traceback. A thread pool
    (or no executor) shares this process and needs nothing."""
    if executor is None:
        return
    if isinstance(executor, ProcessPoolExecutor):
        dumps, where = pickle.dumps, "worker processes (--workers)"
    elif type(executor).__module__.split(".")[0] == "distributed":
        from distributed.protocol.pickle import dumps

        where = "Dask workers (--dask)"
    else:
        return
    # Dask's serialiser also logs the failure with a traceback; the error below says it all.
    dask_log = logging.getLogger("distributed.protocol.pickle")
    level = dask_log.level
    dask_log.setLevel(logging.CRITICAL)
    try:
        dumps(problem)
    except Exception as e:  # pickling raises TypeError, AttributeError, PicklingError, ...
        raise ValueError(
            f"The objective cannot be sent to the {where}: pickling it failed with "
            f"{type(e).__name__}: {e}. Create what cannot be pickled (locks, open files, "
            "connections, ...) inside the function rather than at module level, or evaluate "
            "in this process (no --dask, --workers 0; in Python, a BayesOptLoop without an "
            "executor)."
        ) from e
    finally:
        dask_log.setLevel(level)


def _in_box(X: Tensor, given: Any, bounds: Tensor) -> Tensor | None:
    r"""``X`` (``n x d``, float64, problem units) clamped to ``bounds`` (``2 x d``), or None if
    a point lies outside it by more than rounding: 1e-9 of the box's width, or a few rounding
    steps of the dtype the user ``given`` it in (a point ``ask`` proposed on the boundary and
    passed back in float32 lies up to ~1e-7 relative beyond it), at most 1e-3 of the width."""
    lo, hi = bounds
    dtype = getattr(given, "dtype", None)
    if isinstance(given, np.ndarray):
        eps = float(np.finfo(dtype).eps) if dtype.kind == "f" else 0.0
    else:
        eps = (
            torch.finfo(dtype).eps
            if isinstance(dtype, torch.dtype) and dtype.is_floating_point
            else 0.0
        )
    # Capped: on a box far from 0 (1e6 + [0, 1]) float32's steps span most of the box.
    rounding = torch.minimum(4 * eps * (lo.abs() + hi.abs()), 1e-3 * (hi - lo))
    tol = torch.maximum(1e-9 * (hi - lo), rounding)
    if bool(((X < lo - tol) | (X > hi + tol)).any()):
        return None
    return torch.minimum(torch.maximum(X, lo), hi)  # the surrogate covers the box only


class BayesOptLoop(OnlineLoop):
    r"""BO on a :class:`bo_online.problems.Problem`.

    Args:
        problem: the objective (bounds, noise level, direction, optimum).
        acq: one of ``qucb``, ``ucb``, ``logei``, ``ei``, ``qlognei``, ``ts``.
        acq_options: acquisition options (``beta``, ``beta_schedule``, ``num_mc_samples``,
            ``num_candidates`` for ``ts``, ...; each acquisition's are listed in
            :data:`bo_online.acquisition.ACQ_OPTIONS`, and any other is refused).
        optimizer_options: ``optimize_acqf`` settings (``num_restarts``, ``raw_samples``,
            ``maxiter``, ``batch_limit``, ``sequential``).
        n_init: initial Sobol points (default ``max(5, 2 d)``, or 0 with ``initial_data``).
        initial_data: ``(X, y)`` the user already has (``m x d`` problem units, ``m`` values in
            the problem's sense); the surrogate starts from them plus ``n_init`` Sobol points.
            With ``n_init=0`` nothing is evaluated before the first ``ask``, so a problem
            without an objective (``CallableProblem(None, bounds)``) works through ask/tell.
        refit_every: the refit schedule (default ``"auto"``: every step, except for the exact
            GP, t-SVGP, the decoupled SVGP and a learned input projection beyond 100 points,
            refit whenever n has grown by 10%; see
            :meth:`bo_online.loops.core.OnlineLoop._refit_due`); an integer k refits every k-th
            step, 0 never after the initial fit.
        **kwargs: the shared options of :class:`bo_online.loops.core.OnlineLoop` (model,
            model_options, q, seed, refit_every, fit_max_iter, out_dir, quiet, device, dtype,
            executor, ...).
    """

    kind = "bo"

    def __init__(
        self,
        problem: Problem,
        acq: str = "qucb",
        acq_options: dict[str, Any] | None = None,
        optimizer_options: dict[str, Any] | None = None,
        n_init: int | None = None,
        initial_data: tuple[Tensor, Tensor] | None = None,
        refit_every: int | str = "auto",
        **kwargs: Any,
    ) -> None:
        if not isinstance(problem, Problem):
            raise ValueError(
                f"BayesOptLoop needs a bo_online.problems.Problem, got {type(problem).__name__}."
            )
        if acq.lower() not in ACQUISITIONS or acq.lower() == "qnipv":
            raise ValueError(
                f"Unknown BO acquisition {acq!r}; choose one of "
                f"{', '.join(a for a in ACQUISITIONS if a != 'qnipv')}."
            )
        optimizer_kwargs(optimizer_options)  # validate the names now
        check_acq_options(acq, dict(acq_options or {}))
        data = self._check_initial_data(problem, initial_data)
        if n_init is None:
            n_init = 0 if data is not None else default_n_init(problem.dim)
        if data is None and n_init == 0:
            raise ValueError("n_init=0 needs initial_data=(X, y) to start from.")
        check_sendable(problem, kwargs.get("executor"))
        super().__init__(n_init=n_init, refit_every=refit_every, **kwargs)
        n_cand = (acq_options or {}).get("num_candidates", 1000)
        if acq.lower() == "ts" and n_cand < self.config["q"]:
            # MaxPosteriorSampling draws q of them without replacement: "selected index k out
            # of range" at the first step, after the initial design had been evaluated
            raise ValueError(
                f"Thompson sampling picks the q = {self.config['q']} points of a batch among its "
                f"num_candidates = {n_cand} candidates: give at least q candidates."
            )
        self.problem = problem
        self.sign = 1.0 if problem.maximize else -1.0  # the model always maximises
        self.config.update(
            acq=acq.lower(),
            acq_options=dict(acq_options or {}),
            optimizer_options=dict(optimizer_options or {}),
            n_initial_data=0 if data is None else int(data[0].shape[0]),
            objective=getattr(problem, "objective_spec", None),
        )
        self._initial_data = data
        self.X = torch.empty(0, problem.dim, dtype=torch.float64)  # problem units
        self.y = torch.empty(0, dtype=torch.float64)  # observed (noisy), problem sense
        self.y_true = torch.empty(0, dtype=torch.float64)  # noiseless
        self.noise_generator = torch.Generator().manual_seed(self.config["seed"])

    min_n_init = 0

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _check_initial_data(
        problem: Problem, initial_data: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor] | None:
        if initial_data is None:
            return None
        try:
            X, y = initial_data
        except (TypeError, ValueError) as e:
            raise ValueError("initial_data must be a pair (X, y).") from e
        # Detached copies: the user's tensors may carry autograd graphs or be changed later.
        given = X
        X = real_float64(X, "initial_data X").clone()
        y = real_float64(y, "initial_data y").clone().reshape(-1)
        if X.dim() != 2 or X.shape[-1] != problem.dim or X.shape[0] != y.shape[0] or not len(y):
            raise ValueError(
                f"initial_data must be X of shape m x {problem.dim} and y of m values (m >= 1), "
                f"got {tuple(X.shape)} and {tuple(y.shape)}."
            )
        if not (bool(torch.isfinite(X).all()) and bool(torch.isfinite(y).all())):
            raise ValueError("initial_data holds NaN/inf.")
        X = _in_box(X, given, problem.bounds)
        if X is None:
            raise ValueError(f"initial_data X lies outside the bounds {problem.bounds.tolist()}.")
        return X, y

    def _problem_spec(self) -> dict[str, Any] | None:
        return self.problem.spec

    def _unit(self, X: Tensor) -> Tensor:
        return to_unit(X.to(torch.float64), self.problem.bounds).to(**self.tkwargs)

    def _model_y(self, y: Tensor) -> Tensor:
        r"""Observed values (problem sense) as the surrogate takes them: maximisation sense,
        ``n x 1``, through the run's target scaling (:meth:`_model_targets`)."""
        return self._model_targets(self.sign * y)

    def _training_data(self) -> tuple[Tensor, Tensor]:
        return self._unit(self.X), self._model_y(self.y)

    def _evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        y_true = self.evaluate_batch(self.problem.evaluate_true, X)
        noise = torch.randn(y_true.shape, generator=self.noise_generator, dtype=torch.float64)
        return y_true + self.problem.noise_std * noise, y_true

    def _best(self, values: Tensor) -> float:
        return float(values.max() if self.problem.maximize else values.min())

    def _summary_fields(self) -> dict[str, Any]:
        best_true = self._best(self.y_true)
        return {
            "n": int(self.y.shape[0]),
            "best_value": self._best(self.y),
            "best_true_value": best_true,
            "regret": self.problem.regret(best_true),
        }

    def _status(self) -> str:
        if not self.records:
            return ""
        r = self.records[-1]
        regret = "" if r.get("regret") is None else f"  regret {r['regret']:.4g}"
        return f"best {r['best_value']:.5g}{regret}"

    # ------------------------------------------------------------------ initial design

    def _initial_design(self) -> dict[str, Any]:
        n0, d = self.config["n_init"], self.problem.dim
        sobol = SobolEngine(d, scramble=True, seed=self.config["seed"])
        U0 = (
            sobol.draw(n0, dtype=torch.float64)
            if n0 > 0
            else torch.empty(0, d, dtype=torch.float64)
        )
        X0 = from_unit(U0, self.problem.bounds)
        if n0 > 0 and getattr(self.problem, "fn", ...) is None:  # CallableProblem(None, ...)
            raise ValueError(
                f"Problem {self.problem.name!r} has no objective to call, so the loop cannot "
                f"evaluate its initial design of {n0} Sobol points (before the first ask() can "
                "propose anything): evaluate points of your own and start from them, "
                f"{type(self).__name__}(problem, initial_data=(X, y), n_init=0, ...); then ask() "
                "proposes and tell() takes the values you measure."
            )
        t0 = self._now()
        if n0 > 0:
            X0, y0, y0_true = self._evaluate_initial(X0)
        else:
            y0, y0_true = torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.float64)
        t_eval = self._now() - t0
        if self._initial_data is not None:  # the user's data first (noiseless values unknown)
            Xu, yu = self._initial_data
            X0, y0, y0_true = torch.cat([Xu, X0]), torch.cat([yu, y0]), torch.cat([yu, y0_true])
        self.X, self.y, self.y_true = X0, y0, y0_true
        self._set_target_scaling(self.sign * y0)
        t0 = self._now()
        self.model = self._build_model(self._unit(X0), self._model_y(y0))
        t_update = self._now() - t0
        t_fit = self._fit(self.config["init_fit_max_iter"])
        return {
            "step": 0,
            "X": X0,
            "y": y0,
            "y_true": y0_true,
            **self._summary_fields(),
            **self._initial_costs(t_fit, t_eval, t_update),
        }

    def _evaluate_initial(self, X0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""The initial design's observations: ``(X, y, y_true)`` of the Sobol points ``X0``
        (``n0 x d``) that the model starts from; here all of them (a failure stops the run),
        in the asynchronous loop those that did not fail."""
        y0, y0_true = self._evaluate(X0)
        return X0, y0, y0_true

    # ------------------------------------------------------------------ ask / tell

    def ask(self) -> Tensor:
        r"""Propose the next batch: ``q x d`` in problem units."""
        if not self.initialized:
            self.initialize()
        t0 = self._now()
        q, d, name = self.config["q"], self.problem.dim, self.config["acq"]
        self.model.eval()
        with self._seeded("ask"):
            if name == "ts":
                n_cand = int(self.config["acq_options"].get("num_candidates", 1000))
                U = thompson_sample(self.model, q, d, num_candidates=n_cand, **self.tkwargs)
            else:
                U = self._maximize_acquisition(q)
        X = from_unit(U.detach().cpu().to(torch.float64), self.problem.bounds)
        self._pending = {"X": X, "time_acquisition": self._now() - t0}
        return X

    def _maximize_acquisition(self, q: int, U_pending: Tensor | None = None) -> Tensor:
        r"""Build the configured acquisition for ``q`` points (with ``U_pending``, ``p x d`` in
        the unit cube, as BoTorch's ``X_pending``) and maximise it: ``q x d`` in the unit cube."""
        d = self.problem.dim
        acq = build_acquisition(
            self.config["acq"],
            self.model,
            q=q,
            step=self.step_count + 1,
            dim=d,
            X_observed=self._unit(self.X),
            Y_observed=self._model_y(self.y),
            noisy=self.problem.noise_std > 0,
            options=self.config["acq_options"],
        )
        if U_pending is not None:
            acq.set_X_pending(U_pending)
        return propose(acq, q, d, self.config["optimizer_options"], **self.tkwargs)

    def _evaluate_pending(self) -> dict[str, Any]:
        assert self._pending is not None
        t0 = self._now()
        y, y_true = self._evaluate(self._pending["X"])
        self._pending["time_evaluation"] = self._now() - t0
        return {"X": self._pending["X"], "y": y, "y_true": y_true}

    def _checked_observations(
        self, X: Any, y: Any, y_true: Any | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        r"""``X`` as ``q x d`` (a single point may be a ``d``-vector; with ``d = 1``, ``q``
        values are ``q`` points), ``y`` and ``y_true`` as
        ``q`` (or ``q x 1``) finite values, all float64; else a ``ValueError`` that says what
        was expected. No reshaping across dimensions: a transposed ``d x q`` batch is refused,
        not silently reinterpreted."""
        d = self.problem.dim
        X = real_float64(X, "tell() X")  # detached: data, not part of a graph
        if X.dim() == 1 and d == 1:  # one input: q values are q points
            X = X.unsqueeze(-1)
        elif X.dim() == 1 and X.shape[0] == d:
            X = X.unsqueeze(0)
        if X.dim() != 2 or X.shape[-1] != d:
            raise ValueError(
                f"tell() expects X of shape q x {d} (or one point of {d} values), "
                f"got shape {tuple(X.shape)}."
            )
        q = X.shape[0]
        if q == 0:  # would count as a step and trigger a scheduled refit on no new data
            raise ValueError(f"tell() got no points: pass X of shape q x {d} with q >= 1.")
        values = {}
        for name, v in (("y", y), ("y_true", y if y_true is None else y_true)):
            v = real_float64(v, f"tell() {name}")
            if v.dim() == 2 and v.shape[-1] == 1:
                v = v.squeeze(-1)
            elif v.dim() == 0:
                v = v.reshape(1)
            if v.dim() != 1 or v.shape[0] != q:
                raise ValueError(
                    f"tell() got {q} point(s) but {name} of shape {tuple(v.shape)}; "
                    f"expected {q} value(s) (shape ({q},) or ({q}, 1))."
                )
            if not bool(torch.isfinite(v).all()):
                raise ValueError(
                    f"tell() got NaN/inf in {name} at row(s) "
                    f"{torch.nonzero(~torch.isfinite(v)).reshape(-1).tolist()}; evaluate those "
                    "points again or leave them out."
                )
            values[name] = v
        return X, values["y"], values["y_true"]

    def tell(self, X: Tensor, y: Tensor, y_true: Tensor | None = None) -> dict[str, Any]:
        r"""Fold observations in: ``X`` (``q x d``, problem units), ``y`` (``q``, observed, the
        problem's sense), optional noiseless ``y_true`` (for regret; defaults to ``y``)."""
        if not self.initialized:
            raise RuntimeError("Call ask() (or initialize()) before tell().")
        given = X
        X, y, y_true = self._checked_observations(X, y, y_true)
        X = _in_box(X, given, self.problem.bounds)
        if X is None:
            raise ValueError(
                "tell() got points outside the problem's bounds "
                f"{self.problem.bounds.tolist()}; the surrogate only covers that box."
            )
        pending = self._pending or {}
        self._pending = None
        t0 = self._now()
        rescaled = self._outgrows_target_scaling(self.sign * y)
        if rescaled:
            X_all, y_all = torch.cat([self.X, X]), torch.cat([self.y, y])
            self._rebuild_rescaled(self._unit(X_all), self.sign * y_all, y.numel())
        else:
            self.model.update(self._unit(X), self._model_y(y))  # validates before any change
        t_update = self._now() - t0
        self.X = torch.cat([self.X, X])
        self.y = torch.cat([self.y, y])
        self.y_true = torch.cat([self.y_true, y_true])
        self.step_count += 1
        refit = rescaled or self._refit_needed()
        # a rebuilt surrogate holds default hyperparameters: it gets the initial fit's budget
        budget = self.config["init_fit_max_iter" if rescaled else "fit_max_iter"]
        with self._seeded("tell"):
            t_fit = self._fit(budget) if refit else 0.0
        if getattr(self.model_cls, "refits_on_update", False):
            # its update is a rebuild and refit from scratch (e.g. the SingleTaskGP baseline):
            # record it as the refit it is, so fit times compare with the online models'
            refit, t_fit, t_update = True, t_update, 0.0
        record = {
            "step": self.step_count,
            "X": X,
            "y": y,
            "y_true": y_true,
            **self._summary_fields(),
            "refit": refit,
            "time_fit": t_fit,
            "time_acquisition": pending.get("time_acquisition", 0.0),
            "time_evaluation": pending.get("time_evaluation", 0.0),
            "time_update": t_update,
        }
        return self._finish_record(record)

    # ------------------------------------------------------------------ checkpoint / resume

    def _state(self) -> dict[str, Any]:
        return {
            "X": self.X,
            "y": self.y,
            "y_true": self.y_true,
            "noise_generator": self.noise_generator.get_state(),
        }

    def _restore_state(self, state: dict[str, Any]) -> None:
        self.X, self.y, self.y_true = state["X"], state["y"], state["y_true"]
        self.noise_generator.set_state(state["noise_generator"])

    @classmethod
    def from_checkpoint(
        cls,
        ckpt: dict[str, Any],
        out_dir: str | Path | None,
        problem: Problem | None = None,
        data_dir: str | None = None,
        **overrides: Any,
    ) -> "BayesOptLoop":
        r"""Rebuild a loop from a checkpoint (``problem`` is needed for user callables)."""
        cfg = dict(ckpt["config"])
        if problem is None:
            spec = cfg.get("objective")
            if ckpt["problem"] is None and spec is not None:  # a run of bo-online --objective
                from bo_online.loops.history import resume_command

                cluster = " --dask ADDRESS" if ckpt.get("kind") == "bo_async" else ""
                where = "RUN_DIR" if out_dir is None else out_dir
                raise ValueError(
                    f"This run optimises the user objective {spec['objective']!r}, which is "
                    "imported only when given again: resume it with "
                    f"`{resume_command(where, spec['objective'])}{cluster}`, or from Python "
                    "with problem=bo_online.objectives.objective_problem("
                    f"{spec['objective']!r}, {spec['bounds']!r}, maximize={spec['maximize']!r}, "
                    f"noise_std={spec['noise_std']!r})."
                )
            if ckpt["problem"] is None:
                raise ValueError(
                    resume_in_python_advice(
                        "objective is a Python callable", out_dir, ckpt.get("kind")
                    )
                )
            problem = make_problem(ckpt["problem"])
        else:
            check_resumed_problem(ckpt, problem)
        initial = None
        if cfg.get("n_initial_data", 0):
            k = cfg["n_initial_data"]
            initial = (ckpt["state"]["X"][:k], ckpt["state"]["y"][:k])
        loop = cls(
            problem,
            initial_data=initial,
            acq=cfg["acq"],
            # runs from before unread options were refused kept every CLI flag's value
            acq_options=known_acq_options(cfg["acq"], cfg["acq_options"]),
            optimizer_options=cfg["optimizer_options"],
            **_shared_kwargs(cfg),
            out_dir=out_dir,
            overwrite=True,
            **overrides,
        )
        loop._restore_state(ckpt["state"])
        n0 = cfg["n_init"] + cfg.get("n_initial_data", 0)
        loop._restore(ckpt, loop._unit(loop.X[:n0]), loop.sign * loop.y[:n0])
        return loop
