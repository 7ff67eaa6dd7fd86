r"""Plots of run records (matplotlib, PNG files; no display needed).

* :func:`plot_progress` -- best value (or regret, log scale) vs step and vs wall time;
* :func:`plot_time_per_step` -- time per step vs n, one line per run (how the surrogate's cost
  grows with the data it holds);
* :func:`plot_rmse` -- test RMSE vs step (active learning / streaming);
* :func:`plot_accuracy` -- test accuracy vs step (streaming classification);
* :func:`plot_runs` -- every plot that fits the runs given, written into a directory.

Each function takes run directories (or record lists with labels) and writes one PNG.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter  # noqa: E402

from bo_online.loops.history import (  # noqa: E402
    CONFIG_FILE,
    RECORDS_FILE,
    _damaged_records,
    read_records,
)

__all__ = [
    "load_runs",
    "plot_progress",
    "plot_time_per_step",
    "plot_rmse",
    "plot_accuracy",
    "plot_runs",
]

Run = tuple[str, list[dict[str, Any]]]


def load_runs(paths: Sequence[str | os.PathLike]) -> list[Run]:
    r"""``(label, records)`` for each run directory; the label is ``model/acq`` from the run's
    config when the directory names alone would be ambiguous, else the directory name."""
    runs = []
    for p in paths:
        p = Path(p)
        records = read_records(p)
        if not records:
            raise ValueError(f"Run {str(p)!r} has no records yet.")
        _check_plotted_fields(p / RECORDS_FILE if p.is_dir() else p, records)
        label = p.name or str(p)
        try:  # the label's model/acquisition, where the run's configuration can be read
            cfg = json.loads((p / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            cfg = None
        if isinstance(cfg, dict):
            label = f"{p.name} ({cfg.get('model')}{'/' + str(cfg['acq']) if 'acq' in cfg else ''})"
        runs.append((label, records))
    return runs


#: fields every record must hold for the plots, and those every record after the initial
#: design must hold as well (time per step vs n)
_PLOTTED_FIELDS = ("n",)
_PLOTTED_STEP_FIELDS = ("time_step", "time_update")


def _check_plotted_fields(path: Path, records: list[dict[str, Any]]) -> None:
    r"""Refuse, naming the file, the line and the field, records that lack a field the plots
    read (a person deleted or renamed it), rather than fail with a bare ``KeyError``. Records
    are ``path``'s lines in order (:func:`read_records` keeps one per line)."""
    for i, record in enumerate(records):
        needed = _PLOTTED_FIELDS + (_PLOTTED_STEP_FIELDS if record["step"] > 0 else ())
        missing = next((k for k in needed if k not in record), None)
        if missing is not None:
            raise _damaged_records(
                path, i, f"no field {missing!r}, which the plots need: deleted or renamed"
            )


def _save(fig: plt.Figure, out: str | os.PathLike) -> Path:
    r"""Save ``fig`` to ``out`` whole or not at all: a run killed while plotting leaves the
    previous plot, not a truncated image (drawn beside it, then moved over it)."""
    from bo_online.loops.history import _new_temp_file

    out = Path(out)
    part, fd = None, None
    try:  # the figure is closed whatever fails, its folder or temp file included
        out.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own (``.NAME.<random>``): two processes drawing the same plot at once
        # (two sweeps, or `bo-online plot`s, on one folder) each replace it whole; with one
        # ``NAME.part`` for both, one moved the other's away and failed (FileNotFoundError, in
        # half the saves)
        fd, part = _new_temp_file(out)
        _hold(fd)  # until it is moved: marks it in use (see _remove_stale_temps)
        fig.tight_layout()
        fig.savefig(part, dpi=110, format=out.suffix.lstrip(".") or "png")
        os.replace(part, out)
        part = None
        _remove_stale_temps(out)
    finally:
        plt.close(fig)
        if fd is not None:
            os.close(fd)
        if part is not None:
            Path(part).unlink(missing_ok=True)
    return out


#: a temp file of a save younger than this is never taken for a stale one (it may be a live
#: save's, between its creation and its lock); without file locks (Windows), the age alone
_STALE_TEMP_SECONDS = 2.0
_STALE_TEMP_SECONDS_UNLOCKED = 3600.0


