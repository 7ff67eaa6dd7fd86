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
from typing import Annotated, Any, NoReturn, Optional

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
    rich_markup_mode="markdown",
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
        "module.Class(literal args) builds that object (only classes of "
        "bo_online.models.wiski.projection, gpytorch kernels, means, priors, constraints and "
        "likelihoods, and bo_online.likelihoods are allowed). Passed unchanged to "
        "the model "
        "class, e.g. --model-option grid_size=64 or (WISKI, d > 3; default all-pairs up to 6 "
        "inputs, pairs+tanh above) --model-option projection=pairs+tanh.",
    ),
]
QOpt = Annotated[int, typer.Option("--q", help="Batch size: points proposed per step.")]
SeedOpt = Annotated[int, typer.Option(help="Seed of everything random in the run.")]
RefitOpt = Annotated[
    str,
    typer.Option(
        help="Refit hyperparameters every this many steps (warm-started; the exact GP, and "
        "t-SVGP and the decoupled SVGP while n <= 128, refit from the defaults); 0 = never; "
        "auto: every step, except that the exact GP, t-SVGP, the decoupled SVGP and WISKI "
        "with a learned input projection (above 6 inputs) refit every step only up to n = 100 "
        "and then whenever n has grown by 10% since their last fit (as bo's default)."
    ),
]
RefitFromOpt = Annotated[
    str,
    typer.Option(
        help="Where a refit starts. auto: from the current hyperparameters, except that the "
        "exact GP (and t-SVGP / the decoupled SVGP while every point is a basis) is rebuilt "
        "from the defaults, small-n refits of t-SVGP, the decoupled SVGP and QSGP also try the "
        "defaults, and WISKI's learned projection is re-derived from the data. current: every "
        "refit continues from the current values (with --refit-every 1 --fit-max-iter 1: one "
        "optimisation step per step, as in the WISKI paper's streams)."
    ),
]
FitIterOpt = Annotated[
    int, typer.Option(help="Optimiser iterations per refit (L-BFGS by default).")
]
OutOpt = Annotated[
    Optional[Path],
    typer.Option(
        help="Run directory for records, checkpoint, config and plots (default runs/PROBLEM-MODEL)."
    ),
]
OverwriteOpt = Annotated[
    bool, typer.Option(help="Replace a run already in --out instead of refusing.")
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-Q", help="No progress bar or summary table (for scripts).")
]
DeviceOpt = Annotated[
    str, typer.Option(help="Torch device of surrogate and acquisition (cpu, cuda, cuda:1).")
]
DtypeOpt = Annotated[str, typer.Option(help="float64 (default) or float32.")]
ThreadsOpt = Annotated[
    Optional[int],
    typer.Option(help="Torch CPU threads (torch.set_num_threads); default: torch's choice."),
]
CkptOpt = Annotated[
    Optional[int],
    typer.Option(
        help="Write the checkpoint every this many steps (overrides --checkpoint-seconds)."
    ),
]
CkptSecondsOpt = Annotated[
    float,
    typer.Option(
        help="Write the checkpoint when this many seconds have passed since the last one "
        "(and always at the end and on Ctrl-C / SIGTERM); 0 = every step."
    ),
]
TargetOpt = Annotated[
    Optional[str],
    typer.Option(
        help="With a data file: the target column, by header name or index (default: the last "
        "column that is not the --test-mask column)."
    ),
]
TestFractionOpt = Annotated[
    Optional[float],
    typer.Option(
        help="With a data file: fraction of rows held out at random as the test set "
        "(seeded; default 0.1)."
    ),
]
TestMaskOpt = Annotated[
    Optional[str],
    typer.Option(
        help="With a data file: a column (name or index) or a file with one 0/1 column "
        "marking the test rows (instead of --test-fraction)."
    ),
]
InputsOpt = Annotated[
    Optional[str],
    typer.Option(
        help="With a data file: comma-separated input columns (names or indices; default: "
        "all but the target and mask)."
    ),
]
PlotsOpt = Annotated[bool, typer.Option("--plots/--no-plots", help="Write PNG plots at the end.")]
RestartsOpt = Annotated[int, typer.Option(help="optimize_acqf num_restarts.")]
RawOpt = Annotated[int, typer.Option(help="optimize_acqf raw_samples.")]
AcqIterOpt = Annotated[int, typer.Option(help="optimize_acqf L-BFGS maxiter per restart.")]
BatchLimitOpt = Annotated[
    int, typer.Option(help="optimize_acqf batch_limit (restarts optimised jointly).")
]
SequentialOpt = Annotated[
    bool, typer.Option(help="Optimise a q-batch one point at a time (optimize_acqf sequential).")
]
McOpt = Annotated[int, typer.Option(help="QMC samples of MC acquisitions (qUCB, qLogNEI, ...).")]
DataDirOpt = Annotated[
    Optional[Path],
    typer.Option(
        help="Data directory (default: $BO_ONLINE_DATA_DIR, else ../shared/data "
        "next to the project root)."
    ),
]


