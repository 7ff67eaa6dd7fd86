r"""The `bo-online` command: bad options give one line and a non-zero exit with nothing written;
--help documents every option; bo/active/stream/resume/plot work end to end (small sizes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bo_online import datasets
from bo_online.cli import app, main

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "--num-restarts",
    "2",
    "--raw-samples",
    "32",
    "--acqf-maxiter",
    "20",
    "--fit-max-iter",
    "10",
    "--threads",
    "1",
]


@pytest.fixture(autouse=True, scope="module")
def _restore_threads():
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


def _run(argv, capsys):
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _has_data() -> bool:
    return (datasets.resolve_data_dir() / "magnetometer" / "1-loc.csv").is_file()


def _bo_option(model: str, option: str) -> list[str]:
    r"""A one-step Branin run of ``model`` with one ``--model-option``."""
    steps = ["bo", "--problem", "branin", "--steps", "1", "--model", model, *SMALL]
    return [*steps, "--model-option", option]


BAD = {
    "unknown problem": (["bo", "--problem", "nope"], "Unknown problem 'nope'"),
    "unsupported dim": (["bo", "--problem", "branin", "--dim", "3"], "dim in [2]"),
    "hartmann dim": (["bo", "--problem", "hartmann", "--dim", "5"], "dim in [3, 4, 6]"),
    "negative steps": (["bo", "--problem", "levy", "--steps", "-1"], "--steps must be >= 0"),
    "non-integer steps": (["bo", "--problem", "levy", "--steps", "abc"], "--steps"),
    "negative noise": (["bo", "--problem", "levy", "--noise", "-2"], "--noise"),
    "unknown option": (["bo", "--problem", "levy", "--bogus", "1"], "--bogus"),
    "unknown model": (["bo", "--problem", "levy", "--model", "gpt"], "Unknown model 'gpt'"),
    "bad acquisition": (["bo", "--problem", "levy", "--acq", "qnipv"], "Unknown --acq"),
    "model option syntax": (["bo", "--problem", "levy", "--model-option", "x"], "key=value"),
    "rejected model option": (
        ["bo", "--problem", "branin", "--steps", "1", "--model-option", "no_such_option=3", *SMALL],
        "no_such_option",
    ),
    # a misspelt option name: Python's message alone, now with the constructor's closest name
    "misspelt model option": (
        [
            "bo",
            "--problem",
            "branin",
            "--steps",
            "1",
            "--model",
            "wiski",
            "--model-option",
            "gridsize=10",
            *SMALL,
        ],
        "unexpected keyword argument 'gridsize' (did you mean 'grid_size'?)",
    ),
    # a likelihood by name failed in the model with an AttributeError traceback
    "likelihood by name (tsvgp)": (
        _bo_option("tsvgp", "likelihood=poisson"),
        "TSVGP's likelihood must be a bo_online.likelihoods.SiteLikelihood",
    ),
    "likelihood by name (decoupled)": (
        _bo_option("decoupled", "likelihood=bernoulli"),
        "DecoupledSVGP's likelihood must be a GPyTorch Likelihood",
    ),
    # the exact GP kept a name and failed in its first fit with a TypeError traceback
    "kernel by name (exact)": (
        _bo_option("exact", "covar_module=rbf"),
        "covar_module must be a GPyTorch Kernel, got 'rbf'",
    ),
    "kernel by name (wiski)": (
        _bo_option("wiski", "covar_module=rbf"),
        "covar_module must be a GPyTorch Kernel, got 'rbf'",
    ),
    "likelihood by name (singletaskgp)": (
        _bo_option("singletaskgp", "likelihood=gaussian"),
        "likelihood must be a GPyTorch GaussianLikelihood, got 'gaussian'",
    ),
    # a non-Gaussian likelihood, now nameable, failed in the exact GP's first fit
    "non-Gaussian likelihood (exact)": (
        _bo_option("exact", "likelihood=gpytorch.likelihoods.BernoulliLikelihood()"),
        "needs the tsvgp model",
    ),
    # a string was read as true
    "standardize not a bool (tsvgp)": (
        _bo_option("tsvgp", "standardize=maybe"),
        "standardize must be True or False, got 'maybe'",
    ),
    # an allow-listed class that raised AttributeError on its arguments: a traceback
    "kernel of a number (exact)": (
        _bo_option("exact", "covar_module=gpytorch.kernels.ScaleKernel(3)"),
        "Cannot build the model option gpytorch.kernels.ScaleKernel",
    ),
    # a kernel for another number of inputs failed in the first fit with a traceback
    "kernel for 5 inputs on 2 (exact)": (
        _bo_option("exact", "covar_module=gpytorch.kernels.RBFKernel(ard_num_dims=5)"),
        "failed on the initial design with its option(s) covar_module",
    ),
    "kernel for 5 inputs on 2 (tsvgp)": (
        _bo_option("tsvgp", "covar_module=gpytorch.kernels.RBFKernel(ard_num_dims=5)"),
        "Expected the input to have 5 dimensionality",
    ),
    # a device torch knows but the loops cannot run on: a traceback from the first fit
    "meta device": (
        ["bo", "--problem", "branin", "--steps", "1", "--device", "meta", *SMALL],
        "--device must be cpu or cuda",
    ),
    # the message named the Python argument, not the option the user typed
    "half precision": (
        ["bo", "--problem", "branin", "--dtype", "float16"],
        "dtype (--dtype on the command line) must be one of ['float64', 'float32']",
    ),
    # options of the asynchronous loop were silently ignored by a synchronous run
    "max failures without dask": (
        ["bo", "--problem", "branin", "--max-failures", "3"],
        "--max-failures applies to asynchronous runs: add --dask",
    ),
    "no-workers timeout without dask": (
        ["bo", "--problem", "branin", "--no-workers-timeout", "30"],
        "--no-workers-timeout applies to asynchronous runs: add --dask",
    ),
    "likelihood by name (exact)": (
        _bo_option("exact", "likelihood=gaussian"),
        "likelihood must be a GPyTorch GaussianLikelihood, got 'gaussian'",
    ),
    "zero batch": (["bo", "--problem", "levy", "--q", "0"], "--q must be >= 1"),
    "bad refit schedule (bo)": (
        ["bo", "--problem", "levy", "--refit-every", "often"],
        "--refit-every must be 'auto' or an integer >= 0, got 'often'",
    ),
    "bad refit schedule (active)": (
        ["active", "--refit-every", "sometimes"],
        "--refit-every must be 'auto' or an integer >= 0, got 'sometimes'",
    ),
    "negative refit schedule (stream)": (
        ["stream", "--problem", "yacht", "--refit-every", "-1"],
        "--refit-every must be 'auto' or an integer >= 0, got '-1'",
    ),
    "missing data dir (active)": (["active", "--data-dir", "{missing}"], "magnetometer/1-loc.csv"),
    "missing data dir (stream)": (
        ["stream", "--problem", "yacht", "--data-dir", "{missing}"],
        "uci/yacht/data.csv.gz",
    ),
    "unknown UCI set": (["stream", "--problem", "iris"], "Unknown UCI set"),
    "regression-only model on banana": (
        ["stream", "--problem", "banana", "--model", "exact"],
        "Model 'exact' cannot classify",
    ),
    "missing data dir (banana)": (
        ["stream", "--problem", "banana", "--model", "tsvgp", "--data-dir", "{missing}"],
        "banana/banana_train_x.txt",
    ),
    "resume nothing": (["resume", "{missing}"], "No run directory"),
    # optimize_acqf chooses its restarts among the raw samples: this failed at the first
    # acquisition, after the initial design, and every resume failed the same way
    "raw samples below restarts": (
        ["bo", "--problem", "branin", "--num-restarts", "3", "--raw-samples", "2"],
        "--raw-samples (2) must be at least --num-restarts (3)",
    ),
    "negative stream cut": (
        ["stream", "--problem", "yacht", "--max-stream", "-30"],
        "--max-stream must be >= 1",
    ),
    "empty test set": (
        ["stream", "--problem", "yacht", "--max-test", "0"],
        "--max-test must be >= 1",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_options_print_one_line_and_write_nothing(case, tmp_path, capsys):
    argv, expected = BAD[case]
    missing = tmp_path / "no-data-here"
    out_dir = tmp_path / "out"
    argv = [a.replace("{missing}", str(missing)) for a in argv]
    if argv[0] in ("bo", "active", "stream"):
        argv = [*argv, "--out", str(out_dir)]
    code, out, err = _run(argv, capsys)
    assert code == 2, (code, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("bo-online: error: ") and expected in lines[0], lines[0]
    if "data dir" in case:
        assert str(missing) in lines[0] and "--data-dir" in lines[0]
    assert not out_dir.exists() and not missing.exists()


def test_bad_option_in_a_real_process_is_one_line():
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-m", "bo_online.cli", "bo", "--problem", "levy", "--steps", "-5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "bo-online: error: --steps must be >= 0, got -5."
    assert proc.stdout == ""


def test_model_option_values():
    from bo_online.cli import CLIError
    from bo_online.cli.checks import _parse_options

    parsed = _parse_options(
        [
            "grid_size=64",
            "sizes=[10, 20]",
            "learn=true",
            "name=abc",
            "projection=bo_online.models.projection.TanhProjection(6, out_dim=2)",
        ]
    )
    assert parsed == {
        "grid_size": 64,
        "sizes": [10, 20],
        "learn": True,
        "name": "abc",
        "projection": {
            "__class__": "bo_online.models.projection.TanhProjection",
            "args": [6],
            "kwargs": {"out_dim": 2},
        },
    }
    with pytest.raises(CLIError, match="literals"):
        _parse_options(["p=torch.nn.Linear(x, 2)"])


def test_help_documents_every_option(capsys):
    from typer.main import get_command

    group = get_command(app)
    assert set(group.commands) == {"bo", "active", "stream", "resume", "plot", "sweep"}
    for name, command in group.commands.items():
        assert command.help, name
        for param in command.params:
            assert getattr(param, "help", None), f"{name}: {param.name} has no help"
        code, out, _ = _run([name, "--help"], capsys)
        assert code == 0 and "Usage" in out
    code, out, _ = _run(["--help"], capsys)
    assert code == 0 and all(c in out for c in ("bo", "active", "stream", "resume", "plot"))


def test_help_reflows_command_docstrings_and_keeps_placeholders(capsys, monkeypatch):
    r"""Command descriptions are paragraphs: the help once broke each line where the docstring
    did ("... with an online" / "surrogate."), even on a wide terminal. Markdown help reflows
    them; placeholders are written so that markdown keeps them (``<problem>`` vanished)."""
    from typer.main import get_command

    monkeypatch.setenv("COLUMNS", "500")  # each description on one line
    code, out, _ = _run(["--help"], capsys)
    assert code == 0
    lines = [" ".join(line.strip("│ ").split()) for line in out.splitlines()]
    for name, command in get_command(app).commands.items():
        first = " ".join(command.help.split("\n\n")[0].split())  # its first paragraph
        assert any(line == f"{name} {first}" for line in lines), (name, first)
    code, out, _ = _run(["bo", "--help"], capsys)
    assert "runs/PROBLEM-MODEL" in " ".join(out.split())


def test_plot_help_names_every_plot_it_writes():
    r"""``bo-online plot``'s description names each figure :func:`bo_online.plotting.plot_runs`
    writes: a classification stream's ``accuracy.png`` (test accuracy vs step) was missing, so
    ``plot --help`` read as if such a run had no plot of its test metric."""
    from typer.main import get_command

    text = " ".join(get_command(app).commands["plot"].help.split())
    for figure in ("regret", "time per step", "test RMSE", "test accuracy"):
        assert figure in text, (figure, text)


def test_model_option_help_names_the_allow_list():
    r"""``--model-option``'s help names every family of classes a value may build (the allow-list
    of :mod:`bo_online.loops.options`), likelihoods included."""
    from typer.main import get_command

    from bo_online.loops.options import ALLOWED_MODULES

    option = next(p for p in get_command(app).commands["bo"].params if p.name == "model_option")
    for module in ALLOWED_MODULES:
        if module == "bo_online.models.projection":  # the old path, accepted but not advertised
            continue
        if module.startswith("bo_online."):  # named in full
            assert module in option.help, (module, option.help)
        else:  # "gpytorch kernels, means, ...": each family after the package's name
            family = module.rpartition(".")[2]
            assert re.search(rf"gpytorch [a-z ,]*\b{family}\b", option.help), (module, option.help)


@pytest.mark.parametrize("command", ["bo", "active", "stream"])
def test_refit_help_names_each_surrogate_a_due_refit_rebuilds_and_up_to_which_n(command):
    r"""``--refit-every`` and ``--refit-from`` say which surrogates a due refit rebuilds and fits
    from the defaults (as BoTorch refits its exact GP) and up to which n: each that the loops
    build as the exact GP on its data (``is_exact_gp_on_data()``). The help named t-SVGP and the
    decoupled SVGP only, though WISKI (up to the loops' ``exact_max_n``) and QSGP (up to its
    number of features) are rebuilt the same way. Checked against models built as the loops
    build them, at the n the help gives and one more."""
    from typer.main import get_command

    from bo_online.models.registry import get_model_class

    params = {p.name: p for p in get_command(app).commands[command].params}
    for option in ("refit_every", "refit_from"):
        text = " ".join(params[option].help.split())
        assert "exact GP" in text and "from the defaults" in text, text
        labels = {"wiski": "WISKI", "qsgp": "QSGP"}
        if option == "refit_every" and command != "stream":
            labels.update(tsvgp="t-SVGP", decoupled="the decoupled SVGP")
        else:  # a long stream gives them more bases (512 / 1,024): named by the rule
            assert re.search(r"t-SVGP [^()]*decoupled SVGP (while |\()every point", text), text
        for name, label in labels.items():
            found = re.search(rf"{re.escape(label)}[^()]*?\(n <= (\d+)\)", text)
            assert found, (command, option, label, text)
            n_max = int(found.group(1))
            cls = get_model_class(name)
            for n, exact in ((n_max, True), (n_max + 1, False)):
                X = torch.rand(
                    n, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(n)
                )
                Y = torch.sin(6 * X).sum(-1, keepdim=True)
                defaults = getattr(cls, "loop_default_options", None)
                options = defaults(2, {}) if callable(defaults) else {}
                assert cls(X, Y, **options).is_exact_gp_on_data() is exact, (name, n)


def test_plot_of_a_run_whose_records_file_is_gone_says_to_resume_it(tmp_path, capsys):
    """`bo-online plot` of a run directory whose records.jsonl was deleted (its checkpoint is
    there) said "No records at ... (expected a run directory)": it is one, and `bo-online
    resume` rewrites the records from the checkpoint. It now says so, with the command."""
    out = tmp_path / "run"
    argv = ["bo", "--problem", "branin", "--model", "exact", "--acq", "ts", "--steps", "1"]
    code, _, err = _run([*argv, "--out", str(out), "--quiet", "--no-plots", *SMALL], capsys)
    assert code == 0, err
    records = (out / "records.jsonl").read_text()
    (out / "records.jsonl").unlink()
    code, _, err = _run(["plot", str(out), "--out", str(tmp_path / "plots")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "though the run's checkpoint is there" in err
    assert err.rstrip().endswith(f"`bo-online resume {out}` rewrites it from the checkpoint.")
    assert not (tmp_path / "plots").exists()
    code, _, err = _run(["resume", str(out), "--quiet", "--no-plots"], capsys)
    assert code == 0, err
    assert (out / "records.jsonl").read_text() == records
    code, stdout, err = _run(["plot", str(out), "--out", str(tmp_path / "plots")], capsys)
    assert code == 0 and "progress.png" in stdout, err


def test_bo_resume_and_plot_end_to_end(tmp_path, capsys):
    out = tmp_path / "branin"
    code, stdout, err = _run(
        [
            "bo",
            "--problem",
            "branin",
            "--model",
            "exact",
            "--acq",
            "ts",
            "--num-candidates",
            "128",
            "--steps",
            "3",
            "--seed",
            "1",
            "--out",
            str(out),
            *SMALL,
        ],
        capsys,
    )
    assert code == 0, err
    assert "simple regret" in stdout and f"records:    {out / 'records.jsonl'}" in stdout
    assert "progress.png" in stdout and "time_per_step.png" in stdout
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    config = json.loads((out / "config.json").read_text())
    assert config["problem"] == {"name": "branin", "dim": 2, "noise_std": 0.0}
    assert config["acq"] == "ts" and config["fit_max_iter"] == 10
    assert config["acq_options"]["num_candidates"] == 128
    for png in ("progress.png", "time_per_step.png"):
        assert (out / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    # the same --out again is refused, the run untouched
    code, _, err = _run(["bo", "--problem", "branin", "--out", str(out), "--steps", "1"], capsys)
    assert code == 2 and "already holds a run" in err
    assert len((out / "records.jsonl").read_text().splitlines()) == 4
    # a target below the steps already done is refused with one line, the run untouched
    code, _, err = _run(["resume", str(out), "--steps", "2", "--quiet"], capsys)
    assert code == 2 and "--steps 2 is below the 3 steps this run has already done" in err
    assert len((out / "records.jsonl").read_text().splitlines()) == 4
    # resume to a longer target, quietly
    code, stdout, err = _run(["resume", str(out), "--steps", "5", "--quiet"], capsys)
    assert code == 0 and stdout == "", err
    assert len((out / "records.jsonl").read_text().splitlines()) == 6
    # plot two runs together
    other = tmp_path / "branin-ts"
    code, _, err = _run(
        [
            "bo",
            "--problem",
            "branin",
            "--acq",
            "ts",
            "--steps",
            "2",
            "--quiet",
            "--no-plots",
            "--out",
            str(other),
            *SMALL,
        ],
        capsys,
    )
    assert code == 0, err
    assert not (other / "plots").exists()
    code, stdout, _ = _run(["plot", str(out), str(other), "--out", str(tmp_path / "cmp")], capsys)
    assert code == 0 and (tmp_path / "cmp" / "progress.png").is_file()
    assert stdout.count("plot: ") == 2
    # --out naming an existing file: said so (it printed "File exists ... free space")
    png = tmp_path / "cmp" / "progress.png"
    before = png.read_bytes()
    code, _, err = _run(["plot", str(out), "--out", str(png)], capsys)
    assert code == 2 and "is a file; --out names the directory" in err
    assert png.read_bytes() == before


@pytest.mark.skipif(not _has_data(), reason="real data not available")
def test_active_and_stream_commands(tmp_path, capsys):
    out = tmp_path / "mag"
    code, stdout, err = _run(
        [
            "active",
            "--test-size",
            "300",
            "--pool-size",
            "2000",
            "--q",
            "6",
            "--steps",
            "2",
            "--n-init",
            "8",
            "--num-mc-points",
            "64",
            "--out",
            str(out),
            *SMALL,
        ],
        capsys,
    )
    assert code == 0, err
    assert "test RMSE (step 2), initial -> final" in stdout
    assert (out / "plots" / "rmse.png").is_file()
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["n"] for r in records] == [8, 14, 20]
    out = tmp_path / "yacht"
    code, stdout, err = _run(
        [
            "stream",
            "--problem",
            "yacht",
            "--max-stream",
            "60",
            "--max-test",
            "30",
            "--n-init",
            "20",
            "--q",
            "4",
            "--eval-every",
            "5",
            "--steps",
            "10",
            "--out",
            str(out),
            "--threads",
            "1",
        ],
        capsys,
    )
    assert code == 0, err
    assert "prequential RMSE" in stdout
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["n"] for r in records] == list(range(20, 61, 4))
    config = json.loads((out / "config.json").read_text())
    assert config["refit_every"] == "auto"  # the stream's schedule: 50 points after n_init = 20
    assert [r["n"] for r in records if r["refit"]] == [20]
    for schedule, expected in (("auto", "auto"), ("4", 4)):  # the default can also be named
        run_dir = tmp_path / f"yacht-{schedule}"
        code, _, err = _run(
            [
                "stream", "--problem", "yacht", "--max-stream", "40", "--max-test", "20",
                "--n-init", "20", "--q", "4", "--steps", "4", "--fit-max-iter", "2",
                "--refit-every", schedule, "--out", str(run_dir), "-Q",
            ],
            capsys,
        )  # fmt: skip
        assert code == 0, err
        assert json.loads((run_dir / "config.json").read_text())["refit_every"] == expected
    code, _, err = _run(
        [
            "stream",
            "--problem",
            "yacht",
            "--max-stream",
            "60",
            "--n-init",
            "20",
            "--steps",
            "100",
            "--out",
            str(tmp_path / "y2"),
        ],
        capsys,
    )
    assert code == 2 and "exceeds" in err and not (tmp_path / "y2").exists()


def _has_banana() -> bool:
    return (datasets.resolve_data_dir() / "banana" / "banana_train_x.txt").is_file()


@pytest.mark.skipif(not _has_banana(), reason="real data not available")
def test_stream_banana_classification_command(tmp_path, capsys):
    out = tmp_path / "banana"
    code, stdout, err = _run(
        [
            "stream",
            "--problem",
            "banana",
            "--model",
            "wiski",
            "--model-option",
            "grid_size=12",
            "--max-stream",
            "60",
            "--max-test",
            "200",
            "--n-init",
            "20",
            "--q",
            "5",
            "--eval-every",
            "2",
            "--fit-max-iter",
            "10",
            "--out",
            str(out),
            "--threads",
            "1",
        ],
        capsys,
    )
    assert code == 0, err
    assert "prequential accuracy" in stdout and "test accuracy (step " in stdout
    assert (out / "plots" / "accuracy.png").is_file()
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["n"] for r in records] == list(range(20, 61, 5))
    assert all(len(r["pred_prob"]) == 5 and 0 < min(r["pred_prob"]) for r in records[1:])
    assert [r["test_accuracy"] is not None for r in records] == [s % 2 == 0 for s in range(9)]


def test_resume_command_quotes_what_a_shell_would_split(tmp_path):
    """The resume command printed for a run in a directory with a space, and of an objective
    in such a file, runs as printed: each part is one shell word."""
    import shlex
    from types import SimpleNamespace

    from bo_online.cli.running import _resume_command

    out = tmp_path / "my runs" / "levy"
    spec = f"{tmp_path / 'my objectives' / 'obj.py'}:f"
    loop = SimpleNamespace(out_dir=out, problem=SimpleNamespace(objective_spec={"objective": spec}))
    words = shlex.split(_resume_command(loop))
    assert words == ["bo-online", "resume", str(out), "--objective", spec]


def _field_csv(tmp_path: Path, rows: int) -> Path:
    """A 2-input pool file ``a,b,f`` of a smooth field, seeded (a user's own data)."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(rows, 2, generator=g, dtype=torch.float64)
    y = torch.sin(4 * X[:, 0]) + X[:, 1]
    path = tmp_path / "field.csv"
    path.write_text(
        "a,b,f\n" + "\n".join(f"{a:.17g},{b:.17g},{v:.17g}" for (a, b), v in zip(X, y)) + "\n"
    )
    return path


def test_active_summary_reports_the_last_evaluated_metrics_with_their_step(tmp_path, capsys):
    """With --eval-every 2 and 3 steps the last record has no test metrics: the summary printed
    '-' for the variance and NLL. It now shows the step-2 values, labelled, equal to the
    records'."""
    path = _field_csv(tmp_path, 120)
    out = tmp_path / "run"
    argv = ["active", "--pool", str(path), "--test-fraction", "0.2", "--model", "exact"]
    argv += ["--q", "2", "--steps", "3", "--n-init", "6", "--eval-every", "2", "--out", str(out)]
    code, stdout, err = _run([*argv, *SMALL], capsys)
    assert code == 0, err
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert records[-1]["nll"] is None and records[2]["step"] == 2
    lines = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in stdout.splitlines()
        if line.count("│") == 3
    }
    assert lines["test NLL (step 2)"] == f"{records[2]['nll']:.4g}"
    assert lines["mean predictive variance (step 2)"] == f"{records[2]['mean_var']:.4g}"
    assert lines["test RMSE (step 2), initial -> final"].endswith(f"-> {records[2]['rmse']:.4g}")


