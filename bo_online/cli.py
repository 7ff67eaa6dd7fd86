r"""The ``bo-online`` command: BO, active-learning and streaming runs, resume, and plots.

Examples::

    bo-online bo --problem branin --model exact --acq logei --steps 25 --out runs/branin
    bo-online bo --problem levy --dim 3 --noise 10 --model wiski --acq qucb --q 3 \
        --steps 1500 --out runs/levy-wiski
    bo-online active --problem magnetometer --model exact --q 6 --steps 50 --out runs/mag
    bo-online stream --problem protein --model exact --steps 2000 --out runs/protein
    bo-online resume runs/levy-wiski
    bo-online plot runs/levy-wiski runs/levy-exact --out plots/levy

Bad options print one line (``bo-online: error: ...``) and exit with status 2 before anything is
written.
"""

from __future__ import annotations

import ast
import json
import math
import re
import statistics
import sys
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

__all__ = ["app", "main"]

app = typer.Typer(
    name="bo-online",
    help=(
        "Bayesian optimisation, active learning and streaming regression with online GP "
        "surrogates. Every run writes records.jsonl (one line per step), checkpoint.pt (resume "
        "with `bo-online resume`), config.json and plots/*.png into its --out directory."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


# ---------------------------------------------------------------------------------- option types

ModelOpt = Annotated[
    str,
    typer.Option(
        help="Surrogate: exact (OnlineExactGP), wiski, tsvgp, decoupled, qsgp, or singletaskgp "
        "(BoTorch SingleTaskGP refit from scratch every step, the classical baseline). "
        "Unavailable ones are reported."
    ),
]
ModelOptionOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--model-option",
        help="Surrogate constructor option as key=value (repeatable); values are parsed as JSON "
        "when possible (numbers, true/false, lists), else kept as strings; a value "
        "package.module.Class(literal args) builds that object. Passed unchanged to the model "
        "class, e.g. --model-option grid_size=64 or --model-option "
        "'projection=bo_online.models.projection.TanhProjection(6, out_dim=2)'.",
    ),
]
QOpt = Annotated[int, typer.Option("--q", help="Batch size: points proposed per step.")]
SeedOpt = Annotated[int, typer.Option(help="Seed of everything random in the run.")]
RefitOpt = Annotated[
    int,
    typer.Option(help="Refit hyperparameters every this many steps (warm-started); 0 = never."),
]
FitIterOpt = Annotated[
    int, typer.Option(help="Optimiser iterations per refit (L-BFGS by default).")
]
OutOpt = Annotated[
    Optional[Path],
    typer.Option(help="Run directory for records, checkpoint, config and plots "
                 "(default runs/<problem>-<model>)."),
]
OverwriteOpt = Annotated[
    bool, typer.Option(help="Replace a run already in --out instead of refusing.")
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-Q", help="No progress bar or summary table (for scripts).")
]
DeviceOpt = Annotated[str, typer.Option(help="Torch device of surrogate and acquisition (cpu, cuda, cuda:1).")]
DtypeOpt = Annotated[str, typer.Option(help="float64 (default) or float32.")]
ThreadsOpt = Annotated[
    Optional[int],
    typer.Option(help="Torch CPU threads (torch.set_num_threads); default: torch's choice."),
]
CkptOpt = Annotated[int, typer.Option(help="Write the checkpoint every this many steps.")]
PlotsOpt = Annotated[bool, typer.Option("--plots/--no-plots", help="Write PNG plots at the end.")]
RestartsOpt = Annotated[int, typer.Option(help="optimize_acqf num_restarts.")]
RawOpt = Annotated[int, typer.Option(help="optimize_acqf raw_samples.")]
AcqIterOpt = Annotated[int, typer.Option(help="optimize_acqf L-BFGS maxiter per restart.")]
BatchLimitOpt = Annotated[int, typer.Option(help="optimize_acqf batch_limit (restarts optimised jointly).")]
SequentialOpt = Annotated[
    bool, typer.Option(help="Optimise a q-batch one point at a time (optimize_acqf sequential).")
]
McOpt = Annotated[int, typer.Option(help="QMC samples of MC acquisitions (qUCB, qLogNEI, ...).")]
DataDirOpt = Annotated[
    Optional[Path],
    typer.Option(help="Data directory (default: $BO_ONLINE_DATA_DIR, else ../shared/data "
                 "next to the project root)."),
]


