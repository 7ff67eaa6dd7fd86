r"""Users' own objectives named on the command line.

``--objective package.module:function`` imports ``function`` from an importable module;
``--objective path/to/file.py:function`` loads it from a Python file. The function is called
with an ``n x d`` float64 tensor of points in problem units and returns ``n`` values (a
function of one point, ``d`` values -> a float, works too: it is then called row by row).

Importing runs the user's code, so a stored run never re-imports it on its own: resuming a run
of a user objective needs the same ``--objective`` spec given again (see :func:`check_resume`).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import os
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from bo_online.errors import NONE_RESULT, ObjectiveError, describe
from bo_online.problems import CallableProblem, objective_values
from bo_online.userdata import file_sha256

__all__ = [
    "load_objective",
    "parse_bounds",
    "objective_problem",
    "check_resume",
    "vectorised_objective",
    "with_calling_convention",
]


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
        added = _add_import_folder(path.resolve().parent)
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[name]
            added()
            raise ValueError(f"Importing {str(path)!r} failed: {type(e).__name__}: {e}") from e
        # A worker process cannot import a module that only this process made up: cloudpickle
        # ships its code instead (what _Vectorised.__reduce__ uses, since Dask tries plain
        # pickle first).
        import cloudpickle

        cloudpickle.register_pickle_by_value(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            # `bo-online` (unlike `python -m`) does not put the working directory on the import
            # path, so a module beside the user is not found by name: name its file form
            here = Path(*target.split(".")).with_suffix(".py")
            hint = (
                f" ({str(here)!r} is here, but the working directory is not on the import "
                f"path: pass --objective {here}:{attribute}, or add . to PYTHONPATH)"
                if here.is_file() and getattr(e, "name", None) == target.split(".")[0]
                else ""
            )
            raise ValueError(f"Cannot import module {target!r} for --objective: {e}{hint}") from e
        except Exception as e:  # its code failed (a syntax error, a raise at module level)
            raise ValueError(
                f"Importing module {target!r} for --objective failed: {type(e).__name__}: {e}"
            ) from e
    fn = getattr(module, attribute, None)
    if not callable(fn):
        raise ValueError(f"{target!r} has no callable {attribute!r} for --objective.")
    return fn


def _add_import_folder(folder: Path) -> Callable[[], None]:
    r"""Put ``folder`` first on ``sys.path`` and on ``PYTHONPATH`` (which the worker processes
    this process starts inherit: a Dask ``LocalCluster``), as ``python file.py`` puts the
    script's folder first, so that a file objective can import the modules beside it; a folder
    already on either stays where it is. Returns a function that undoes what was added (for a
    file that failed to import)."""
    entry = str(folder)
    on_path = entry in sys.path
    env = os.environ.get("PYTHONPATH")
    parts = env.split(os.pathsep) if env else []
    if not on_path:
        sys.path.insert(0, entry)
    if entry not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([entry, *parts])

    def undo() -> None:
        if not on_path and entry in sys.path:
            sys.path.remove(entry)
        if entry not in parts:
            if env is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = env

    return undo


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
    if pairs is None and any(w in str(raw).lower() for w in ("inf", "nan")):
        # JSON has no inf / nan, so '[[0, inf]]' failed as JSON and was told it was not JSON
        raise ValueError(f"--bounds need finite numbers (a box), got {raw!r}.")
    if (
        not isinstance(pairs, list)
        or not pairs
        or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs)
    ):
        raise ValueError(
            f"--bounds must be a JSON list of [lo, hi] per dimension (e.g. '[[0, 1], [-5, 5]]') "
            f"or 'lo,hi' per dimension (e.g. '0,1 -5,5'), got {raw!r}."
        )
    if any(isinstance(v, bool) for p in pairs for v in p):  # JSON true / false: not numbers
        raise ValueError(f"--bounds must hold numbers only, got {raw!r} (true / false).")
    try:
        bounds = torch.tensor(pairs, dtype=torch.float64).T.contiguous()
    except (TypeError, ValueError, RuntimeError) as e:  # null, strings, nested lists
        raise ValueError(f"--bounds must hold numbers only, got {raw!r} ({e}).") from e
    ok = torch.isfinite(bounds).all(0) & (bounds[1] > bounds[0])
    ok &= torch.isfinite(bounds[1] - bounds[0])
    if not bool(ok.all()):
        i = int((~ok).nonzero()[0])  # the first dimension at fault, named (1-based)
        raise ValueError(
            f"--bounds need finite lo < hi in every dimension, with a finite width hi - lo; "
            f"dimension {i + 1} has lo = {bounds[0, i].item():g}, hi = {bounds[1, i].item():g} "
            f"(got {raw!r})."
        )
    return bounds


def canonical_spec(spec: str) -> str:
    r"""``spec`` with a ``file.py`` part made absolute (``package.module:function`` as it is), so
    a run can be resumed from any working directory and two spellings of one file compare
    equal."""
    target, sep, attribute = str(spec).rpartition(":")
    if sep and target.endswith(".py"):
        return f"{Path(target).expanduser().resolve()}:{attribute}"
    return str(spec)


class _Vectorised:
    r"""A user objective on an ``n x d`` batch, whether it is written for a batch
    (``fn(X: n x d) -> n values``) or for one point (``fn(x: d) -> value``).

    The mode is decided once, on the first call that can tell: a batch function returns ``n``
    values for ``n`` points. Until then any other outcome of the batch call -- an exception
    (a per-point function unpacking or indexing a row), one value for the batch, or a count
    that is not ``n`` (a per-point function that indexes rows, iterates over them or uses
    ``x @ x``) -- makes the function per-point, and it is called row by row from then on, after
    a warning (that batch call may have run part of an experiment). A call on one point decides
    nothing when it returns one value (both kinds do). A call with as many points as dimensions
    decides nothing either, since a per-point function can return ``n`` values there by chance
    (``x[0] + x[1]`` adds rows instead of coordinates): it is evaluated one point at a time, each
    point as a ``d``-vector or, if the function cannot take one, as a ``1 x d`` batch, so every
    point is evaluated once and right whichever kind the function is. Once the mode is decided,
    an exception is the objective's own and propagates, and a wrong number of values is an
    :class:`~bo_online.errors.ObjectiveError`.
    """

    def __init__(self, fn: Callable[[Tensor], Any]) -> None:
        self.fn = fn
        self.per_point: bool | None = None  # None: not decided yet
        self._why_per_point = ""  # what the deciding batch call did, for later error messages

    def __reduce__(self) -> tuple[Any, ...]:
        # Dask pickles a task with plain pickle first, which names a function by its module;
        # the module made up for a file.py objective exists only in this process, so every
        # worker failed to unpickle the task and the run waited forever. cloudpickle ships
        # such a function by value (its module is registered so in load_objective).
        import cloudpickle

        state = (self.fn, self.per_point, self._why_per_point)
        return (_Vectorised._from_bytes, (cloudpickle.dumps(state),))

    def __copy__(self) -> _Vectorised:
        # A shallow copy, as before __reduce__ (which copy.copy would otherwise go through).
        out = _Vectorised.__new__(_Vectorised)
        out.__dict__.update(self.__dict__)
        return out

    @staticmethod
    def _from_bytes(data: bytes) -> _Vectorised:
        import cloudpickle

        fn, per_point, why = cloudpickle.loads(data)
        out = _Vectorised(fn)
        out.per_point, out._why_per_point = per_point, why
        return out

    def __call__(self, X: Tensor) -> Tensor:
        n, d = X.shape[0], X.shape[-1]
        if self.per_point:
            return torch.stack([self._one(x) for x in X])
        if self.per_point is False:
            return self._checked(self.fn(X), n)
        if n > 1 and n == d:  # the count cannot tell the kinds apart: stay undecided
            return torch.stack([self._one_of_either_kind(x) for x in X])
        try:  # not decided yet: try the batch (on a copy: a per-point function that writes into
            # its input, `x -= shift`, would otherwise shift the points it is then called on)
            out = self.fn(X.clone())
            values = None if out is None else self._values(out)
        except ObjectiveError:  # values no call can fix (complex): not a reason to go per point
            raise
        except Exception as error:  # a per-point function given a batch, or a real failure
            try:
                return self._decide_per_point(X, f"raised {describe(error)}")
            except Exception as per_point_error:
                if self.per_point:  # some points worked one at a time: its own error
                    raise
                if (type(per_point_error), str(per_point_error)) == (type(error), str(error)):
                    raise error from None  # the same failure either way (with its frame)
                # Neither kind of call worked on any point, so which is the objective's own
                # failure is unknown: report both.
                raise ObjectiveError(
                    f"raised {describe(error)} when called on the {n} x {d} batch, and "
                    f"{describe(per_point_error)} when called one point at a time"
                ) from error
        if values is None:  # no kind of objective returns None: report, do not go per-point
            raise ObjectiveError(NONE_RESULT)
        if values.shape[0] != n:  # one value for the batch, or rows mixed up: per-point
            try:
                return self._decide_per_point(X, f"returned {values.shape[0]} value(s)")
            except ObjectiveError:  # its values per point are wrong too: said with both counts
                raise
            except Exception as per_point_error:
                if self.per_point:  # some points worked one at a time: its own error
                    raise
                # A batch function that miscounts fails on a d-vector it never expected:
                # that error alone hid the wrong count.
                raise ObjectiveError(
                    f"returned {values.shape[0]} values for the {n} x {d} batch (one per point "
                    f"expected), and raised {describe(per_point_error)} "
                    "when called one point at a time"
                ) from per_point_error
        if n > 1:  # one point says nothing: both kinds return one value for 1 x d
            self.per_point = False
        return values

    def _decide_per_point(self, X: Tensor, why: str) -> Tensor:
        r"""The values of ``X`` point by point. Once one point works so, the objective is called
        one point at a time from then on, with a warning; if none does, it stays undecided and
        the error propagates."""
        self._why_per_point = f"{why} on a {X.shape[0]} x {X.shape[-1]} batch"
        self.per_point = True
        values: list[Tensor] = []
        try:
            for x in X:
                values.append(self._one(x))
        except BaseException:
            if not values:
                self.per_point, self._why_per_point = None, ""
                raise
            self._warn_per_point()
            raise
        self._warn_per_point()
        return torch.stack(values)

    def _warn_per_point(self) -> None:
        warnings.warn(
            f"The objective {self._why_per_point}; calling it one point at a time from now on.",
            RuntimeWarning,
            stacklevel=4,
        )

    def _one_of_either_kind(self, x: Tensor) -> Tensor:
        r"""The value at one point ``x`` (``d``) while the kind is undecided: ``fn(x)`` if that
        gives one value (a per-point function, or a batch function that takes a ``d``-vector),
        else ``fn`` on the ``1 x d`` batch (a batch function that needs rows); if that raises
        too, the first exception."""
        first: Exception | None = None
        try:  # on a copy, as the batch is tried in __call__
            values = self._values(self.fn(x.clone()))
        except Exception as error:
            first = error
        else:
            if values.shape[0] == 1:
                return values[0]
        try:
            return self._checked(self.fn(x.unsqueeze(0)), 1)[0]
        except Exception:
            if first is not None:
                raise first from None
            raise

    def _checked(self, out: Any, n: int) -> Tensor:
        values = self._values(out)
        if values.shape[0] != n:
            raise ObjectiveError(_count_message(values.shape[0], n))
        return values

    @staticmethod
    def _values(out: Any) -> Tensor:
        return objective_values(out).reshape(-1)

    def _one(self, x: Tensor) -> Tensor:
        values = self._values(self.fn(x))
        if values.shape[0] != 1:
            since = f" (it is called one point at a time: it {self._why_per_point})"
            raise ObjectiveError(
                f"returned {values.shape[0]} values for one point; it must return one value per "
                f"point{since if self._why_per_point else ''}"
            )
        return values[0]


def vectorised_objective(problem: Any) -> _Vectorised | None:
    r"""The :class:`_Vectorised` wrapper through which ``problem`` calls a user objective (a
    :class:`~bo_online.problems.CallableProblem` of :func:`objective_problem`, or a problem that
    wraps one as ``inner``, e.g. :class:`~bo_online.loops.async_bo.SlowProblem`), or None: the
    problem has one calling convention only."""
    for _ in range(16):  # a chain of wrappers, never a cycle
        fn = getattr(problem, "fn", None)
        if isinstance(fn, _Vectorised):
            return fn
        problem = getattr(problem, "inner", None)
        if problem is None:
            break
    return None


def with_calling_convention(problem: Any, per_point: bool) -> Any:
    r"""A shallow copy of ``problem`` whose :class:`_Vectorised` wrapper (see
    :func:`vectorised_objective`) has its calling convention decided: one point at a time
    (``fn(x: d)``, ``per_point=True``) or the rows as given (``fn(X: n x d)``, ``False``). An
    exception of the objective is then its own failure, after one call, where the undecided
    wrapper tried the other convention on the same point. ``problem`` and its wrapper are left
    as they are; a problem without such a wrapper is returned itself."""
    fn = getattr(problem, "fn", None)
    if isinstance(fn, _Vectorised):
        wrapper = copy.copy(fn)
        wrapper.per_point = bool(per_point)
        out = copy.copy(problem)
        out.fn = wrapper
        return out
    inner = getattr(problem, "inner", None)
    if inner is None or vectorised_objective(inner) is None:
        return problem
    out = copy.copy(problem)
    out.inner = with_calling_convention(inner, per_point)
    return out


def _count_message(got: int, n: int) -> str:
    return (
        f"returned {got} values for {n} point(s); it must return one value per "
        "point (fn(X: n x d) -> n values) or one value for one point (fn(x: d) -> value)"
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
        "objective": canonical_spec(spec),
        "bounds": box.T.tolist(),
        "maximize": bool(maximize),
        "noise_std": float(noise_std),
    }
    path = _objective_file(spec)
    if path is not None:  # what the run's evaluations came from, for a later resume to compare
        problem.objective_spec["objective_sha256"] = file_sha256(path)
    return problem


def _objective_file(spec: str) -> Path | None:
    r"""The file of a ``file.py:function`` spec (absolute), None for a module."""
    target, sep, _ = canonical_spec(spec).rpartition(":")
    return Path(target) if sep and target.endswith(".py") else None


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
            f"--objective {shlex.quote(stored['objective'])} again to resume it (importing it "
            "runs its code)."
        )
    if canonical_spec(given) != canonical_spec(stored["objective"]):
        raise ValueError(
            f"--objective {given!r} differs from the run's {stored['objective']!r}; a run resumes "
            "only with the objective it started with."
        )
    problem = objective_problem(given, stored["bounds"], stored["maximize"], stored["noise_std"])
    before = stored.get("objective_sha256")
    now = problem.objective_spec.get("objective_sha256")
    if before is not None and now != before:
        # Fixing an objective and resuming is what a failed run asks for, so this is not refused;
        # but the records so far came from the file as it was.
        warnings.warn(
            f"{_objective_file(given)} has changed since the run last started or resumed (SHA-256 "
            f"{before[:12]}... then, {now[:12]}... now): the records so far came from the "
            "earlier version.",
            UserWarning,
            stacklevel=2,
        )
    return problem