def test_active_names_its_options_when_pool_candidates_are_fewer_than_q(tmp_path, capsys):
    """`--selection pool --num-pool-candidates 1 --q 2` was refused with the loop's message,
    which names its Python arguments (num_pool_candidates, q); the CLI's names the options, and
    nothing is written."""
    path = _field_csv(tmp_path, 60)
    out = tmp_path / "run"
    argv = ["active", "--pool", str(path), "--selection", "pool", "--num-pool-candidates", "1"]
    code, _, err = _run([*argv, "--q", "2", "--steps", "1", "--out", str(out), *SMALL], capsys)
    assert code == 2
    assert err.strip() == (
        "bo-online: error: --num-pool-candidates 1 is below --q 2: each step labels --q of the "
        "pool points it scores; give --num-pool-candidates 2 or more."
    )
    assert not out.exists()


def test_active_takes_the_auto_refit_schedule_as_bo_and_stream_do(tmp_path, capsys):
    """`bo-online active --refit-every auto` was refused by the option parser (an integer was
    expected), though the loop takes it and `bo` and `stream` name their default so. It is now
    the default, as for `bo` and `stream` (it was every 10 steps); `auto` refits the exact GP
    every step while n <= 100."""
    path = _field_csv(tmp_path, 60)
    argv = ["active", "--pool", str(path), "--test-fraction", "0.2", "--model", "exact"]
    argv += ["--q", "2", "--steps", "3", "--n-init", "6", "--fit-max-iter", "2", "-Q", *SMALL]
    for given, expected, refits in (
        (None, "auto", [1, 2, 3]),
        ("10", 10, []),
        ("auto", "auto", [1, 2, 3]),
        ("2", 2, [2]),
    ):
        out = tmp_path / f"run-{given}"
        extra = [] if given is None else ["--refit-every", given]
        code, _, err = _run([*argv, *extra, "--out", str(out)], capsys)
        assert code == 0, err
        assert json.loads((out / "config.json").read_text())["refit_every"] == expected
        records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if r["refit"] and r["step"] > 0] == refits


