r"""Active learning of a field from a finite pool, in the ask/tell style.

Per step the loop picks ``q`` unused pool points that most reduce the integrated posterior variance
(BoTorch's ``qNegIntegratedPosteriorVariance``, integrated over a fixed random subset of the
held-out test inputs, or over Sobol points), reads their outcomes, folds them into the surrogate
with ``model.update`` and reports the test RMSE, the mean predictive variance and the test NLL.

Two ways to choose from the pool (``selection``):

* ``"snap"``: maximise qNIPV over the continuous unit cube with ``optimize_acqf``, then snap each
  candidate to the nearest unused pool point (distinct points, in candidate order);
* ``"pool"``: score a random subset of ``num_pool_candidates`` unused pool points directly
  (``optimize_acqf_discrete``, greedy sequential over the batch).

``acq="random"`` picks unused pool points uniformly at random (the passive baseline).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gpytorch
import torch
from torch import Tensor

from bo_online.acquisition import (
    build_acquisition,
    check_acq_options,
    known_acq_options,
    nearest_distinct_rows,
    optimizer_kwargs,
    propose,
    propose_from_pool,
)
from bo_online.loops.core import OnlineLoop, _shared_kwargs, problem_from_checkpoint
from bo_online.problems import PoolProblem, to_unit

__all__ = ["ActiveLearningLoop", "predictive_metrics"]


def predictive_metrics(
    model: Any,
    X: Tensor,
    y: Tensor,
    chunk: int = 2048,
    target_shift: float = 0.0,
    target_scale: float = 1.0,
    per_point: bool = False,
) -> dict[str, Any]:
    r"""Test metrics of ``model`` at ``X`` (``m x d``, model space) against ``y`` (``m``).

    Returns ``rmse`` (of the predictive mean), ``mean_var`` (mean latent predictive variance,
    the quantity qNIPV reduces) and ``nll`` (mean Gaussian negative log predictive density with
    observation noise). Marginals only: points are evaluated as ``m x 1 x d`` batches.
    ``per_point``: also return ``mean`` and ``var`` (``m`` float64 tensors, ``y``'s units), the
    predictive mean and the variance with observation noise the NLL is computed from.
    ``target_shift``, ``target_scale``: the model was given ``(y - shift) / scale`` (a loop's
    target scaling, :meth:`bo_online.loops.core.OnlineLoop._set_target_scaling`); its
    predictions are mapped back to ``y``'s units in float64 before they are scored.
    """
    scaled = target_shift != 0.0 or target_scale != 1.0
    sq, var_f, nll, means, var_y = [], [], [], [], []
    # GPyTorch floors posterior variances at 1e-10 (float64) / 1e-6 (float32) in the user's
    # units, which cut the NLL of targets on a small scale (sd 1e-6: -10.6 for -14.4); floor them
    # at the dtype's smallest normal number instead
    tiny = {t: torch.finfo(t).tiny for t in (torch.float32, torch.float64, torch.float16)}
    floor = gpytorch.settings.min_variance(
        float_value=tiny[torch.float32],
        double_value=tiny[torch.float64],
        half_value=tiny[torch.float16],
    )
    with torch.no_grad(), floor:
        for i in range(0, X.shape[0], chunk):
            Xi = X[i : i + chunk].unsqueeze(-2)
            # scored in float64 against the targets as given: cast to a float32 model's dtype,
            # targets 1e8 + O(1) all equal the float32 prediction and scored RMSE 0
            yi = y[i : i + chunk].to(device=Xi.device, dtype=torch.float64)
            post_f = model.posterior(Xi)
            post_y = model.posterior(Xi, observation_noise=True)
            mean = post_f.mean.reshape(-1).double()
            vf = post_f.variance.reshape(-1).double()
            vy = post_y.variance.reshape(-1).double().clamp_min(tiny[Xi.dtype])
            if scaled:  # back to the targets' units, in float64
                mean = mean * target_scale + target_shift
                vf, vy = vf * target_scale**2, vy * target_scale**2
            sq.append((mean - yi).pow(2))
            var_f.append(vf)
            means.append(mean)
            var_y.append(vy)
            nll.append(0.5 * (torch.log(2 * math.pi * vy) + (yi - mean).pow(2) / vy))
    metrics: dict[str, Any] = {
        "rmse": float(torch.cat(sq).mean().sqrt()),
        "mean_var": float(torch.cat(var_f).mean()),
        "nll": float(torch.cat(nll).mean()),
    }
    if per_point:
        metrics.update(mean=torch.cat(means), var=torch.cat(var_y))
    return metrics


class ActiveLearningLoop(OnlineLoop):
    r"""Active learning on a :class:`bo_online.problems.PoolProblem`.

    Args:
        problem: pool with known outcomes and a held-out test set.
        acq: ``"qnipv"`` or ``"random"``.
        selection: ``"snap"`` or ``"pool"`` (see the module docstring).
        num_mc_points: number of points qNIPV integrates the posterior variance over.
        integrate_over: ``"test"`` (a random subset of the held-out test inputs, fixed for the
            run) or ``"sobol"`` (scrambled Sobol points of the unit cube, redrawn each step).
        num_pool_candidates: pool points scored per step with ``selection="pool"``.
        acq_options: as for :class:`bo_online.loops.BayesOptLoop`.
        optimizer_options: as for :class:`bo_online.loops.BayesOptLoop`.
        eval_every: compute the test metrics every this many steps (and at step 0).
        n_init: random pool points of the initial design.
        refit_every: the refit schedule (default ``"auto"``, as the BO and streaming loops: every
            step, for the exact GP, t-SVGP, the decoupled SVGP and WISKI with a learned
            projection only up to n = 100 and then at every 10% of growth; see
            :meth:`bo_online.loops.core.OnlineLoop._refit_due`). Every 10 steps, the default
            until then, left the hyperparameters of the 10-point initial design in place for
            the first 60 labels at q = 6: test RMSE after 3 / 6 / 9 steps was higher in all
            12 comparisons on two pools and two seeds (docs/results.md, "Active learning").
        **kwargs: the shared options of :class:`bo_online.loops.core.OnlineLoop`.
    """

    kind = "active"

    def __init__(
        self,
        problem: PoolProblem,
        acq: str = "qnipv",
        selection: str = "snap",
        num_mc_points: int = 256,
        integrate_over: str = "test",
        num_pool_candidates: int = 2048,
        acq_options: dict[str, Any] | None = None,
        optimizer_options: dict[str, Any] | None = None,
        eval_every: int = 1,
        n_init: int = 10,
        refit_every: int | str = "auto",
        **kwargs: Any,
    ) -> None:
        if not isinstance(problem, PoolProblem):
            raise ValueError(
                f"ActiveLearningLoop needs a PoolProblem, got {type(problem).__name__}."
            )
        if acq.lower() not in ("qnipv", "random"):
            raise ValueError(
                f"Unknown active-learning acquisition {acq!r}; choose qnipv or random."
            )
        if integrate_over not in ("test", "sobol"):
            raise ValueError(f"integrate_over must be 'test' or 'sobol', got {integrate_over!r}.")
        if selection not in ("snap", "pool"):
            raise ValueError(f"selection must be 'snap' or 'pool', got {selection!r}.")
        for name, value in (
            ("num_mc_points", num_mc_points),
            ("num_pool_candidates", num_pool_candidates),
            ("eval_every", eval_every),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}.")
        if selection == "pool" and num_pool_candidates < kwargs.get("q", 1):
            raise ValueError(
                f"num_pool_candidates ({num_pool_candidates}) must be at least q "
                f"({kwargs.get('q', 1)}): each step labels q of the scored candidates."
            )
        optimizer_kwargs(optimizer_options)
        check_acq_options(acq, dict(acq_options or {}))
        if n_init > problem.X_pool.shape[0]:
            raise ValueError(f"n_init={n_init} exceeds the pool size {problem.X_pool.shape[0]}.")
        super().__init__(n_init=n_init, refit_every=refit_every, **kwargs)
        self.problem = problem
        self.config.update(
            acq=acq.lower(),
            selection=selection,
            num_mc_points=int(num_mc_points),
            integrate_over=integrate_over,
            num_pool_candidates=int(num_pool_candidates),
            acq_options=dict(acq_options or {}),
            optimizer_options=dict(optimizer_options or {}),
            eval_every=int(eval_every),
        )
        self.U_pool = to_unit(problem.X_pool, problem.bounds).to(**self.tkwargs)
        self.U_test = to_unit(problem.X_test, problem.bounds).to(**self.tkwargs)
        gen = torch.Generator().manual_seed(self.config["seed"])
        m = min(int(num_mc_points), problem.X_test.shape[0])
        self.mc_idx = torch.randperm(problem.X_test.shape[0], generator=gen)[:m]
        self.used = torch.zeros(problem.X_pool.shape[0], dtype=torch.bool)
        self.chosen = torch.empty(0, dtype=torch.long)

    def _problem_spec(self) -> dict[str, Any] | None:
        return self.problem.spec

    def _status(self) -> str:
        last = next((r for r in reversed(self.records) if r.get("rmse") is not None), None)
        return "" if last is None else f"test RMSE {last['rmse']:.4g}"

    def _metrics(self) -> dict[str, Any]:
        # Only on the eval_every grid (not "at the end"): records must not depend on how many
        # steps a run was asked for, or a run extended by resume would differ from a long one.
        # ``time_test``: the scoring's own time, outside the step's (see StreamingLoop).
        if self.step_count % self.config["eval_every"] != 0:
            return {"rmse": None, "mean_var": None, "nll": None, "time_test": 0.0}
        t0 = self._now()
        metrics = predictive_metrics(
            self.model,
            self.U_test,
            self.problem.y_test,
            target_shift=self.target_shift,
            target_scale=self.target_scale,
        )
        return {**metrics, "time_test": self._now() - t0}

    def _training_data(self) -> tuple[Tensor, Tensor]:
        return self.U_pool[self.chosen], self._model_targets(self.problem.y_pool[self.chosen])

    def _take(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        self.used[idx] = True
        self.chosen = torch.cat([self.chosen, idx])
        return self.problem.X_pool[idx], self.problem.y_pool[idx]

    def _initial_design(self) -> dict[str, Any]:
        n0 = self.config["n_init"]
        t0 = self._now()
        idx = torch.randperm(self.problem.X_pool.shape[0])[:n0]  # global RNG, seeded
        X0, y0 = self._take(idx)
        t_eval = self._now() - t0
        t0 = self._now()
        self._set_target_scaling(y0)
        self.model = self._build_model(self.U_pool[idx], self._model_targets(y0))
        t_update = self._now() - t0
        t_fit = self._fit(self.config["init_fit_max_iter"])
        return {
            "step": 0,
            "n": int(self.chosen.shape[0]),
            "indices": idx,
            "X": X0,
            "y": y0,
            **self._metrics(),
            **self._initial_costs(t_fit, t_eval, t_update),
        }

    def max_steps(self) -> int:
        """Steps until fewer than ``q`` unlabelled pool points are left (counted from the
        points still unlabelled once the loop has started: ``tell`` may label any number)."""
        q = self.config["q"]
        if not self.initialized:
            return (self.problem.X_pool.shape[0] - self.config["n_init"]) // q
        return self.step_count + int((~self.used).sum()) // q

    def ask(self) -> Tensor:
        r"""Row indices (``q``) of the pool points to label next."""
        if not self.initialized:
            self.initialize()
        t0 = self._now()
        q, d = self.config["q"], self.problem.dim
        free = (~self.used).nonzero().squeeze(-1)
        if free.numel() < q:
            raise ValueError(f"Only {free.numel()} unused pool points left for a batch of {q}.")
        with self._seeded("ask"):
            if self.config["acq"] == "random":
                idx = free[torch.randperm(free.numel())[:q]]
            else:
                acq = build_acquisition(
                    "qnipv",
                    self.model,
                    q=q,
                    step=self.step_count + 1,
                    dim=d,
                    # the labelled inputs give the Sobol points (integrate_over="sobol") the
                    # model's dtype and device: float64 ones broke a float32 SingleTaskGP
                    X_observed=self.U_pool[self.chosen.to(self.U_pool.device)],
                    mc_points=(
                        self.U_test[self.mc_idx]
                        if self.config["integrate_over"] == "test"
                        else None
                    ),
                    options={
                        "num_mc_points": self.config["num_mc_points"],
                        **self.config["acq_options"],
                    },
                )
                if self.config["selection"] == "snap":
                    U = propose(acq, q, d, self.config["optimizer_options"], **self.tkwargs)
                    idx = self._snap(U, free)
                else:
                    k = min(self.config["num_pool_candidates"], free.numel())
                    cand = free[torch.randperm(free.numel())[:k]]
                    _, rows = propose_from_pool(acq, q, self.U_pool[cand])
                    idx = cand[rows.cpu()]
        self._pending = {"indices": idx, "time_acquisition": self._now() - t0}
        return idx

    def _snap(self, U: Tensor, free: Tensor) -> Tensor:
        r"""Nearest unused pool point to each candidate, distinct, in candidate order."""
        return free[nearest_distinct_rows(U, self.U_pool[free]).to(free.device)]

    def _evaluate_pending(self) -> dict[str, Any]:
        assert self._pending is not None
        return {"indices": self._pending["indices"]}

    def tell(self, indices: Tensor) -> dict[str, Any]:
        r"""Label pool rows ``indices`` (``q``) and fold them into the surrogate."""
        if not self.initialized:
            raise RuntimeError("Call ask() (or initialize()) before tell().")
        raw = torch.as_tensor(indices)
        if raw.numel() == 0:
            raise ValueError("tell() got no pool indices: label at least one point per step.")
        if raw.is_floating_point() or raw.is_complex() or raw.dtype == torch.bool:
            raise ValueError(
                f"tell() takes integer pool row indices, got a {raw.dtype} tensor (ask() "
                "returns them)."
            )
        indices = raw.to(torch.long).reshape(-1)
        if indices.numel() == 0:
            raise ValueError("tell() got no pool indices: label at least one point per step.")
        size = self.used.shape[0]
        if bool(((indices < 0) | (indices >= size)).any()):
            raise ValueError(
                f"tell() got pool indices outside [0, {size}): {indices.tolist()} (the pool "
                f"has {size} rows; negative indices are not accepted)."
            )
        if bool(self.used[indices].any()) or indices.unique().numel() != indices.numel():
            raise ValueError("tell() got pool points that are already labelled or repeated.")
        pending = self._pending or {}
        self._pending = None
        t0 = self._now()
        # the "evaluation" of a pool problem is a lookup
        X, y = self.problem.X_pool[indices], self.problem.y_pool[indices]
        t_eval = self._now() - t0
        t0 = self._now()
        rescaled = self._outgrows_target_scaling(y)
        if rescaled:  # a value far beyond the initial design's: rebuilt on all labelled rows
            rows = torch.cat([self.chosen, indices])
            self._rebuild_rescaled(self.U_pool[rows], self.problem.y_pool[rows], indices.numel())
        else:  # validates before any change
            self.model.update(self.U_pool[indices], self._model_targets(y))
        self._take(indices)  # the rows count as labelled only once the model has them
        t_update = self._now() - t0
        self.step_count += 1
        refit = rescaled or self._refit_needed()
        # a rebuilt surrogate holds default hyperparameters: it gets the initial fit's budget
        budget = self.config["init_fit_max_iter" if rescaled else "fit_max_iter"]
        with self._seeded("tell"):
            t_fit = self._fit(budget) if refit else 0.0
        record = {
            "step": self.step_count,
            "n": int(self.chosen.shape[0]),
            "indices": indices,
            "X": X,
            "y": y,
            **self._metrics(),
            "refit": refit,
            "time_fit": t_fit,
            "time_acquisition": pending.get("time_acquisition", 0.0),
            "time_evaluation": t_eval,
            "time_update": t_update,
        }
        return self._finish_record(record)

    def _state(self) -> dict[str, Any]:
        return {"used": self.used, "chosen": self.chosen}

    def _restore_state(self, state: dict[str, Any]) -> None:
        self.used, self.chosen = state["used"].clone(), state["chosen"].clone()

    @classmethod
    def from_checkpoint(
        cls,
        ckpt: dict[str, Any],
        out_dir: str | Path | None,
        problem: PoolProblem | None = None,
        data_dir: str | None = None,
        **overrides: Any,
    ) -> "ActiveLearningLoop":
        cfg = ckpt["config"]
        problem = problem_from_checkpoint(ckpt, problem, "pool", data_dir, out_dir)
        integrate_over = cfg.get("integrate_over", "test")
        num_mc_points = cfg["num_mc_points"]
        if integrate_over == "sobol" and "num_mc_points" in cfg["acq_options"]:
            # runs from before it was refused as an acquisition option drew this many points
            num_mc_points = cfg["acq_options"]["num_mc_points"]
        loop = cls(
            problem,
            acq=cfg["acq"],
            selection=cfg["selection"],
            num_mc_points=num_mc_points,
            integrate_over=integrate_over,
            num_pool_candidates=cfg["num_pool_candidates"],
            # runs from before unread options were refused kept every CLI flag's value
            acq_options=known_acq_options(cfg["acq"], cfg["acq_options"]),
            optimizer_options=cfg["optimizer_options"],
            eval_every=cfg["eval_every"],
            **_shared_kwargs(cfg),
            out_dir=out_dir,
            overwrite=True,
            **overrides,
        )
        loop._restore_state(ckpt["state"])
        idx0 = loop.chosen[: cfg["n_init"]]
        loop._restore(ckpt, loop.U_pool[idx0], problem.y_pool[idx0])
        return loop