# ---------------------------------------------------------------------------------- helpers


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise CLIError(message)


def _nonneg(name: str, value: int) -> None:
    _check(value >= 0, f"{name} must be >= 0, got {value}.")


def _positive(name: str, value: int) -> None:
    _check(value >= 1, f"{name} must be >= 1, got {value}.")


_CALL = re.compile(r"^\s*([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+)\s*\((.*)\)\s*$", re.S)


def _parse_call(raw: str) -> dict[str, Any] | None:
    r"""``package.module.Class(1, k=2)`` -> ``{"__class__": ..., "args": [1], "kwargs": {"k": 2}}``
    (arguments must be literals), or None if ``raw`` is not such a call."""
    match = _CALL.match(raw)
    if match is None:
        return None
    try:
        call = ast.parse(f"f({match.group(2)})", mode="eval").body
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    except (SyntaxError, ValueError) as e:
        raise CLIError(f"--model-option value {raw!r}: arguments must be literals ({e}).") from e
    return {"__class__": match.group(1), "args": args, "kwargs": kwargs}


def _parse_options(items: list[str] | None) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        _check(bool(sep) and key.strip() != "", f"--model-option expects key=value, got {item!r}.")
        value = _parse_call(raw)
        if value is None:
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                value = {"True": True, "False": False, "None": None}.get(raw, raw)
        options[key.strip()] = value
    return options


def _check_model(name: str) -> None:
    from bo_online.models.registry import get_model_class

    get_model_class(name)  # raises a one-line ModelUnavailableError (a ValueError)


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
    return {
        "num_restarts": num_restarts,
        "raw_samples": raw_samples,
        "maxiter": acqf_maxiter,
        "batch_limit": batch_limit,
        "sequential": sequential,
    }


def _shared(
    model: str, model_option: list[str] | None, q: int, seed: int, refit_every: int,
    fit_max_iter: int, checkpoint_every: int, out: Path, overwrite: bool, quiet: bool,
    device: str, dtype: str,
) -> dict[str, Any]:
    _positive("--q", q)
    _nonneg("--refit-every", refit_every)
    _nonneg("--fit-max-iter", fit_max_iter)
    _positive("--checkpoint-every", checkpoint_every)
    _check_model(model)
    return {
        "model": model,
        "model_options": _parse_options(model_option),
        "q": q,
        "seed": seed,
        "refit_every": refit_every,
        "fit_max_iter": fit_max_iter,
        "checkpoint_every": checkpoint_every,
        "out_dir": out,
        "overwrite": overwrite,
        "quiet": quiet,
        "device": device,
        "dtype": dtype,
    }


