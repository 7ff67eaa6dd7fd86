r"""Users' own objectives named on the command line.

``--objective package.module:function`` imports ``function`` from an importable module;
``--objective path/to/file.py:function`` loads it from a Python file. The function is called
with an ``n x d`` float64 tensor of points in problem units and returns ``n`` values (a
function of one point, ``d`` values -> a float, works too: it is then called row by row).

Importing runs the user's code, so a stored run never re-imports it on its own: resuming a run
of a user objective needs the same ``--objective`` spec given again (see :func:`check_resume`).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from bo_online.problems import CallableProblem

__all__ = ["load_objective", "parse_bounds", "objective_problem", "check_resume"]


def load_objective(spec: str) -> Callable[[Tensor], Any]:
    r"""The callable named by ``spec`` (``package.module:function`` or ``file.py:function``)."""
    target, sep, attribute = str(spec).rpartition(":")
    if not sep or not target or not attribute.isidentifier():
        raise ValueError(
            f"--objective must look like package.module:function or path/to/file.py:function, "
            f"got {spec!r}."
        )
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.is_file():
            raise ValueError(f"--objective file {str(path)!r} does not exist.")
        name = f"_bo_online_objective_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"Cannot load {str(path)!r} as a Python module.")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # so that pickling the function (process pools) finds it
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[name]
            raise ValueError(f"Importing {str(path)!r} failed: {type(e).__name__}: {e}") from e
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ValueError(f"Cannot import module {target!r} for --objective: {e}") from e
    fn = getattr(module, attribute, None)
    if not callable(fn):
        raise ValueError(f"{target!r} has no callable {attribute!r} for --objective.")
    return fn


def parse_bounds(raw: str | list) -> Tensor:
    r"""``2 x d`` bounds from JSON (``[[lo, hi], ...]`` per dimension) or ``lo,hi`` per
    dimension separated by spaces or semicolons (``"0,1 -5,5"``)."""
    try:
        pairs = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        try:
            pairs = [
                [float(v) for v in item.split(",")] for item in str(raw).replace(";", " ").split()
            ]
        except ValueError:
            pairs = None
    if (
        not isinstance(pairs, list)
        or not pairs
        or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs)
    ):
        raise ValueError(
            f"--bounds must be a JSON list of [lo, hi] per dimension (e.g. '[[0, 1], [-5, 5]]') "
            f"or 'lo,hi' per dimension (e.g. '0,1 -5,5'), got {raw!r}."
        )
    bounds = torch.tensor(pairs, dtype=torch.float64).T.contiguous()
    if not bool(torch.isfinite(bounds).all()) or not bool((bounds[1] > bounds[0]).all()):
        raise ValueError(f"--bounds need finite lo < hi in every dimension, got {raw!r}.")
    return bounds


class _Vectorised:
    """``fn`` on an ``n x d`` batch; a per-point function is called row by row."""

    def __init__(self, fn: Callable[[Tensor], Any]) -> None:
        self.fn = fn

    def __call__(self, X: Tensor) -> Tensor:
        try:
            values = torch.as_tensor(self.fn(X), dtype=torch.float64).reshape(-1)
            if values.shape[0] == X.shape[0]:
                return values
        except Exception:
            if X.shape[0] == 1:
                raise
        return torch.stack(
            [torch.as_tensor(self.fn(x), dtype=torch.float64).reshape(()) for x in X]
        )


def objective_problem(
    spec: str, bounds: str | list, maximize: bool = False, noise_std: float = 0.0
) -> CallableProblem:
    r"""A :class:`bo_online.problems.CallableProblem` for a user objective named on the CLI;
    its ``objective_spec`` (stored in the run's config) says how to rebuild it."""
    box = parse_bounds(bounds)
    fn = load_objective(spec)
    name = spec.rpartition(":")[2]
    problem = CallableProblem(
        _Vectorised(fn), box, maximize=maximize, noise_std=noise_std, name=name
    )
    problem.objective_spec = {
        "objective": spec,
        "bounds": box.T.tolist(),
        "maximize": bool(maximize),
        "noise_std": float(noise_std),
    }
    return problem


def check_resume(stored: dict[str, Any] | None, given: str | None) -> CallableProblem | None:
    r"""The problem to resume a run with. A run of a user objective (``stored``: its
    ``objective_spec``) is resumed only when the same ``--objective`` is given again: the
    import runs code, so it is never done from a stored file alone."""
    if stored is None:
        if given is not None:
            raise ValueError("This run is not of a user objective; resume it without --objective.")
        return None
    if given is None:
        raise ValueError(
            f"This run optimises the user objective {stored['objective']!r}; pass "
            f"--objective {stored['objective']} again to resume it (importing it runs its code)."
        )
    if given != stored["objective"]:
        raise ValueError(
            f"--objective {given!r} differs from the run's {stored['objective']!r}; a run resumes "
            "only with the objective it started with."
        )
    return objective_problem(given, stored["bounds"], stored["maximize"], stored["noise_std"])
