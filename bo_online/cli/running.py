r"""Running a built loop from a command: threads, optimiser options, the options ``bo``,
``active`` and ``stream`` share, process pools and Dask clients, and the hint printed when a
run stops (how to resume it)."""

from __future__ import annotations

import math
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bo_online.cli.application import _fail
from bo_online.cli.checks import (
    _check,
    _check_model,
    _check_out,
    _check_seed,
    _nonneg,
    _parse_options,
    _positive,
)
from bo_online.cli.memory import _check_sizes


def _setup(threads: int | None) -> None:
    if threads is not None:
        _positive("--threads", threads)
        import torch

        torch.set_num_threads(threads)


def _optimizer_options(
    num_restarts: int, raw_samples: int, acqf_maxiter: int, batch_limit: int, sequential: bool
) -> dict[str, Any]:
    _positive("--num-restarts", num_restarts)
    _positive("--raw-samples", raw_samples)
    _positive("--acqf-maxiter", acqf_maxiter)
    _positive("--batch-limit", batch_limit)
    _check(
        raw_samples >= num_restarts,
        f"--raw-samples ({raw_samples}) must be at least --num-restarts ({num_restarts}): the "
        "restarts are chosen among the raw samples.",
    )
    return {
        "num_restarts": num_restarts,
        "raw_samples": raw_samples,
        "maxiter": acqf_maxiter,
        "batch_limit": batch_limit,
        "sequential": sequential,
    }


def _shared(
    *,
    model: str,
    model_option: list[str] | None,
    q: int,
    seed: int,
    refit_every: int | str,
    fit_max_iter: int,
    checkpoint_every: int | None,
    refit_from: str = "auto",
    out: Path,
    overwrite: bool,
    quiet: bool,
    device: str,
    dtype: str,
    dim: int | None = None,
    checkpoint_seconds: float = 30.0,
) -> dict[str, Any]:
    _positive("--q", q)
    if refit_every != "auto":
        _nonneg("--refit-every", refit_every)
    _nonneg("--fit-max-iter", fit_max_iter)
    from bo_online.loops.core import REFIT_FROM

    _check(
        refit_from in REFIT_FROM,
        f"--refit-from must be one of {', '.join(REFIT_FROM)}, got {refit_from!r}.",
    )
    if checkpoint_every is not None:
        _positive("--checkpoint-every", checkpoint_every)
    _check(
        math.isfinite(checkpoint_seconds) and checkpoint_seconds >= 0,
        f"--checkpoint-seconds must be >= 0, got {checkpoint_seconds}.",
    )
    _check_seed(seed)
    _check_out(out)
    _check_model(model)
    options = _parse_options(model_option)
    _check_sizes(options, dim, dtype, device)
    return {
        "model": model,
        "model_options": options,
        "q": q,
        "seed": seed,
        "refit_every": refit_every,
        "fit_max_iter": fit_max_iter,
        "refit_from": refit_from,
        "checkpoint_every": checkpoint_every,
        "checkpoint_seconds": checkpoint_seconds,
        "out_dir": out,
        "overwrite": overwrite,
        "quiet": quiet,
        "device": device,
        "dtype": dtype,
    }


def _watch_parent(parent: int) -> None:
    r"""Worker initializer: a daemon thread that ends this worker as soon as its driver is gone
    (its parent pid changes), so no worker outlives a driver killed even by SIGKILL."""
    import os
    import signal
    import threading
    import time

    # Workers are forked from the driver: drop its SIGTERM handler (die quietly when terminated)
    # and ignore Ctrl-C, which the terminal sends to the whole group (the driver stops them).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _dask_client(address: str) -> Any:
    """A Dask client (closed, with its LocalCluster, on exit); see bo_online.sweep.dask_client."""
    from bo_online.sweep import dask_client

    return dask_client(address)


#: the loop now running, its run directory and resume command, named in the
#: interrupted/terminated message (the commands and the entry point reach it, ``_ACTIVE_SWEEP``
#: and ``_dask_client`` through this module, so that each has one place to set or replace it)
_ACTIVE_RUN: list[tuple[Any, Path, str]] = []


#: set while a sweep runs: its campaigns continue when the same sweep command runs again
_ACTIVE_SWEEP: list[bool] = []


