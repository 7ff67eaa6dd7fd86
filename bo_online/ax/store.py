r"""The per-process store behind Ax's incremental path: the last model built for each
(experiment, model class, outcome, features) key, and the decision whether new training data
extend what it saw (same earlier inputs, earlier outcomes an exact positive affine image of the
old ones), in which case the new model is the old one conditioned on the new rows."""

from __future__ import annotations

import copy
import math
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor

from bo_online.models.base import OnlineModel

# Relative tolerance when checking that earlier outcomes are an exact affine image of the ones
# the previous model saw (Ax standardises in float64, so agreement is at round-off level).
_AFFINE_RTOL = 1e-9
# ... and in units of the coarsest dtype's epsilon, for outcomes given in float32 (each value
# rounded to within half a float32 step: 1e-9 refused every float32 extension, so every trial
# rebuilt); 32 eps is 3.8e-6 in float32 and below 1e-9 in float64.
_AFFINE_EPS_FACTOR = 32


def _affine_rtol(*tensors: Tensor) -> float:
    r"""The relative tolerance of the affine check for outcomes held in these tensors' dtypes."""
    eps = max(torch.finfo(t.dtype).eps for t in tensors if t.dtype.is_floating_point)
    return max(_AFFINE_RTOL, _AFFINE_EPS_FACTOR * eps)


#: guards the store and the class caches (Ax may build models from several threads)
_LOCK = threading.RLock()


@dataclass
class _Session:
    """What the last model built for one (class, outcomes, features) key saw."""

    model: OnlineModel
    X: Tensor  # n x d, Ax's training inputs (before the model's input transform)
    Y: Tensor  # n x 1, in the Ax outcome units of that trial
    Yvar: Tensor | None  # n x 1 or None
    fingerprint: Any  # options + input transform, to decide whether reuse is allowed


@dataclass
class _Stats:
    """Counts of what the Ax subclasses did (read by tests and benchmarks)."""

    rebuilds: int = 0
    incremental: int = 0
    refits: int = 0
    reasons: deque[str] = field(default_factory=lambda: deque(maxlen=100))  # latest rebuilds
    construct_seconds: float = 0.0  # wall time in the constructor (rebuild or condition)
    fit_seconds: float = 0.0  # wall time in Ax's fitting step (refits)


class _SessionStore:
    """Bounded LRU map key -> :class:`_Session` (few experiments are live in one process)."""

    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Any, _Session] = OrderedDict()
        self.stats = _Stats()

    def get(self, key: Any) -> _Session | None:
        with _LOCK:
            session = self._items.get(key)
            if session is not None:
                self._items.move_to_end(key)
            return session

    def put(self, key: Any, session: _Session) -> None:
        with _LOCK:
            self._items[key] = session
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with _LOCK:
            self._items.clear()
            self.stats = _Stats()


_SESSIONS = _SessionStore()


def clear_sessions() -> None:
    """Forget every remembered model (the next construction in each experiment rebuilds)."""
    _SESSIONS.clear()


def session_stats() -> _Stats:
    """Counts of rebuilds, incremental constructions and refits since the last clear."""
    return _SESSIONS.stats


# ====================================================================== fingerprints


