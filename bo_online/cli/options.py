r"""The command-line options the commands share, as ``Annotated`` Typer option types (each
with its help text)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

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
        "while they are the exact GP on their data t-SVGP and the decoupled SVGP (n <= 128), "
        "WISKI (n <= 256) and QSGP (n <= 512), refit from the defaults); 0 = never; "
        "auto: every step, except that the exact GP, t-SVGP, the decoupled SVGP and WISKI "
        "with a learned input projection (above 6 inputs) refit every step only up to n = 100 "
        "and then whenever n has grown by 10% since their last fit (as bo's default)."
    ),
]


RefitFromOpt = Annotated[
    str,
    typer.Option(
        help="Where a refit starts. auto: from the current hyperparameters, except that the "
        "exact GP (and t-SVGP / the decoupled SVGP while every point is a basis, WISKI "
        "(n <= 256) and QSGP (n <= 512), while they are the exact GP on their data) is rebuilt "
        "from the defaults, "
        "small-n refits of t-SVGP, the decoupled SVGP and QSGP also try the "
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


DaskOpt = Annotated[
    Optional[str],
    typer.Option(
        help="Run on a Dask cluster: local:N (a LocalCluster of N single-threaded worker "
        "processes) or a scheduler address tcp://host:port."
    ),
]

NoWorkersTimeoutOpt = Annotated[
    Optional[float],
    typer.Option(
        "--no-workers-timeout",
        metavar="SECONDS",
        help="With --dask: stop the run (saved, to resume) once the cluster has had no worker "
        "for this many seconds while evaluations are in flight (workers that died or were "
        "stopped); raise it for a cluster that scales from zero in a batch queue, or give inf "
        "to wait forever (default 120).",
    ),
]


_PROBLEM_HELP = (
    "Test function (minimised; cosine8 maximised): any unconstrained function of "
    "botorch.test_functions.synthetic with a known optimum -- ackley, beale, branin, bukin, "
    "cosine8, dixonprice, dropwave, eggholder, griewank, hartmann (--dim 3/4/6), hartmann3, "
    "hartmann6, holdertable, levy, michalewicz, powell (dim a multiple of 4), rastrigin, "
    "rosenbrock, shekel, sixhumpcamel, styblinskitang, threehumpcamel; --dim sets the dimension "
    "of those defined for any d. Or give --objective instead."
)