# ---------------------------------------------------------------------------------- helpers


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise CLIError(message)


def _nonneg(name: str, value: int) -> None:
    _check(value >= 0, f"{name} must be >= 0, got {value}.")


def _positive(name: str, value: int) -> None:
    _check(value >= 1, f"{name} must be >= 1, got {value}.")


def _refit_schedule(value: str | None) -> int | str:
    """``--refit-every``: ``auto`` (also when left out) or a cadence in steps (>= 0)."""
    if value is None or value.strip().lower() == "auto":
        return "auto"
    try:
        steps = int(value)
    except ValueError:
        steps = -1
    _check(steps >= 0, f"--refit-every must be 'auto' or an integer >= 0, got {value!r}.")
    return steps


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
    r"""``--model-option`` values -> the options dict; object values must name allow-listed
    classes (:mod:`bo_online.loops.options`), checked here before anything is imported or built."""
    from bo_online.loops.options import check_options

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
    check_options(options)
    return options


# Limits checked before any file is written or any evaluation made (see docs/usage.md).
#: largest --dim of a test function: the surrogates and acquisition optimisation here target
#: low/moderate dimension (WISKI projects to <= 3 features); at d > 100 a BO step's optimise_acqf
#: alone takes minutes, so larger d is refused rather than left to run silently.
MAX_DIM = 100
#: largest --q of the bo command: q-batch acquisitions optimise q x d variables jointly and hold
#: raw_samples x q x q covariances; beyond 100 a step takes minutes to hours.
MAX_Q = 100
#: largest observation-noise std: outputs must stay far below the 1e150 standardisation limit.
MAX_NOISE = 1e100
MAX_SEED = 2**63 - 1
#: model options that are sizes: integers >= 1; each m gives m x m matrices in the model.
_SIZE_OPTIONS = (
    "grid_size",
    "inducing_points",
    "num_inducing",
    "num_mean_bases",
    "num_features",
    "num_dense_columns",
)


def _check_beta(beta: float) -> None:
    _check(math.isfinite(beta) and beta >= 0, f"--beta must be a finite number >= 0, got {beta}.")


def _check_noise(noise: float) -> None:
    _check(
        math.isfinite(noise) and 0 <= noise <= MAX_NOISE,
        f"--noise must be a finite std between 0 and {MAX_NOISE:g}, got {noise}.",
    )


def _check_seed(seed: int) -> None:
    _check(0 <= seed <= MAX_SEED, f"--seed must be between 0 and 2**63-1, got {seed}.")


def _check_out(out: Path | None) -> None:
    if out is not None:
        _check(
            not out.exists() or out.is_dir(),
            f"--out {str(out)!r} is an existing file; give a directory.",
        )


def _gpu_index(device: str) -> int | None:
    r"""The index of the CUDA device ``device`` names if this machine has it, else None: a string
    that is no device, or a CUDA device that is absent (``cuda:1`` on a one-GPU machine, or no
    CUDA at all), is refused with its own message once the run is built."""
    import torch

    try:
        where = torch.device(device)
    except RuntimeError:
        return None
    if where.type != "cuda" or not torch.cuda.is_available():
        return None
    index = where.index if where.index is not None else torch.cuda.current_device()
    return index if index < torch.cuda.device_count() else None