def _fingerprint(value: Any) -> Any:
    r"""A comparable snapshot of a constructor option: tensors cloned, modules as their type and
    state (taken before any fitting, so a fresh module from the same ``ModelConfig`` matches)."""
    if isinstance(value, Tensor):
        return ("tensor", value.detach().clone())
    if isinstance(value, torch.nn.Module):
        state = {k: v.detach().clone() for k, v in value.state_dict().items()}
        return ("module", type(value).__qualname__, state)
    if isinstance(value, Mapping):
        return ("map", {k: _fingerprint(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return ("seq", [_fingerprint(v) for v in value])
    return ("value", value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (
            isinstance(a, Tensor)
            and isinstance(b, Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # values without a usable equality never match
        return False


# ====================================================================== the reuse decision


def _affine_map(y_old: Tensor, y_new: Tensor) -> tuple[float, float] | None:
    r"""``(a, b)`` with ``y_new = a y_old + b`` exactly (to round-off) and ``a > 0``, else None.

    Identical values give ``(1, 0)``. Otherwise at least three earlier points with distinct values
    are required: with two, every pair of values is an affine image of every other pair, so a
    changed observation could not be told from a change of standardisation.
    """
    if torch.equal(y_old, y_new):
        return 1.0, 0.0
    rtol = _affine_rtol(y_old, y_new)
    # in float64 whatever the outcomes' dtype: the fit's own rounding stays below the tolerance
    y_old, y_new = y_old.reshape(-1).double(), y_new.reshape(-1).double()
    if y_old.numel() < 3:
        return None
    xc = y_old - y_old.mean()
    var = xc.pow(2).sum()
    if var <= 0:
        return None
    a = float((xc * (y_new - y_new.mean())).sum() / var)
    b = float(y_new.mean() - a * y_old.mean())
    if not (a > 0 and math.isfinite(a) and math.isfinite(b)):
        return None
    scale = float(y_new.abs().max()) + abs(b) + 1.0
    if float((a * y_old + b - y_new).abs().max()) > rtol * scale:
        return None
    return a, b


def _plan_reuse(
    session: _Session, X: Tensor, Y: Tensor, Yvar: Tensor | None, fingerprint: Any
) -> tuple[float, float] | str:
    """The affine map to reuse ``session.model`` with, or the reason it cannot be reused."""
    n_old = session.X.shape[0]
    if not _same(session.fingerprint, fingerprint):
        return "model options or input transform changed"
    if X.shape[0] < n_old or X.shape[-1] != session.X.shape[-1]:
        return "fewer rows or other features than before"
    if X.dtype != session.X.dtype or X.device != session.X.device:
        return "dtype or device changed"
    if not torch.equal(X[:n_old], session.X):
        return "earlier inputs changed or were reordered"
    if (Yvar is None) != (session.Yvar is None):
        return "observation-noise information appeared or disappeared"
    ab = _affine_map(session.Y, Y[:n_old])
    if ab is None:
        return "earlier outcomes are not an affine image of the previous ones"
    a, _ = ab
    if Yvar is not None:
        expected = session.Yvar.double() * a**2
        tol = _affine_rtol(session.Yvar, Yvar) * (float(expected.abs().max()) + 1e-300)
        if float((Yvar[:n_old].double() - expected).abs().max()) > tol:
            return "earlier noise variances changed"
    return ab


def _extended_model(
    previous: OnlineModel, a: float, b: float, X_new: Tensor, Y_new: Tensor, Yvar_new: Tensor | None
) -> OnlineModel:
    r"""``previous`` re-expressed in the new Ax units and conditioned on the new rows.

    The model itself keeps the units of the trial at which it was built (its *anchor* units);
    only the affine map from those to Ax's current units, ``(_ax_scale, _ax_shift)``, is
    composed with the new ``y_new = a y_old + b`` on a shallow copy. The Ax subclass applies the
    map in ``posterior`` and inverts it in ``condition_on_observations`` / ``update``, so nothing
    is assumed about how a model stores its statistics. ``previous`` itself is untouched.
    """
    model = previous._shallow_copy()
    model._ax_scale = a * previous._ax_scale
    model._ax_shift = a * previous._ax_shift + b
    if X_new.shape[0] == 0:
        return model
    # BoTorch's convention: Y in (Ax) user units, noise in the model's standardised units,
    # i.e. anchor-unit variances over outcome_std^2.
    noise = None
    if Yvar_new is not None:
        noise = Yvar_new / (model._ax_scale**2 * model.outcome_std.pow(2))
    if getattr(previous, "conditioned_rows_held", True):
        return model.condition_on_observations(X_new, Y_new, noise=noise)
    # The model keeps conditioned rows apart from the data it holds (WISKI's Woodbury caches,
    # t-SVGP's fantasy sites: neither reaches ``fit``), so later refits would ignore them, or
    # a chain of conditionings grows a low-rank term every trial (QSGP's): fold them in with
    # the in-place ``update`` on a copy instead (Ax units in, as ``update`` takes them). The
    # copy costs about what the update does (the model's state).
    model = copy.deepcopy(model)
    model.update(X_new, Y_new, Yvar_new)
    return model
