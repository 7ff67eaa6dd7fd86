r"""``bo-online bo``: Bayesian optimisation of a test function or the user's own objective."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from bo_online.cli import running
from bo_online.cli.application import app
from bo_online.cli.checks import (
    MAX_DIM,
    MAX_Q,
    _check,
    _check_beta,
    _check_noise,
    _check_out,
    _check_seed,
    _no_workers_timeout,
    _nonneg,
    _positive,
    _refit_schedule,
)
from bo_online.cli.memory import _check_candidates_memory, _check_dense_memory
from bo_online.cli.options import (
    _PROBLEM_HELP,
    AcqIterOpt,
    BatchLimitOpt,
    CkptOpt,
    CkptSecondsOpt,
    DaskOpt,
    DeviceOpt,
    DtypeOpt,
    FitIterOpt,
    McOpt,
    ModelOpt,
    ModelOptionOpt,
    NoWorkersTimeoutOpt,
    OutOpt,
    OverwriteOpt,
    PlotsOpt,
    QOpt,
    QuietOpt,
    RawOpt,
    RefitFromOpt,
    RestartsOpt,
    SeedOpt,
    SequentialOpt,
    ThreadsOpt,
)
from bo_online.cli.running import (
    _executor,
    _optimizer_options,
    _run,
    _run_async,
    _setup,
    _shared,
    _shutdown,
)
from bo_online.cli.summary import _finish


@app.command()
def bo(
    problem: Annotated[Optional[str], typer.Option(help=_PROBLEM_HELP)] = None,
    objective: Annotated[
        Optional[str],
        typer.Option(
            help="Your own objective instead of --problem: package.module:function or "
            "path/to/file.py:function, called with an n x d float64 tensor (problem "
            "units) and returning n values (minimised unless --maximize). Needs --bounds."
        ),
    ] = None,
    bounds: Annotated[
        Optional[str],
        typer.Option(
            help="Box of --objective: JSON '\\[\\[lo, hi], ...]' or 'lo,hi lo,hi ...' "
            "(one pair per input dimension)."
        ),
    ] = None,
    maximize: Annotated[bool, typer.Option("--maximize", help="Maximise --objective.")] = False,
    dim: Annotated[
        Optional[int], typer.Option(help="Input dimension (default: the function's).")
    ] = None,
    noise: Annotated[
        float, typer.Option(help="Std of Gaussian observation noise added to each evaluation.")
    ] = 0.0,
    model: ModelOpt = "exact",
    model_option: ModelOptionOpt = None,
    acq: Annotated[
        str,
        typer.Option(
            help="Acquisition: qucb, ucb, logei, ei, qlognei, ts (Thompson sampling "
            "over Sobol candidates)."
        ),
    ] = "qucb",
    beta: Annotated[float, typer.Option(help="UCB beta (scale of the schedule).")] = 2.0,
    beta_schedule: Annotated[
        str,
        typer.Option(help="UCB beta schedule: constant, kandasamy (0.1 beta d log 2t), srinivas."),
    ] = "constant",
    q: QOpt = 1,
    steps: Annotated[int, typer.Option(help="BO steps after the initial design.")] = 30,
    n_init: Annotated[
        Optional[int], typer.Option(help="Initial Sobol points (default max(5, 2d)).")
    ] = None,
    seed: SeedOpt = 0,
    refit_every: Annotated[
        Optional[str],
        typer.Option(
            help="Refit hyperparameters every this many steps (warm-started, at most "
            "--fit-max-iter iterations; the exact GP, and while they are the exact GP on "
            "their data t-SVGP and the decoupled SVGP (n <= 128), WISKI (n <= 256) and QSGP "
            "(n <= 512), are rebuilt and fit from the defaults, as BoTorch's loop does); "
            "0 = never. Default (auto): every step, except that the "
            "exact GP (a fit costs O(n^3)), t-SVGP, the decoupled SVGP and WISKI with a learned "
            "input projection (above 6 inputs) (a refit visits every point held) refit every "
            "step only up to n = 100 and then whenever n has grown by 10% since their last "
            "fit."
        ),
    ] = None,
    fit_max_iter: FitIterOpt = 50,
    refit_from: RefitFromOpt = "auto",
    num_restarts: RestartsOpt = 10,
    raw_samples: RawOpt = 512,
    acqf_maxiter: AcqIterOpt = 200,
    batch_limit: BatchLimitOpt = 5,
    sequential: SequentialOpt = False,
    num_mc_samples: McOpt = 128,
    num_candidates: Annotated[int, typer.Option(help="Sobol candidates for --acq ts.")] = 1000,
    workers: Annotated[
        int,
        typer.Option(
            help="Evaluate each batch in a process pool of this many workers (0: in-process)."
        ),
    ] = 0,
    dask: DaskOpt = None,
    max_failures: Annotated[
        Optional[int],
        typer.Option(
            help="With --dask: stop after more than this many evaluations raised (default 10)."
        ),
    ] = None,
    no_workers_timeout: NoWorkersTimeoutOpt = None,
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
    """Bayesian optimisation of a test function (or your own --objective) with an online
    surrogate."""
    # Cheap checks first, before torch/BoTorch are imported: bad options fail fast.
    _nonneg("--steps", steps)
    _check_noise(noise)
    _check_beta(beta)
    _positive("--q", q)
    _check(
        q <= MAX_Q, f"--q must be at most {MAX_Q} for bo (a q-batch is optimised jointly), got {q}."
    )
    if dim is not None:
        _check(1 <= dim <= MAX_DIM, f"--dim must be between 1 and {MAX_DIM}, got {dim}.")
    _check_seed(seed)
    _check_out(out)
    # The asynchronous loop's own options were silently ignored by a synchronous run.
    for flag, value in (
        ("--max-failures", max_failures),
        ("--no-workers-timeout", no_workers_timeout),
    ):
        _check(
            dask is not None or value is None,
            f"{flag} applies to asynchronous runs: add --dask local:N (or a scheduler address), "
            f"or leave {flag} out.",
        )
    from bo_online.acquisition import ACQUISITIONS, BETA_SCHEDULES, known_acq_options
    from bo_online.loops import BayesOptLoop
    from bo_online.problems import synthetic_problem

    _check(
        (problem is None) != (objective is None),
        "Give exactly one of --problem NAME and "
        "--objective package.module:function (or path/to/file.py:function).",
    )
    _check(
        objective is None or bounds is not None,
        "--objective needs --bounds (e.g. --bounds '[[0, 1], [-5, 5]]' or --bounds '0,1 -5,5').",
    )
    _check(
        objective is not None or (bounds is None and not maximize),
        "--bounds and --maximize go with --objective (test functions have their own).",
    )
    _check(
        objective is None or dim is None,
        "--dim is for --problem; --bounds sets the dimension of --objective.",
    )
    _setup(threads)
    _check(
        acq in ACQUISITIONS and acq != "qnipv",
        f"Unknown --acq {acq!r}; choose one of "
        f"{', '.join(a for a in ACQUISITIONS if a != 'qnipv')}.",
    )
    _check(
        beta_schedule in BETA_SCHEDULES,
        f"Unknown --beta-schedule {beta_schedule!r}; choose one of {', '.join(BETA_SCHEDULES)}.",
    )
    _positive("--num-candidates", num_candidates)
    _positive("--num-mc-samples", num_mc_samples)
    if n_init is not None:
        _positive("--n-init", n_init)
    refit = _refit_schedule(refit_every)  # before the objective or problem is built
    if objective is not None:
        from bo_online.objectives import objective_problem

        prob = objective_problem(objective, bounds, maximize=maximize, noise_std=noise)
    else:
        prob = synthetic_problem(problem, dim=dim, noise_std=noise)
    out = out or Path("runs") / f"{prob.name}-{model}"
    shared = _shared(
        model=model,
        model_option=model_option,
        q=q,
        seed=seed,
        refit_every=refit,
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
    bo_options = dict(
        acq=acq,
        acq_options=known_acq_options(  # the CLI has flags for every acquisition's
            acq,
            {
                "beta": beta,
                "beta_schedule": beta_schedule,
                "num_mc_samples": num_mc_samples,
                "num_candidates": num_candidates,
            },
        ),
        optimizer_options=_optimizer_options(
            num_restarts, raw_samples, acqf_maxiter, batch_limit, sequential
        ),
        n_init=n_init,
        **shared,
    )
    from bo_online.loops.bayesopt import default_n_init

    n_first = n_init if n_init is not None else default_n_init(prob.dim)
    _check_dense_memory(model, n_first + q * steps, dtype, device=device)
    if acq == "ts":
        _check_candidates_memory(num_candidates, dtype, device=device)
    if dask is not None:  # asynchronous BO on a Dask cluster (bo_online.loops.async_bo)
        _check(workers == 0, "--workers and --dask exclude each other: use --dask local:N.")
        _check(q == 1, "--dask proposes one point per free worker: leave --q at 1.")
        # given ones only: the asynchronous loop's own defaults apply to the others
        async_options: dict[str, float] = {}
        if max_failures is not None:
            _nonneg("--max-failures", max_failures)
            async_options["max_failures"] = max_failures
        if no_workers_timeout is not None:
            async_options["no_workers_timeout"] = _no_workers_timeout(no_workers_timeout)
        from bo_online.loops.async_bo import AsyncBayesOptLoop

        _check(
            acq in ("qucb", "qlognei", "ts"),
            f"--dask needs --acq qucb, qlognei or ts, got {acq!r}.",
        )
        # Every option and the run directory checked before the cluster starts (which takes
        # seconds to minutes): the synchronous loop's constructor checks them, writing nothing,
        # and the model options reach a model built on a few points (as for a sweep).
        import torch

        check = BayesOptLoop(prob, **bo_options)
        U = torch.rand(4, prob.dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        check._build_model(U, U.sum(-1, keepdim=True))
        with running._dask_client(dask) as client:
            loop = AsyncBayesOptLoop(
                prob,
                client,
                **async_options,
                **bo_options,
            )
            _run_async(loop, steps, dask)
        _finish(loop, plots, quiet)
        return
    executor = _executor(workers)
    try:
        loop = BayesOptLoop(prob, executor=executor, **bo_options)
        _run(loop, steps)
    finally:
        _shutdown(executor)
    _finish(loop, plots, quiet)