def _resume_command(loop: Any, address: str | None = None) -> str:
    r"""``bo-online resume DIR`` for ``loop``'s run, with the ``--objective`` that a run of a
    user objective must be given again, and ``--dask address`` (the cluster it ran on) for an
    asynchronous run, which resumes only on a cluster."""
    import shlex

    from bo_online.loops.history import resume_command

    spec = getattr(getattr(loop, "problem", None), "objective_spec", None)
    command = resume_command(loop.out_dir, spec["objective"] if spec else None)
    workers = getattr(getattr(loop, "executor", None), "_max_workers", None)
    if workers:  # a --workers run: resumed in-process it would evaluate a batch point by point
        command += f" --workers {int(workers)}"
    return command if address is None else f"{command} --dask {shlex.quote(address)}"


def _run(loop: Any, steps: int | None, address: str | None = None) -> None:
    """``loop.run(steps)``, remembering its run directory for the message on Ctrl-C/SIGTERM
    (``address``: the Dask cluster of an asynchronous run)."""
    _ACTIVE_SWEEP.clear()
    if getattr(loop, "out_dir", None) is not None:
        _ACTIVE_RUN[:] = [(loop, Path(loop.out_dir), _resume_command(loop, address))]
    loop.run(steps)


def _stopped(what: str) -> str:
    r"""The message for a command stopped by ``what`` (``"terminated"``, ``"interrupted"``):
    what to do next, as the run directory's files stand. A stop that came once the run's last
    checkpoint held all its steps (during that write, or the summary after) stopped nothing:
    it says so rather than advise a resume."""
    if not _ACTIVE_SWEEP and _ACTIVE_RUN:
        loop, out, command = _ACTIVE_RUN[0]
        if getattr(loop, "finished_on_disk", False):
            return (
                f"{what} after the run finished: all {loop.step_count} steps are saved in "
                f"{str(out)!r} and nothing is left to resume (`{command} --steps N` with a "
                "larger N extends it)"
            )
    return f"{what}; {_resume_hint()}"


def _resume_hint() -> str:
    from bo_online.loops import history

    if _ACTIVE_SWEEP:
        return (
            "run the same `bo-online sweep` command again (finished campaigns are skipped, "
            "interrupted ones resumed)"
        )
    if not _ACTIVE_RUN:  # stopped while reading data or building the loop
        return "stopped before the loop started (nothing was written); run the same command again"
    loop, out, command = _ACTIVE_RUN[0]
    if not (out / history.CHECKPOINT_FILE).exists():  # stopped before its first checkpoint
        return "run the same command again (nothing was kept)"
    if not getattr(loop, "wrote_run_files", True):  # the checkpoint is an older run's
        return (
            f"run the same command again (nothing was kept; the run already in {str(out)!r} "
            "is left as it was)"
        )
    return f"continue the run with `{command}`"


def _run_async(loop: Any, steps: int | None, address: str) -> None:
    r"""``loop.run(steps)`` on the cluster at ``address``; stopped by ``--max-failures``, one line
    with the command that continues the run: with ``--dask`` and a limit that allows as many
    failures again (the count runs over the whole run, so the old one stops it at once)."""
    from bo_online.loops.async_bo import NoWorkers, TooManyFailures

    try:
        _run(loop, steps, address)
    except NoWorkers as e:
        then = (
            f"continue the run with `{_resume_command(loop, address)}`"
            if e.saved
            else "run the same command again"  # stopped in the initial design: nothing kept
        )
        _fail(
            f"{e.situation} Start workers (or fix the objective; for a cluster that starts its "
            "workers slowly, add --no-workers-timeout with more seconds, or inf to wait for "
            f"good), then {then}.",
            1,
        )
    except TooManyFailures as e:
        limit = loop.failures + loop.config["max_failures"]
        command = f"{_resume_command(loop, address)} --max-failures {limit}"
        # the CLI's option, not the loop's argument (max_failures=) the exception names
        _fail(
            f"{e.failures} objective evaluations failed (more than --max-failures {e.limit}); "
            f"last error: {e.last_error}. Fix the objective, then continue the run with "
            f"`{command}` (failures count over the whole run: {loop.failures} so far).",
            1,
        )


def _executor(workers: int) -> Executor | None:
    import os

    _nonneg("--workers", workers)
    _check(
        workers <= 4 * (os.cpu_count() or 1),
        f"--workers must be at most 4 x the CPU count "
        f"({4 * (os.cpu_count() or 1)}), got {workers}.",
    )
    if workers == 0:
        return None
    return ProcessPoolExecutor(
        max_workers=workers, initializer=_watch_parent, initargs=(os.getpid(),)
    )


def _shutdown(executor: Executor | None) -> None:
    r"""Stop a worker pool now: cancel queued evaluations and terminate running workers
    (``shutdown`` alone would wait for them)."""
    if executor is None:
        return
    processes = list((getattr(executor, "_processes", None) or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(timeout=5)
