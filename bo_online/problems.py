r"""Problems the loops run on: test functions, pool problems from real data, user callables.

Three kinds, one per loop:

* :class:`Problem` -- a black-box objective on a box (BO). Built from BoTorch's synthetic test
  functions by name (:func:`synthetic_problem`, with dimension and observation-noise level and the
  known optimum for regret) or from any user callable (:class:`CallableProblem`).
* :class:`PoolProblem` -- a finite pool of candidate inputs with known outcomes plus a held-out
  test set (active learning). :func:`magnetometer_problem` builds the magnetometer field
  magnitude over (x, y) with a random 10,000-point held-out test set.
* :class:`StreamProblem` -- an ordered stream of (x, y) with a test set (streaming regression
  or binary classification, its ``task``); :func:`uci_problem` builds one per UCI set,
  :func:`banana_problem` the banana classification stream.

Problems live in their own units and bounds; loops map the bounds to the unit cube the models
work on (:func:`to_unit` / :func:`from_unit`). Noise is added by the loop (with its own seeded
generator), never inside ``evaluate_true``, so objective evaluation can run in any executor and a
run stays reproducible.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from botorch.test_functions import synthetic as botorch_synthetic
from botorch.utils.transforms import normalize, unnormalize
from torch import Tensor

from bo_online import datasets

__all__ = [
    "Problem",
    "SyntheticProblem",
    "CallableProblem",
    "PoolProblem",
    "StreamProblem",
    "SYNTHETIC_PROBLEMS",
    "POOL_PROBLEMS",
    "STREAM_PROBLEMS",
    "synthetic_problem",
    "magnetometer_problem",
    "uci_problem",
    "banana_problem",
    "CLASSIFICATION_PROBLEMS",
    "make_problem",
    "problem_names",
    "to_unit",
    "from_unit",
]


def to_unit(X: Tensor, bounds: Tensor) -> Tensor:
    r"""Map ``... x d`` points from the box ``bounds`` (``2 x d``) to ``[0, 1]^d``."""
    return normalize(X, bounds.to(X))


def from_unit(U: Tensor, bounds: Tensor) -> Tensor:
    r"""Map ``... x d`` points from ``[0, 1]^d`` to the box ``bounds`` (``2 x d``)."""
    return unnormalize(U, bounds.to(U))


# ---------------------------------------------------------------------------------------- BO


class Problem:
    r"""A black-box objective on a box.

    Attributes:
        name: a short name (used in records and plots).
        bounds: ``2 x d`` float64 box (lower row, upper row).
        maximize: whether larger values are better (BoTorch's test functions are minimised).
        noise_std: standard deviation of the Gaussian noise the loop adds to each evaluation.
        optimal_value: the known optimum (for regret), or None.
        spec: a JSON-able dict from which :func:`make_problem` rebuilds the problem (None for
            user callables, which must be passed again to ``resume``).
    """

    name: str
    bounds: Tensor
    maximize: bool = False
    noise_std: float = 0.0
    optimal_value: float | None = None
    spec: dict[str, Any] | None = None

    @property
    def dim(self) -> int:
        return int(self.bounds.shape[-1])

    def evaluate_true(self, X: Tensor) -> Tensor:
        r"""Noiseless values at ``X`` (``n x d``, problem units) -> ``n`` (float64, CPU)."""
        raise NotImplementedError

    def regret(self, best_true: float) -> float | None:
        """Simple regret of a best (noiseless) value, >= 0; None when the optimum is unknown."""
        if self.optimal_value is None:
            return None
        gap = self.optimal_value - best_true if self.maximize else best_true - self.optimal_value
        return float(gap)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, dim={self.dim}, "
            f"noise_std={self.noise_std}, maximize={self.maximize})"
        )


# name -> (BoTorch class, supported dims (None: any d >= min_dim), min_dim, default dim)
SYNTHETIC_PROBLEMS: dict[str, tuple[type, tuple[int, ...] | None, int, int]] = {
    "branin": (botorch_synthetic.Branin, (2,), 2, 2),
    "hartmann": (botorch_synthetic.Hartmann, (3, 4, 6), 3, 6),
    "hartmann3": (botorch_synthetic.Hartmann, (3,), 3, 3),
    "hartmann6": (botorch_synthetic.Hartmann, (6,), 6, 6),
    "ackley": (botorch_synthetic.Ackley, None, 1, 2),
    "levy": (botorch_synthetic.Levy, None, 1, 2),
    "rastrigin": (botorch_synthetic.Rastrigin, None, 1, 2),
    "griewank": (botorch_synthetic.Griewank, None, 1, 2),
    "michalewicz": (botorch_synthetic.Michalewicz, None, 1, 2),
    "styblinskitang": (botorch_synthetic.StyblinskiTang, None, 1, 2),
    "rosenbrock": (botorch_synthetic.Rosenbrock, None, 2, 2),
    "sixhumpcamel": (botorch_synthetic.SixHumpCamel, (2,), 2, 2),
}


class SyntheticProblem(Problem):
    r"""A BoTorch synthetic test function (minimised) with Gaussian observation noise.

    Args:
        name: a key of :data:`SYNTHETIC_PROBLEMS` (case-insensitive; ``styblinski_tang`` and
            ``StyblinskiTang`` both work).
        dim: input dimension; None for the function's default.
        noise_std: observation-noise standard deviation (>= 0).
    """

    def __init__(self, name: str, dim: int | None = None, noise_std: float = 0.0) -> None:
        key = _key(name)
        if key not in SYNTHETIC_PROBLEMS:
            raise ValueError(
                f"Unknown problem {name!r}; choose one of {', '.join(problem_names())}."
            )
        cls, dims, min_dim, default = SYNTHETIC_PROBLEMS[key]
        dim = default if dim is None else int(dim)
        if dims is not None and dim not in dims:
            raise ValueError(
                f"Problem {key!r} is defined for dim in {list(dims)}, not dim={dim}."
            )
        if dims is None and dim < min_dim:
            raise ValueError(f"Problem {key!r} needs dim >= {min_dim}, got dim={dim}.")
        if not np.isfinite(noise_std) or noise_std < 0:
            raise ValueError(f"noise must be a finite standard deviation >= 0, got {noise_std}.")
        kwargs = {} if key in ("branin", "sixhumpcamel") else {"dim": dim}
        self._fn = cls(**kwargs, dtype=torch.float64)
        self.name = key if key not in ("hartmann",) else f"hartmann{dim}"
        self.bounds = self._fn.bounds.to(torch.float64)
        self.maximize = False
        self.noise_std = float(noise_std)
        try:
            self.optimal_value = float(self._fn.optimal_value)
        except NotImplementedError:
            self.optimal_value = None
        self.spec = {"name": key, "dim": dim, "noise_std": self.noise_std}

    def evaluate_true(self, X: Tensor) -> Tensor:
        return self._fn.evaluate_true(X.to(torch.float64).cpu())


class CallableProblem(Problem):
    r"""Any user objective on a box.

    Args:
        fn: ``fn(X)`` with ``X`` an ``n x d`` float64 tensor in problem units, returning ``n``
            (or ``n x 1``) values. Must be picklable to run in a process pool.
        bounds: ``2 x d`` box (lower row, upper row).
        maximize: whether larger is better.
        noise_std: Gaussian noise the loop adds (0 if ``fn`` is itself a noisy experiment).
        optimal_value: known optimum for regret, if any.
        name: a short name for records and plots.
    """

    def __init__(
        self,
        fn: Callable[[Tensor], Tensor],
        bounds: Tensor | list,
        maximize: bool = False,
        noise_std: float = 0.0,
        optimal_value: float | None = None,
        name: str = "objective",
    ) -> None:
        bounds = torch.as_tensor(bounds, dtype=torch.float64)
        if bounds.dim() != 2 or bounds.shape[0] != 2 or not bool((bounds[1] > bounds[0]).all()):
            raise ValueError(
                f"bounds must be 2 x d with lower < upper in every column, got {bounds.tolist()}."
            )
        if not callable(fn):
            raise ValueError("fn must be callable: fn(X: n x d tensor) -> n values.")
        if noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {noise_std}.")
        self.fn, self.bounds, self.maximize = fn, bounds, bool(maximize)
        self.noise_std, self.optimal_value, self.name = float(noise_std), optimal_value, name
        self.spec = None

    def evaluate_true(self, X: Tensor) -> Tensor:
        values = torch.as_tensor(self.fn(X.to(torch.float64).cpu()), dtype=torch.float64)
        values = values.reshape(-1)
        if values.shape[0] != X.shape[0]:
            raise ValueError(
                f"Objective {self.name!r} returned {values.shape[0]} values for {X.shape[0]} points."
            )
        return values


# ---------------------------------------------------------------------------------------- pools


@dataclass
class PoolProblem:
    r"""A finite pool with known outcomes and a held-out test set (active learning).

    Attributes:
        X_pool: ``N x d`` candidate inputs (problem units); ``y_pool``: ``N`` outcomes.
        X_test: ``M x d`` held-out inputs; ``y_test``: ``M`` outcomes.
        bounds: ``2 x d`` box containing pool and test inputs.
    """

    name: str
    X_pool: Tensor
    y_pool: Tensor
    X_test: Tensor
    y_test: Tensor
    bounds: Tensor
    spec: dict[str, Any] | None = None

    @property
    def dim(self) -> int:
        return int(self.bounds.shape[-1])


@dataclass
class StreamProblem:
    r"""An ordered stream of observations with a test set (streaming regression or binary
    classification).

    Attributes:
        X_stream: ``N x d`` inputs in arrival order (problem units); ``y_stream``: ``N``
            (targets, or class labels in {0, 1} when ``task == "classification"``).
        X_test, y_test: the test set.
        bounds: ``2 x d`` box containing every input.
        task: ``"regression"`` or ``"classification"`` (binary, labels {0, 1}); selects the
            surrogate's prediction and the metrics of :class:`bo_online.loops.StreamingLoop`.
    """

    name: str
    X_stream: Tensor
    y_stream: Tensor
    X_test: Tensor
    y_test: Tensor
    bounds: Tensor
    spec: dict[str, Any] | None = None
    task: str = "regression"

    def __post_init__(self) -> None:
        if self.task not in ("regression", "classification"):
            raise ValueError(f"task must be 'regression' or 'classification', got {self.task!r}.")
        if self.task == "classification":
            for name, y in (("y_stream", self.y_stream), ("y_test", self.y_test)):
                if not bool(((y == 0) | (y == 1)).all()):
                    raise ValueError(f"A classification stream needs labels in {{0, 1}} in {name}.")

    @property
    def dim(self) -> int:
        return int(self.bounds.shape[-1])


def _data_bounds(*arrays: np.ndarray) -> Tensor:
    """Box spanned by the rows of the arrays; a constant column gets width 1."""
    X = np.concatenate(arrays)
    lo, hi = X.min(0), X.max(0)
    hi = np.where(hi > lo, hi, lo + 1.0)
    return torch.tensor(np.stack([lo, hi]), dtype=torch.float64)


def magnetometer_problem(
    test_size: int = 10_000,
    pool_size: int | None = None,
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
    tracks: tuple[int, ...] = datasets.MAGNETOMETER_TRACKS,
) -> PoolProblem:
    r"""The magnetometer field magnitude over (x, y): pool = all rows of the chosen tracks but a
    random held-out test set of ``test_size`` rows (seeded).

    Args:
        test_size: size of the held-out test set (10,000 in the WISKI-style experiment).
        pool_size: optionally keep only a random subset of this many pool rows (small tests).
        seed: seed of the random test/pool split.
        data_dir: data directory (see :func:`bo_online.datasets.resolve_data_dir`).
        tracks: which of the nine tracks to use.
    """
    data = datasets.load_magnetometer(tracks=tuple(tracks), data_dir=data_dir)
    n = len(data.y)
    if not 1 <= test_size < n:
        raise ValueError(f"test_size must be in 1..{n - 1} for {n} rows, got {test_size}.")
    perm = np.random.default_rng(seed).permutation(n)
    test, pool = perm[:test_size], perm[test_size:]
    if pool_size is not None:
        if not 1 <= pool_size <= len(pool):
            raise ValueError(f"pool_size must be in 1..{len(pool)}, got {pool_size}.")
        pool = pool[:pool_size]
    t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    return PoolProblem(
        name="magnetometer",
        X_pool=t(data.X[pool]),
        y_pool=t(data.y[pool]),
        X_test=t(data.X[test]),
        y_test=t(data.y[test]),
        bounds=_data_bounds(data.X),
        spec={
            "name": "magnetometer",
            "test_size": test_size,
            "pool_size": pool_size,
            "seed": seed,
            "tracks": list(tracks),
        },
    )


def uci_problem(
    name: str,
    split: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    max_stream: int | None = None,
    max_test: int | None = None,
    data_dir: str | os.PathLike | None = None,
) -> StreamProblem:
    r"""A UCI regression set as a stream: the training rows of a fixed split (shuffled with
    ``seed`` unless ``shuffle=False``) arrive in order; the split's test rows are the test set.

    Args:
        name: UCI set (see :data:`bo_online.datasets.UCI_DATASETS`).
        split: which fixed 90/10 split (0..9).
        shuffle: randomise the arrival order (seeded).
        max_stream, max_test: optionally truncate the stream / test set (small tests).
    """
    data = datasets.load_uci(name, split=split, data_dir=data_dir)
    X_tr, y_tr = data.train
    X_te, y_te = data.test
    order = np.random.default_rng(seed).permutation(len(y_tr)) if shuffle else np.arange(len(y_tr))
    if max_stream is not None:
        order = order[:max_stream]
    test_rows = np.arange(len(y_te)) if max_test is None else np.arange(min(max_test, len(y_te)))
    t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    return StreamProblem(
        name=data.name,
        X_stream=t(X_tr[order]),
        y_stream=t(y_tr[order]),
        X_test=t(X_te[test_rows]),
        y_test=t(y_te[test_rows]),
        bounds=_data_bounds(data.X),
        spec={
            "name": data.name,
            "split": split,
            "shuffle": shuffle,
            "seed": seed,
            "max_stream": max_stream,
            "max_test": max_test,
        },
    )


def banana_problem(
    shuffle: bool = True,
    seed: int = 0,
    max_stream: int | None = None,
    max_test: int | None = None,
    data_dir: str | os.PathLike | None = None,
) -> StreamProblem:
    r"""The 2-D banana set as a binary classification stream: its 400 training rows (shuffled
    with ``seed`` unless ``shuffle=False``) arrive in order, its 4,900 test rows are the test set.
    Labels -1/1 are mapped to {0, 1} (1 = the +1 class).

    Args:
        shuffle: randomise the arrival order (seeded).
        max_stream, max_test: optionally truncate the stream / test set (small tests).
    """
    data = datasets.load_banana(data_dir=data_dir)
    X_tr, y_tr = data.train
    X_te, y_te = data.test
    order = np.random.default_rng(seed).permutation(len(y_tr)) if shuffle else np.arange(len(y_tr))
    if max_stream is not None:
        order = order[:max_stream]
    test_rows = np.arange(len(y_te)) if max_test is None else np.arange(min(max_test, len(y_te)))
    t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    label = lambda y: t((np.asarray(y) > 0).astype(np.float64))  # noqa: E731  (-1/1 -> 0/1)
    return StreamProblem(
        name="banana",
        X_stream=t(X_tr[order]),
        y_stream=label(y_tr[order]),
        X_test=t(X_te[test_rows]),
        y_test=label(y_te[test_rows]),
        bounds=_data_bounds(data.X),
        spec={
            "name": "banana",
            "shuffle": shuffle,
            "seed": seed,
            "max_stream": max_stream,
            "max_test": max_test,
        },
        task="classification",
    )


POOL_PROBLEMS = ("magnetometer",)
CLASSIFICATION_PROBLEMS = ("banana",)
STREAM_PROBLEMS = tuple(datasets.UCI_DATASETS) + CLASSIFICATION_PROBLEMS


def _key(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def problem_names() -> list[str]:
    """Names of the built-in synthetic test functions."""
    return sorted(SYNTHETIC_PROBLEMS)


def synthetic_problem(name: str, dim: int | None = None, noise_std: float = 0.0) -> SyntheticProblem:
    """A BoTorch test function by name (see :class:`SyntheticProblem`)."""
    return SyntheticProblem(name, dim=dim, noise_std=noise_std)


def make_problem(
    spec: dict[str, Any], data_dir: str | os.PathLike | None = None
) -> Problem | PoolProblem | StreamProblem:
    r"""Rebuild a problem from its ``spec`` (as stored in a run's checkpoint)."""
    spec = dict(spec)
    if spec.get("name") == "file":  # a user's data file (path and SHA-256 checked)
        from bo_online.userdata import problem_from_spec

        return problem_from_spec(spec)
    name = _key(spec.pop("name"))
    if name in SYNTHETIC_PROBLEMS:
        return SyntheticProblem(name, **spec)
    if name == "magnetometer":
        if "tracks" in spec:
            spec["tracks"] = tuple(spec["tracks"])
        return magnetometer_problem(**spec, data_dir=data_dir)
    if name in datasets.UCI_DATASETS:
        return uci_problem(name, **spec, data_dir=data_dir)
    if name == "banana":
        return banana_problem(**spec, data_dir=data_dir)
    raise ValueError(
        f"Unknown problem {name!r}; choose a test function ({', '.join(problem_names())}), "
        f"'magnetometer', or a stream ({', '.join(STREAM_PROBLEMS)})."
    )
