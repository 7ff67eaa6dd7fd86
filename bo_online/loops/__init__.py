r"""Ask/tell loops: Bayesian optimisation, active learning and streaming regression and classification.

Each loop writes one record per step to ``<out_dir>/records.jsonl`` as it happens and a checkpoint
after every step; :func:`resume` continues a run from its directory (e.g. after the process was
killed) and yields the same records an uninterrupted run would have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bo_online.loops import history
from bo_online.loops.bayesopt import BayesOptLoop
from bo_online.loops.core import OnlineLoop, RunDirectoryError
from bo_online.loops.history import read_records, without_timing

__all__ = [
    "BayesOptLoop",
    "ActiveLearningLoop",
    "StreamingLoop",
    "OnlineLoop",
    "RunDirectoryError",
    "load_loop",
    "resume",
    "read_records",
    "without_timing",
]


def _loop_classes() -> dict[str, type]:
    from bo_online.loops.active import ActiveLearningLoop
    from bo_online.loops.async_bo import AsyncBayesOptLoop
    from bo_online.loops.streaming import StreamingLoop

    return {
        "bo": BayesOptLoop,
        "bo_async": AsyncBayesOptLoop,
        "active": ActiveLearningLoop,
        "stream": StreamingLoop,
    }


def load_loop(out_dir: str | Path, problem: Any = None, **overrides: Any) -> OnlineLoop:
    r"""Rebuild the loop saved in ``out_dir`` at its last checkpoint.

    Args:
        out_dir: the run directory.
        problem: the problem object, needed only when the run used a user callable.
        **overrides: runtime options that do not change the trajectory: ``quiet``,
            ``executor``, ``client`` (a ``distributed.Client``; asynchronous runs), and ``data_dir`` (where pool/stream data are read from).
    """
    out_dir = Path(out_dir)
    ckpt = history.load_checkpoint(out_dir / history.CHECKPOINT_FILE)
    classes = _loop_classes()
    if ckpt.get("kind") not in classes:
        raise ValueError(f"{str(out_dir)!r}: unknown run kind {ckpt.get('kind')!r}.")
    return classes[ckpt["kind"]].from_checkpoint(ckpt, out_dir, problem=problem, **overrides)


def resume(
    out_dir: str | Path, steps: int | None = None, problem: Any = None, **overrides: Any
) -> list[dict[str, Any]]:
    r"""Continue the run in ``out_dir`` to its target number of steps (or ``steps``)."""
    loop = load_loop(out_dir, problem=problem, **overrides)
    return loop.run(steps)


def __getattr__(name: str) -> Any:
    if name in ("ActiveLearningLoop", "StreamingLoop"):
        return _loop_classes()["active" if name == "ActiveLearningLoop" else "stream"]
    raise AttributeError(name)