def _memory_bytes(device: str = "cpu") -> int:
    r"""Total memory where a run on ``device`` keeps its matrices: the GPU's for a CUDA device
    (a 16 GB card in a 64 GB host is full long before the host is), the host's otherwise."""
    import os

    import torch

    index = _gpu_index(device)
    if index is not None:
        return int(torch.cuda.get_device_properties(index).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 2**40


def _memory_name(device: str) -> str:
    """How the messages name the memory of :func:`_memory_bytes`."""
    return f"the {device} GPU's" if _gpu_index(device) is not None else "this machine's"


def _check_sizes(options: dict[str, Any], dim: int | None, dtype: str, device: str = "cpu") -> None:
    r"""Size options (``grid_size``, inducing points, ...) are positive integers, and the m x m
    matrices they imply fit in memory: estimate 4 m^2 x (8 or 4 bytes), m = prod(grid sizes)."""
    itemsize = 4 if dtype == "float32" else 8
    for key in _SIZE_OPTIONS:
        if key not in options or options[key] is None:
            continue
        value = options[key]
        if key != "grid_size" and isinstance(value, list):
            continue  # explicit points (e.g. inducing point coordinates), not a size
        values = value if isinstance(value, list) else [value]
        _check(
            all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values),
            f"--model-option {key} must be an integer >= 1 (or a list of them), got {value!r}.",
        )
        m = math.prod(values)
        if key == "grid_size" and not isinstance(value, list):
            proj = options.get("projection")
            k = dim if dim is not None and dim <= 3 else 2
            if isinstance(proj, dict):
                kw, args = proj.get("kwargs", {}), proj.get("args", [])
                k = kw.get("out_dim", args[1] if len(args) > 1 else 2)
            m = value ** max(int(k) if isinstance(k, int) else 1, 1)
        need, have = 4 * m * m * itemsize, _memory_bytes(device)
        _check(
            need <= have,
            f"--model-option {key}={value!r} gives m = {m} and needs about {need / 1e9:.3g} GB "
            f"of memory (4 m x m matrices), more than {_memory_name(device)} "
            f"{have / 1e9:.3g} GB; choose a smaller {key}.",
        )


def _check_dense_memory(
    model: str, n: int, dtype: str, stop: str = "--steps", device: str = "cpu"
) -> None:
    r"""A model that holds its ``n`` points' ``n x n`` kernel matrix and factor (the exact GP,
    SingleTaskGP) must fit in memory at the run's last ``n``: estimate 4 n^2 x (8 or 4 bytes),
    as for the grids. A user's file of 100,000 rows streamed into the default exact GP would
    run for hours (its refits are O(n^3)) and be killed for memory long before its end."""
    if model not in ("exact", "singletaskgp"):
        return
    need, have = 4 * n * n * (4 if dtype == "float32" else 8), _memory_bytes(device)
    _check(
        need <= have,
        f"--model {model} holds an n x n factor of the points seen: by the run's end (n = {n:,}) "
        f"about {need / 1e9:,.3g} GB (4 n x n matrices), more than {_memory_name(device)} "
        f"{have / 1e9:.3g} GB; use --model tsvgp (a fixed cost per point), or stop "
        f"earlier with {stop}.",
    )


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


def _columns(raw: str | None) -> list[str] | None:
    """``"a,b,3"`` -> ``["a", "b", "3"]`` (names or indices, resolved against the file)."""
    if raw is None:
        return None
    columns = [c.strip() for c in raw.split(",") if c.strip()]
    _check(bool(columns), f"--inputs expects comma-separated column names or indices, got {raw!r}.")
    return columns


def _tracks(raw: str | None) -> tuple[int, ...]:
    from bo_online.datasets import MAGNETOMETER_TRACKS

    if raw is None:
        return MAGNETOMETER_TRACKS
    try:
        tracks = tuple(int(t) for t in raw.split(",") if t.strip())
    except ValueError:
        raise CLIError(
            f"--tracks expects comma-separated track numbers 1..9, got {raw!r}."
        ) from None
    _check(
        bool(tracks) and all(t in MAGNETOMETER_TRACKS for t in tracks),
        f"--tracks expects comma-separated track numbers 1..9, got {raw!r}.",
    )
    _check(
        len(set(tracks)) == len(tracks),
        f"--tracks lists a track more than once ({raw!r}): name each track once.",
    )
    return tracks


def _file_options(file: Path | None, flag: str, **options: Any) -> None:
    """Options that only make sense with a data file; the fraction's range."""
    if file is None:
        given = [f"--{k.replace('_', '-')}" for k, v in options.items() if v is not None]
        _check(
            not given,
            f"{', '.join(given)} only {'applies' if len(given) == 1 else 'apply'} to "
            f"your own data file ({flag} FILE).",
        )
        return
    _check(
        options.get("test_fraction") is None or options.get("test_mask") is None,
        "Give --test-fraction or --test-mask, not both.",
    )
    fraction = options.get("test_fraction")
    _check(
        fraction is None or 0 < fraction < 1, f"--test-fraction must be in (0, 1), got {fraction}."
    )