def _fmt(value: Any, digits: int = 5) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}g}"
    return str(value)


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
    steps = [r for r in records if r["step"] > 0]
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
    if loop.kind in ("bo", "bo_async"):
        rows += [
            ("best observed value", _fmt(last["best_value"])),
            ("best true value", _fmt(last.get("best_true_value"))),
            ("optimum", _fmt(loop.problem.optimal_value)),
            ("simple regret", _fmt(last.get("regret"))),
        ]
    elif loop.kind == "active":
        first = records[0]
        last_rmse = next((r["rmse"] for r in reversed(records) if r.get("rmse") is not None), None)
        rows += [
            ("test RMSE: initial -> final", f"{_fmt(first.get('rmse'), 4)} -> {_fmt(last_rmse, 4)}"),
            ("mean predictive variance", _fmt(last.get("mean_var"), 4)),
            ("test NLL", _fmt(last.get("nll"), 4)),
        ]
    elif getattr(loop, "classify", False):
        rows += [
            ("prequential accuracy", _fmt(last.get("prequential_accuracy"), 4)),
            ("prequential log loss", _fmt(last.get("prequential_nll"), 4)),
            ("last test accuracy", _fmt(next((r["test_accuracy"] for r in reversed(records) if r.get("test_accuracy") is not None), None), 4)),
            ("last test NLL", _fmt(next((r["test_nll"] for r in reversed(records) if r.get("test_nll") is not None), None), 4)),
        ]
    else:
        rows += [
            ("prequential RMSE", _fmt(last.get("prequential_rmse"), 4)),
            ("prequential NLL", _fmt(last.get("prequential_nll"), 4)),
            ("last test RMSE", _fmt(next((r["test_rmse"] for r in reversed(records) if r.get("test_rmse") is not None), None), 4)),
            ("last test NLL", _fmt(next((r["test_nll"] for r in reversed(records) if r.get("test_nll") is not None), None), 4)),
        ]
    if steps:
        rows += [
            ("median time / step (s)", _fmt(statistics.median(r["time_step"] for r in steps), 3)),
            ("median update time (s)", _fmt(statistics.median(r["time_update"] for r in steps), 3)),
        ]
    rows.append(("total wall time (s)", _fmt(last["wall_time"], 4)))
    for name, value in rows:
        table.add_row(name, str(value))
    console = Console()
    console.print(table)
    if out is not None:  # plain print: paths must never be wrapped
        print(f"records:    {out / history.RECORDS_FILE}")
        cluster = " --dask local:N|tcp://host:port" if loop.kind == "bo_async" else ""
        print(f"checkpoint: {out / history.CHECKPOINT_FILE}  (continue: bo-online resume {out}{cluster})")
        for path in written:
            print(f"plot:       {path}")


DaskOpt = Annotated[
    Optional[str],
    typer.Option(help="Run on a Dask cluster: local:N (a LocalCluster of N single-threaded worker "
                 "processes) or a scheduler address tcp://host:port."),
]


def _dask_client(address: str) -> Any:
    """A Dask client (closed, with its LocalCluster, on exit); see bo_online.loops.async_bo."""
    import contextlib

    from bo_online.loops.async_bo import connect

    client = connect(address)
    cluster = client.cluster if address.startswith("local:") else None

    @contextlib.contextmanager
    def closing():
        try:
            yield client
        finally:
            client.close()
            if cluster is not None:
                cluster.close()

    return closing()


def _run_async(loop: Any, steps: int | None) -> None:
    from bo_online.loops.async_bo import TooManyFailures

    try:
        loop.run(steps)
    except TooManyFailures as e:
        _fail(str(e), 1)


def _executor(workers: int) -> Executor | None:
    _nonneg("--workers", workers)
    return ProcessPoolExecutor(max_workers=workers) if workers > 0 else None


# ---------------------------------------------------------------------------------- commands