def _hold(fd: int) -> None:
    r"""Lock the open temp file ``fd`` (POSIX ``flock``, released when it is closed or its
    process dies) so that no other save takes it for a stale one. Where ``flock`` is refused
    (``ENOLCK`` on NFS without a lock daemon) the save goes on unlocked: another save's
    ``flock`` fails there too, so it removes nothing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the age alone tells
        return
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX)


def _remove_stale_temps(out: Path) -> list[Path]:
    r"""Delete the temp files of saves of ``out`` (``.NAME.<12 hex>`` beside it) that a killed
    process left: unlocked (no live save holds them, :func:`_hold`) and older than
    ``_STALE_TEMP_SECONDS``. Returns those removed."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        fcntl = None
    name = re.compile(rf"\.{re.escape(out.name)}\.[0-9a-f]{{12}}")
    removed = []
    for tmp in out.parent.iterdir():
        if not name.fullmatch(tmp.name):
            continue
        try:
            age = time.time() - tmp.stat().st_mtime
            min_age = _STALE_TEMP_SECONDS if fcntl else _STALE_TEMP_SECONDS_UNLOCKED
            if age < min_age:
                continue
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:  # gone meanwhile (its save finished), or not ours to read
            continue
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by a live save: raises
            tmp.unlink()
            removed.append(tmp)
        except OSError:  # in use, or gone meanwhile
            continue
        finally:
            os.close(fd)
    return removed


def _plain_log_ticks(ax: plt.Axes) -> None:
    r"""Label a log-scale y axis with plain numbers (``0.01``, ``1.5``), not matplotlib's
    ``1.5 x 10^0``; its minor ticks (2, 3, ..., 9 times a power of ten) are labelled only where
    the axis spans less than a decade, which otherwise would show one label or none. Call it
    once the data are plotted: it reads the axis' limits."""
    plain = FuncFormatter(lambda value, _: f"{value:.3g}")
    ax.yaxis.set_major_formatter(plain)
    low, high = ax.get_ylim()
    ax.yaxis.set_minor_formatter(plain if high < 10 * low else NullFormatter())


