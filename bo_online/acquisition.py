r"""Acquisition builders for the loops, all thin wrappers around BoTorch classes.

* ``qucb`` -- ``qUpperConfidenceBound`` with a beta schedule (:func:`ucb_beta`); ``ucb`` its
  analytic q = 1 form;
* ``logei`` / ``ei`` -- ``LogExpectedImprovement`` / ``ExpectedImprovement`` for q = 1, their MC
  forms ``qLogExpectedImprovement`` / ``qExpectedImprovement`` for q > 1;
* ``qlognei`` -- ``qLogNoisyExpectedImprovement`` with the observed inputs as baseline (above
  ``max_baseline`` observations, those of highest posterior mean: :func:`likely_best_inputs`);
* ``qnipv`` -- ``qNegIntegratedPosteriorVariance`` over given integration points (active learning);
* ``ts`` -- Thompson sampling: BoTorch's ``MaxPosteriorSampling`` over a Sobol candidate set,
  i.e. a joint posterior sample at the candidates (any model with a joint posterior supports it).

Everything here works in the model's space (the unit cube) and maximises: loops negate
objectives that are minimised before the model sees them.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any, Callable

import torch
from botorch.acquisition import (
    AcquisitionFunction,
    ExpectedImprovement,
    LogExpectedImprovement,
    UpperConfidenceBound,
    qExpectedImprovement,
    qLogExpectedImprovement,
    qLogNoisyExpectedImprovement,
    qUpperConfidenceBound,
)
from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance
from botorch.generation.sampling import MaxPosteriorSampling
from botorch.models.model import Model
from botorch.optim import optimize_acqf, optimize_acqf_discrete
from botorch.sampling import SobolQMCNormalSampler
from torch import Tensor
from torch.quasirandom import SobolEngine

from bo_online.models.validation import whole_number

__all__ = [
    "ACQUISITIONS",
    "BETA_SCHEDULES",
    "DEFAULT_OPTIMIZER_OPTIONS",
    "OPTIMIZER_COUNTS",
    "ucb_beta",
    "build_acquisition",
    "thompson_sample",
    "propose",
    "propose_from_pool",
    "optimizer_kwargs",
    "check_optimizer_counts",
    "check_acq_options",
    "check_acq_option_values",
]

ACQUISITIONS = ("qucb", "ucb", "logei", "ei", "qlognei", "qnipv", "ts")
BETA_SCHEDULES = ("constant", "kandasamy", "srinivas")

#: the ``acq_options`` each acquisition reads (see :func:`build_acquisition`,
#: :func:`thompson_sample`); anything else is refused, not silently ignored
ACQ_OPTIONS: dict[str, tuple[str, ...]] = {
    "qucb": ("beta", "beta_schedule", "delta", "num_mc_samples"),
    "ucb": ("beta", "beta_schedule", "delta", "num_mc_samples"),
    "logei": ("num_mc_samples",),
    "ei": ("num_mc_samples",),
    "qlognei": ("num_mc_samples", "prune_baseline", "max_baseline"),
    "qnipv": ("num_fantasies",),  # its integration points are the loop's (num_mc_points)
    "ts": ("num_candidates",),
    "random": (),
}


def known_acq_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``options`` that acquisition ``name`` reads (all, for a name without a
    list)."""
    known = ACQ_OPTIONS.get(name.lower())
    return dict(options) if known is None else {k: v for k, v in options.items() if k in known}


def check_acq_options(name: str, options: dict[str, Any]) -> None:
    r"""Raise ``ValueError`` for an ``acq_options`` key that acquisition ``name`` does not read
    (a misspelt ``beta`` would otherwise leave the default in force without a word), or for a
    value it cannot use (see :func:`check_acq_option_values`)."""
    known = ACQ_OPTIONS.get(name.lower())
    if known is None:
        return  # an unknown acquisition is reported where it is built
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"acq_options {', '.join(map(repr, unknown))} "
            f"{'is' if len(unknown) == 1 else 'are'} not read by {name}; its options: "
            f"{', '.join(known) or 'none'}."
        )
    check_acq_option_values(options)


#: ``acq_options`` that count something (whole numbers >= 1)
ACQ_COUNTS = ("num_mc_samples", "num_candidates", "num_fantasies", "max_baseline")