@app.command()
def bo(
    problem: Annotated[
        str,
        typer.Option(help="Test function: branin, hartmann (dim 3/4/6), hartmann3, hartmann6, "
                     "ackley, levy, rastrigin, griewank, michalewicz, styblinskitang, rosenbrock, "
                     "sixhumpcamel. All are minimised."),
    ],
    dim: Annotated[Optional[int], typer.Option(help="Input dimension (default: the function's).")] = None,
    noise: Annotated[float, typer.Option(help="Std of Gaussian observation noise added to each evaluation.")] = 0.0,
    model: ModelOpt = "exact",
    model_option: ModelOptionOpt = None,
    acq: Annotated[
        str,
        typer.Option(help="Acquisition: qucb, ucb, logei, ei, qlognei, ts (Thompson sampling "
                     "over Sobol candidates)."),
    ] = "qucb",
    beta: Annotated[float, typer.Option(help="UCB beta (scale of the schedule).")] = 2.0,
    beta_schedule: Annotated[
        str, typer.Option(help="UCB beta schedule: constant, kandasamy (0.1 beta d log 2t), srinivas.")
    ] = "constant",
    q: QOpt = 1,
    steps: Annotated[int, typer.Option(help="BO steps after the initial design.")] = 30,
    n_init: Annotated[Optional[int], typer.Option(help="Initial Sobol points (default max(5, 2d)).")] = None,
    seed: SeedOpt = 0,
    refit_every: RefitOpt = 10,
    fit_max_iter: FitIterOpt = 50,
    num_restarts: RestartsOpt = 10,
    raw_samples: RawOpt = 512,
    acqf_maxiter: AcqIterOpt = 200,
    batch_limit: BatchLimitOpt = 5,
    sequential: SequentialOpt = False,
    num_mc_samples: McOpt = 128,
    num_candidates: Annotated[int, typer.Option(help="Sobol candidates for --acq ts.")] = 1000,
    workers: Annotated[
        int, typer.Option(help="Evaluate each batch in a process pool of this many workers (0: in-process).")
    ] = 0,
    dask: DaskOpt = None,
    max_failures: Annotated[
        int, typer.Option(help="With --dask: stop after more than this many evaluations raised.")
    ] = 10,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    checkpoint_every: CkptOpt = 1,
    quiet: QuietOpt = False,
    plots: PlotsOpt = True,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float64",
    threads: ThreadsOpt = None,
) -> None:
    """Bayesian optimisation of a test function with an online surrogate."""
    # Cheap checks first, before torch/BoTorch are imported: bad options fail fast.
    _nonneg("--steps", steps)
    _check(math.isfinite(noise) and noise >= 0, f"--noise must be >= 0, got {noise}.")
    _positive("--q", q)
    from bo_online.acquisition import ACQUISITIONS, BETA_SCHEDULES
    from bo_online.loops import BayesOptLoop
    from bo_online.problems import synthetic_problem

    _setup(threads)
    _check(acq in ACQUISITIONS and acq != "qnipv", f"Unknown --acq {acq!r}; choose one of "
           f"{', '.join(a for a in ACQUISITIONS if a != 'qnipv')}.")
    _check(beta_schedule in BETA_SCHEDULES, f"Unknown --beta-schedule {beta_schedule!r}; choose one of {', '.join(BETA_SCHEDULES)}.")
    _positive("--num-candidates", num_candidates)
    _positive("--num-mc-samples", num_mc_samples)
    if n_init is not None:
        _positive("--n-init", n_init)
    prob = synthetic_problem(problem, dim=dim, noise_std=noise)
    out = out or Path("runs") / f"{prob.name}-{model}"
    shared = _shared(model, model_option, q, seed, refit_every, fit_max_iter, checkpoint_every,
                     out, overwrite, quiet, device, dtype)
    if dask is not None:  # asynchronous BO on a Dask cluster (bo_online.loops.async_bo)
        _check(workers == 0, "--workers and --dask exclude each other: use --dask local:N.")
        _check(q == 1, "--dask proposes one point per free worker: leave --q at 1.")
        _nonneg("--max-failures", max_failures)
        from bo_online.loops.async_bo import AsyncBayesOptLoop

        _check(acq in ("qucb", "qlognei", "ts"), f"--dask needs --acq qucb, qlognei or ts, got {acq!r}.")
        with _dask_client(dask) as client:
            loop = AsyncBayesOptLoop(
                prob,
                client,
                acq=acq,
                max_failures=max_failures,
                acq_options={"beta": beta, "beta_schedule": beta_schedule,
                             "num_mc_samples": num_mc_samples, "num_candidates": num_candidates},
                optimizer_options=_optimizer_options(num_restarts, raw_samples, acqf_maxiter,
                                                     batch_limit, sequential),
                n_init=n_init,
                **shared,
            )
            _run_async(loop, steps)
        _finish(loop, plots, quiet)
        return
    executor = _executor(workers)
    try:
        loop = BayesOptLoop(
            prob,
            acq=acq,
            acq_options={"beta": beta, "beta_schedule": beta_schedule,
                         "num_mc_samples": num_mc_samples, "num_candidates": num_candidates},
            optimizer_options=_optimizer_options(num_restarts, raw_samples, acqf_maxiter,
                                                 batch_limit, sequential),
            n_init=n_init,
            executor=executor,
            **shared,
        )
        loop.run(steps)
    finally:
        if executor is not None:
            executor.shutdown()
    _finish(loop, plots, quiet)


