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

import inspect
import math
import os
import reprlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from botorch.test_functions import synthetic as botorch_synthetic
from botorch.utils.transforms import normalize, unnormalize
from torch import Tensor

from bo_online import datasets
from bo_online.errors import COMPLEX_RESULT, NONE_RESULT, ObjectiveError, describe
from bo_online.models.validation import is_complex, max_abs_output, real_float64

__all__ = [
    "Problem",
    "SyntheticProblem",
    "CallableProblem",
    "ObjectiveError",
    "checked_values",
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
        # Beyond round-off, a negative gap means the stated optimum is wrong (a user's
        # optimal_value): say so once, and report the regret of a value at the optimum.
        tolerance = 1e-9 * max(1.0, abs(self.optimal_value))
        if gap < -tolerance and not getattr(self, "_warned_optimum", False):
            self._warned_optimum = True
            warnings.warn(
                f"{self.name}: found the value {best_true:.10g}, better than the stated "
                f"optimal_value {self.optimal_value}; the optimum is wrong, so regret is "
                "reported as 0 from here on. Pass the true optimum (or None) for a meaningful "
                "regret.",
                RuntimeWarning,
                stacklevel=2,
            )
        return max(float(gap), 0.0)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, dim={self.dim}, "
            f"noise_std={self.noise_std}, maximize={self.maximize})"
        )


# name -> (BoTorch class, supported dims (None: any d >= min_dim), min_dim, default dim).
# Every unconstrained, continuous function of ``botorch.test_functions.synthetic`` with a known
# optimum (constrained, mixed-integer and binary ones are left out: the BO loop has no
# constraints or discrete inputs).
SYNTHETIC_PROBLEMS: dict[str, tuple[type, tuple[int, ...] | None, int, int]] = {
    "ackley": (botorch_synthetic.Ackley, None, 1, 2),
    "beale": (botorch_synthetic.Beale, (2,), 2, 2),
    "branin": (botorch_synthetic.Branin, (2,), 2, 2),
    "bukin": (botorch_synthetic.Bukin, (2,), 2, 2),
    "cosine8": (botorch_synthetic.Cosine8, (8,), 8, 8),
    "dixonprice": (botorch_synthetic.DixonPrice, None, 1, 2),
    "dropwave": (botorch_synthetic.DropWave, (2,), 2, 2),
    "eggholder": (botorch_synthetic.EggHolder, (2,), 2, 2),
    "griewank": (botorch_synthetic.Griewank, None, 1, 2),
    "hartmann": (botorch_synthetic.Hartmann, (3, 4, 6), 3, 6),
    "hartmann3": (botorch_synthetic.Hartmann, (3,), 3, 3),
    "hartmann6": (botorch_synthetic.Hartmann, (6,), 6, 6),
    "holdertable": (botorch_synthetic.HolderTable, (2,), 2, 2),
    "levy": (botorch_synthetic.Levy, None, 1, 2),
    "michalewicz": (botorch_synthetic.Michalewicz, None, 1, 2),
    "powell": (botorch_synthetic.Powell, None, 4, 4),
    "rastrigin": (botorch_synthetic.Rastrigin, None, 1, 2),
    "rosenbrock": (botorch_synthetic.Rosenbrock, None, 2, 2),
    "shekel": (botorch_synthetic.Shekel, (4,), 4, 4),
    "sixhumpcamel": (botorch_synthetic.SixHumpCamel, (2,), 2, 2),
    "styblinskitang": (botorch_synthetic.StyblinskiTang, None, 1, 2),
    "threehumpcamel": (botorch_synthetic.ThreeHumpCamel, (2,), 2, 2),
}
#: functions BoTorch defines for maximisation (the others are minimised).
_MAXIMIZED = frozenset({"cosine8"})