def check_acq_option_values(options: Mapping[str, Any]) -> None:
    r"""Refuse ``acq_options`` values the acquisitions cannot use: counts
    (:data:`ACQ_COUNTS`) that are not whole numbers >= 1, a ``beta`` that is not a finite number
    >= 0, a ``delta`` outside (0, 1), a ``beta_schedule`` that is neither a name of
    :data:`BETA_SCHEDULES` nor a callable, a ``prune_baseline`` that is not True or False. Each
    failed only at the first acquisition, after the initial design had been evaluated (``beta =
    -1``: "math domain error"; ``num_candidates = 0``: a tensor of negative size; in a sweep, on
    the cluster, its campaign's directory then holding the bad setting), or was used in a form
    nobody asked for (2.5 samples as 2, the string "no" as True)."""
    for name in ACQ_COUNTS:
        if name in options:
            whole_number(f"acq_options {name}", options[name], 1)
    if "beta" in options:
        beta = options["beta"]
        real = isinstance(beta, numbers.Real) and not isinstance(beta, bool)
        if not real or not math.isfinite(beta) or beta < 0:
            raise ValueError(f"acq_options beta must be a finite number >= 0, got {beta!r}.")
    if "delta" in options:
        delta = options["delta"]
        real = isinstance(delta, numbers.Real) and not isinstance(delta, bool)
        if not real or not 0 < delta < 1:
            raise ValueError(
                f"acq_options delta (the srinivas schedule's probability) must be a number in "
                f"(0, 1), got {delta!r}."
            )
    schedule = options.get("beta_schedule", "constant")
    if not callable(schedule) and schedule not in BETA_SCHEDULES:
        raise ValueError(
            f"acq_options beta_schedule must be one of {', '.join(BETA_SCHEDULES)} or a callable "
            f"(step, dim) -> beta, got {schedule!r}."
        )
    prune = options.get("prune_baseline", True)
    if isinstance(prune, str) or prune not in (True, False):  # NumPy's bool_ too
        raise ValueError(f"acq_options prune_baseline must be true or false, got {prune!r}.")


#: qLogNEI's baseline holds at most this many observed inputs (see :func:`likely_best_inputs`)
DEFAULT_MAX_BASELINE = 256


#: BoTorch's ``optimize_acqf`` settings the loops use unless told otherwise.
DEFAULT_OPTIMIZER_OPTIONS: dict[str, Any] = {
    "num_restarts": 10,
    "raw_samples": 512,
    "maxiter": 200,
    "batch_limit": 5,
    "sequential": False,
}


def ucb_beta(
    step: int,
    dim: int,
    schedule: str | Callable[[int, int], float] = "constant",
    beta: float = 2.0,
    delta: float = 0.1,
) -> float:
    r"""The exploration weight of (q)UCB at BO step ``step`` (1-based).

    Schedules:
        * ``"constant"``: ``beta``;
        * ``"kandasamy"``: ``beta * 0.1 * d * log(2 t)``, the practical GP-UCB schedule of
          Kandasamy et al. (2015, Sec. 3; ``beta = 2`` gives their 0.2 d log 2t);
        * ``"srinivas"``: ``beta / 2 * 2 log(d t^2 pi^2 / (6 delta))``, Srinivas et al. (2010,
          Theorem 1) with ``|D|`` replaced by d as is usual in practice;
        * a callable ``(step, dim) -> beta``.
    """
    t = max(int(step), 1)
    if callable(schedule):
        return float(schedule(t, dim))
    if schedule == "constant":
        return float(beta)
    if schedule == "kandasamy":
        return float(beta * 0.1 * dim * math.log(2 * t))
    if schedule == "srinivas":
        return float(beta / 2 * 2 * math.log(dim * t**2 * math.pi**2 / (6 * delta)))
    raise ValueError(f"Unknown beta schedule {schedule!r}; choose one of {BETA_SCHEDULES}.")


def _sampler(num_samples: int) -> SobolQMCNormalSampler:
    # No explicit seed: drawn from the global torch RNG, which the loops seed per step.
    return SobolQMCNormalSampler(sample_shape=torch.Size([int(num_samples)]))