def _fmt(value: Any, digits: int = 5) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}g}"
    return str(value)


def _last_metric(records: list[dict[str, Any]], key: str, label: str) -> tuple[str, str]:
    """A summary row for the last recorded value of a metric, labelled with its step (test
    metrics are recorded every ``--eval-every`` steps, so the last may predate the last step)."""
    last = next((r for r in reversed(records) if r.get(key) is not None), None)
    if last is None:
        return (f"last {label}", _fmt(None))
    return (f"{label} (step {last['step']})", _fmt(last[key], 4))


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
        # 10 digits: an objective's values on an offset (1e6 + O(1)) differ after the 5th
        rows += [
            ("best observed value", _fmt(last["best_value"], 10)),
            ("best true value", _fmt(last.get("best_true_value"), 10)),
            ("optimum", _fmt(loop.problem.optimal_value, 10)),
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


DaskOpt = Annotated[
    Optional[str],
    typer.Option(
        help="Run on a Dask cluster: local:N (a LocalCluster of N single-threaded worker "
        "processes) or a scheduler address tcp://host:port."
    ),
]


def _dask_client(address: str) -> Any:
    """A Dask client (closed, with its LocalCluster, on exit); see bo_online.sweep.dask_client."""
    from bo_online.sweep import dask_client

    return dask_client(address)


#: the loop now running, its run directory and resume command, named in the
#: interrupted/terminated message
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
    from bo_online.loops.async_bo import TooManyFailures

    try:
        _run(loop, steps, address)
    except TooManyFailures as e:
        limit = loop.failures + loop.config["max_failures"]
        command = f"{_resume_command(loop, address)} --max-failures {limit}"
        _fail(
            f"{str(e).removesuffix(TooManyFailures.ADVICE)}Fix the objective, then continue the "
            f"run with `{command}` (failures count over the whole run: {loop.failures} so far).",
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


# ---------------------------------------------------------------------------------- commands


_PROBLEM_HELP = (
    "Test function (minimised; cosine8 maximised): any unconstrained function of "
    "botorch.test_functions.synthetic with a known optimum -- ackley, beale, branin, bukin, "
    "cosine8, dixonprice, dropwave, eggholder, griewank, hartmann (--dim 3/4/6), hartmann3, "
    "hartmann6, holdertable, levy, michalewicz, powell (dim a multiple of 4), rastrigin, "
    "rosenbrock, shekel, sixhumpcamel, styblinskitang, threehumpcamel; --dim sets the dimension "
    "of those defined for any d. Or give --objective instead."
)


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
            "--fit-max-iter iterations; the exact GP, and t-SVGP and the decoupled SVGP while "
            "n <= 128 (every point a basis), are rebuilt and fit from the defaults, as "
            "BoTorch's loop does); 0 = never. Default (auto): every step, except that the "
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
        int, typer.Option(help="With --dask: stop after more than this many evaluations raised.")
    ] = 10,
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
    if dask is not None:  # asynchronous BO on a Dask cluster (bo_online.loops.async_bo)
        _check(workers == 0, "--workers and --dask exclude each other: use --dask local:N.")
        _check(q == 1, "--dask proposes one point per free worker: leave --q at 1.")
        _nonneg("--max-failures", max_failures)
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
        with _dask_client(dask) as client:
            loop = AsyncBayesOptLoop(prob, client, max_failures=max_failures, **bo_options)
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


@app.command()
def stream(
    problem: Annotated[
        Optional[str],
        typer.Option(
            help="UCI regression set (skillcraft, elevators, protein, kin40k, bike, pol, airfoil, "
            "concrete, energy, yacht, housing) or the banana classification set (models tsvgp, "
            "wiski)."
        ),
    ] = None,
    data: Annotated[
        Optional[Path],
        typer.Option(
            help="Your own data instead: a .csv, .csv.gz or .npz file (inputs then a target "
            "column; see --target, --test-fraction, --test-mask, --task)."
        ),
    ] = None,
    target: TargetOpt = None,
    inputs: InputsOpt = None,
    test_fraction: TestFractionOpt = None,
    test_mask: TestMaskOpt = None,
    task: Annotated[
        str,
        typer.Option(
            help="With --data: regression, or classification (two target values, numbers or "
            "text labels, mapped to 0 / 1 in sorted order; models tsvgp, wiski)."
        ),
    ] = "regression",
    data_dir: DataDirOpt = None,
    split: Annotated[
        Optional[int],
        typer.Option(
            help="Fixed 90/10 split (0..9) of a UCI set (default 0); its test rows are the test "
            "set (banana has one fixed split)."
        ),
    ] = None,
    shuffle: Annotated[
        bool, typer.Option(help="Stream the training rows in a seeded random order.")
    ] = True,
    max_stream: Annotated[
        Optional[int], typer.Option(help="Use only the first this many stream rows.")
    ] = None,
    max_test: Annotated[
        Optional[int], typer.Option(help="Use only the first this many test rows.")
    ] = None,
    model: ModelOpt = "exact",
    model_option: ModelOptionOpt = None,
    q: Annotated[int, typer.Option("--q", help="Points arriving per step.")] = 1,
    steps: Annotated[
        Optional[int],
        typer.Option(help="Steps after the initial points (default: until the stream ends)."),
    ] = None,
    n_init: Annotated[int, typer.Option(help="Stream points the surrogate starts from.")] = 100,
    eval_every: Annotated[
        int,
        typer.Option(help="Test RMSE/NLL (classification: accuracy/NLL) every this many steps."),
    ] = 50,
    seed: SeedOpt = 0,
    refit_every: Annotated[
        Optional[str],
        typer.Option(
            help="Refit hyperparameters every this many steps (warm-started, at most "
            "--fit-max-iter iterations; the exact GP, and t-SVGP and the decoupled SVGP while "
            "every point is one of their inducing inputs / bases, refit from the defaults); "
            "0 = never. Default (auto): whenever the data "
            "have grown by 50 points or 10% since the last fit, whichever is more, so the "
            "refits cost O(1) per point however long the stream."
        ),
    ] = None,
    fit_max_iter: FitIterOpt = 50,
    refit_from: RefitFromOpt = "auto",
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
    """Streaming regression (a UCI set or your own --data file) or binary classification
    (banana, or --data with --task classification): predict each arriving point, then update.
    In a regression stream of 2,000 rows or more t-SVGP has 512 inducing inputs and the
    decoupled SVGP 2,048 mean / 1,024 covariance bases unless --model-option says otherwise."""
    if steps is not None:
        _nonneg("--steps", steps)
    _positive("--q", q)
    _check_seed(seed)
    refit = _refit_schedule(refit_every)  # before any data is read
    from bo_online.loops import StreamingLoop
    from bo_online.models.classifiers import classifier_class
    from bo_online.problems import (
        CLASSIFICATION_PROBLEMS,
        STREAM_PROBLEMS,
        banana_problem,
        uci_problem,
    )

    _setup(threads)
    _check(
        (problem is None) != (data is None),
        "Give a shipped set with --problem NAME or your own data with --data FILE (one of them).",
    )
    _file_options(
        data,
        "--data",
        target=target,
        test_fraction=test_fraction,
        test_mask=test_mask,
        inputs=inputs,
    )
    _check(
        task in ("regression", "classification"),
        f"--task must be regression or classification, got {task!r}.",
    )
    _check(
        data is not None or task == "regression",
        "--task applies to --data files; the shipped sets have a fixed task.",
    )
    key = (problem or "").lower()
    _check(
        data is not None or key in STREAM_PROBLEMS,
        f"Unknown UCI set {problem!r}; choose one of {', '.join(STREAM_PROBLEMS)}, or give your "
        f"own data with --data FILE.csv.",
    )
    _positive("--n-init", n_init)
    _positive("--eval-every", eval_every)
    for name, value in (("--max-stream", max_stream), ("--max-test", max_test)):
        if value is not None:
            _positive(name, value)
    _check_model(model)
    _check(
        split is None or (data is None and key not in CLASSIFICATION_PROBLEMS),
        "--split only applies to the shipped UCI sets; "
        + (
            "with --data FILE use --test-fraction or --test-mask."
            if data is not None
            else "banana has one fixed split."
        ),
    )
    if data is not None:
        from bo_online.userdata import stream_from_file

        if task == "classification":
            classifier_class(model)
        prob = stream_from_file(
            data,
            target=target,
            inputs=_columns(inputs),
            test_fraction=test_fraction,
            test_mask=test_mask,
            task=task,
            shuffle=shuffle,
            seed=seed,
            max_stream=max_stream,
            max_test=max_test,
        )
        _check(
            n_init < prob.X_stream.shape[0],
            f"--n-init {n_init} leaves nothing to stream: {data} has "
            f"{prob.X_stream.shape[0]} training rows.",
        )
    elif key in CLASSIFICATION_PROBLEMS:
        classifier_class(model)  # one-line error for a regression-only model, before any data
        prob = banana_problem(
            shuffle=shuffle, seed=seed, max_stream=max_stream, max_test=max_test, data_dir=data_dir
        )
    else:
        prob = uci_problem(
            problem,
            split=0 if split is None else split,
            shuffle=shuffle,
            seed=seed,
            max_stream=max_stream,
            max_test=max_test,
            data_dir=data_dir,
        )
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
    loop = StreamingLoop(prob, eval_every=eval_every, n_init=n_init, **shared)
    _check(
        loop.default_steps() >= (steps or 0),
        f"--steps {steps} exceeds the {loop.default_steps()} steps the stream holds "
        f"({prob.X_stream.shape[0]} rows: {n_init} initial, then --q {loop.config['q']} per step).",
    )
    _check_dense_memory(
        model,
        n_init + loop.config["q"] * (steps or loop.default_steps()),
        dtype,
        "--max-stream or --steps",
        device=device,
    )
    _run(loop, steps)
    _finish(loop, plots, quiet)


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
        with _dask_client(dask) as client:
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
        _check_resume_memory(loop, steps)
        _run(loop, steps)
    finally:
        _shutdown(executor)
    _finish(loop, plots, quiet)


def _check_resume_steps(done: int, steps: int | None) -> None:
    r"""Refuse a ``--steps`` below the ``done`` steps of the run's checkpoint."""
    _check(
        steps is None or steps >= done,
        f"--steps {steps} is below the {done} steps this run has already done; "
        "pass a larger --steps to extend it, or leave it out to finish the original target.",
    )


def _check_resume_memory(loop: Any, steps: int | None) -> None:
    r"""A resumed run into a dense model (the exact GP, SingleTaskGP) must fit in memory at its
    last ``n``, as a new run must: ``--steps`` can extend a run far beyond what it was started
    for. The last ``n`` is the checkpoint's plus ``q`` points per step still to run, to the
    steps :meth:`~bo_online.loops.core.OnlineLoop.run` takes (a stream driven by ``step()``
    from Python has no target: it runs to its end). Checked once the run is loaded, which
    writes nothing: a ``--steps`` beyond what a stream or pool holds is left to ``run``, whose
    message names that limit (the ``n`` it implies could not be reached)."""
    target = steps if steps is not None else loop.target_steps
    if target is None:
        target = loop.default_steps()
    limit = loop.max_steps()
    if target is None or not loop.records or (limit is not None and target > limit):
        return
    to_run = max(0, int(target) - loop.step_count)
    n_end = int(loop.records[-1]["n"]) + int(loop.config["q"]) * to_run
    _check_dense_memory(
        loop.config["model"],
        n_end,
        loop.config["dtype"],
        "a smaller --steps",
        device=str(loop.config.get("device", "cpu")),
    )


def _check_campaign_memory(campaign: Any) -> None:
    r"""A sweep's campaign of a dense model must fit in memory at its last ``n``, as a ``bo``
    run must (a worker that runs out of it fails the campaign hours in)."""
    if campaign.model not in ("exact", "singletaskgp"):
        return
    from bo_online.loops.bayesopt import default_n_init
    from bo_online.problems import synthetic_problem

    p, options = campaign.problem, campaign.options
    dim = p.get("dim") or synthetic_problem(p["name"]).dim
    n_init = options.get("n_init", default_n_init(dim))
    n = int(n_init) + int(options.get("q", 1)) * campaign.steps
    where = f"a smaller steps in the spec (campaign {campaign.name})"
    _check_dense_memory(campaign.model, n, str(options.get("dtype", "float64")), where)


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

    from bo_online.sweep import campaigns, load_spec, plot_sweep, run_sweep, summarize

    for c in campaigns(load_spec(spec)):  # bad specs fail before a cluster starts
        _check_campaign_memory(c)
    _check(
        not out.exists() or out.is_dir(),
        f"--out {str(out)!r} is a file; --out names the directory that holds one run "
        "directory per campaign.",
    )
    _ACTIVE_SWEEP[:] = [True]  # the message on Ctrl-C / SIGTERM
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
    console.print(table)
    console.print(means)
    for path in written:
        typer.echo(f"plot: {path}")


@app.command()
def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run directories to compare.")],
    out: Annotated[
        Optional[Path],
        typer.Option(help="Directory for the PNGs (default: plots/ in the first run directory)."),
    ] = None,
) -> None:
    """Plot best value/regret vs step and wall time, time per step vs n, and test RMSE vs step."""
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


# ---------------------------------------------------------------------------------- entry point


def _fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` as one line on stderr and exit with ``code``."""
    line = " ".join(str(message).split())
    print(f"bo-online: error: {line}", file=sys.stderr)
    raise SystemExit(code)


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that cleanup (workers, lock) runs."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(argv: list[str] | None = None) -> None:
    r"""Console-script entry point. User errors (bad options, missing data, unavailable model)
    print ONE line on stderr and exit with status 2; nothing is written before options are
    validated and the surrogate is built."""
    # SIGTERM is raised as an exception in the main thread, so cleanup (worker processes, the
    # run directory's lock) runs as for Ctrl-C.
    import signal
    import threading
    import warnings

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    previous_showwarning, warnings.showwarning = warnings.showwarning, _show_warning
    _SHOWN_WARNINGS.clear()
    try:
        _main(argv)
    finally:
        warnings.showwarning = previous_showwarning
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    r"""A warning during a command as one line on stderr, ``bo-online: warning: ...`` (Python's
    default format adds the package's file, line number and source line, which say nothing to
    a user of the command), each text once per command: a library's warning raised at every
    step (BoTorch's advice on ``--acq ei``, several lines long) filled the terminal."""
    text = " ".join(str(message).split())  # one line: a multi-line text's breaks and tabs
    if (category.__name__, text) in _SHOWN_WARNINGS:
        return
    _SHOWN_WARNINGS.add((category.__name__, text))
    print(f"bo-online: warning: {text} ({category.__name__})", file=sys.stderr)


#: (category, text) of the warnings :func:`_show_warning` has printed in this command
_SHOWN_WARNINGS: set[tuple[str, str]] = set()


def _main(argv: list[str] | None) -> None:
    # Typer vendors click; its exception classes live here (ClickException, UsageError) and
    # typer.Abort is what click makes of Ctrl-C (KeyboardInterrupt) and of EOFError.
    from typer._click import exceptions as click_exc

    from bo_online.errors import CampaignError, ObjectiveError

    _ACTIVE_RUN.clear()  # a run of an earlier command in this process is not this one's
    _ACTIVE_SWEEP.clear()
    try:
        code = app(args=argv, prog_name="bo-online", standalone_mode=False)
    except click_exc.UsageError as e:
        hint = f" (see bo-online {e.ctx.info_name} --help)" if e.ctx is not None else ""
        _fail(e.format_message() + hint)
    except click_exc.ClickException as e:
        _fail(e.format_message())
    except typer.Abort:
        _fail(f"interrupted; {_resume_hint()}", 130)
    except ObjectiveError as e:  # the user's objective failed mid-run: its state is saved
        _fail(f"{e}; fix the objective, then {_resume_hint()}", 1)
    except CampaignError as e:  # a campaign of a sweep raised: the message says how to go on
        _fail(str(e), 1)
    except (CLIError, ValueError, FileNotFoundError) as e:
        _fail(str(e))
    except OSError as e:  # e.g. a full disk outside the run directory's own writes
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        _fail(
            f"{e.strerror or e}{where}; free space or fix permissions, then try again "
            "(an interrupted run continues with `bo-online resume OUT_DIR`)."
        )
    except SystemExit as e:
        if e.code == 128 + 15:  # a loop that stopped on SIGTERM after writing its checkpoint
            _fail(f"terminated; {_resume_hint()}", 143)
        raise
    except (KeyboardInterrupt, _Terminated) as e:
        # 128 + the signal, as for a loop stopped after its step: 143 for SIGTERM, 130 for Ctrl-C
        if isinstance(e, _Terminated):
            _fail(f"terminated; {_resume_hint()}", 143)
        _fail(f"interrupted; {_resume_hint()}", 130)
    if code == 130:  # typer turns Ctrl-C (KeyboardInterrupt) into a return code of 130
        _fail(f"interrupted; {_resume_hint()}", 130)
    if isinstance(code, int) and code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
