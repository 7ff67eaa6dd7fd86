r"""``bo-online resume``: continue a run from its checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from bo_online.cli import running
from bo_online.cli.application import app
from bo_online.cli.checks import (
    _check,
    _check_resume_steps,
    _check_resume_steps_within_data,
    _no_workers_timeout,
    _nonneg,
)
from bo_online.cli.memory import _check_resume_memory
from bo_online.cli.options import DaskOpt, DataDirOpt, PlotsOpt, QuietOpt, ThreadsOpt
from bo_online.cli.running import _executor, _run, _run_async, _setup, _shutdown
from bo_online.cli.summary import _finish


@app.command()
def resume(
    run_dir: Annotated[
        Path, typer.Argument(help="Run directory (the --out of the interrupted run).")
    ],
    steps: Annotated[
        Optional[int], typer.Option(help="New target number of steps (default: the original).")
    ] = None,
    objective: Annotated[
        Optional[str],
        typer.Option(
            help="A run of your own --objective resumes only with the same spec given "
            "again (importing it runs its code; it is never imported from the run's files alone)."
        ),
    ] = None,
    data_dir: DataDirOpt = None,
    quiet: QuietOpt = False,
    plots: PlotsOpt = True,
    threads: ThreadsOpt = None,
    dask: DaskOpt = None,
    max_failures: Annotated[
        Optional[int],
        typer.Option(
            help="With --dask: a new limit on failed evaluations, counted over the whole run "
            "(a run stopped by the limit stops again at its next failure unless raised)."
        ),
    ] = None,
    no_workers_timeout: Annotated[
        Optional[float],
        typer.Option(
            "--no-workers-timeout",
            metavar="SECONDS",
            help="With --dask: a new limit on how long the cluster may have no worker while "
            "evaluations are in flight, in seconds, or inf to wait forever (default: the run's "
            "own, 120 s unless set when it started).",
        ),
    ] = None,
    device: Annotated[
        Optional[str],
        typer.Option(
            help="Continue on this torch device (cpu, cuda, cuda:1) instead of the run's own, "
            "e.g. a run copied from a GPU machine to one without (default: the run's device)."
        ),
    ] = None,
    data: Annotated[
        Optional[Path],
        typer.Option(
            help="A run on your own data file (--data): the file's new place, if it was moved or "
            "copied (its SHA-256 must be the run's; its next checkpoint records the new path)."
        ),
    ] = None,
    test_mask: Annotated[
        Optional[Path],
        typer.Option(
            help="A run with a test-mask file (--test-mask FILE): that file's new place, if it "
            "was moved or copied (its SHA-256 must be the run's)."
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            help="A bo run: evaluate each batch in a process pool of this many workers, as "
            "`bo --workers` (0: in-process; the records are the same either way)."
        ),
    ] = 0,
) -> None:
    """Continue an interrupted run from its last checkpoint (same records as if never stopped)."""
    from bo_online.loops import load_loop

    _setup(threads)
    if steps is not None:
        _nonneg("--steps", steps)
    if max_failures is not None:
        _nonneg("--max-failures", max_failures)
        _check(dask is not None, "--max-failures applies to asynchronous runs: add --dask.")
    wait_for_workers: float | None = None
    if no_workers_timeout is not None:
        wait_for_workers = _no_workers_timeout(no_workers_timeout)
        _check(dask is not None, "--no-workers-timeout applies to asynchronous runs: add --dask.")
    _nonneg("--workers", workers)
    _check(workers == 0 or dask is None, "--workers and --dask exclude each other.")
    _check(run_dir.is_dir(), f"No run directory {str(run_dir)!r}.")
    from bo_online.loops import history
    from bo_online.objectives import check_resume

    ckpt_path = run_dir / history.CHECKPOINT_FILE
    if not ckpt_path.is_file() and (run_dir / history.RECORDS_FILE).is_file():
        load_loop(run_dir)  # raises the advice for a run stopped before its first checkpoint
    _check(ckpt_path.is_file(), f"No checkpoint in {str(run_dir)!r}: nothing to resume.")
    ckpt = history.load_checkpoint(ckpt_path)
    # before the run is loaded, which rewrites its records from the checkpoint
    _check_resume_steps(int(ckpt.get("step_count", 0)), steps)
    stored = ckpt["config"].get("objective")
    if objective is not None and stored is None and ckpt.get("problem") is None:
        # a BO run started from Python on a callable: a user objective, but no spec resumes it
        # (check_resume would say it is not one)
        from bo_online.loops.core import resume_in_python_advice

        _check(
            ckpt.get("kind") not in ("bo", "bo_async"),
            resume_in_python_advice(
                "objective is a Python callable (the run was started from Python, not with "
                "--objective)",
                run_dir,
                ckpt.get("kind"),
            ),
        )
    user_problem = check_resume(stored, objective)
    _check(
        dask is None or ckpt.get("kind") == "bo_async",
        f"{str(run_dir)!r} is not an asynchronous (Dask) run (its kind is {ckpt.get('kind')!r}); "
        "resume it without --dask.",
    )
    _check(
        workers == 0 or ckpt.get("kind") == "bo",
        f"--workers evaluates a bo run's objective in parallel; the run in {str(run_dir)!r} is "
        f"of kind {ckpt.get('kind')!r}: resume it without --workers.",
    )
    moved: dict[str, Any] = {} if device is None else {"device": device}
    if data is not None:
        moved["data"] = data
    if test_mask is not None:
        moved["test_mask"] = test_mask
    if dask is not None:  # an asynchronous run: continue on this cluster
        with running._dask_client(dask) as client:
            loop = load_loop(
                run_dir,
                problem=user_problem,
                quiet=quiet,
                data_dir=data_dir,
                client=client,
                **moved,
            )
            _check_resume_memory(loop, steps)
            if max_failures is not None:
                loop.config["max_failures"] = int(max_failures)
            if no_workers_timeout is not None:  # saved with the run's next checkpoint
                loop.no_workers_timeout = wait_for_workers
                loop.config["no_workers_timeout"] = wait_for_workers
            _run_async(loop, steps, dask)
        _finish(loop, plots, quiet)
        return
    executor = _executor(workers)
    try:
        loop = load_loop(
            run_dir,
            problem=user_problem,
            quiet=quiet,
            data_dir=data_dir,
            **moved,
            **({} if executor is None else {"executor": executor}),
        )
        _check_resume_steps_within_data(loop, steps)
        _check_resume_memory(loop, steps)
        _run(loop, steps)
    finally:
        _shutdown(executor)
    _finish(loop, plots, quiet)
