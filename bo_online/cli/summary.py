r"""The end of a run: the summary table, and where the records, checkpoint and plots went."""

from __future__ import annotations

import math
import statistics
from typing import Any

from bo_online.cli.running import _resume_command


def _fmt(value: Any, digits: int = 5) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}g}"
    return str(value)


def _fmt_value(value: Any) -> str:
    r"""An objective's value for a person to read: 6 significant digits, and in fixed point
    at least 4 decimals from 1 up to 1e15, trailing zeros dropped. ``0.397887`` for
    0.3978873577297, ``1000000.0123`` for 1e6 + 0.0123 (6 significant digits alone read
    ``1e+06``, whatever the run found). The records keep the full value."""
    if isinstance(value, float) and value == 0:
        return "0"  # -0.0 (an objective's -(0 * x)) printed "-0"
    if not isinstance(value, float) or not math.isfinite(value) or not 1 <= abs(value) < 1e15:
        return _fmt(value, 6)
    decimals = max(6 - 1 - math.floor(math.log10(abs(value))), 4)
    return f"{value:.{decimals}f}".rstrip("0").rstrip(".")


def _last_metric(records: list[dict[str, Any]], key: str, label: str) -> tuple[str, str]:
    """A summary row for the last recorded value of a metric, labelled with its step (test
    metrics are recorded every ``--eval-every`` steps, so the last may predate the last step)."""
    last = next((r for r in reversed(records) if r.get(key) is not None), None)
    if last is None:
        return (f"last {label}", _fmt(None))
    return (f"{label} (step {last['step']})", _fmt(last[key], 4))


def _class_rows(problem: Any) -> list[tuple[str, str]]:
    r"""Summary rows of a classification stream: which of the file's labels is class 1 (the one
    ``pred_prob`` is the probability of) and how many test rows hold it, with the accuracy of
    always predicting the majority class, against which a test accuracy is read (0.99 is no
    skill where 1% of the rows are positive)."""
    classes = (getattr(problem, "spec", None) or {}).get("classes")
    rows = []
    if classes is not None:
        from bo_online.userdata import _label

        shown = [_label(c) for c in classes]
        rows.append(("classes 0 / 1 (pred_prob: p(class 1))", f"{shown[0]} / {shown[1]}"))
    y = problem.y_test
    m, ones = int(y.numel()), int((y > 0.5).sum())
    if m:
        rows.append(("test rows of class 1", f"{ones} of {m}"))
        rows.append(("majority-class test accuracy", _fmt(max(ones, m - ones) / m, 4)))
    return rows


def _finish(loop: Any, plots: bool, quiet: bool) -> None:
    r"""Write plots, then print the summary table and where everything went."""
    from bo_online.loops import history

    out = loop.out_dir
    written = []
    if plots and out is not None:
        from bo_online.plotting import plot_runs

        written = plot_runs([out], out / "plots")
    if quiet:
        return
    from rich.console import Console
    from rich.table import Table

    records = loop.records
    # failed asynchronous evaluations time an acquisition but no update: not a step's cost
    steps = [r for r in records if r["step"] > 0 and not r.get("failed")]
    last = records[-1]
    table = Table(title=f"bo-online {loop.kind}: summary", show_header=True)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    problem = getattr(loop.problem, "name", "?")
    rows: list[tuple[str, Any]] = [
        ("problem", problem),
        ("model", loop.config["model"]),
    ]
    if "acq" in loop.config:
        rows.append(("acquisition", loop.config["acq"]))
    rows += [("q", loop.config["q"]), ("steps", loop.step_count), ("n (observations)", last["n"])]
    if loop.kind == "bo_async":  # an evaluation that raised is a step but adds no observation
        rows.append(("failed evaluations (not in n)", sum(1 for r in records if r.get("failed"))))
    if loop.kind in ("bo", "bo_async"):
        # readable digits that still show an objective's values on an offset (1e6 + O(1)),
        # which differ after the 5th significant digit
        rows += [
            ("best observed value", _fmt_value(last["best_value"])),
            ("best true value", _fmt_value(last.get("best_true_value"))),
            ("optimum", _fmt_value(loop.problem.optimal_value)),
            ("simple regret", _fmt(last.get("regret"))),
        ]
    elif loop.kind == "active":
        # test metrics come every --eval-every steps: report the last evaluated, with its step
        label, final = _last_metric(records, "rmse", "test RMSE")
        rows += [
            (f"{label}, initial -> final", f"{_fmt(records[0].get('rmse'), 4)} -> {final}"),
            _last_metric(records, "mean_var", "mean predictive variance"),
            _last_metric(records, "nll", "test NLL"),
        ]
    elif getattr(loop, "classify", False):
        rows += _class_rows(loop.problem)
        rows += [
            ("prequential accuracy", _fmt(last.get("prequential_accuracy"), 4)),
            ("prequential log loss", _fmt(last.get("prequential_nll"), 4)),
            _last_metric(records, "test_accuracy", "test accuracy"),
            _last_metric(records, "test_nll", "test NLL"),
        ]
    else:
        rows += [
            ("prequential RMSE", _fmt(last.get("prequential_rmse"), 4)),
            ("prequential NLL", _fmt(last.get("prequential_nll"), 4)),
            _last_metric(records, "test_rmse", "test RMSE"),
            _last_metric(records, "test_nll", "test NLL"),
        ]
    if steps:
        rows += [
            ("median time / step (s)", _fmt(statistics.median(r["time_step"] for r in steps), 3)),
            ("median update time (s)", _fmt(statistics.median(r["time_update"] for r in steps), 3)),
        ]
    rows.append(("wall time, elapsed (s)", _fmt(loop.elapsed, 4)))
    rows.append(("  of which in steps (s)", _fmt(last["wall_time"], 4)))
    # scoring on the test set, outside the steps (not shown for a run resumed from records
    # written before it was timed: their steps' times hold it)
    if records and all("time_test" in r for r in records):
        scoring = sum(r["time_test"] for r in records)
        rows.append(("  of which scoring the test set (s)", _fmt(scoring, 4)))
    for name, value in rows:
        table.add_row(name, str(value))
    console = Console()
    console.print(table)
    if out is not None:  # plain print: paths must never be wrapped
        print(f"records:    {out / history.RECORDS_FILE}")
        cluster = " --dask local:N|tcp://host:port" if loop.kind == "bo_async" else ""
        print(
            f"checkpoint: {out / history.CHECKPOINT_FILE}  "
            f"(continue: {_resume_command(loop)}{cluster})"
        )
        for path in written:
            print(f"plot:       {path}")