@app.command()
def active(
    problem: Annotated[str, typer.Option(help="Pool problem: magnetometer (field magnitude over x, y).")] = "magnetometer",
    data_dir: DataDirOpt = None,
    test_size: Annotated[int, typer.Option(help="Held-out test points (random, seeded).")] = 10_000,
    pool_size: Annotated[Optional[int], typer.Option(help="Keep a random subset of this many pool points (default: all).")] = None,
    model: ModelOpt = "exact",
    model_option: ModelOptionOpt = None,
    acq: Annotated[str, typer.Option(help="qnipv (integrated variance over test points) or random.")] = "qnipv",
    selection: Annotated[str, typer.Option(help="snap (optimise over the box, snap to the nearest unused pool point) or pool (score pool points directly).")] = "snap",
    q: QOpt = 6,
    steps: Annotated[int, typer.Option(help="Active-learning steps after the initial design.")] = 50,
    n_init: Annotated[int, typer.Option(help="Random pool points of the initial design.")] = 10,
    num_mc_points: Annotated[int, typer.Option(help="Points qNIPV integrates the posterior variance over.")] = 256,
    integrate_over: Annotated[str, typer.Option(help="test (random held-out test inputs, fixed for the run) or sobol (Sobol points of the box, redrawn each step).")] = "test",
    num_pool_candidates: Annotated[int, typer.Option(help="Pool points scored per step with --selection pool.")] = 2048,
    eval_every: Annotated[int, typer.Option(help="Compute test RMSE/variance/NLL every this many steps.")] = 1,
    seed: SeedOpt = 0,
    refit_every: RefitOpt = 10,
    fit_max_iter: FitIterOpt = 50,
    num_restarts: RestartsOpt = 10,
    raw_samples: RawOpt = 512,
    acqf_maxiter: AcqIterOpt = 200,
    batch_limit: BatchLimitOpt = 5,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    checkpoint_every: CkptOpt = 1,
    quiet: QuietOpt = False,
    plots: PlotsOpt = True,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float64",
    threads: ThreadsOpt = None,
) -> None:
    """Active learning of a real field from a pool (qNIPV), reporting test RMSE each step."""
    _nonneg("--steps", steps)
    _positive("--q", q)
    from bo_online.loops import ActiveLearningLoop
    from bo_online.problems import POOL_PROBLEMS, magnetometer_problem

    _setup(threads)
    _check(problem in POOL_PROBLEMS, f"Unknown pool problem {problem!r}; choose one of {', '.join(POOL_PROBLEMS)}.")
    _check(acq in ("qnipv", "random"), f"Unknown --acq {acq!r}; choose qnipv or random.")
    _check(selection in ("snap", "pool"), f"--selection must be snap or pool, got {selection!r}.")
    _check(integrate_over in ("test", "sobol"), f"--integrate-over must be test or sobol, got {integrate_over!r}.")
    for name, value in (("--n-init", n_init), ("--num-mc-points", num_mc_points),
                        ("--num-pool-candidates", num_pool_candidates), ("--eval-every", eval_every)):
        _positive(name, value)
    _check_model(model)
    prob = magnetometer_problem(test_size=test_size, pool_size=pool_size, seed=seed, data_dir=data_dir)
    out = out or Path("runs") / f"{prob.name}-{model}"
    shared = _shared(model, model_option, q, seed, refit_every, fit_max_iter, checkpoint_every,
                     out, overwrite, quiet, device, dtype)
    loop = ActiveLearningLoop(
        prob, acq=acq, selection=selection, num_mc_points=num_mc_points, integrate_over=integrate_over,
        num_pool_candidates=num_pool_candidates, eval_every=eval_every, n_init=n_init,
        optimizer_options=_optimizer_options(num_restarts, raw_samples, acqf_maxiter, batch_limit, False),
        **shared,
    )
    loop.run(steps)
    _finish(loop, plots, quiet)