def _finish(fig: plt.Figure, ax: plt.Axes, out: str | os.PathLike, **props: Any) -> Path:
    r"""Set the axes' properties (``xlabel``, ``ylabel``, ``title``, ``yscale``, ...), add the
    grid and legend every single-panel plot has, and save."""
    ax.set(**props)
    if props.get("yscale") == "log":
        _plain_log_ticks(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


def _series(records: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = [r for r in records if r.get(key) is not None]
    step = np.array([r["step"] for r in rows], float)
    wall = np.array([r.get("wall_time", np.nan) for r in rows], float)
    value = np.array([r[key] for r in rows], float)
    return step, wall, value


def plot_progress(runs: Sequence[Run], out: str | os.PathLike, metric: str = "auto") -> Path:
    r"""Best value (or regret) vs step (left) and vs cumulative wall time (right).

    Args:
        runs: ``(label, records)`` of BO runs.
        out: PNG path.
        metric: ``"regret"`` (log scale), ``"best_value"``, or ``"auto"`` (regret when every run
            has it).
    """
    if metric == "auto":
        has_regret = all(any(r.get("regret") is not None for r in rec) for _, rec in runs)
        metric = "regret" if has_regret else "best_value"
    if metric not in ("regret", "best_value"):
        raise ValueError(f"metric must be 'regret', 'best_value' or 'auto', got {metric!r}.")
    ylabel = "simple regret (log scale)" if metric == "regret" else "best observed value"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, records in runs:
        step, wall, value = _series(records, metric)
        if metric == "regret":
            value = np.maximum(value, 1e-12)
        ax1.step(step, value, where="post", label=label)
        ax2.step(wall, value, where="post", label=label)
    for ax, xlabel in ((ax1, "BO step (0 = initial design)"), (ax2, "wall time (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if metric == "regret":
            ax.set_yscale("log")
            _plain_log_ticks(ax)
        ax.grid(alpha=0.3)
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps: no 0.5 ticks on short runs
    ax1.set_title(f"{'Regret' if metric == 'regret' else 'Best value'} vs step")
    ax2.set_title(f"{'Regret' if metric == 'regret' else 'Best value'} vs wall time")
    ax1.legend(fontsize=8)
    return _save(fig, out)


def plot_time_per_step(runs: Sequence[Run], out: str | os.PathLike) -> Path:
    r"""Time per step (fit + acquisition + evaluation + update) vs n, with the update time
    alone dashed; steps after the initial design only, not an asynchronous run's failed
    evaluations (no observation added, nothing fitted or updated: a second point at that n,
    with an update time of 0 off the log axis)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, records in runs:
        rows = [r for r in records if r["step"] > 0 and not r.get("failed")]
        if not rows:
            continue
        n = np.array([r["n"] for r in rows], float)
        total = np.array([r["time_step"] for r in rows], float)
        update = np.array([r["time_update"] for r in rows], float)
        (line,) = ax.plot(n, total, label=f"{label}: step", lw=1.2)
        ax.plot(n, update, ls="--", color=line.get_color(), label=f"{label}: update", lw=1)
    return _finish(
        fig,
        ax,
        out,
        xlabel="n (observations held by the surrogate)",
        ylabel="seconds",
        yscale="log",
        title="Time per step vs n",
    )


def _plot_metric_vs_step(
    runs: Sequence[Run],
    out: str | os.PathLike,
    keys: Sequence[str],
    ylabel: str,
    title: str,
) -> Path:
    r"""One line per run of a test metric vs step (markers at the steps that recorded it).

    Args:
        runs: ``(label, records)`` pairs.
        out: PNG path.
        keys: record keys the metric may be stored under, in order of preference: each run
            plots the first key some of its records hold (not ``None``), else the last key.
        ylabel: the y-axis label.
        title: the plot's title.
    """
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, records in runs:
        key = next((k for k in keys[:-1] if any(r.get(k) is not None for r in records)), keys[-1])
        step, _, value = _series(records, key)
        ax.plot(step, value, marker="o", ms=3, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _finish(fig, ax, out, xlabel="step (0 = initial design)", ylabel=ylabel, title=title)


def plot_rmse(runs: Sequence[Run], out: str | os.PathLike) -> Path:
    r"""Test RMSE vs step (active-learning ``rmse`` or streaming ``test_rmse`` records)."""
    return _plot_metric_vs_step(
        runs, out, ("rmse", "test_rmse"), ylabel="test RMSE", title="Test RMSE vs step"
    )


def plot_accuracy(runs: Sequence[Run], out: str | os.PathLike) -> Path:
    r"""Test accuracy vs step (streaming-classification ``test_accuracy`` records)."""
    return _plot_metric_vs_step(
        runs, out, ("test_accuracy",), ylabel="test accuracy", title="Test accuracy vs step"
    )


def plot_runs(
    paths: Sequence[str | os.PathLike], out_dir: str | os.PathLike, prefix: str = ""
) -> list[Path]:
    r"""Every plot that applies to the runs in ``paths``, written to ``out_dir``:
    ``progress.png`` (BO runs), ``rmse.png`` (runs with test RMSE), ``accuracy.png`` (runs with
    test accuracy), ``time_per_step.png`` (all)."""
    runs = load_runs(paths)
    out_dir = Path(out_dir)
    written = []
    bo = [(lab, rec) for lab, rec in runs if any("best_value" in r for r in rec)]
    if bo:
        written.append(plot_progress(bo, out_dir / f"{prefix}progress.png"))
    rmse = [
        (lab, rec)
        for lab, rec in runs
        if any(r.get("rmse") is not None or r.get("test_rmse") is not None for r in rec)
    ]
    if rmse:
        written.append(plot_rmse(rmse, out_dir / f"{prefix}rmse.png"))
    acc = [(lab, rec) for lab, rec in runs if any(r.get("test_accuracy") is not None for r in rec)]
    if acc:
        written.append(plot_accuracy(acc, out_dir / f"{prefix}accuracy.png"))
    if any(len(rec) > 1 for _, rec in runs):
        written.append(plot_time_per_step(runs, out_dir / f"{prefix}time_per_step.png"))
    return written
