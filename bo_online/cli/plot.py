r"""``bo-online plot``: plots of one or more run directories."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from bo_online.cli.application import app
from bo_online.cli.checks import _check


@app.command()
def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run directories to compare.")],
    out: Annotated[
        Optional[Path],
        typer.Option(help="Directory for the PNGs (default: plots/ in the first run directory)."),
    ] = None,
) -> None:
    """Plot best value/regret vs step and wall time, time per step vs n, test RMSE vs step
    (active learning, regression streams) and test accuracy vs step (classification streams)."""
    from bo_online.plotting import plot_runs

    for d in run_dirs:
        _check(d.is_dir(), f"No run directory {str(d)!r}.")
    _check(
        out is None or not out.exists() or out.is_dir(),
        f"--out {str(out)!r} is a file; --out names the directory the PNGs are written into.",
    )
    written = plot_runs(run_dirs, out or run_dirs[0] / "plots")
    for path in written:
        typer.echo(f"plot: {path}")
