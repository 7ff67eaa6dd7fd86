r"""``bo-online sweep``: a sweep of BO campaigns on a Dask cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bo_online.cli import running
from bo_online.cli.application import app
from bo_online.cli.checks import _check
from bo_online.cli.memory import _check_campaign_memory
from bo_online.cli.options import DaskOpt, PlotsOpt, QuietOpt
from bo_online.cli.summary import _fmt


@app.command()
def sweep(
    spec: Annotated[
        Path,
        typer.Argument(
            help="Sweep spec (TOML, or YAML): steps, problems, models, acqs, seeds, \\[options]."
        ),
    ],
    out: Annotated[
        Path, typer.Option(help="Directory holding one run directory per campaign.")
    ] = Path("runs/sweep"),
    dask: DaskOpt = None,
    plots: PlotsOpt = True,
    quiet: QuietOpt = False,
) -> None:
    """Run a sweep of BO campaigns on a Dask cluster (default: a LocalCluster with one worker
    per CPU); finished campaigns are skipped, interrupted ones resumed (bo_online.sweep)."""
    import os

    from bo_online.sweep import (
        campaigns,
        load_spec,
        plot_sweep,
        run_sweep,
        summarize,
        write_summary,
    )

    for c in campaigns(load_spec(spec)):  # bad specs fail before a cluster starts
        _check_campaign_memory(c)
    _check(
        not out.exists() or out.is_dir(),
        f"--out {str(out)!r} is a file; --out names the directory that holds one run "
        "directory per campaign.",
    )
    from bo_online.loops.history import probe_writable

    # the campaigns write under --out, and this process its plots: an unwritable --out (read
    # only, under a file) is refused here, not by every campaign once a cluster has started
    probe_writable(out)
    running._ACTIVE_SWEEP[:] = [True]  # the message on Ctrl-C / SIGTERM
    with running._dask_client(dask or f"local:{os.cpu_count() or 1}") as client:
        summaries = run_sweep(spec, out, client)
    results = write_summary(summaries, out)
    written = plot_sweep(summaries, out) if plots else []
    if quiet:
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"bo-online sweep: {len(summaries)} campaigns")
    for col in ("campaign", "evaluations", "final regret", "wall time (s)", "status"):
        table.add_column(col, justify="left" if col == "campaign" else "right")
    for s in summaries:
        table.add_row(
            s["campaign"],
            str(s["evaluations"]),
            _fmt(s["regret"], 4),
            _fmt(s["wall_time"], 3),
            s["status"],
        )
    means = Table(title="final regret over seeds")
    for col in ("problem", "model", "acq", "seeds", "mean regret", "SE"):
        means.add_column(col)
    for r in summarize(summaries):
        means.add_row(
            r["problem"],
            r["model"],
            r["acq"],
            str(r["seeds"]),
            _fmt(r["mean_regret"], 4),
            _fmt(r["se_regret"], 2),
        )
    console = Console()
    # Rendered at the tables' natural width, wider than a terminal or a pipe's 80 columns if
    # need be: rich would cut a long campaign name to "hartmann6d-exact-qucb…", losing the seed
    # that tells its rows apart (a narrow terminal wraps the lines instead, dropping nothing).
    unbounded = console.options.update_width(10_000)
    width = max(
        console.width, *(console.measure(t, options=unbounded).maximum for t in (table, means))
    )
    console = Console(width=width)
    console.print(table)
    console.print(means)
    typer.echo(f"summary: {results}")
    for path in written:
        typer.echo(f"plot: {path}")