@app.command()
def stream(
    problem: Annotated[str, typer.Option(help="UCI regression set (skillcraft, elevators, protein, kin40k, bike, pol, airfoil, concrete, energy, yacht, housing) or the banana classification set (models tsvgp, wiski).")],
    data_dir: DataDirOpt = None,
    split: Annotated[int, typer.Option(help="Fixed 90/10 split (0..9) of a UCI set; its test rows are the test set (banana has one fixed split).")] = 0,
    shuffle: Annotated[bool, typer.Option(help="Stream the training rows in a seeded random order.")] = True,
    max_stream: Annotated[Optional[int], typer.Option(help="Use only the first this many stream rows.")] = None,
    max_test: Annotated[Optional[int], typer.Option(help="Use only the first this many test rows.")] = None,
    model: ModelOpt = "exact",
    model_option: ModelOptionOpt = None,
    q: Annotated[int, typer.Option("--q", help="Points arriving per step.")] = 1,
    steps: Annotated[Optional[int], typer.Option(help="Steps after the initial points (default: until the stream ends).")] = None,
    n_init: Annotated[int, typer.Option(help="Stream points the surrogate starts from.")] = 100,
    eval_every: Annotated[int, typer.Option(help="Test RMSE/NLL (classification: accuracy/NLL) every this many steps.")] = 50,
    seed: SeedOpt = 0,
    refit_every: RefitOpt = 50,
    fit_max_iter: FitIterOpt = 50,
    out: OutOpt = None,
    overwrite: OverwriteOpt = False,
    checkpoint_every: CkptOpt = 1,
    quiet: QuietOpt = False,
    plots: PlotsOpt = True,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float64",
    threads: ThreadsOpt = None,
) -> None:
    """Streaming regression (UCI set) or binary classification (banana): predict each arriving
    point, then update."""
    if steps is not None:
        _nonneg("--steps", steps)
    _positive("--q", q)
    from bo_online.loops import StreamingLoop
    from bo_online.loops.classifiers import classifier_class
    from bo_online.problems import CLASSIFICATION_PROBLEMS, STREAM_PROBLEMS, banana_problem, uci_problem

    _setup(threads)
    key = problem.lower()
    _check(key in STREAM_PROBLEMS, f"Unknown UCI set {problem!r}; choose one of {', '.join(STREAM_PROBLEMS)}.")
    _positive("--n-init", n_init)
    _positive("--eval-every", eval_every)
    _check_model(model)
    if key in CLASSIFICATION_PROBLEMS:
        classifier_class(model)  # one-line error for a regression-only model, before any data
        prob = banana_problem(shuffle=shuffle, seed=seed, max_stream=max_stream, max_test=max_test,
                              data_dir=data_dir)
    else:
        prob = uci_problem(problem, split=split, shuffle=shuffle, seed=seed, max_stream=max_stream,
                           max_test=max_test, data_dir=data_dir)
    out = out or Path("runs") / f"{prob.name}-{model}"
    shared = _shared(model, model_option, q, seed, refit_every, fit_max_iter, checkpoint_every,
                     out, overwrite, quiet, device, dtype)
    loop = StreamingLoop(prob, eval_every=eval_every, n_init=n_init, **shared)
    _check(loop.default_steps() >= (steps or 0),
           f"--steps {steps} exceeds the {loop.default_steps()} steps the stream holds.")
    loop.run(steps)
    _finish(loop, plots, quiet)


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (the --out of the interrupted run).")],
    steps: Annotated[Optional[int], typer.Option(help="New target number of steps (default: the original).")] = None,
    data_dir: DataDirOpt = None,
    quiet: QuietOpt = False,
    plots: PlotsOpt = True,
    threads: ThreadsOpt = None,
    dask: DaskOpt = None,
) -> None:
    """Continue an interrupted run from its last checkpoint (same records as if never stopped)."""
    from bo_online.loops import load_loop

    _setup(threads)
    if steps is not None:
        _nonneg("--steps", steps)
    _check(run_dir.is_dir(), f"No run directory {str(run_dir)!r}.")
    if dask is not None:  # an asynchronous run: continue on this cluster
        with _dask_client(dask) as client:
            loop = load_loop(run_dir, quiet=quiet, data_dir=data_dir, client=client)
            _run_async(loop, steps)
        _finish(loop, plots, quiet)
        return
    loop = load_loop(run_dir, quiet=quiet, data_dir=data_dir)
    loop.run(steps)
    _finish(loop, plots, quiet)