def _separable_optimum(fn: Any, dim: int) -> float | None:
    r"""Exact minimum of a separable function (Michalewicz, Styblinski-Tang): a sum over
    coordinates of one-dimensional terms, each minimised on a fine grid then by Brent's
    method (BoTorch gives neither optimisers nor an optimum for every d)."""
    from scipy.optimize import minimize_scalar

    lo, hi = float(fn.bounds[0, 0]), float(fn.bounds[1, 0])
    if isinstance(fn, botorch_synthetic.Michalewicz):
        m = 10.0  # BoTorch's steepness, fixed in its Michalewicz
        term = lambda x, i: -np.sin(x) * np.sin((i + 1) * x**2 / np.pi) ** (2 * m)  # noqa: E731
    elif isinstance(fn, botorch_synthetic.StyblinskiTang):
        term = lambda x, i: 0.5 * (x**4 - 16 * x**2 + 5 * x)  # noqa: E731
    else:
        return None
    total, grid, x_star = 0.0, np.linspace(lo, hi, 20_001), []
    for i in range(dim):
        values = term(grid, i)
        j = int(np.argmin(values))
        a, b = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
        res = minimize_scalar(
            lambda x: term(x, i), bounds=(a, b), method="bounded", options={"xatol": 1e-14}
        )
        x_star.append(res.x if res.fun < values[j] else grid[j])
        total += float(min(res.fun, values[j]))
    # the same point through the function itself (summation order can differ by an ulp)
    at_x_star = float(fn.evaluate_true(torch.tensor([x_star], dtype=torch.float64)))
    return min(total, at_x_star)


def _refined_optimum(fn: Any, stated: float | None, maximize: bool = False) -> float | None:
    r"""The optimum without BoTorch's rounding: the function evaluated at its stated optimisers
    after a tight L-BFGS-B polish (SciPy; gradients by autograd), so that no point can score
    below it (regret >= 0). Falls back to the stated value where there is nothing to polish
    or the polish lands farther than rounding from it (another basin)."""
    optimizers = getattr(fn, "_optimizers", None)
    if not optimizers:
        return stated
    from scipy.optimize import minimize

    sign = -1.0 if maximize else 1.0  # minimise sign * f
    bounds = list(zip(fn.bounds[0].tolist(), fn.bounds[1].tolist()))
    lo, hi = np.asarray(bounds).T

    def f_and_grad(x: np.ndarray) -> tuple[float, np.ndarray]:
        if not np.isfinite(x).all():  # a kink at the optimum (Bukin) gives NaN steps
            return float("inf"), np.zeros_like(x)
        X = torch.tensor(np.clip(x, lo, hi), dtype=torch.float64, requires_grad=True)
        value = sign * fn.evaluate_true(X.unsqueeze(0)).sum()
        value.backward()
        return float(value.detach()), X.grad.numpy().copy()

    best = None
    for x0 in optimizers:
        x0 = np.clip(np.asarray(x0, dtype=np.float64), lo, hi)
        value0 = f_and_grad(x0)[0]
        with np.errstate(all="ignore"):
            res = minimize(
                f_and_grad,
                x0,
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 500},
            )
        value = min(value0, float(res.fun)) if np.isfinite(res.fun) else value0
        best = value if best is None else min(best, value)
    if best is None:
        return stated
    best = sign * best
    if stated is not None and abs(best - stated) > 1e-3 * max(1.0, abs(stated)):
        return stated
    return best


