r"""``bo-online active``: active learning from a pool with qNIPV."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from bo_online.cli.application import app
from bo_online.cli.checks import (
    _check,
    _check_model,
    _check_seed,
    _columns,
    _file_options,
    _nonneg,
    _positive,
    _refit_schedule,
    _tracks,
)
from bo_online.cli.memory import _check_dense_memory
from bo_online.cli.options import (
    AcqIterOpt,
    BatchLimitOpt,
    CkptOpt,
    CkptSecondsOpt,
    DataDirOpt,
    DeviceOpt,
    DtypeOpt,
    FitIterOpt,
    InputsOpt,
    ModelOpt,
    ModelOptionOpt,
    OutOpt,
    OverwriteOpt,
    PlotsOpt,
    QOpt,
    QuietOpt,
    RawOpt,
    RefitFromOpt,
    RefitOpt,
    RestartsOpt,
    SeedOpt,
    TargetOpt,
    TestFractionOpt,
    TestMaskOpt,
    ThreadsOpt,
)
from bo_online.cli.running import _optimizer_options, _run, _setup, _shared
from bo_online.cli.summary import _finish


@app.command()
def active(
    problem: Annotated[
        str, typer.Option(help="Pool problem: magnetometer (field magnitude over x, y).")
    ] = "magnetometer",
    pool: Annotated[
        Optional[Path],
        typer.Option(
            help="Your own pool instead: a .csv, .csv.gz or .npz file (inputs and a target column; "
            "see --inputs, --target)."
        ),
    ] = None,
    inputs: InputsOpt = None,
    target: TargetOpt = None,
    test_fraction: TestFractionOpt = None,
    test_mask: TestMaskOpt = None,
    tracks: Annotated[
        Optional[str],
        typer.Option(help="Magnetometer tracks to use, comma separated (default: 1..9)."),
    ] = None,
    data_dir: DataDirOpt = None,
    test_size: Annotated[
        Optional[int],
        typer.Option(
            help="Held-out test points of the magnetometer pool (random, seeded; default 10,000)."
        ),
    ] = None,
    pool_size: Annotated[
        Optional[int],
        typer.Option(help="Keep a random subset of this many pool points (default: all)."),
    ] = None,
    model: ModelOpt = "exact",
    model_option: ModelOptionOpt = None,
    acq: Annotated[
        str, typer.Option(help="qnipv (integrated variance over test points) or random.")
    ] = "qnipv",
    selection: Annotated[
        str,
        typer.Option(
            help="snap (optimise over the box, snap to the nearest unused pool point) or pool "
            "(score pool points directly)."
        ),
    ] = "snap",
    q: QOpt = 6,
    steps: Annotated[
        int, typer.Option(help="Active-learning steps after the initial design.")
    ] = 50,
    n_init: Annotated[int, typer.Option(help="Random pool points of the initial design.")] = 10,
    num_mc_points: Annotated[
        int, typer.Option(help="Points qNIPV integrates the posterior variance over.")
    ] = 256,
    integrate_over: Annotated[
        str,
        typer.Option(
            help="test (random held-out test inputs, fixed for the run) or sobol (Sobol points of "
            "the box, redrawn each step)."
        ),
    ] = "test",
    num_pool_candidates: Annotated[
        int, typer.Option(help="Pool points scored per step with --selection pool.")
    ] = 2048,
    eval_every: Annotated[
        int, typer.Option(help="Compute test RMSE/variance/NLL every this many steps.")
    ] = 1,
    seed: SeedOpt = 0,
    refit_every: RefitOpt = "auto",
    fit_max_iter: FitIterOpt = 50,
    refit_from: RefitFromOpt = "auto",
    num_restarts: RestartsOpt = 10,
    raw_samples: RawOpt = 512,
    acqf_maxiter: AcqIterOpt = 200,
    batch_limit: BatchLimitOpt = 5,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    checkpoint_every: CkptOpt = None,
    checkpoint_seconds: CkptSecondsOpt = 30.0,
    quiet: QuietOpt = False,
    plots: PlotsOpt = True,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float64",
    threads: ThreadsOpt = None,
) -> None:
    """Active learning from a pool (the magnetometer field, or your own --pool file) with
    qNIPV, reporting test RMSE each step."""
    _nonneg("--steps", steps)
    _positive("--q", q)
    _check_seed(seed)
    from bo_online.loops import ActiveLearningLoop
    from bo_online.problems import POOL_PROBLEMS, magnetometer_problem

    _setup(threads)
    _check(
        pool is not None or problem in POOL_PROBLEMS,
        f"Unknown pool problem {problem!r}; choose one of {', '.join(POOL_PROBLEMS)}, or give "
        f"your own data with --pool FILE.csv.",
    )
    _file_options(
        pool,
        "--pool",
        target=target,
        test_fraction=test_fraction,
        test_mask=test_mask,
        inputs=inputs,
    )
    _check(acq in ("qnipv", "random"), f"Unknown --acq {acq!r}; choose qnipv or random.")
    refit_every = _refit_schedule(refit_every)  # before any data is read
    _check(selection in ("snap", "pool"), f"--selection must be snap or pool, got {selection!r}.")
    _check(
        integrate_over in ("test", "sobol"),
        f"--integrate-over must be test or sobol, got {integrate_over!r}.",
    )
    for name, value in (
        ("--n-init", n_init),
        ("--num-mc-points", num_mc_points),
        ("--num-pool-candidates", num_pool_candidates),
        ("--eval-every", eval_every),
    ):
        _positive(name, value)
    # the loop's own error names its Python arguments (num_pool_candidates, q)
    _check(
        selection != "pool" or num_pool_candidates >= q,
        f"--num-pool-candidates {num_pool_candidates} is below --q {q}: each step labels --q "
        f"of the pool points it scores; give --num-pool-candidates {q} or more.",
    )
    _check_model(model)
    if pool is not None:
        from bo_online.userdata import pool_from_file

        _check(
            tracks is None,
            "--tracks only applies to the shipped magnetometer pool; with --pool FILE the "
            "pool is the file's rows (--inputs and --target name its columns).",
        )
        _check(
            test_size is None,
            "--test-size only applies to the shipped magnetometer pool; with --pool FILE use "
            "--test-fraction or --test-mask.",
        )

        prob = pool_from_file(
            pool,
            target=target,
            inputs=_columns(inputs),
            test_fraction=test_fraction,
            test_mask=test_mask,
            seed=seed,
            pool_size=pool_size,
        )
    else:
        prob = magnetometer_problem(
            test_size=10_000 if test_size is None else test_size,
            pool_size=pool_size,
            seed=seed,
            data_dir=data_dir,
            tracks=_tracks(tracks),
        )
    rows = prob.X_pool.shape[0]
    where = (
        f"the pool holds {rows} points"
        if pool is None
        else f"{pool} has {rows} pool rows (the rows not held out for testing)"
    )
    if pool_size is not None:  # the file holds more: the option, not the file, is the limit
        where = f"--pool-size keeps {rows} points"
    _check(
        n_init <= rows,
        f"--n-init {n_init} exceeds the pool: {where}; give --n-init {rows} or fewer"
        + (", or a larger --pool-size." if pool_size is not None else "."),
    )
    out = out or Path("runs") / f"{prob.name}-{model}"
    shared = _shared(
        model=model,
        model_option=model_option,
        q=q,
        seed=seed,
        refit_every=refit_every,
        fit_max_iter=fit_max_iter,
        refit_from=refit_from,
        checkpoint_every=checkpoint_every,
        out=out,
        overwrite=overwrite,
        quiet=quiet,
        device=device,
        dtype=dtype,
        dim=prob.dim,
        checkpoint_seconds=checkpoint_seconds,
    )
    loop = ActiveLearningLoop(
        prob,
        acq=acq,
        selection=selection,
        num_mc_points=num_mc_points,
        integrate_over=integrate_over,
        num_pool_candidates=num_pool_candidates,
        eval_every=eval_every,
        n_init=n_init,
        optimizer_options=_optimizer_options(
            num_restarts, raw_samples, acqf_maxiter, batch_limit, False
        ),
        **shared,
    )
    _check(  # before the memory check, whose n the pool could not reach
        loop.max_steps() >= (steps or 0),
        f"--steps {steps} exceeds the {loop.max_steps()} steps the pool allows "
        f"({prob.X_pool.shape[0]} points: {n_init} initial, then --q {loop.config['q']} per step).",
    )
    _check_dense_memory(model, n_init + loop.config["q"] * steps, dtype, device=device)
    _run(loop, steps)
    _finish(loop, plots, quiet)