@app.command()
def sweep(
    spec: Annotated[Path, typer.Argument(help="Sweep spec (TOML, or YAML): steps, problems, models, acqs, seeds, [options].")],
    out: Annotated[Path, typer.Option(help="Directory holding one run directory per campaign.")] = Path("runs/sweep"),
    dask: DaskOpt = None,
    plots: PlotsOpt = True,
    quiet: QuietOpt = False,
) -> None:
    """Run a sweep of BO campaigns on a Dask cluster (default: a LocalCluster with one worker
    per CPU); finished campaigns are skipped, interrupted ones resumed (bo_online.sweep)."""
    import os

    from bo_online.sweep import campaigns, load_spec, plot_sweep, run_sweep, summarize

    campaigns(load_spec(spec))  # bad specs fail before a cluster starts
    with _dask_client(dask or f"local:{os.cpu_count() or 1}") as client:
        summaries = run_sweep(spec, out, client)
    written = plot_sweep(summaries, out) if plots else []
    if quiet:
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"bo-online sweep: {len(summaries)} campaigns")
    for col in ("campaign", "evaluations", "final regret", "wall time (s)", "status"):
        table.add_column(col, justify="left" if col == "campaign" else "right")
    for s in summaries:
        table.add_row(s["campaign"], str(s["evaluations"]), _fmt(s["regret"], 4),
                      _fmt(s["wall_time"], 3), s["status"])
    means = Table(title="final regret over seeds")
    for col in ("problem", "model", "acq", "seeds", "mean regret", "SE"):
        means.add_column(col)
    for r in summarize(summaries):
        means.add_row(r["problem"], r["model"], r["acq"], str(r["seeds"]),
                      _fmt(r["mean_regret"], 4), _fmt(r["se_regret"], 2))
    console = Console()
    console.print(table)
    console.print(means)
    for path in written:
        typer.echo(f"plot: {path}")


@app.command()
def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run directories to compare.")],
    out: Annotated[Optional[Path], typer.Option(help="Directory for the PNGs (default: <first run>/plots).")] = None,
) -> None:
    """Plot best value/regret vs step and wall time, time per step vs n, and test RMSE vs step."""
    from bo_online.plotting import plot_runs

    for d in run_dirs:
        _check(d.is_dir(), f"No run directory {str(d)!r}.")
    written = plot_runs(run_dirs, out or run_dirs[0] / "plots")
    for path in written:
        typer.echo(f"plot: {path}")


# ---------------------------------------------------------------------------------- entry point


def _fail(message: str, code: int = 2) -> None:
    line = " ".join(str(message).split())
    print(f"bo-online: error: {line}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    r"""Console-script entry point. User errors (bad options, missing data, unavailable model)
    print ONE line on stderr and exit with status 2; nothing is written before options are
    validated and the surrogate is built."""
    # Typer vendors click; its exception classes live here (ClickException, UsageError) and
    # typer.Abort is raised on Ctrl-C during prompts.
    from typer._click import exceptions as click_exc

    try:
        code = app(args=argv, prog_name="bo-online", standalone_mode=False)
    except click_exc.UsageError as e:
        hint = f" (see bo-online {e.ctx.info_name} --help)" if e.ctx is not None else ""
        _fail(e.format_message() + hint)
    except click_exc.ClickException as e:
        _fail(e.format_message())
    except typer.Abort:
        _fail("aborted", 130)
    except (CLIError, ValueError, FileNotFoundError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        _fail("interrupted; continue the run with `bo-online resume <out dir>`", 130)
    if isinstance(code, int) and code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