def build_acquisition(
    name: str,
    model: Model,
    *,
    q: int,
    step: int,
    dim: int,
    X_observed: Tensor | None = None,
    Y_observed: Tensor | None = None,
    noisy: bool = False,
    mc_points: Tensor | None = None,
    options: dict[str, Any] | None = None,
) -> AcquisitionFunction:
    r"""Build the acquisition function ``name`` (see :data:`ACQUISITIONS`; not ``ts``).

    Args:
        name: acquisition name.
        model: a BoTorch model on the unit cube (maximisation).
        q: batch size.
        step: 1-based BO step (for the beta schedule).
        dim: input dimension.
        X_observed: ``n x d`` observed inputs (unit cube), needed by EI (incumbent) and qLogNEI.
        Y_observed: ``n x 1`` observed values (maximisation sense), needed by EI.
        noisy: EI's incumbent is the best posterior mean at ``X_observed`` rather than the best
            observation.
        mc_points: ``m x d`` integration points for qNIPV.
        options: ``beta``, ``beta_schedule``, ``delta`` (UCB), ``num_mc_samples`` (MC
            acquisitions, default 128), ``prune_baseline`` (qLogNEI, default True),
            ``max_baseline`` (qLogNEI: the baseline's largest size, default
            :data:`DEFAULT_MAX_BASELINE`; see :func:`likely_best_inputs`).
    """
    opts = dict(options or {})
    key = name.lower()
    num_mc = int(opts.get("num_mc_samples", 128))
    if key in ("qucb", "ucb"):
        beta = ucb_beta(
            step,
            dim,
            schedule=opts.get("beta_schedule", "constant"),
            beta=float(opts.get("beta", 2.0)),
            delta=float(opts.get("delta", 0.1)),
        )
        if key == "ucb" and q == 1:
            return UpperConfidenceBound(model, beta=beta)
        return qUpperConfidenceBound(model, beta=beta, sampler=_sampler(num_mc))
    if key in ("logei", "ei"):
        if X_observed is None or Y_observed is None:
            raise ValueError(f"{key} needs the observed data for its incumbent.")
        best_f = _incumbent(model, X_observed, Y_observed, noisy)
        if q == 1:
            return (LogExpectedImprovement if key == "logei" else ExpectedImprovement)(
                model, best_f=best_f
            )
        cls = qLogExpectedImprovement if key == "logei" else qExpectedImprovement
        return cls(model, best_f=best_f, sampler=_sampler(num_mc))
    if key == "qlognei":
        if X_observed is None:
            raise ValueError("qlognei needs the observed inputs as its baseline.")
        max_baseline = whole_number(
            "max_baseline", opts.get("max_baseline", DEFAULT_MAX_BASELINE), 1
        )
        return qLogNoisyExpectedImprovement(
            model,
            X_baseline=likely_best_inputs(model, X_observed, max_baseline),
            sampler=_sampler(num_mc),
            prune_baseline=bool(opts.get("prune_baseline", True)),
            cache_root=False,
        )
    if key == "qnipv":
        if mc_points is None:  # integrate over scrambled Sobol points of the cube
            like = X_observed if X_observed is not None else torch.empty(0, dtype=torch.float64)
            n_mc = int(opts.get("num_mc_points", 256))
            seed = int(torch.randint(0, 2**31 - 1, (1,)))  # from the (per-step seeded) global RNG
            mc_points = (
                SobolEngine(dim, scramble=True, seed=seed).draw(n_mc, dtype=torch.float64).to(like)
            )
        return qNegIntegratedPosteriorVariance(
            model, mc_points=mc_points, sampler=_sampler(int(opts.get("num_fantasies", 1)))
        )
    if key == "ts":
        raise ValueError("Thompson sampling is not an acquisition function: use thompson_sample.")
    raise ValueError(f"Unknown acquisition {name!r}; choose one of {', '.join(ACQUISITIONS)}.")


def likely_best_inputs(model: Model, X: Tensor, k: int) -> Tensor:
    r"""The (at most) ``k`` rows of ``X`` with the highest posterior mean, in their order in ``X``.

    qLogNEI's baseline pruning (BoTorch's ``prune_inferior_points``) draws joint posterior
    samples at every baseline point: O(n^2) memory and O(n^3) time, 1.9 GB and 6 s at n = 4,000,
    which a long campaign cannot pay every step. Only points that may be the best observed
    one matter to the noisy incumbent, so above ``k`` observations the baseline is cut, before
    pruning, to the ``k`` of highest marginal posterior mean (an n x 1 x d posterior: linear in
    n for the online models). Written here because BoTorch's pruning has no such pre-selection.

    Args:
        model: a BoTorch model (maximisation).
        X: ``n x d`` observed inputs.
        k: the largest number of rows to keep.

    Returns:
        ``min(n, k) x d``: ``X`` itself when ``n <= k`` (or the model has several outputs).
    """
    if X.shape[-2] <= k:
        return X
    with torch.no_grad():  # marginal means only (n x 1 x d): no n x n covariance is formed
        mean = model.posterior(X.unsqueeze(-2)).mean  # n x 1 x m
    if mean.shape[-1] != 1:  # several outputs: which point is best depends on the objective
        return X
    return X[torch.topk(mean.reshape(-1), k).indices.sort().values]


def _incumbent(model: Model, X: Tensor, Y: Tensor, noisy: bool) -> Tensor:
    if not noisy:
        return Y.max()
    with torch.no_grad():  # marginal means only: n x 1 x d keeps the cost linear in n
        return model.posterior(X.unsqueeze(-2)).mean.max()


def thompson_sample(
    model: Model, q: int, dim: int, num_candidates: int = 1000, **tensor_kwargs: Any
) -> Tensor:
    r"""Thompson sampling: ``q`` maximisers of joint posterior samples over ``num_candidates``
    scrambled Sobol points in the unit cube (BoTorch's ``MaxPosteriorSampling``, without
    replacement). Returns ``q x d``."""
    seed = int(torch.randint(0, 2**31 - 1, (1,)))
    sobol = SobolEngine(dim, scramble=True, seed=seed)
    cands = sobol.draw(int(num_candidates), dtype=torch.float64).to(**tensor_kwargs)
    with torch.no_grad():
        return MaxPosteriorSampling(model, replacement=False)(cands, num_samples=q)


