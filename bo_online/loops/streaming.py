r"""Streaming regression and binary classification with prequential evaluation, in the
ask/tell style.

The data arrive in order (a :class:`bo_online.problems.StreamProblem`). Each step takes the next
``q`` points, first *predicts* them (the prequential, test-then-train protocol), then folds them
into the surrogate with ``model.update`` and refits on the schedule. Every ``eval_every`` steps
the test metrics are recorded as well, and every step its time, so time per step vs n can be
plotted. The problem's ``task`` selects the surrogate's prediction and the metrics:

* ``"regression"``: squared error and Gaussian negative log predictive density with observation
  noise (test RMSE / NLL);
* ``"classification"`` (labels {0, 1}): the surrogate is the registry name's classifier
  (:mod:`bo_online.models.classifiers`); it predicts ``p(y = 1 | x)``, scored by accuracy (threshold
  1/2) and log loss ``-log p(y | x)`` (test accuracy / NLL).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from bo_online.loops.active import predictive_metrics
from bo_online.loops.core import OnlineLoop, _shared_kwargs, problem_from_checkpoint
from bo_online.loops.options import check_options, instantiate
from bo_online.models.classifiers import classifier_class
from bo_online.problems import StreamProblem, to_unit

__all__ = ["StreamingLoop", "classification_metrics"]


def classification_metrics(model: Any, X: Tensor, y: Tensor, chunk: int = 2048) -> dict[str, Any]:
    r"""Binary-classification metrics of ``model`` (with ``predict_proba``) at ``X`` (``m x d``,
    model space) against labels ``y`` (``m``, in {0, 1}).

    Returns ``prob`` (``m`` tensor of ``p(y = 1 | x)``), ``accuracy`` (fraction with
    ``1[p > 1/2] == y``) and ``nll`` (mean log loss ``-log p(y | x)``, probabilities clamped to
    ``[1e-12, 1 - 1e-12]``).
    """
    probs = torch.cat(
        [model.predict_proba(X[i : i + chunk]).reshape(-1) for i in range(0, X.shape[0], chunk)]
    )
    # The metrics in float64 whatever the model's dtype: a float32 mean reported an accuracy of
    # 9 / 10 as 0.8999999761581421 (and 1 - 1e-12 is 1 in float32: no clamp at the top). The
    # labels (on the CPU) go to the model's device.
    p64, y = probs.double(), y.to(device=probs.device, dtype=torch.float64)
    p_y = torch.where(y > 0.5, p64, 1.0 - p64).clamp(1e-12, 1.0 - 1e-12)
    return {
        "prob": probs,
        "accuracy": int(((p64 > 0.5).double() == y).sum()) / max(probs.numel(), 1),
        "nll": float(-p_y.log().mean()),
    }


class StreamingLoop(OnlineLoop):
    r"""Prequential streaming regression or binary classification (``problem.task``).

    Args:
        problem: the stream and its test set.
        eval_every: record the test metrics (RMSE/NLL, or accuracy/NLL) every this many steps
            (and at step 0 and at the stream's last step).
        n_init: stream points the surrogate starts from.
        refit_every: the refit schedule (default ``"auto"``, :meth:`_refit_due`: whenever the
            data have grown by 50 points or 10% since the last fit, whichever is more) or an
            integer k (every k-th step; 0: never after the initial fit).
        stream_model_defaults: constructor options the surrogate gets unless ``model_options``
            sets them; default (None): :attr:`STREAM_MODEL_DEFAULTS` for a regression stream of
            at least :attr:`LONG_STREAM_POINTS` rows, else none. Kept in the run's config, so a
            resumed run rebuilds the model it checkpointed.
        **kwargs: the shared options of :class:`bo_online.loops.core.OnlineLoop` (``q`` is the
            number of points per step).
    """

    kind = "stream"

    #: "auto" schedule: refit once n has grown by at least this many points since the last fit
    STREAM_REFIT_MIN_POINTS: ClassVar[int] = 50

    #: Constructor options a long regression stream (at least ``LONG_STREAM_POINTS`` rows)
    #: gives a surrogate unless the user sets them (shorter streams, classification and the BO
    #: and active-learning loops keep the model's own defaults). t-SVGP's 128 inducing inputs
    #: are enough for a few hundred BO evaluations but not for thousands of points of strongly
    #: coupled inputs: on 5,000-point kin40k and pol streams it ended 1.40x and 1.29x above the
    #: RMSE of an exact GP fitted in hindsight on 2,000 rows, and 1.00x and 0.97x with 512
    #: (docs/results.md, "Streaming at size"). The decoupled SVGP at 256 / 128 bases ended
    #: 1.89x and 1.51x above it on kin40k and pol; with 2,048 mean / 1,024 covariance bases
    #: it gets there, and its hyperparameters come from the exact marginal likelihood of a
    #: 2,048-point random subset, retrained once n has doubled (a refit in between re-selects
    #: the bases and re-solves the coefficients): refining them on the bound of all 2,048
    #: bases at every refit made one kin40k stream take an hour (DecoupledSVGP's
    #: ``exact_fit_points`` and ``hyperparameter_refit_growth``).
    STREAM_MODEL_DEFAULTS: ClassVar[dict[str, dict[str, Any]]] = {
        "tsvgp": {"inducing_points": 512},
        "decoupled": {
            "num_mean_bases": 2048,
            "num_cov_bases": 1024,
            "exact_fit_points": 2048,
            "hyperparameter_refit_growth": 2.0,
        },
    }
    #: Below this many stream rows the larger model buys little and its refits cost much: on
    #: concrete (927 rows) each refit above n = 512 took about 70 s with 512 inducing inputs.
    LONG_STREAM_POINTS: ClassVar[int] = 2000

    def __init__(
        self,
        problem: StreamProblem,
        eval_every: int = 50,
        n_init: int = 100,
        refit_every: int | str = "auto",
        stream_model_defaults: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(problem, StreamProblem):
            raise ValueError(f"StreamingLoop needs a StreamProblem, got {type(problem).__name__}.")
        if eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {eval_every}.")
        if n_init >= problem.X_stream.shape[0]:
            raise ValueError(
                f"n_init={n_init} leaves nothing to stream ({problem.X_stream.shape[0]} points)."
            )
        super().__init__(n_init=n_init, refit_every=refit_every, **kwargs)
        rows_left, q = problem.X_stream.shape[0] - n_init, self.config["q"]
        if rows_left < q:
            raise ValueError(
                f"q={q} points per step, but the stream has {rows_left} rows after the "
                f"{n_init} initial ones: lower q or n_init."
            )
        self.problem = problem
        self.classify = problem.task == "classification"
        if self.classify:  # the registry name's classifier; raises for regression-only models
            self.model_cls = classifier_class(self.config["model"])
        if stream_model_defaults is None:
            long_stream = problem.X_stream.shape[0] >= self.LONG_STREAM_POINTS
            regression = not self.classify
            stream_model_defaults = (
                self.STREAM_MODEL_DEFAULTS.get(self.config["model"], {})
                if long_stream and regression
                else {}
            )
        if not isinstance(stream_model_defaults, dict):
            raise ValueError(
                f"stream_model_defaults must be a dict, got {type(stream_model_defaults).__name__}."
            )
        # like model options: plain data and allow-listed object specs, built in _model_options
        check_options(stream_model_defaults, "stream model default")
        self.config.update(
            eval_every=int(eval_every), stream_model_defaults=dict(stream_model_defaults)
        )
        if self.out_dir is not None:
            self._check_storable()
        self.U_stream = to_unit(problem.X_stream, problem.bounds).to(**self.tkwargs)
        self.U_test = to_unit(problem.X_test, problem.bounds).to(**self.tkwargs)
        self.position = 0  # stream rows consumed
        self.sq_err_sum = 0.0
        self.correct_sum = 0.0
        self.nll_sum = 0.0
        self.num_predicted = 0

    def default_steps(self) -> int:
        """Steps until the stream is exhausted: the last takes the rows left when they are fewer
        than ``q`` (they were dropped without a word)."""
        rows_left = self.problem.X_stream.shape[0] - self.config["n_init"]
        return -(-rows_left // self.config["q"])

    def max_steps(self) -> int:
        return self.default_steps()

    def _problem_spec(self) -> dict[str, Any] | None:
        return self.problem.spec

    def _status(self) -> str:
        if not self.num_predicted:
            return ""
        if self.classify:
            return f"prequential accuracy {self.correct_sum / self.num_predicted:.4g}"
        return f"prequential RMSE {math.sqrt(self.sq_err_sum / self.num_predicted):.4g}"

    def _test_metrics(self) -> dict[str, Any]:
        # On the eval_every grid and at the stream's last step, not at the end of a run: records
        # must not depend on how many steps a run was asked for, or a run extended by resume
        # would differ from a long one. The stream's last step is the same for every run, and
        # without it the final metrics could miss up to eval_every - 1 points of the stream.
        # ``time_test``: the scoring's own time, outside the step's (it is the run's
        # measurement, not the loop's work), so the summary can account for elapsed time.
        due = self.step_count % self.config["eval_every"] == 0
        due = due or self.step_count == self.default_steps()
        first = "test_accuracy" if self.classify else "test_rmse"
        if not due:
            return {first: None, "test_nll": None, "time_test": 0.0}
        t0 = self._now()
        m = self._predict(self.U_test, self.problem.y_test)
        value = m["accuracy"] if self.classify else m["rmse"]
        return {first: value, "test_nll": m["nll"], "time_test": self._now() - t0}

    def _predict(self, U: Tensor, y: Tensor, per_point: bool = False) -> dict[str, Any]:
        r"""The task's metrics of the current surrogate at ``U`` (``m x d``, unit cube) against
        ``y`` (``m``); ``per_point``: a regression stream's also hold each point's predictive
        ``mean`` and ``var`` (``m``; a classification stream's always hold ``prob``)."""
        if self.classify:
            return classification_metrics(self.model, U, y)
        return predictive_metrics(
            self.model,
            U,
            y,
            target_shift=self.target_shift,
            target_scale=self.target_scale,
            per_point=per_point,
        )

    def _initial_design(self) -> dict[str, Any]:
        n0 = self.config["n_init"]
        t0 = self._now()
        self._set_target_scaling(self.problem.y_stream[:n0])
        self.model = self._build_model(
            self.U_stream[:n0], self._model_targets(self.problem.y_stream[:n0])
        )
        t_update = self._now() - t0
        self.position = n0
        t_fit = self._fit(self.config["init_fit_max_iter"])
        return {
            "step": 0,
            "n": n0,
            **self._test_metrics(),
            **self._initial_costs(t_fit, 0.0, t_update),
        }

    def _training_data(self) -> tuple[Tensor, Tensor]:
        rows = slice(0, self.position)
        return self.U_stream[rows], self._model_targets(self.problem.y_stream[rows])

    def ask(self) -> Tensor:
        r"""The next ``q`` stream rows (indices; fewer at the stream's end, the rows left); also
        predicts them (prequential)."""
        if not self.initialized:
            self.initialize()
        total = self.problem.X_stream.shape[0]
        if self.position >= total:
            raise ValueError("The stream is exhausted.")
        rows = torch.arange(self.position, min(self.position + self.config["q"], total))
        t0 = self._now()
        pred = self._predict(self.U_stream[rows], self.problem.y_stream[rows], per_point=True)
        self._pending = {"rows": rows, "pred": pred, "time_acquisition": self._now() - t0}
        return rows

    def _scales_targets(self) -> bool:
        r"""Labels of a classification stream reach the classifier as given."""
        return not self.classify and super()._scales_targets()

    def _model_options(self) -> dict[str, Any]:
        r"""The user's options, plus the run's ``stream_model_defaults`` (see ``__init__``)
        where the user did not set them."""
        return {**instantiate(self.config["stream_model_defaults"]), **super()._model_options()}

    def _refit_due(self) -> bool:
        r"""Whether to refit after the step just told (never with ``fit_max_iter = 0``: a
        refit of no iterations would be recorded but not happen).

        ``"auto"``: once n has grown since the last fit (or, if there was none, since the
        ``n_init`` initial points) by ``STREAM_REFIT_MIN_POINTS`` (50) points or by
        ``AUTO_REFIT_GROWTH`` (10%) of n at that fit, whichever is more, for every surrogate.
        Most refits visit every point held (the sparse models' bound sums over their
        per-point sites, WISKI's learned projection is fitted on the raw data, the exact GP
        is O(n^3)), so a fixed cadence makes the refits' share of a step grow with n: t-SVGP
        with 512 inducing inputs on a 5,000-point kin40k stream spent 74 min refitting every
        50 points. Refits at geometrically spaced n cost a constant factor (about 11) times one
        fit at the final n in all, i.e. O(1) per point, while the hyperparameters never lag the data
        by more than max(50 points, 10%) (plus up to q - 1 points of the step that crosses
        it). An integer ``refit_every`` is the fixed cadence of
        :meth:`OnlineLoop._refit_due`."""
        if self.config["fit_max_iter"] == 0:
            return False
        if self.config["refit_every"] != "auto" or getattr(
            self.model_cls, "refits_on_update", False
        ):
            return super()._refit_due()
        n = self._num_data()
        if self._n_last_fit is None:
            self._n_last_fit = self._last_fit_n_from_records()
        last = self.config["n_init"] if self._n_last_fit is None else self._n_last_fit
        if n is None:
            return True
        # n - last >= max(50, 0.1 last), in integers (0.1 * last is not exact in floating point)
        growth_tenths = max(
            10 * self.STREAM_REFIT_MIN_POINTS, round(10 * self.AUTO_REFIT_GROWTH * last)
        )
        return 10 * (n - last) >= growth_tenths

    def _evaluate_pending(self) -> dict[str, Any]:
        assert self._pending is not None
        return {"rows": self._pending["rows"]}

    def tell(self, rows: Tensor) -> dict[str, Any]:
        r"""Fold stream rows ``rows`` (the ones ``ask`` returned) into the surrogate."""
        if self._pending is None or not torch.equal(torch.as_tensor(rows), self._pending["rows"]):
            raise ValueError("tell() must receive the rows the last ask() returned, in order.")
        pending = self._pending
        rows = pending["rows"]
        q = rows.numel()
        t0 = self._now()
        y = self.problem.y_stream[rows]
        rescaled = self._outgrows_target_scaling(y)
        if rescaled:  # a value far beyond the initial design's: rebuilt on the stream so far
            end = self.position + q
            self._rebuild_rescaled(self.U_stream[:end], self.problem.y_stream[:end], q)
        else:
            self.model.update(self.U_stream[rows], self._model_targets(y))
        # Only now are the asked rows told: where the surrogate refused them (an error that says
        # what to change), the loop is as before and the same tell() can be tried again.
        self._pending = None
        t_update = self._now() - t0
        self.position += q
        self.step_count += 1
        pred = pending["pred"]
        if self.classify:
            self.correct_sum += pred["accuracy"] * q
        else:
            self.sq_err_sum += pred["rmse"] ** 2 * q
        self.nll_sum += pred["nll"] * q
        self.num_predicted += q
        refit = rescaled or self._refit_needed()
        # a rebuilt surrogate holds default hyperparameters: it gets the initial fit's budget
        budget = self.config["init_fit_max_iter" if rescaled else "fit_max_iter"]
        with self._seeded("tell"):
            t_fit = self._fit(budget) if refit else 0.0
        record = {
            "step": self.step_count,
            "n": self.position,
            "rows": rows,
            # bool labels (a StreamProblem given them from Python): 0 / 1, not JSON true / false
            "y": y.double() if y.dtype == torch.bool else y,
            **self._prequential_fields(pred),
            **self._test_metrics(),
            "refit": refit,
            "time_fit": t_fit,
            "time_acquisition": pending["time_acquisition"],
            "time_evaluation": 0.0,
            "time_update": t_update,
        }
        return self._finish_record(record)

    def _prequential_fields(self, pred: dict[str, Any]) -> dict[str, Any]:
        if self.classify:
            return {
                "pred_prob": pred["prob"],
                "pred_accuracy": pred["accuracy"],
                "pred_nll": pred["nll"],
                "prequential_accuracy": self.correct_sum / self.num_predicted,
                "prequential_nll": self.nll_sum / self.num_predicted,
            }
        return {
            # the Gaussian each row was predicted by (with observation noise), so prequential
            # RMSE / NLL over any span can be computed from the records
            "pred_mean": pred["mean"],
            "pred_var": pred["var"],
            "pred_rmse": pred["rmse"],
            "pred_nll": pred["nll"],
            "prequential_rmse": math.sqrt(self.sq_err_sum / self.num_predicted),
            "prequential_nll": self.nll_sum / self.num_predicted,
        }

    def _state(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "sq_err_sum": self.sq_err_sum,
            "correct_sum": self.correct_sum,
            "nll_sum": self.nll_sum,
            "num_predicted": self.num_predicted,
        }

    def _restore_state(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])
        self.sq_err_sum = float(state["sq_err_sum"])
        self.correct_sum = float(state.get("correct_sum", 0.0))  # absent in older checkpoints
        self.nll_sum = float(state["nll_sum"])
        self.num_predicted = int(state["num_predicted"])

    @classmethod
    def from_checkpoint(
        cls,
        ckpt: dict[str, Any],
        out_dir: str | Path | None,
        problem: StreamProblem | None = None,
        data_dir: str | None = None,
        **overrides: Any,
    ) -> "StreamingLoop":
        cfg = ckpt["config"]
        problem = problem_from_checkpoint(ckpt, problem, "stream", data_dir, out_dir)
        loop = cls(
            problem,
            eval_every=cfg["eval_every"],
            # a run checkpointed before the stream defaults existed had none
            stream_model_defaults=cfg.get("stream_model_defaults", {}),
            **_shared_kwargs(cfg),
            out_dir=out_dir,
            overwrite=True,
            **overrides,
        )
        loop._restore_state(ckpt["state"])
        n0 = cfg["n_init"]
        loop._restore(ckpt, loop.U_stream[:n0], problem.y_stream[:n0])
        return loop