class SyntheticProblem(Problem):
    r"""A BoTorch synthetic test function with Gaussian observation noise (minimised, except
    ``cosine8``, which BoTorch defines for maximisation).

    ``optimal_value`` is exact to float64 evaluation (BoTorch rounds several, e.g. SixHumpCamel's
    ``-1.0316``): polished from BoTorch's optimisers, or summed over coordinates for the
    separable Michalewicz and Styblinski-Tang, so regret is never negative.

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
            raise ValueError(f"Problem {key!r} is defined for dim in {list(dims)}, not dim={dim}.")
        if dims is None and dim < min_dim:
            raise ValueError(f"Problem {key!r} needs dim >= {min_dim}, got dim={dim}.")
        if key == "powell" and dim % 4:
            raise ValueError(f"Problem 'powell' needs dim a multiple of 4, got dim={dim}.")
        if not np.isfinite(noise_std) or noise_std < 0:
            raise ValueError(f"noise must be a finite standard deviation >= 0, got {noise_std}.")
        takes_dim = "dim" in inspect.signature(cls.__init__).parameters
        self._fn = cls(**({"dim": dim} if takes_dim else {}), dtype=torch.float64)
        self.name = key if key not in ("hartmann",) else f"hartmann{dim}"
        self.bounds = self._fn.bounds.to(torch.float64)
        self.maximize = key in _MAXIMIZED
        self.noise_std = float(noise_std)
        self.optimal_value = _exact_optimum(key, dim, self._fn)
        self.spec = {"name": key, "dim": dim, "noise_std": self.noise_std}

    def evaluate_true(self, X: Tensor) -> Tensor:
        return self._fn.evaluate_true(X.to(torch.float64).cpu())


_OPTIMA: dict[tuple[str, int], float | None] = {}


def _exact_optimum(key: str, dim: int, fn: Any) -> float | None:
    """Cached :func:`_separable_optimum` / :func:`_refined_optimum` of a function."""
    cache_key = (SYNTHETIC_PROBLEMS[key][0].__name__, dim)
    if cache_key not in _OPTIMA:
        try:
            stated = float(fn.optimal_value)
        except NotImplementedError:
            stated = None
        separable = _separable_optimum(fn, dim)
        value = _refined_optimum(
            fn, separable if separable is not None else stated, maximize=key in _MAXIMIZED
        )
        if separable is not None and value is not None:  # both are attained values
            value = min(separable, value)
        _OPTIMA[cache_key] = value
    return _OPTIMA[cache_key]


def _user_frame(error: BaseException, shipped_file: str | None = None) -> str:
    r"""`` (at file.py:12)``: the innermost traceback frame in the user's own code (not this
    package, an installed package or the standard library), or ``""``. ``shipped_file``: the
    name of the ``--objective`` file, whose code reaches worker processes through cloudpickle,
    which names its frames ``<dynamic-code>``."""
    import sysconfig
    import traceback

    skip = [str(Path(__file__).resolve().parent)]
    skip += [str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("stdlib", "purelib")]
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if not any(str(Path(f.filename).resolve()).startswith(s) for s in skip)
        and "site-packages" not in f.filename
    ]
    if not frames:
        return ""
    name = Path(frames[-1].filename).name
    if name == "<dynamic-code>" and shipped_file is not None:
        name = shipped_file
    return f" (at {name}:{frames[-1].lineno})"


def objective_values(result: Any) -> Tensor:
    r"""What an objective returned as a float64 tensor (detached: values computed with autograd,
    a torch model as objective, are data).

    Raises:
        ObjectiveError: (not yet naming the objective) for None or complex values, which
            ``torch.as_tensor(..., dtype=float64)`` would pass on or cut to their real part.
    """
    if result is None:
        raise ObjectiveError(NONE_RESULT)
    if is_complex(result):
        raise ObjectiveError(COMPLEX_RESULT)
    try:
        return torch.as_tensor(result, dtype=torch.float64).detach()
    except (TypeError, ValueError, RuntimeError) as error:  # a string, a dict, ragged lists
        raise ObjectiveError(
            f"returned {type(result).__name__} {reprlib.repr(result)}, which is not numbers "
            f"({error}); it must return one real number per point (a tensor, array or list)"
        ) from error


def _is_box(bounds: Tensor) -> bool:
    r"""Whether ``bounds`` is a ``2 x d`` box: finite, lower row < upper row, finite widths."""
    return (
        bounds.dim() == 2
        and bounds.shape[0] == 2
        and bool(torch.isfinite(bounds).all())
        and bool((bounds[1] > bounds[0]).all())
        and bool(torch.isfinite(bounds[1] - bounds[0]).all())
    )


class CallableProblem(Problem):
    r"""Any user objective on a box.

    Args:
        fn: ``fn(X)`` with ``X`` an ``n x d`` float64 tensor in problem units, returning ``n``
            (or ``n x 1``) values. Must be picklable to run in a process pool. None: no
            objective in-process -- the user evaluates every point (ask/tell) and the loop
            starts from their data (``BayesOptLoop(initial_data=..., n_init=0)``).
        bounds: ``2 x d`` box (lower row, upper row).
        maximize: whether larger is better.
        noise_std: Gaussian noise the loop adds (0 if ``fn`` is itself a noisy experiment).
        optimal_value: known optimum for regret, if any.
        name: a short name for records and plots.
    """

    def __init__(
        self,
        fn: Callable[[Tensor], Tensor] | None,
        bounds: Tensor | list,
        maximize: bool = False,
        noise_std: float = 0.0,
        optimal_value: float | None = None,
        name: str = "objective",
    ) -> None:
        bounds = torch.as_tensor(bounds, dtype=torch.float64)
        if not _is_box(bounds):
            # one [lo, hi] pair per input, as --bounds and objective_problem take them
            pairs = bounds.dim() == 2 and bounds.shape[-1] == 2 and _is_box(bounds.T)
            raise ValueError(
                "bounds must be 2 x d, finite, with lower < upper and a finite width "
                "upper - lower in every column, got "
                f"{bounds.tolist()}"
                + (
                    f", which reads as one [lo, hi] pair per input (as --bounds takes them): "
                    f"pass the box transposed: {bounds.T.tolist()}."
                    if pairs
                    else "."
                )
            )
        if fn is not None and not callable(fn):
            raise ValueError("fn must be callable (fn(X: n x d tensor) -> n values) or None.")
        if not math.isfinite(noise_std) or noise_std < 0:
            raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std}.")
        if optimal_value is not None and not math.isfinite(optimal_value):
            raise ValueError(f"optimal_value must be finite (or None), got {optimal_value}.")
        self.fn, self.bounds, self.maximize = fn, bounds, bool(maximize)
        self.noise_std, self.optimal_value, self.name = float(noise_std), optimal_value, name
        self.spec = None

    def _shipped_file(self) -> str | None:
        r"""The name of the ``--objective`` file (``objective_spec``, set by
        :func:`bo_online.objectives.objective_problem`), or None."""
        spec = getattr(self, "objective_spec", None)
        target = str(spec["objective"]).rpartition(":")[0] if spec else ""
        return Path(target).name if target.endswith(".py") else None

    def evaluate_true(self, X: Tensor) -> Tensor:
        if self.fn is None:
            raise ValueError(
                f"Problem {self.name!r} has no objective to call: evaluate the points of ask() "
                "yourself and pass them to tell() (start from your data with initial_data=)."
            )
        try:
            # A copy: an objective that writes into its input must not change the loop's points.
            result = self.fn(X.detach().to(torch.float64).cpu().clone())
            values = objective_values(result)
        except ObjectiveError as error:  # from the wrapper that checks the values, or nested
            if error.objective is not None:  # already names its objective
                raise
            raise ObjectiveError(f"Objective {self.name!r} {error}", self.name) from error
        except SystemExit as error:  # sys.exit() in an objective is its failure
            raise ObjectiveError(
                f"Objective {self.name!r} called sys.exit({error.code!r})"
                f"{_user_frame(error, self._shipped_file())} "
                f"on {X.shape[0]} point(s)",
                self.name,
            ) from error
        except Exception as error:
            raise ObjectiveError(
                f"Objective {self.name!r} raised {describe(error)}"
                f"{_user_frame(error, self._shipped_file())} on {X.shape[0]} point(s)",
                self.name,
            ) from error
        return checked_values(self.name, X, values)


def checked_values(name: str, X: Tensor, values: Tensor) -> Tensor:
    r"""An objective's ``values`` at ``X`` (``n x d``) as ``n`` float64 values, else an
    :class:`~bo_online.errors.ObjectiveError` naming the objective ``name``: a wrong number of
    values, NaN/inf, or a magnitude beyond which a model's standardisation overflows."""
    values = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    if values.shape[0] != X.shape[0]:
        raise ObjectiveError(
            f"Objective {name!r} returned {values.shape[0]} values for {X.shape[0]} points.",
            name,
        )
    bad = ~torch.isfinite(values)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise ObjectiveError(
            f"Objective {name!r} returned {values[i].item()} at "
            f"{[round(v, 6) for v in X[i].tolist()]} ({int(bad.sum())} of {X.shape[0]} "
            "value(s) NaN/inf); it must return a finite value for every point",
            name,
        )
    # Finite but too large for any model to standardise: refused here, where the objective
    # can be named, not later by the model as "Y holds values ...".
    limit = max_abs_output(torch.float64)
    huge = values.abs() >= limit
    if bool(huge.any()):
        i = int(torch.nonzero(huge)[0])
        raise ObjectiveError(
            f"Objective {name!r} returned {values[i].item():.3g} at "
            f"{[round(v, 6) for v in X[i].tolist()]} ({int(huge.sum())} of {X.shape[0]} "
            f"value(s) of magnitude >= {limit:.3g}, beyond which a model's standardisation "
            "overflows). Rescale the objective (e.g. divide it by a constant)",
            name,
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

    def __post_init__(self) -> None:
        _check_labelled_sets(
            self.name,
            self.bounds,
            (
                ("X_pool", self.X_pool, "y_pool", self.y_pool),
                ("X_test", self.X_test, "y_test", self.y_test),
            ),
        )
        _normalise_labelled_sets(self, ("X_pool", "y_pool", "X_test", "y_test"))
        _require_rows(
            self,
            ("X_pool", "X_test"),
            "a pool problem needs at least one pool row and one test row.",
        )

    @property
    def dim(self) -> int:
        return int(self.bounds.shape[-1])


def _normalise_labelled_sets(problem: Any, arrays: tuple[str, ...]) -> None:
    r"""After :func:`_check_labelled_sets`: inputs and targets given as NumPy arrays or lists
    become float64 tensors (the loops index them with tensors and move them with ``.to``: a
    NumPy pool failed in the first step with torch's TypeError), as do inputs given as an
    integer or boolean tensor; targets given ``N x 1`` become ``N`` (the loops index, score and
    record ``N``: an ``N x 1`` stream broadcast its prequential errors to ``q x q``) and a box
    given as a list becomes a float64 tensor. ``arrays``: the attribute names of the inputs and
    targets, targets named ``y...``."""
    problem.bounds = torch.as_tensor(problem.bounds, dtype=torch.float64)
    for name in arrays:
        value = getattr(problem, name)
        if not torch.is_tensor(value):  # (tensors keep their dtype: labels may be bool or int)
            value = torch.as_tensor(value, dtype=torch.float64)
        elif name.startswith("X") and not value.is_floating_point():
            # integer inputs (torch.randint): the loops cast the box to the inputs' dtype, which
            # truncated it (-0.5 .. 9.5 became 0 .. 9) and mapped the inputs otherwise
            value = value.to(torch.float64)
        if name.startswith("y") and value.dim() > 1:
            value = value.reshape(-1)
        setattr(problem, name, value)


def _require_rows(problem: Any, names: tuple[str, ...], needs: str) -> None:
    r"""Refuse an empty input array among ``names`` (attributes of ``problem``): the loops score
    every step on the test rows and draw every step from the pool or stream."""
    for rows_name in names:
        if len(getattr(problem, rows_name)) < 1:
            raise ValueError(f"{problem.name}: {rows_name} is empty; {needs}")


def _check_labelled_sets(name: str, bounds: Any, sets: tuple) -> None:
    r"""Check a pool's or a stream's arrays before any loop runs: ``bounds`` ``2 x d``, finite,
    lower < upper; every ``X`` ``N x d`` and finite inside that box (to a 1e-9 relative
    tolerance); every ``y`` ``N`` finite values (``N`` or ``N x 1``). A ``ValueError`` names the
    problem, the array and the first bad row."""
    bounds = torch.as_tensor(bounds, dtype=torch.float64)
    if bounds.dim() != 2 or bounds.shape[0] != 2:
        raise ValueError(f"{name}: bounds must be 2 x d, got shape {tuple(bounds.shape)}.")
    if not bool(torch.isfinite(bounds).all()) or not bool((bounds[1] > bounds[0]).all()):
        raise ValueError(f"{name}: bounds need finite lower < upper, got {bounds.tolist()}.")
    d = bounds.shape[-1]
    tol = 1e-9 * (bounds[1] - bounds[0])
    for x_name, X, y_name, y in sets:
        X, y = real_float64(X, f"{name}: {x_name}"), real_float64(y, f"{name}: {y_name}")
        if X.dim() != 2 or X.shape[-1] != d:
            raise ValueError(f"{name}: {x_name} must be N x {d}, got shape {tuple(X.shape)}.")
        if y.shape[:1] != X.shape[:1] or y.numel() != X.shape[0]:
            raise ValueError(
                f"{name}: {y_name} must hold one value per row of {x_name} ({X.shape[0]}), "
                f"got shape {tuple(y.shape)}."
            )
        for array_name, rows in (
            (x_name, ~torch.isfinite(X).all(-1)),
            (y_name, ~torch.isfinite(y.reshape(-1))),
        ):
            if bool(rows.any()):
                raise ValueError(
                    f"{name}: {array_name} has NaN/inf in row {int(torch.nonzero(rows)[0])} "
                    f"({int(rows.sum())} row(s) in all); remove or impute them."
                )
        outside = ((X < bounds[0] - tol) | (X > bounds[1] + tol)).any(-1)
        if bool(outside.any()):
            i = int(torch.nonzero(outside)[0])
            raise ValueError(
                f"{name}: {x_name} row {i} {X[i].tolist()} is outside the bounds "
                f"{bounds.tolist()} ({int(outside.sum())} row(s) in all); widen the bounds or "
                "drop those rows."
            )


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
        _check_labelled_sets(
            self.name,
            self.bounds,
            (
                ("X_stream", self.X_stream, "y_stream", self.y_stream),
                ("X_test", self.X_test, "y_test", self.y_test),
            ),
        )
        _normalise_labelled_sets(self, ("X_stream", "y_stream", "X_test", "y_test"))
        _require_rows(self, ("X_stream", "X_test"), "a stream needs at least one row.")
        if self.task not in ("regression", "classification"):
            raise ValueError(f"task must be 'regression' or 'classification', got {self.task!r}.")
        if self.task == "classification":
            for name, y in (("y_stream", self.y_stream), ("y_test", self.y_test)):
                if not bool(((y == 0) | (y == 1)).all()):
                    # banana's native -1 / 1 (and 1 / 2, NaN, ...) were refused without saying
                    # which values were found or how to map them
                    found = torch.unique(y.detach().double().cpu())
                    shown = ", ".join(f"{v:g}" for v in found[:5].tolist())
                    more = f", ... ({found.numel()} distinct)" if found.numel() > 5 else ""
                    raise ValueError(
                        f"A classification stream needs labels in {{0, 1}} in {name}, found "
                        f"{shown}{more}; map the two classes to 0 and 1 first (-1 / 1: "
                        "(y > 0).double()), or read the file with "
                        "bo_online.userdata.stream_from_file(..., task='classification'), which "
                        "maps two distinct values to 0 / 1 in sorted order."
                    )

    @property
    def dim(self) -> int:
        return int(self.bounds.shape[-1])


def _data_bounds(*arrays: np.ndarray) -> Tensor:
    """Box spanned by the rows of the arrays; a constant column gets width 1 (or, where
    ``lo + 1`` rounds back to ``lo``, above 2**53, one rounding step)."""
    X = np.concatenate(arrays)
    lo, hi = X.min(0), X.max(0)
    hi = np.where(hi > lo, hi, np.maximum(lo + 1.0, np.nextafter(lo, np.inf)))
    return torch.tensor(np.stack([lo, hi]), dtype=torch.float64)


def stream_arrays(
    X_train: np.ndarray,
    y_train: np.ndarray,
    X_test: np.ndarray,
    y_test: np.ndarray,
    shuffle: bool = True,
    seed: int = 0,
    max_stream: int | None = None,
    max_test: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""A stream's arrays as float64 tensors: the training rows (``n x d``, ``n``) in arrival
    order (a permutation seeded by ``seed`` unless ``shuffle=False``, cut to ``max_stream``) and
    the first ``max_test`` test rows."""
    for name, value in (("max_stream", max_stream), ("max_test", max_test)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 (or None for every row), got {value}.")
    n = len(y_train)
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    if max_stream is not None:
        order = order[:max_stream]
    test_rows = slice(None) if max_test is None else slice(0, max_test)

    def tensor(a: np.ndarray) -> Tensor:
        return torch.tensor(a, dtype=torch.float64)

    return (
        tensor(X_train[order]),
        tensor(y_train[order]),
        tensor(X_test[test_rows]),
        tensor(y_test[test_rows]),
    )


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
        seed: seed of that order.
        max_stream: optionally truncate the stream (small tests).
        max_test: optionally truncate the test set (small tests).
        data_dir: data directory (default: ``$BO_ONLINE_DATA_DIR``, else ``../shared/data``
            next to the project root; :func:`bo_online.datasets.resolve_data_dir`).
    """
    data = datasets.load_uci(name, split=split, data_dir=data_dir)
    X_stream, y_stream, X_test, y_test = stream_arrays(
        *data.train, *data.test, shuffle, seed, max_stream, max_test
    )
    return StreamProblem(
        name=data.name,
        X_stream=X_stream,
        y_stream=y_stream,
        X_test=X_test,
        y_test=y_test,
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
        seed: seed of that order.
        max_stream: optionally truncate the stream (small tests).
        max_test: optionally truncate the test set (small tests).
        data_dir: data directory (default: ``$BO_ONLINE_DATA_DIR``, else ``../shared/data``
            next to the project root; :func:`bo_online.datasets.resolve_data_dir`).
    """
    data = datasets.load_banana(data_dir=data_dir)
    (X_tr, y_tr), (X_te, y_te) = data.train, data.test
    labels = lambda y: (np.asarray(y) > 0).astype(np.float64)  # noqa: E731  (-1/1 -> 0/1)
    X_stream, y_stream, X_test, y_test = stream_arrays(
        X_tr, labels(y_tr), X_te, labels(y_te), shuffle, seed, max_stream, max_test
    )
    return StreamProblem(
        name="banana",
        X_stream=X_stream,
        y_stream=y_stream,
        X_test=X_test,
        y_test=y_test,
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


def synthetic_problem(
    name: str, dim: int | None = None, noise_std: float = 0.0
) -> SyntheticProblem:
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
