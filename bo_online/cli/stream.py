r"""``bo-online stream``: streaming regression or binary classification."""

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
)
from bo_online.cli.memory import _check_dense_memory
from bo_online.cli.options import (
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
    QuietOpt,
    RefitFromOpt,
    SeedOpt,
    TargetOpt,
    TestFractionOpt,
    TestMaskOpt,
    ThreadsOpt,
)
from bo_online.cli.running import _run, _setup, _shared
from bo_online.cli.summary import _finish


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
        Optional[str],
        typer.Option(
            help="With --data: regression, or classification (two target values, numbers or "
            "text labels, mapped to 0 / 1 in sorted order; models tsvgp, wiski). Default: "
            "regression, with a warning naming --task classification where the target holds "
            "two distinct values only."
        ),
    ] = None,
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
        typer.Option(
            help="Test RMSE/NLL (classification: accuracy/NLL) every this many steps and at "
            "the stream's last step."
        ),
    ] = 50,
    seed: SeedOpt = 0,
    refit_every: Annotated[
        Optional[str],
        typer.Option(
            help="Refit hyperparameters every this many steps (warm-started, at most "
            "--fit-max-iter iterations; the exact GP, and while they are the exact GP on "
            "their data t-SVGP and the decoupled SVGP (every point one of their inducing "
            "inputs / bases), WISKI (n <= 256) and QSGP (n <= 512), are rebuilt and fit from "
            "the defaults); "
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
        task in (None, "regression", "classification"),
        f"--task must be regression or classification, got {task!r}.",
    )
    _check(
        data is not None or task in (None, "regression"),
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
    # For every source (a shipped set cut by --max-stream too): a too-large --n-init or --q
    # reached the loop's own errors, which name its Python arguments and no way out.
    rows = prob.X_stream.shape[0]
    source = data if data is not None else prob.name
    cut = f" (--max-stream {max_stream})" if max_stream is not None else ""
    _check(
        n_init < rows,
        f"--n-init {n_init} leaves nothing to stream: {source} has {rows} training rows{cut}; "
        "lower --n-init.",
    )
    _check(
        rows - n_init >= q,
        f"--q {q} points per step, but the stream has {rows - n_init} rows after the {n_init} "
        "initial ones: lower --q or --n-init.",
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
