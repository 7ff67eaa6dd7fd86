r"""Side-by-side timing: interleaved candidates, a warm-up, median and min-max.

Every speed claim in bo_online is a ratio measured in one run: the candidates are timed
interleaved (A B A B ...), after a warm-up, the median of at least five repetitions is reported
with its min-max spread, and the environment (library versions, dtype, device, threads) is
recorded beside the numbers. ``timeit`` does not interleave competitors or synchronise a GPU,
hence this small module.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch


@dataclass
class Timing:
    """Seconds per call of one candidate: median, min, max over ``reps`` repetitions."""

    median: float
    min: float
    max: float
    reps: int


def _sync(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    candidates: dict[str, Callable[[], Any]],
    reps: int = 5,
    warmup: int = 1,
    device: torch.device | str | None = None,
    inner: int = 1,
) -> dict[str, Timing]:
    r"""Time each zero-argument callable ``reps`` times, interleaved, after ``warmup`` calls each.

    Args:
        inner: each sample is the fastest of this many consecutive calls of the same candidate.
            With ``inner > 1`` every candidate is timed in the state its own previous call left
            (caches, the allocator's free memory) rather than the state the previous candidate
            left: a large buffer freed by one candidate and returned to the system makes the
            next candidate's first allocation of that size page in fresh memory, which on a
            millisecond kernel can cost as much as the kernel itself.

    Returns:
        name -> :class:`Timing` (seconds per call).
    """
    if reps < 1 or inner < 1:
        raise ValueError("reps and inner must be >= 1.")
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(reps):
        for name, fn in candidates.items():
            best = math.inf
            for _ in range(inner):
                _sync(device)
                start = time.perf_counter()
                fn()
                _sync(device)
                best = min(best, time.perf_counter() - start)
            samples[name].append(best)
    return {
        name: Timing(statistics.median(v), min(v), max(v), len(v)) for name, v in samples.items()
    }


def environment() -> dict[str, Any]:
    """Library versions, threads and machine, recorded with every benchmark result."""
    import botorch
    import gpytorch
    import linear_operator

    import bo_online

    return {
        "bo_online": bo_online.__version__,
        "torch": torch.__version__,
        "botorch": botorch.__version__,
        "gpytorch": gpytorch.__version__,
        "linear_operator": linear_operator.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def write_results(path: str | Path, payload: dict[str, Any]) -> Path:
    r"""Write ``payload`` (plus :func:`environment`) as indented JSON, creating parent folders.

    Written as a run's files are (``bo_online.loops.history``): valid JSON, a non-finite number
    (a NaN ratio, an infinite error) as ``null``, and atomically (a temporary file moved into
    place), so a benchmark killed mid-write leaves the previous results whole (an ``OSError``
    is raised as such: a benchmark's file is no run directory).
    ``Timing`` values become their fields, dtypes and devices their names, NumPy scalars and
    arrays numbers and lists.
    """
    from bo_online.loops.history import _atomic_write_io, to_jsonable

    path = Path(path)
    obj = to_jsonable(_plain({"environment": environment(), **payload}))
    _atomic_write_io(path, lambda f: json.dump(obj, f, indent=2, allow_nan=False), False)
    return path


def _plain(obj: Any) -> Any:
    """``obj`` with what JSON cannot hold turned into what it can (non-finite floats are left
    to ``to_jsonable``, which makes them None)."""
    if isinstance(obj, Timing):
        return _plain(asdict(obj))
    if isinstance(obj, (torch.dtype, torch.device)):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "tolist") and not torch.is_tensor(obj):  # NumPy scalars and arrays
        return _plain(obj.tolist())
    if obj is None or isinstance(obj, (str, bool, int, float)) or torch.is_tensor(obj):
        return obj
    raise TypeError(f"Cannot serialise {type(obj).__name__}")