#: ``optimize_acqf`` settings that count something (whole numbers >= 1)
OPTIMIZER_COUNTS = ("num_restarts", "raw_samples", "maxiter", "batch_limit")


def check_optimizer_counts(options: Mapping[str, Any], label: str = "") -> None:
    r"""Refuse ``options``' counts (:data:`OPTIMIZER_COUNTS`, those present) that are not whole
    numbers >= 1, and fewer ``raw_samples`` than ``num_restarts``: ``optimize_acqf`` picks its
    restarts among the raw samples, so either would fail at the first acquisition, after the
    initial design has been evaluated. ``label`` starts each message (how the user named them).
    """
    counts = {
        name: whole_number(f"{label}{name}", options[name], 1)
        for name in OPTIMIZER_COUNTS
        if name in options
    }
    if counts.get("raw_samples", math.inf) < counts.get("num_restarts", 0):
        raise ValueError(
            f"{label}raw_samples ({counts['raw_samples']}) must be at least num_restarts "
            f"({counts['num_restarts']}): the restarts are chosen among the raw samples."
        )


def optimizer_kwargs(optimizer_options: dict[str, Any] | None) -> dict[str, Any]:
    r"""``optimize_acqf`` keyword arguments from the loops' flat settings (defaults filled in,
    unknown names rejected)."""
    opts = {**DEFAULT_OPTIMIZER_OPTIONS, **(optimizer_options or {})}
    unknown = set(opts) - set(DEFAULT_OPTIMIZER_OPTIONS) - {"options"}
    if unknown:
        raise ValueError(
            f"Unknown optimize_acqf option(s) {sorted(unknown)}; known: "
            f"{sorted(DEFAULT_OPTIMIZER_OPTIONS)} and 'options' (a dict passed on)."
        )
    check_optimizer_counts(opts, "optimize_acqf option ")
    return {
        "num_restarts": int(opts["num_restarts"]),
        "raw_samples": int(opts["raw_samples"]),
        "sequential": bool(opts["sequential"]),
        "options": {
            "maxiter": int(opts["maxiter"]),
            "batch_limit": int(opts["batch_limit"]),
            **opts.get("options", {}),
        },
    }


def propose(
    acq: AcquisitionFunction,
    q: int,
    dim: int,
    optimizer_options: dict[str, Any] | None = None,
    **tensor_kwargs: Any,
) -> Tensor:
    r"""Maximise ``acq`` over the unit cube with BoTorch's ``optimize_acqf``; returns ``q x d``.

    ``optimizer_options``: ``num_restarts``, ``raw_samples``, ``maxiter``, ``batch_limit``,
    ``sequential`` (see :data:`DEFAULT_OPTIMIZER_OPTIONS`), ``options`` (extra dict for
    ``optimize_acqf``'s ``options``).
    """
    bounds = torch.stack([torch.zeros(dim), torch.ones(dim)]).to(**tensor_kwargs)
    X, _ = optimize_acqf(acq, bounds=bounds, q=q, **optimizer_kwargs(optimizer_options))
    return X.detach().clamp(0.0, 1.0)


def propose_from_pool(
    acq: AcquisitionFunction, q: int, choices: Tensor, max_batch_size: int = 2048
) -> tuple[Tensor, Tensor]:
    r"""Pick ``q`` of the ``choices`` (``N x d``) greedily by ``acq`` (BoTorch's
    ``optimize_acqf_discrete``, sequential, without repeats). Returns the points (``q x d``) and
    their row indices in ``choices``."""
    X, _ = optimize_acqf_discrete(acq, q=q, choices=choices, max_batch_size=max_batch_size)
    # optimize_acqf_discrete returns points, not indices: recover the rows (exact copies),
    # each row at most once (a pool may hold repeated inputs: repeated readings at one place)
    idx = nearest_distinct_rows(X, choices)
    return choices[idx], idx


def nearest_distinct_rows(points: Tensor, choices: Tensor) -> Tensor:
    r"""For each of ``points`` (``q x d``), in order, the index of the nearest row of
    ``choices`` (``N x d``) not taken by an earlier point: ``q`` distinct indices (``q <= N``)
    on ``choices``' device."""
    dist = torch.cdist(points.to(choices), choices)  # q x N
    rows: list[int] = []
    for row in dist:
        if rows:
            row = row.clone()
            row[torch.tensor(rows, device=row.device)] = math.inf
        rows.append(int(row.argmin()))
    return torch.tensor(rows, dtype=torch.long, device=choices.device)