def test_ctrl_c_before_the_run_starts_says_to_run_the_command_again(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the loop was being built advised `bo-online resume DIR`, or named the run
    directory of an earlier command in the same process; neither can continue anything."""
    from bo_online import loops

    out = tmp_path / "first"
    code, _, err = _run(
        ["bo", "--problem", "branin", "--steps", "1", "--out", str(out), *SMALL], capsys
    )
    assert code == 0, err

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loops.BayesOptLoop, "__init__", interrupted)
    second = tmp_path / "second"
    code, _, err = _run(["bo", "--problem", "branin", "--steps", "1", "--out", str(second)], capsys)
    assert code == 130
    assert "interrupted; stopped before the loop started (nothing was written); run the same" in err
    assert "resume" not in err and not second.exists()


def test_sigterm_before_the_run_starts_exits_with_143(tmp_path, capsys, monkeypatch):
    """SIGTERM while the loop was being built (or a second one during a step) exited with
    status 130, Ctrl-C's, though a run stopped by SIGTERM after its step exits with 143 (128 +
    15): a scheduler or script reading the status took a termination for an interrupt."""
    import signal
    import time

    from bo_online import loops

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises first

    monkeypatch.setattr(loops.BayesOptLoop, "__init__", terminated)
    out = tmp_path / "run"
    code, _, err = _run(["bo", "--problem", "branin", "--steps", "1", "--out", str(out)], capsys)
    assert code == 143, err
    assert err.startswith("bo-online: error: terminated; stopped before the loop started"), err
    assert not out.exists()


def _initial_design_summary(tmp_path, capsys, expression: str):
    r"""``bo-online bo`` of the 2-D objective ``f(X) = expression`` for its initial design only:
    (exit code, printed summary, last record)."""
    obj = tmp_path / "obj.py"
    obj.write_text(f"def f(X):\n    return {expression}\n")
    argv = ["bo", "--objective", f"{obj}:f", "--bounds", "0,1 0,1", "--steps", "0"]
    code, out, _ = _run(
        [*argv, "--n-init", "3", "--no-plots", "--out", str(tmp_path / "r"), *SMALL], capsys
    )
    best = json.loads((tmp_path / "r" / "records.jsonl").read_text().splitlines()[-1])
    return code, out, best


def test_the_summary_shows_the_best_value_of_an_objective_on_a_large_offset(tmp_path, capsys):
    # with 5 digits the best of 1e6 + ((x - 0.3)^2).sum() read "1e+06" whatever the run found
    code, out, best = _initial_design_summary(tmp_path, capsys, "1e6 + ((X - 0.3) ** 2).sum(-1)")
    shown = f"{best['best_value']:.4f}".rstrip("0")  # 1e6 + O(1): 4 decimals
    assert code == 0 and shown in out and "1e+06" not in out


def test_the_summary_shows_values_with_6_significant_digits_and_the_records_all(tmp_path, capsys):
    r"""The summary printed the best value and the optimum with 10 significant digits
    (0.3978873577 for Branin's optimum): more than a person reads. It now shows 6, and the
    records keep the full value."""
    code, out, best = _initial_design_summary(tmp_path, capsys, "0.123456789123 + 0.0 * X.sum(-1)")
    assert code == 0 and best["best_value"] == 0.123456789123  # the record: full precision
    rows = [line for line in out.splitlines() if "best observed value" in line]
    assert len(rows) == 1 and "0.123457 " in rows[0] and "0.1234567" not in out
    code, out, _ = _run(
        [
            "bo",
            "--problem",
            "branin",
            "--steps",
            "0",
            "--n-init",
            "3",
            "--no-plots",
            "--out",
            str(tmp_path / "b"),
            *SMALL,
        ],
        capsys,
    )
    rows = [line for line in out.splitlines() if "optimum" in line]
    assert code == 0 and len(rows) == 1 and "0.397887 " in rows[0], out


def test_resume_of_a_python_callable_run_says_how_to_resume_it(tmp_path, capsys):
    """`bo-online resume` of a run whose objective is a Python callable said only "pass
    problem= to resume it", which no command-line option does. It now names the Python call
    that resumes the run, and that call, made as written, finishes the run."""
    from bo_online.loops import BayesOptLoop, read_records, resume
    from bo_online.problems import CallableProblem

    def bowl(X):
        return ((X - 0.25) ** 2).sum(-1)

    def problem():
        return CallableProblem(bowl, bounds=[[-1.0, -1.0], [1.0, 1.0]], name="bowl")

    out = tmp_path / "bowl"
    small = {"num_restarts": 2, "raw_samples": 16}
    loop = BayesOptLoop(
        problem(),
        model="exact",
        seed=0,
        n_init=3,
        fit_max_iter=5,
        optimizer_options=small,
        out_dir=out,
        quiet=True,
    )
    loop.run(steps=1)
    code, _, err = _run(["resume", str(out), "--steps", "2", "--quiet"], capsys)
    assert code == 2
    assert f"bo_online.loops.resume({str(out)!r}, problem=problem)" in err, err
    assert "bo-online resume" in err and "cannot" in err, err
    assert len(read_records(out)) == 2  # the refused resume left the run as it was
    # the advice, followed: the same problem made again in Python
    records = resume(str(out), steps=2, problem=problem())
    assert [r["step"] for r in records][-1] == 2
    assert [r["step"] for r in read_records(out)] == [0, 1, 2]


def test_overwrite_failing_in_the_initial_design_does_not_advise_resuming(tmp_path, capsys):
    """`--overwrite` onto a run, with an objective that fails in its initial design, kept the
    old run (nothing new was written) but advised `bo-online resume DIR --objective NEW`, which
    that run (of another objective) refuses. The advice is now to run the command again, and
    the old run is left as it was."""
    objectives = tmp_path / "obj.py"
    objectives.write_text(
        "def good(X):\n    return ((X - 0.3) ** 2).sum(-1)\n\n"
        "def bad(X):\n    raise RuntimeError('broken')\n"
    )
    out = tmp_path / "run"
    argv = ["bo", "--bounds", "0,1 0,1", "--steps", "0", "--n-init", "3", "--no-plots", "-Q"]
    argv += ["--out", str(out), *SMALL]
    code, _, err = _run([*argv, "--objective", f"{objectives}:good"], capsys)
    assert code == 0, err
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, _, err = _run([*argv, "--objective", f"{objectives}:bad", "--overwrite"], capsys)
    assert code == 1, err
    assert "run the same command again" in err and "resume" not in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def _files_of_a_run_stopped_after_step_3(loop, out) -> dict[str, bytes]:
    """Run ``loop`` towards 4 steps, interrupted after step 3 (checkpointed at step 2, step 3
    recorded only); the run directory's files, by name."""
    from bo_online.loops import read_records

    def killed_after_step_3(record):
        if record["step"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        loop.run(steps=4, callback=killed_after_step_3)
    assert [r["step"] for r in read_records(out)] == [0, 1, 2, 3]
    return {p.name: p.read_bytes() for p in out.iterdir()}


def test_resume_with_too_few_steps_leaves_the_run_files_as_they_were(tmp_path, capsys):
    """`bo-online resume DIR --steps N` with N below the steps done was refused only after the
    run had been loaded, which rewrites records.jsonl from the checkpoint: the records of the
    steps after the last checkpoint (a run killed between checkpoints) were gone though the
    command did nothing. It is now refused before the run is loaded."""
    from bo_online.loops import BayesOptLoop
    from bo_online.problems import synthetic_problem

    out = tmp_path / "run"
    small = {"num_restarts": 2, "raw_samples": 16, "maxiter": 20}
    loop = BayesOptLoop(
        synthetic_problem("branin"),
        model="exact",
        n_init=3,
        fit_max_iter=5,
        optimizer_options=small,
        checkpoint_every=2,
        out_dir=out,
    )

    before = _files_of_a_run_stopped_after_step_3(loop, out)
    code, _, err = _run(["resume", str(out), "--steps", "1", "--quiet", "--no-plots"], capsys)
    assert code == 2
    assert (
        err.startswith("bo-online: error: --steps 1 is below the 2 steps") and err.count("\n") == 1
    ), err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_resume_of_a_stream_with_more_steps_than_rows_leaves_the_run_files_as_they_were(
    tmp_path, capsys
):
    """`bo-online resume DIR --steps N` with N beyond what a stream (or pool) holds was refused
    by the loop once loaded, and loading had rewritten records.jsonl from the checkpoint: the
    records of the steps after the last checkpoint were dropped by a command that did nothing.
    The files are now rewritten only once the resumed run goes on."""
    import numpy as np

    from bo_online.loops import read_records
    from bo_online.loops.streaming import StreamingLoop
    from bo_online.userdata import stream_from_file

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(40, 2))
    data = tmp_path / "rows.csv"
    np.savetxt(data, np.c_[X, np.sin(3 * X).sum(-1)], delimiter=",")
    out = tmp_path / "run"
    loop = StreamingLoop(
        stream_from_file(data, test_fraction=0.25),
        model="exact",
        n_init=10,
        eval_every=2,
        refit_every=0,
        init_fit_max_iter=5,
        checkpoint_every=2,
        out_dir=out,
    )

    before = _files_of_a_run_stopped_after_step_3(loop, out)
    code, _, err = _run(["resume", str(out), "--steps", "1000", "--quiet", "--no-plots"], capsys)
    assert code == 2 and "exceeds the 20 steps the data hold" in err and err.count("\n") == 1
    # (the lock of the loaded run is this process's until it exits, as the command's is)
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"}
    assert after == before
    # the run goes on as before: the step after the checkpoint is redone
    code, _, err = _run(["resume", str(out), "--steps", "4", "--quiet", "--no-plots"], capsys)
    assert code == 0, err
    assert [r["step"] for r in read_records(out)] == [0, 1, 2, 3, 4]


def test_a_run_copied_from_a_gpu_machine_resumes_here_with_device_cpu(tmp_path, capsys):
    """A run whose device this machine lacks (copied from a GPU machine) was refused on resume
    with "device 'cuda:99' requested but ...", which no option could change: the run could not
    be continued here. The error now says to pass --device cpu, which continues it on the CPU
    (here: to the records of a run that never left it)."""
    from bo_online.loops import history, read_records, without_timing

    args = ["--problem", "branin", "--n-init", "4", *SMALL, "--quiet", "--no-plots"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert _run(["bo", *args, "--steps", "3", "--out", str(ref)], capsys)[0] == 0
    assert _run(["bo", *args, "--steps", "1", "--out", str(run)], capsys)[0] == 0
    path = run / history.CHECKPOINT_FILE
    ckpt = history.load_checkpoint(path)
    history.save_checkpoint(path, {**ckpt, "config": {**ckpt["config"], "device": "cuda:99"}})
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    resume = ["resume", str(run), "--steps", "3", "--quiet", "--no-plots"]
    code, _, err = _run(resume, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "ran on 'cuda:99', which this machine lacks" in err and "--device cpu" in err, err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert _run([*resume, "--device", "cpu"], capsys)[0] == 0
    assert without_timing(read_records(run)) == without_timing(read_records(ref))
    assert json.loads((run / history.CONFIG_FILE).read_text())["device"] == "cpu"


def test_the_device_advice_is_the_runs_own_resume_command(tmp_path, capsys):
    """The advice for a run whose device this machine lacks was `bo-online resume DIR --device
    cpu` with DIR unquoted and without the run's --objective: for a directory with a space, or
    a run of the user's objective, the command as written failed. It is now the run's own
    resume command, quoted, plus --device cpu, and that command as written continues it."""
    import shlex

    from bo_online.loops import history

    obj = tmp_path / "my objectives" / "obj.py"
    obj.parent.mkdir()
    obj.write_text("def f(X):\n    return ((X - 0.3) ** 2).sum(-1)\n")
    spec, run = f"{obj}:f", tmp_path / "my run"
    argv = ["bo", "--objective", spec, "--bounds", "0,1 0,1", "--n-init", "3", "--steps", "1"]
    assert _run([*argv, "--out", str(run), "-Q", "--no-plots", *SMALL], capsys)[0] == 0
    path = run / history.CHECKPOINT_FILE
    ckpt = history.load_checkpoint(path)
    history.save_checkpoint(path, {**ckpt, "config": {**ckpt["config"], "device": "cuda:99"}})
    code, _, err = _run(["resume", str(run), "--objective", spec, "-Q", "--no-plots"], capsys)
    assert code == 2, err
    advised = shlex.split(err.split("`")[1])
    assert advised == ["bo-online", "resume", str(run), "--objective", spec, "--device", "cpu"]
    assert _run([*advised[1:], "--steps", "2", "-Q", "--no-plots"], capsys)[0] == 0, err


def test_a_warning_repeated_at_every_step_is_one_line_shown_once(tmp_path, capsys):
    """BoTorch's advice against --acq ei (five lines with tabs) was printed at every step as a
    'bo-online: warning:'; each warning text now shows once per command, on one line."""
    argv = ["bo", "--problem", "branin", "--acq", "ei", "--steps", "3", "--n-init", "4"]
    argv += ["--fit-max-iter", "5", "--num-restarts", "2", "--raw-samples", "16"]
    argv += ["--acqf-maxiter", "5", "-Q", "--no-plots", "--out", str(tmp_path / "run")]
    code, _, err = _run(argv, capsys)
    assert code == 0, err
    lines = err.strip().splitlines()
    shown = [line for line in lines if "ExpectedImprovement has known numerical issues" in line]
    assert len(shown) == 1, err
    assert shown[0].startswith("bo-online: warning: ") and "LogExpectedImprovement" in shown[0]
    assert all(line.startswith("bo-online: ") for line in lines), err


def test_the_memory_checks_of_a_cuda_run_read_the_gpus_memory(monkeypatch):
    """The dense-model and grid-size checks compared a CUDA run's matrices with the host's RAM:
    on a 16 GB card in a 64 GB host an exact GP of n = 40,000 (51 GB in float64) passed the
    check and ran out of GPU memory hours later. They now read the GPU's total memory."""
    from types import SimpleNamespace

    from bo_online.cli import CLIError
    from bo_online.cli import memory as cli

    card = 16 * 10**9
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=card + i)
    )
    monkeypatch.setattr(os, "sysconf", lambda name: 2**20 if name == "SC_PAGE_SIZE" else 2**16)
    assert cli._memory_bytes("cuda") == card and cli._memory_bytes("cuda:1") == card + 1
    assert cli._memory_bytes("cpu") == 2**36  # the host: 64 GiB
    assert cli._memory_bytes("gpu") == 2**36  # not a device: refused later, by its own check
    cli._check_dense_memory("exact", 40_000, "float64")  # fits the host
    with pytest.raises(CLIError, match=r"more than the cuda GPU's 16 GB; use --model tsvgp"):
        cli._check_dense_memory("exact", 40_000, "float64", device="cuda")
    cli._check_dense_memory("exact", 20_000, "float64", device="cuda")  # 12.8 GB fits the card
    grid = {"grid_size": 2_000}  # a 2-D grid of m = 4e6 points: 512 TB, more than either
    with pytest.raises(CLIError, match=r"more than the cuda:1 GPU's 16 GB"):
        cli._check_sizes(grid, 2, "float32", "cuda:1")


def test_thompson_sampling_over_more_candidates_than_memory_holds_is_refused(
    tmp_path, capsys, monkeypatch
):
    """``--acq ts --num-candidates 20000`` needs about 26 GB for its joint posterior sample
    (the exact GP): on a 25 GB machine the run evaluated its initial design, then was killed
    for memory at its first step (under a memory limit: a traceback). A count whose estimate
    exceeds the memory is now refused before anything runs, naming the largest that fits, which
    then runs; float32 halves the estimate."""
    from bo_online.cli import memory as cli

    # 12 x 400^2 x 8 bytes = 15.4 MB > 10 MB; the largest that fits: sqrt(10^7 / 96) = 322
    monkeypatch.setattr(cli, "_memory_bytes", lambda device="cpu": 10**7)
    argv = ["bo", "--problem", "branin", "--steps", "1", "--n-init", "4", *SMALL]
    out = tmp_path / "run"
    code, _, err = _run(
        [*argv, "--acq", "ts", "--num-candidates", "400", "--out", str(out)], capsys
    )
    assert code == 2 and err.count("\n") == 1, err
    assert "over its 400 candidates: about 0.0154 GB" in err and "this machine's 0.01 GB" in err
    assert "give --num-candidates 322 or fewer." in err
    assert not out.exists()
    fits = (
        ["--acq", "ts", "--num-candidates", "322"],
        ["--acq", "ts", "--num-candidates", "400", "--dtype", "float32"],
        ["--acq", "qucb", "--num-candidates", "400"],  # not read by other acquisitions
    )
    for i, extra in enumerate(fits):
        run = tmp_path / f"run{i}"
        code, _, err = _run([*argv, *extra, "-Q", "--no-plots", "--out", str(run)], capsys)
        assert code == 0, err
        assert len((run / "records.jsonl").read_text().splitlines()) == 2


def test_the_thompson_sampling_estimate_bounds_what_its_sample_allocates():
    """:data:`TS_CANDIDATE_MATRICES` against the allocations of one joint sample over 1,500
    candidates, each surrogate as a 6-input BO loop builds it (WISKI: 15 pairs of inputs): at
    most the estimate, and at least the covariance and its factor (2 matrices)."""
    from memory_profile import peak_allocated_bytes

    from bo_online.acquisition import thompson_sample
    from bo_online.cli.memory import TS_CANDIDATE_MATRICES
    from bo_online.loops import BayesOptLoop
    from bo_online.problems import synthetic_problem

    c = 1500
    for model in ("exact", "wiski", "tsvgp", "decoupled", "qsgp", "singletaskgp"):
        loop = BayesOptLoop(
            synthetic_problem("hartmann6"), model=model, n_init=12, fit_max_iter=5, seed=0
        )
        loop.initialize()
        torch.manual_seed(0)
        peak = peak_allocated_bytes(lambda: thompson_sample(loop.model, 3, 6, c, **loop.tkwargs))
        assert 2 * c * c * 8 <= peak <= TS_CANDIDATE_MATRICES * c * c * 8, (model, peak)


def test_a_bad_device_with_a_size_option_is_refused_as_a_bad_device(tmp_path, capsys):
    """With a size option the memory check parsed --device before the device check did."""
    argv = ["bo", "--problem", "branin", "--model", "wiski", "--model-option", "grid_size=10"]
    code, _, err = _run([*argv, "--device", "gpu", "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and "Invalid device 'gpu'" in err and "Traceback" not in err, err
    assert not (tmp_path / "r").exists()


def test_an_absent_cuda_device_is_refused_by_the_device_check_not_the_memory_check(
    tmp_path, capsys, monkeypatch
):
    """On a one-GPU machine the memory check asked for ``cuda:1``'s properties before the run's
    device check: torch's bare ``AssertionError: Invalid device id`` came out as a traceback
    (with the default exact GP, on every ``bo --device cuda:1``). Without CUDA the refusal of a
    too-large grid named the memory as the absent GPU's, giving the host's size."""
    from types import SimpleNamespace

    from bo_online.cli import CLIError
    from bo_online.cli import memory as cli

    def properties(i):  # as torch.cuda.get_device_properties on a machine with one GPU
        if not 0 <= i < 1:
            raise AssertionError("Invalid device id")
        return SimpleNamespace(total_memory=16 * 10**9)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    argv = ["bo", "--problem", "branin", "--device", "cuda:1", "--out", str(tmp_path / "r")]
    code, _, err = _run(argv, capsys)
    assert code == 2 and "this machine has 1 CUDA device(s)" in err, err
    assert "Traceback" not in err and not (tmp_path / "r").exists()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "sysconf", lambda name: 2**20 if name == "SC_PAGE_SIZE" else 2**16)
    with pytest.raises(CLIError, match=r"more than this machine's 68.7 GB"):
        cli._check_sizes({"grid_size": 2_000}, 2, "float32", "cuda")


def test_stream_with_too_large_n_init_or_q_says_which_option_to_lower(tmp_path, capsys):
    r"""A stream cut short by --max-stream (as any shipped set) with --n-init >= its rows, or
    --q above the rows left after them, reached the loop's own errors ("n_init=20 leaves nothing
    to stream (20 points).", "q=25 ...: lower q or n_init."), which name Python arguments and,
    for the first, no way out. Now one line names the options, and nothing is written."""
    rows = [[i / 40, (i * 7 % 40) / 40, float(i % 5)] for i in range(40)]
    data = tmp_path / "mine.csv"
    data.write_text("a,b,y\n" + "".join(f"{a},{b},{y}\n" for a, b, y in rows))
    base = ["stream", "--data", str(data), "--test-fraction", "0.25", "-Q", "--no-plots"]
    out = tmp_path / "run"
    code, _, err = _run([*base, "--max-stream", "20", "--n-init", "20", "--out", str(out)], capsys)
    assert code == 2, err
    assert "--n-init 20 leaves nothing to stream" in err
    assert "has 20 training rows (--max-stream 20); lower --n-init." in err and "n_init=" not in err
    code, _, err = _run([*base, "--n-init", "10", "--q", "25", "--out", str(out)], capsys)
    assert code == 2, err
    assert "--q 25 points per step, but the stream has 20 rows after the 10 initial ones" in err
    assert "lower --q or --n-init." in err
    assert not out.exists()


def test_resume_beyond_the_data_names_the_option(tmp_path, capsys):
    r"""``bo-online resume DIR --steps N`` beyond what a stream holds reached the loop's error,
    "steps=1000 exceeds the 25 steps the data hold", in Python's words. Now one line names
    --steps and the most it can be, and the run is untouched."""
    rows = [[i / 40, (i * 7 % 40) / 40, float(i % 5)] for i in range(40)]
    data = tmp_path / "mine.csv"
    data.write_text("a,b,y\n" + "".join(f"{a},{b},{y}\n" for a, b, y in rows))
    out = tmp_path / "run"
    argv = ["stream", "--data", str(data), "--test-fraction", "0.25", "--n-init", "5"]
    code, _, err = _run([*argv, "--steps", "3", "--out", str(out), "-Q", "--no-plots"], capsys)
    assert code == 0, err
    records = (out / "records.jsonl").read_bytes()
    code, _, err = _run(["resume", str(out), "--steps", "1000", "-Q", "--no-plots"], capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "steps=" not in err, err
    assert "--steps 1000 exceeds the 25 steps the data hold (5 initial points, then --q 1" in err
    assert "give --steps 25 or fewer." in err
    assert (out / "records.jsonl").read_bytes() == records
    code, _, err = _run(["resume", str(out), "--steps", "25", "-Q", "--no-plots"], capsys)
    assert code == 0, err


@pytest.mark.parametrize("when", ["final checkpoint", "summary"])
def test_sigterm_after_the_last_step_says_the_run_finished(tmp_path, capsys, monkeypatch, when):
    r"""SIGTERM while the last step's checkpoint was being written (the write completes: the
    first signal only stops the loop after its step) or while the finished run's summary was
    printed said `terminated; continue the run with bo-online resume DIR`, though the checkpoint
    on disk held every step the run was asked for: nothing was left to continue."""
    import signal

    from bo_online.loops import core, history

    out = tmp_path / "run"
    save = history.save_checkpoint

    def save_and_terminate(path, ckpt):
        save(path, ckpt)
        if when == "final checkpoint" and ckpt["step_count"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(core.history, "save_checkpoint", save_and_terminate)
    if when == "summary":
        from rich.console import Console

        def terminate(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)

        monkeypatch.setattr(Console, "print", terminate)
    argv = ["bo", "--problem", "branin", "--steps", "2", "--no-plots", "--out", str(out)]
    code, _, err = _run([*argv, *SMALL], capsys)
    assert code == 143, err
    assert history.load_checkpoint(out / history.CHECKPOINT_FILE)["step_count"] == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("bo-online: error: terminated after the run finished: all 2 steps"), err
    assert "continue" not in last


def test_sigterm_while_a_finished_run_resumed_shows_its_summary_says_it_finished(
    tmp_path, capsys, monkeypatch
):
    r"""`bo-online resume` of a run whose checkpoint holds every step of its target runs
    nothing and prints the summary; SIGTERM during it said `terminated; continue the run with
    bo-online resume DIR` (the loop knew its checkpoint only once it wrote one, and a resume
    that has nothing to do writes none), advice that again ran nothing."""
    import signal

    from rich.console import Console
    from rich.table import Table

    from bo_online.loops import history

    out = tmp_path / "run"
    argv = ["bo", "--problem", "branin", "--steps", "2", "--no-plots", "--out", str(out)]
    code, _, err = _run([*argv, *SMALL], capsys)
    assert code == 0, err
    show = Console.print

    def terminate(console, *args, **kwargs):  # at the summary table, once the run returned
        if args and isinstance(args[0], Table):
            os.kill(os.getpid(), signal.SIGTERM)
        return show(console, *args, **kwargs)

    monkeypatch.setattr(Console, "print", terminate)
    code, _, err = _run(["resume", str(out), "--no-plots"], capsys)
    assert code == 143, err
    assert history.load_checkpoint(out / history.CHECKPOINT_FILE)["step_count"] == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("bo-online: error: terminated after the run finished: all 2 steps"), err


def test_summary_values_are_read_as_written_from_minus_zero_to_1e20():
    r"""The summary's value format (6 significant digits, fixed point with at least 4 decimals
    from 1 up to 1e15) printed -0.0 as ``-0``; checked by hand at the edges."""
    from bo_online.cli.summary import _fmt_value

    cases = [
        (-0.0, "0"),
        (0.0, "0"),
        (-0.3978873577, "-0.397887"),
        (-1234567.891234, "-1234567.8912"),
        (1e-12, "1e-12"),
        (1e20, "1e+20"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (-float("inf"), "-inf"),
        (1e6 + 0.0123, "1000000.0123"),
        (None, "-"),
    ]
    assert [(v, _fmt_value(v)) for v, _ in cases] == cases


def _summary_rows(loop, capsys) -> tuple[dict[str, str], str]:
    r"""The summary table ``_finish`` prints for ``loop``: ``{row name: value}`` and the text."""
    from bo_online.cli.summary import _finish

    _finish(loop, plots=False, quiet=False)
    out = capsys.readouterr().out
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in out.splitlines()
        if line.count("│") >= 3
    }
    return rows, out


def test_summary_medians_leave_out_failed_asynchronous_evaluations(capsys):
    r"""A failed asynchronous evaluation is a step of its own with an update time of 0 (it adds
    no observation); the summary's median update time counted it, so a run whose evaluations
    failed more often than not showed the median of the failures: 0."""
    from types import SimpleNamespace

    def record(step: int, failed: bool) -> dict:
        return {
            "step": step,
            "n": 3 + step,
            "time_step": 0.5 if failed else 2.0,
            "time_update": 0.0 if failed else 1.0,
            "best_value": 1.0,
            "wall_time": 10.0,
            **({"failed": True} if failed else {}),
        }

    records = [{**record(0, False), "n": 3}] + [record(s, s not in (2, 5)) for s in range(1, 6)]
    loop = SimpleNamespace(
        out_dir=None,
        records=records,
        kind="bo_async",
        problem=SimpleNamespace(name="f", optimal_value=None),
        config={"model": "exact", "q": 1},
        step_count=5,
        elapsed=12.0,
    )
    rows, out = _summary_rows(loop, capsys)
    assert rows["median update time (s)"] == "1" and rows["median time / step (s)"] == "2", out


def test_summary_of_an_asynchronous_run_counts_its_failed_evaluations(capsys):
    r"""An asynchronous run whose objective raised on 5 of its 12 evaluations printed "steps 6"
    and "n (observations) 7" and nothing about the failures, so the numbers did not add up
    (6 initial points + 6 steps, 7 observations). The summary now has the failures' count."""
    from types import SimpleNamespace

    def record(step: int, n: int, failed: bool) -> dict:
        return {
            "step": step,
            "n": n,
            "time_step": 0.5,
            "time_update": 0.1,
            "best_value": 1.0,
            "wall_time": 10.0,
            **({"failed": True} if failed else {}),
        }

    # the records of that run: two of the design's points failed, then steps 1, 2 and 4
    failed = [True, True, True, True, False, True, False, False]
    records = [record(0, 4, False), *(record(max(s - 1, 0), 4, f) for s, f in enumerate(failed))]
    loop = SimpleNamespace(
        out_dir=None,
        records=records,
        kind="bo_async",
        problem=SimpleNamespace(name="f", optimal_value=None),
        config={"model": "exact", "q": 1, "acq": "ts"},
        step_count=6,
        elapsed=12.0,
    )
    rows, out = _summary_rows(loop, capsys)
    assert rows["failed evaluations (not in n)"] == "5", out
    loop.kind, loop.records = "bo", records[:1]  # a synchronous run stops at a failure: no row
    assert "failed evaluations" not in _summary_rows(loop, capsys)[1]
