"""User objectives: batch or per-point functions, failures that name the objective, tell()."""

from __future__ import annotations

import json
import threading
import warnings

import pytest
import torch

from bo_online.errors import ObjectiveError
from bo_online.loops import BayesOptLoop, read_records
from bo_online.objectives import _Vectorised
from bo_online.problems import CallableProblem

X5 = torch.rand(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
EXPECTED = ((X5 - 0.3) ** 2).sum(-1)


def _counting(fn):
    calls = []

    def wrapped(X):
        calls.append(tuple(X.shape))
        return fn(X)

    return wrapped, calls


def test_batch_function_is_called_once_per_batch():
    fn, calls = _counting(lambda X: ((X - 0.3) ** 2).sum(-1))
    v = _Vectorised(fn)
    torch.testing.assert_close(v(X5), EXPECTED)
    torch.testing.assert_close(v(X5[:1]), EXPECTED[:1])
    assert calls == [(5, 2), (1, 2)] and v.per_point is False


def test_per_point_function_that_raises_on_a_batch_is_called_row_by_row_after_a_warning():
    def per_point(x):
        a, b = x  # a d-vector; a 5 x 2 batch cannot be unpacked into two
        return (a - 0.3) ** 2 + (b - 0.3) ** 2

    fn, calls = _counting(per_point)
    v = _Vectorised(fn)
    with pytest.warns(RuntimeWarning, match="raised ValueError.*one point at a time"):
        torch.testing.assert_close(v(X5), EXPECTED)
    assert calls == [(5, 2)] + [(2,)] * 5 and v.per_point is True
    calls.clear()
    torch.testing.assert_close(v(X5[:3]), EXPECTED[:3])
    assert calls == [(2,)] * 3  # decided: no batch call again


def test_per_point_function_returning_one_value_for_a_batch_is_detected():
    fn, calls = _counting(lambda x: ((x - 0.3) ** 2).sum())  # a scalar whatever it gets
    v = _Vectorised(fn)
    with pytest.warns(RuntimeWarning, match="returned 1 value.* 5 x 2 batch.*one point at a"):
        torch.testing.assert_close(v(X5), EXPECTED)
    assert calls == [(5, 2)] + [(2,)] * 5 and v.per_point is True


def test_once_decided_an_exception_propagates_and_nothing_is_called_again():
    state = {"fail": False}

    def flaky(X):
        if state["fail"]:
            raise RuntimeError("instrument offline")
        return ((X - 0.3) ** 2).sum(-1)

    fn, calls = _counting(flaky)
    v = _Vectorised(fn)
    v(X5)
    state["fail"] = True
    with pytest.raises(RuntimeError, match="instrument offline"):
        v(X5)
    assert calls == [(5, 2), (5, 2)]


def _rosenbrock_by_index(x):  # written for one point: indexes coordinates as x[0], x[1]
    return 100.0 * (x[1] - x[0] ** 2) ** 2 + (1.0 - x[0]) ** 2


def _by_iteration(x):  # written for one point: iterates over its coordinates
    return sum((xi - 0.3) ** 2 for xi in x)


def _by_matmul(x):  # written for one point: x @ x is its squared norm
    return (x - 0.3) @ (x - 0.3)


def _rosenbrock_rows(X):
    return 100.0 * (X[:, 1] - X[:, 0] ** 2) ** 2 + (1.0 - X[:, 0]) ** 2


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize(
    "per_point, expected",
    [
        (_rosenbrock_by_index, _rosenbrock_rows),
        (_by_iteration, lambda X: ((X - 0.3) ** 2).sum(-1)),
        (_by_matmul, lambda X: ((X - 0.3) ** 2).sum(-1)),
    ],
)
def test_per_point_functions_that_give_a_batch_the_wrong_count_are_called_row_by_row(
    per_point, expected, n
):
    """On a batch these return d values (rows indexed or iterated instead of coordinates),
    d x d values (``@``), or n values when n == d: every first call -- one point, n == d, any
    n -- must still come out per point and right, and later calls too."""
    X = X5[:n]
    v = _Vectorised(per_point)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the switch's warning: tested below
        torch.testing.assert_close(v(X), expected(X))
        assert v.per_point is (None if n == 2 else True)  # n == d == 2 cannot decide
        torch.testing.assert_close(v(X5), expected(X5))
    assert v.per_point is True


@pytest.mark.parametrize(
    "per_point",
    [
        lambda x: (x[0] - 0.3) ** 2,  # ignores a coordinate: row 0 alone agrees with the batch
        lambda x: torch.maximum(x[0], x[1]),  # saturates: agrees on some rows
        lambda x: torch.relu(x[0] - x[1]) + x[0] ** 2,
    ],
)
def test_at_n_equal_to_d_every_point_is_evaluated_alone_and_right(per_point):
    """n == d: a per-point function's batch call can return n plausible values (here rows
    where coordinates were meant); the points are evaluated one at a time instead, so the
    values are right whatever the function does with the other coordinates."""
    X = X5[:2]
    expected = torch.stack([torch.as_tensor(per_point(x), dtype=torch.float64) for x in X])
    fn, calls = _counting(per_point)
    v = _Vectorised(fn)
    torch.testing.assert_close(v(X), expected)
    assert calls == [(2,), (2,)] and v.per_point is None


def test_at_n_equal_to_d_a_batch_function_evaluates_each_point_once():
    """A noisy or expensive batch function at n == d: one call per point (as a d-vector, or as a
    1 x d batch when it needs rows), none twice; the kind is decided at a later batch."""
    draws = iter(range(100))

    def noisy(X):  # a batch function whose every call gives new noise
        return ((X - 0.3) ** 2).sum(-1) + 1e-3 * next(draws)

    fn, calls = _counting(noisy)
    v = _Vectorised(fn)
    values = v(X5[:2])
    assert calls == [(2,), (2,)] and v.per_point is None
    torch.testing.assert_close(
        values, EXPECTED[:2] + torch.tensor([0.0, 1e-3], dtype=torch.float64)
    )
    rows_only, calls = _counting(lambda X: (X[:, 0] - 0.3) ** 2 + (X[:, 1] - 0.3) ** 2)
    v = _Vectorised(rows_only)  # raises on a d-vector: each point goes as 1 x d
    torch.testing.assert_close(v(X5[:2]), EXPECTED[:2])
    assert calls == [(2,), (1, 2), (2,), (1, 2)] and v.per_point is None
    torch.testing.assert_close(v(X5), EXPECTED)
    assert calls[-1] == (5, 2) and v.per_point is False


def test_wrong_number_of_values_is_an_objective_error():
    two_outputs = _Vectorised(lambda X: torch.stack([X.sum(-1), X.prod(-1)], -1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "one point at a time from now on": neither worked
        with pytest.raises(
            ObjectiveError,
            match=r"returned 2 values for one point.*it returned 10 value\(s\) on a 5 x 2 batch",
        ):
            two_outputs(X5)  # neither a batch nor a per-point function: both counts said
    assert two_outputs.per_point is None
    v = _Vectorised(lambda X: ((X - 0.3) ** 2).sum(-1))
    v(X5)
    v.fn = lambda X: X.sum()
    with pytest.raises(ObjectiveError, match="returned 1 values for 5 point"):
        v(X5)


def test_problem_names_the_objective_the_exception_and_the_users_frame():
    def broken(X):
        return X.sum(-1) / 0 + {}["missing"]

    problem = CallableProblem(broken, [[0, 0], [1, 1]], name="broken")
    with pytest.raises(ObjectiveError, match=r"'broken' raised KeyError: 'missing' \(at test_obj"):
        problem.evaluate_true(X5)

    def with_nan(X):
        out = X.sum(-1)
        out[3] = float("nan")
        return out

    problem = CallableProblem(with_nan, [[0, 0], [1, 1]], name="with_nan")
    with pytest.raises(ObjectiveError, match=r"returned nan at \[.*\] \(1 of 5 value"):
        problem.evaluate_true(X5)

    problem = CallableProblem(_Vectorised(lambda X: X), [[0, 0], [1, 1]], name="identity")
    with pytest.raises(ObjectiveError, match="^Objective 'identity' returned 2 values for one"):
        problem.evaluate_true(X5)

    def huge(X):  # finite, but beyond what a float64 model can standardise
        out = X.sum(-1)
        out[2] = 1e200
        return out

    problem = CallableProblem(huge, [[0, 0], [1, 1]], name="huge")
    expected = r"^Objective 'huge' returned 1e\+200 at \[.*\] \(1 of 5 value.*Rescale"
    with pytest.raises(ObjectiveError, match=expected):
        problem.evaluate_true(X5)
    inner = CallableProblem(with_nan, [[0, 0], [1, 1]], name="sim")
    outer = CallableProblem(inner.evaluate_true, [[0, 0], [1, 1]], name="outer")
    with pytest.raises(ObjectiveError, match=r"^Objective 'sim' returned nan") as caught:
        outer.evaluate_true(X5)
    assert "outer" not in str(caught.value)  # named once, by the problem that called it

    def out_of_memory(X):  # an exception without a message: 'raised MemoryError: (at ...'
        raise MemoryError

    problem = CallableProblem(out_of_memory, [[0, 0], [1, 1]], name="oom")
    with pytest.raises(ObjectiveError, match=r"^Objective 'oom' raised MemoryError \(at test_obj"):
        problem.evaluate_true(X5)


def _ask_tell_loop(X0=None):
    r"""An ask/tell loop (q = 3, the exact GP) on the unit box of ``X0``'s columns, started from
    ``X0`` (default 6 random 2-D points) and ``sum((x - 0.3)^2)`` there."""
    if X0 is None:
        X0 = torch.rand(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    d = X0.shape[-1]
    return BayesOptLoop(
        CallableProblem(None, [[0] * d, [1] * d]),
        initial_data=(X0, ((X0 - 0.3) ** 2).sum(-1)),
        n_init=0,
        model="exact",
        acq="qucb",
        q=3,
        seed=0,
        optimizer_options={"num_restarts": 2, "raw_samples": 32},
    )


def test_tell_refuses_a_transposed_batch_and_nonfinite_values_and_changes_nothing():
    loop = _ask_tell_loop()
    X = loop.ask()  # 3 x 2
    y = ((X - 0.3) ** 2).sum(-1)
    n_model, records = loop.model.num_data, len(loop.records)
    bad = (
        ((X.T, y), r"X of shape q x 2 .* got shape \(2, 3\)"),
        ((X[:, :1], y), r"got shape \(3, 1\)"),
        ((X, y[:2]), r"got 3 point\(s\) but y of shape \(2,\)"),
        ((X, torch.tensor([0.1, float("nan"), 0.2])), r"NaN/inf in y at row\(s\) \[1\]"),
        ((X, y, torch.tensor([0.1, float("inf"), 0.2])), r"NaN/inf in y_true at row\(s\) \[1\]"),
    )
    for args, message in bad:
        with pytest.raises(ValueError, match=message):
            loop.tell(*args)
        assert loop.model.num_data == n_model and len(loop.records) == records
        assert loop.X.shape == (6, 2)
    loop.tell(X, y.unsqueeze(-1), y)  # q x 1 values are fine
    assert loop.X.shape == (9, 2) and loop.records[-1]["best_true_value"] is not None
    one = loop.ask()[0]
    loop.tell(one, ((one - 0.3) ** 2).sum())  # one point as a d-vector, a scalar value
    assert loop.X.shape == (10, 2) and torch.equal(loop.X[-1], one)


def test_tell_with_one_input_takes_q_values_as_q_points():
    loop = _ask_tell_loop(torch.linspace(0.05, 0.95, 5, dtype=torch.float64).unsqueeze(-1))
    x = loop.ask().squeeze(-1)  # q = 3 values of the one input
    loop.tell(x, (x - 0.3) ** 2)
    assert loop.X.shape == (8, 1) and torch.equal(loop.X[-3:, 0], x)


def _cli(argv, capsys):
    from bo_online.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_cli_objective_failure_is_one_line_with_the_right_way_on(tmp_path, capsys):
    flag = tmp_path / "offline"
    (tmp_path / "obj.py").write_text(
        "import pathlib\n"
        "def f(X):\n"
        f"    if pathlib.Path({str(flag)!r}).exists():\n"
        "        raise RuntimeError('instrument offline')\n"
        "    return ((X - 0.3) ** 2).sum(-1)\n"
    )
    spec = f"{tmp_path / 'obj.py'}:f"
    run = tmp_path / "run"
    common = ["-Q", "--no-plots", "--num-restarts", "2", "--raw-samples", "32"]
    argv = ["bo", "--objective", spec, "--bounds", "0,1 0,1", "--steps", "1", "--out", str(run)]
    flag.touch()  # fails in the initial design: nothing is kept, the same command reruns
    code, err = _cli(argv + common, capsys)
    lines = [line for line in err.splitlines() if line.startswith("bo-online: error:")]
    assert code == 1 and len(lines) == 1, err
    assert "'f' raised RuntimeError: instrument offline (at obj.py:4)" in lines[0]
    assert "run the same command again" in lines[0] and not run.exists()
    flag.unlink()
    assert _cli(argv + common, capsys)[0] == 0
    flag.touch()  # fails later: the run resumes, and the hint gives the --objective it needs
    resume = ["resume", str(run), "--steps", "3", "--objective", spec, "-Q", "--no-plots"]
    code, err = _cli(resume, capsys)
    assert code == 1
    assert f"continue the run with `bo-online resume {run} --objective {spec}`" in err
    flag.unlink()
    assert _cli(resume, capsys)[0] == 0


def test_cli_prints_the_switch_to_per_point_calls_as_one_warning_line(tmp_path, capsys):
    (tmp_path / "obj.py").write_text(
        "def rosen(x):  # one point: indexes coordinates\n"
        "    return 100.0 * (x[1] - x[0] ** 2) ** 2 + (1.0 - x[0]) ** 2\n"
    )
    argv = ["bo", "--objective", f"{tmp_path / 'obj.py'}:rosen", "--bounds", "-2,2 -1,3"]
    argv += ["--steps", "1", "--out", str(tmp_path / "run"), "-Q", "--no-plots"]
    code, err = _cli(argv + ["--num-restarts", "2", "--raw-samples", "32"], capsys)
    lines = [line for line in err.splitlines() if "warning" in line.lower()]
    assert code == 0 and lines == [
        "bo-online: warning: The objective returned 2 value(s) on a 5 x 2 batch; calling it one "
        "point at a time from now on. (RuntimeWarning)"
    ], err


def test_bounds_that_are_not_numbers_or_whose_width_overflows_are_refused():
    from bo_online.objectives import parse_bounds

    for raw in ("[[null, 1], [0, 1]]", '[["0", "1"], [0, 1]]', "[[-1e308, 1e308], [0, 1]]"):
        with pytest.raises(ValueError, match="--bounds"):
            parse_bounds(raw)
    # JSON true / false were taken as 1 / 0
    with pytest.raises(ValueError, match=r"--bounds must hold numbers only.*true / false"):
        parse_bounds("[[false, true], [0, 1]]")
    with pytest.raises(ValueError, match="lower < upper .* width"):
        CallableProblem(lambda X: X.sum(-1), bounds=[[-1e308, 0], [1e308, 1]])


def test_bounds_refused_name_the_dimension_at_fault_and_infinity():
    r"""lo >= hi said only "in every dimension", leaving the user to find which of d pairs was
    wrong; '[[0, inf]]' (not JSON, which has no inf) was told it was not a JSON list."""
    from bo_online.objectives import parse_bounds

    with pytest.raises(ValueError, match=r"dimension 2 has lo = 5, hi = -5"):
        parse_bounds("[[0, 1], [5, -5], [0, 1]]")
    with pytest.raises(ValueError, match=r"dimension 3 has lo = 2, hi = 2"):
        parse_bounds("0,1 -5,5 2,2")
    with pytest.raises(ValueError, match=r"--bounds need finite numbers \(a box\)"):
        parse_bounds("[[0, inf], [0, 1]]")
    with pytest.raises(ValueError, match=r"dimension 1 has lo = 0, hi = nan"):  # Python's JSON
        parse_bounds("[[0, NaN]]")
    with pytest.raises(ValueError, match=r"dimension 2 has lo = -inf, hi = 5"):  # 'lo,hi' form
        parse_bounds("0,1 -inf,5")
    torch.testing.assert_close(  # a good box still reads as 2 x d
        parse_bounds("0,1 -5,5"), torch.tensor([[0.0, -5.0], [1.0, 5.0]], dtype=torch.float64)
    )


def test_a_relative_objective_path_is_stored_absolute_and_resumes_from_anywhere(
    tmp_path, monkeypatch, capsys
):
    """A run of `--objective obj/f.py:fn` (relative) resumes from another working directory with
    the relative path from there, the absolute path, or what the run prints."""
    (tmp_path / "obj").mkdir()
    (tmp_path / "obj" / "f.py").write_text("def fn(X):\n    return ((X - 0.3) ** 2).sum(-1)\n")
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    common = ["-Q", "--no-plots", "--num-restarts", "2", "--raw-samples", "32"]
    argv = ["bo", "--objective", "obj/f.py:fn", "--bounds", "0,1 0,1", "--steps", "1"]
    assert _cli(argv + ["--out", str(run)] + common, capsys)[0] == 0
    stored = json.loads((run / "config.json").read_text())
    assert str(tmp_path / "obj" / "f.py") in json.dumps(stored)
    monkeypatch.chdir(tmp_path / "obj")
    for steps, spec in ((2, "f.py:fn"), (3, f"{tmp_path / 'obj' / 'f.py'}:fn")):
        resume = [
            "resume",
            str(run),
            "--steps",
            str(steps),
            "--objective",
            spec,
            "-Q",
            "--no-plots",
        ]
        code, err = _cli(resume, capsys)
        assert code == 0, err


def test_a_file_objective_reaches_processes_that_cannot_import_its_file(tmp_path):
    """``--objective path/f.py:fn`` with ``--dask``: the workers unpickle the task in a fresh
    process, where the module name the file was loaded under does not exist. Its code must
    travel with the function (before, every worker died unpickling it and the run hung)."""
    import subprocess
    import sys

    import cloudpickle

    from bo_online.objectives import load_objective

    (tmp_path / "my_objective.py").write_text(
        "import torch\nOFFSET = 0.25\ndef f(X):\n    return ((X - OFFSET) ** 2).sum(-1)\n"
    )
    fn = load_objective(f"{tmp_path / 'my_objective.py'}:f")
    payload = tmp_path / "task.pkl"
    payload.write_bytes(cloudpickle.dumps(fn))
    code = (
        "import pickle, sys, torch\n"
        "fn = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "print(float(fn(torch.tensor([[0.5, 1.25]], dtype=torch.float64))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(payload)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip()) == pytest.approx(0.25**2 + 1.0**2)


def test_an_objective_that_cannot_be_pickled_is_refused_before_anything_runs(tmp_path):
    """An objective holding a lock (or an open file, a connection) cannot reach worker
    processes. Before, the run started and its first evaluation failed inside the executor with
    a serialisation traceback (Dask's: ``Could not serialize object of type LLGExpr``); now the
    loop refuses it at construction, says what to do, evaluates nothing and writes nothing."""
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    from distributed import Client

    calls = []
    lock = threading.Lock()

    def f(X):
        calls.append(X.shape[0])
        with lock:
            return ((X - 0.3) ** 2).sum(-1)

    problem = CallableProblem(_Vectorised(f), torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    process_pool = ProcessPoolExecutor(max_workers=1)  # starts no process until a submit
    client = Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None)
    try:
        for executor, where in ((process_pool, "worker processes"), (client, "Dask workers")):
            out = tmp_path / where.replace(" ", "_")
            with pytest.raises(ValueError, match=f"cannot be sent to the {where}.*_thread.lock"):
                BayesOptLoop(problem, executor=executor, out_dir=out, n_init=3)
            assert not out.exists() and not calls
    finally:
        client.close()
        process_pool.shutdown()
    # A thread pool shares the process: the same objective runs there.
    with ThreadPoolExecutor(max_workers=1) as pool:
        loop = BayesOptLoop(problem, executor=pool, n_init=3, model="exact")
        loop.initialize()
    assert sum(calls) == 3


def test_a_failing_batch_objective_reports_its_own_error_once_undecided():
    """Asked for one point before its kind is known (every async evaluation is a fresh copy of
    the wrapper), a batch objective that fails is tried per point as well; the error reported
    is its own, not what it does with a d-vector, and no per-point warning is given."""
    calls = []

    def diverges(X):
        calls.append(tuple(X.shape))
        if bool((X[:, 0] > 0.5).any()):
            raise RuntimeError("simulation diverged")
        return X.sum(-1)

    wrapped = _Vectorised(diverges)
    problem = CallableProblem(wrapped, [[0, 0], [1, 1]], name="sim")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ObjectiveError, match="'sim' raised RuntimeError: simulation diverged"):
            problem.evaluate_true(torch.tensor([[0.9, 0.1]], dtype=torch.float64))
    assert calls == [(1, 2), (2,)] and wrapped.per_point is None
    assert float(problem.evaluate_true(torch.tensor([[0.25, 0.5]], dtype=torch.float64))) == 0.75


def test_an_undecided_per_point_objective_that_fails_reports_its_own_error_too():
    """Review finding: with the batch error alone, a per-point objective that fails on a single
    point was reported as the batch call's unpacking error; both are named now, and once one
    point worked per point, the per-point error alone (a missing return)."""

    def crashes(x):
        a, b = x
        raise RuntimeError("simulator crashed")

    problem = CallableProblem(_Vectorised(crashes), [[0, 0], [1, 1]], name="sim")
    with pytest.raises(ObjectiveError, match="simulator crashed") as info:
        problem.evaluate_true(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    assert "ValueError" in str(info.value)  # the batch call's error, named as such

    def forgets_a_return(x):
        a, b = x
        if float(a) < 0.5:
            return float(a + b)

    problem = CallableProblem(_Vectorised(forgets_a_return), [[0, 0], [1, 1]], name="f")
    X = torch.tensor([[0.1, 0.2], [0.9, 0.2], [0.3, 0.3]], dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="one point at a time"):
        with pytest.raises(ObjectiveError, match="returned None instead of one value"):
            problem.evaluate_true(X)


def test_values_as_a_list_of_tensors_with_autograd_are_accepted():
    """The complex-value check must not call numpy() on tensors that carry a graph."""
    w = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    problem = CallableProblem(lambda X: [(x * w).sum() ** 2 for x in X], [[0, 0], [1, 1]])
    values = problem.evaluate_true(torch.tensor([[0.5, 0.25], [1.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(values, torch.tensor([2.25, 4.0], dtype=torch.float64))


def test_a_batch_objective_returning_too_few_values_is_reported_as_such():
    """A batch objective that drops a value (n - 1 for n points) is tried point by point, where
    it fails on a d-vector it never expected; the run stopped with that error alone ('raised
    IndexError: slice() cannot be applied to a 0-dim tensor'), hiding the wrong count of the
    batch call. Both are named now, as when the batch call raises."""

    def drops_one(X):
        return (X**2).sum(-1)[: max(1, X.shape[0] - 1)]

    wrapped = _Vectorised(drops_one)
    problem = CallableProblem(wrapped, [[0, 0], [1, 1]], name="f")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "one point at a time from now on": neither worked
        with pytest.raises(ObjectiveError) as info:
            problem.evaluate_true(X5)
    assert "returned 4 values for the 5 x 2 batch" in str(info.value)
    assert "and raised IndexError: slice() cannot be applied to a 0-dim tensor" in str(info.value)
    assert "when called one point at a time" in str(info.value)
    assert wrapped.per_point is None


def test_a_module_objective_whose_import_fails_is_one_line(tmp_path, monkeypatch, capsys):
    """`--objective package.module:f` whose module raises on import (a syntax error, a
    RuntimeError at module level) ended in a traceback: only ImportError was caught, while the
    file.py form reports any failure of the import in one line."""
    (tmp_path / "broken_pkg").mkdir()
    (tmp_path / "broken_pkg" / "__init__.py").write_text("raise RuntimeError('no licence')\n")
    (tmp_path / "typo_mod.py").write_text("def f(X:\n    return X.sum(-1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    failures = (("broken_pkg:f", "RuntimeError: no licence"), ("typo_mod:f", "SyntaxError"))
    for spec, error in failures:
        argv = ["bo", "--objective", spec, "--bounds", "0,1", "--out", str(tmp_path / "run")]
        code, err = _cli(argv, capsys)
        assert code == 2, err
        assert err.count("\n") == 1 and err.startswith("bo-online: error: "), err
        assert f"Importing module {spec.split(':')[0]!r} for --objective failed" in err, err
        assert error in err, err
        assert not (tmp_path / "run").exists()


def test_a_file_objective_imports_the_modules_beside_it(tmp_path, monkeypatch):
    """`--objective dir/obj.py:f` where obj.py imports a helper module from its own folder (as
    `python dir/obj.py` can) failed with ModuleNotFoundError unless the folder was on
    PYTHONPATH. The folder now goes first on sys.path and on PYTHONPATH (which a local Dask
    cluster's workers inherit); a file that fails to import leaves both as they were."""
    import os
    import sys

    from bo_online.objectives import load_objective

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delitem(sys.modules, "obj_helper_scale", raising=False)
    folder = tmp_path / "my_experiments"
    folder.mkdir()
    (folder / "obj_helper_scale.py").write_text("SCALE = 3.0\n")
    (folder / "obj.py").write_text(
        "import obj_helper_scale\n\ndef f(X):\n    return obj_helper_scale.SCALE * X.sum(-1)\n"
    )
    fn = load_objective(f"{folder / 'obj.py'}:f")
    X = torch.tensor([[0.25, 0.5], [1.0, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(fn(X), 3.0 * X.sum(-1))
    assert sys.path[0] == str(folder.resolve())
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(folder.resolve())
    sys.modules.pop("obj_helper_scale")

    other = tmp_path / "broken"
    other.mkdir()
    (other / "obj.py").write_text("import no_such_module_beside_it\n")
    before_path, before_env = list(sys.path), os.environ["PYTHONPATH"]
    with pytest.raises(ValueError, match="ModuleNotFoundError"):
        load_objective(f"{other / 'obj.py'}:f")
    assert sys.path == before_path and os.environ["PYTHONPATH"] == before_env


def test_a_resume_after_the_objective_file_changed_says_so(tmp_path, capsys):
    """A file objective edited between a run's start and its resume (a fixed bug, or another
    function entirely) resumed silently: the path was compared, not the code. Its SHA-256 is
    now stored in the run's config, and a resume from a changed file warns in one line (it is
    not refused: fixing the objective is how a failed run goes on). An unchanged file, and a
    resume that passes the same spec, say nothing."""
    obj = tmp_path / "obj.py"
    obj.write_text("def f(X):\n    return ((X - 0.3) ** 2).sum(-1)\n")
    spec, run = f"{obj}:f", tmp_path / "run"
    common = ["-Q", "--no-plots", "--num-restarts", "2", "--raw-samples", "32"]
    argv = ["bo", "--objective", spec, "--bounds", "0,1 0,1", "--steps", "1", "--out", str(run)]
    assert _cli(argv + common, capsys)[0] == 0
    config = json.loads((run / "config.json").read_text())
    assert len(config["objective"]["objective_sha256"]) == 64
    resume = ["resume", str(run), "--objective", spec, "-Q", "--no-plots"]
    code, err = _cli([*resume, "--steps", "2"], capsys)
    assert code == 0 and "warning" not in err, err
    obj.write_text("def f(X):\n    return ((X - 0.7) ** 2).sum(-1)\n")
    code, err = _cli([*resume, "--steps", "3"], capsys)
    lines = [line for line in err.splitlines() if "warning" in line]
    assert code == 0 and len(lines) == 1, err
    assert f"{obj} has changed since the run last started or resumed" in lines[0]
    assert "the records so far came from the earlier version" in lines[0]


def test_a_worker_process_that_dies_in_the_objective_is_one_line(tmp_path, capsys, monkeypatch):
    # A crash in compiled code, os._exit or the out-of-memory killer ends the worker process:
    # the pool's BrokenProcessPool came out as a traceback.
    calls = tmp_path / "calls"
    (tmp_path / "obj.py").write_text(
        "import os, pathlib\n"
        "def f(X):\n"
        f"    calls = pathlib.Path({str(calls)!r})\n"
        "    with calls.open('a') as fh:\n"
        "        fh.write('.')\n"
        "    if len(calls.read_text()) > int(os.environ.get('BO_TEST_LIVES', '4')):\n"
        "        os._exit(3)\n"
        "    return ((X - 0.3) ** 2).sum(-1)\n"
    )
    spec = f"{tmp_path / 'obj.py'}:f"
    run = tmp_path / "run"
    argv = ["bo", "--objective", spec, "--bounds", "0,1 0,1", "--steps", "2", "--out", str(run)]
    argv += ["-Q", "--no-plots", "--num-restarts", "2", "--raw-samples", "32"]
    argv += ["--n-init", "4", "--workers", "1"]
    code, err = _cli(argv, capsys)  # dies in the first step (each point is one task)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("bo-online: error: Objective 'f': the worker process evaluating")
    assert f"continue the run with `bo-online resume {run} --objective {spec}" in lines[0]
    assert len(read_records(run)) == 1  # the initial design, kept
    calls.unlink()
    monkeypatch.setenv("BO_TEST_LIVES", "2")  # dies in the initial design: nothing is kept
    code, err = _cli(argv + ["--overwrite"], capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert "the worker process evaluating it died" in lines[0]
    assert "run the same command again (nothing was kept" in lines[0]


def test_resuming_a_run_of_a_python_callable_with_objective_says_to_resume_from_python(
    tmp_path, capsys
):
    # It said "This run is not of a user objective; resume it without --objective", and
    # without it, to resume from Python: two answers that contradict each other.
    (tmp_path / "obj.py").write_text("def f(X):\n    return ((X - 0.3) ** 2).sum(-1)\n")
    run = tmp_path / "run"
    problem = CallableProblem(lambda X: ((X - 0.3) ** 2).sum(-1), bounds=[[0, 0], [1, 1]])
    BayesOptLoop(
        problem, n_init=4, acq="ts", acq_options={"num_candidates": 64}, out_dir=run, quiet=True
    ).run(1)
    resume = ["resume", str(run), "--objective", f"{tmp_path / 'obj.py'}:f", "-Q", "--no-plots"]
    code, err = _cli(resume, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "not of a user objective" not in lines[0]
    assert "objective is a Python callable" in lines[0]
    assert f"bo_online.loops.resume({str(run)!r}, problem=problem)" in lines[0]


def test_a_failure_in_a_worker_process_names_the_line_of_the_objective_file(tmp_path, capsys):
    # The file's code reaches the workers through cloudpickle, which names its frames
    # <dynamic-code>: the line said "(at <dynamic-code>:2)".
    (tmp_path / "obj.py").write_text(
        "def check(X):\n    raise ValueError('bad point')\ndef f(X):\n    return check(X)\n"
    )
    argv = ["bo", "--objective", f"{tmp_path / 'obj.py'}:f", "--bounds", "0,1 0,1"]
    argv += ["--steps", "1", "--n-init", "4", "--out", str(tmp_path / "run"), "-Q", "--no-plots"]
    code, err = _cli(argv + ["--workers", "1"], capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert "'f' raised ValueError: bad point (at obj.py:2) on 1 point(s)" in lines[0]


def test_an_objective_that_writes_into_its_points_is_evaluated_at_the_points_given():
    # The batch call that finds out the kind shifted the points the per-point calls then got:
    # a per-point `x -= 0.3` was evaluated at X - 0.6.
    def per_point(x):
        x -= 0.3
        return float((x**2).sum())

    def batch(X):  # a batch function that shifts first, then fails on a d-vector (n == d)
        X -= 0.3
        return (X**2).sum(1)

    problem = CallableProblem(_Vectorised(per_point), bounds=[[0, 0], [1, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the switch to per-point calls
        torch.testing.assert_close(problem.evaluate_true(X5), EXPECTED)
    problem = CallableProblem(_Vectorised(batch), bounds=[[0, 0], [1, 1]])
    torch.testing.assert_close(problem.evaluate_true(X5[:2]), EXPECTED[:2])


def test_loading_a_run_of_an_objective_spec_without_its_problem_says_how_to_resume_it(
    tmp_path, capsys
):
    # It said the run's objective was a Python callable that `bo-online resume` cannot
    # rebuild, when `bo-online resume --objective SPEC` does.
    from bo_online.loops import load_loop
    from bo_online.objectives import objective_problem

    (tmp_path / "obj.py").write_text("def f(X):\n    return ((X - 0.3) ** 2).sum(-1)\n")
    spec, run = f"{tmp_path / 'obj.py'}:f", tmp_path / "run"
    argv = ["bo", "--objective", spec, "--bounds", "0,1 -5,5", "--maximize", "--steps", "1"]
    argv += ["--n-init", "4", "--acq", "ts", "--num-candidates", "64", "--out", str(run)]
    assert _cli(argv + ["-Q", "--no-plots"], capsys)[0] == 0
    with pytest.raises(ValueError) as e:
        load_loop(run)
    message = str(e.value)
    assert "Python callable" not in message
    assert f"`bo-online resume {run} --objective {spec}`" in message
    call = message.split("problem=")[1].removesuffix(".")
    assert call.startswith("bo_online.objectives.objective_problem(")
    problem = eval(
        call.replace("bo_online.objectives.", ""), {"objective_problem": objective_problem}
    )
    loop = load_loop(run, problem=problem, quiet=True)  # the problem it names resumes the run
    assert loop.step_count == 1 and loop.problem.maximize
    loop._lock.release()
    # another objective file on the same box was accepted from Python (the CLI compares specs)
    from bo_online.userdata import DataChangedError

    (tmp_path / "other.py").write_text("def f(X):\n    return X.sum(-1)\n")
    other = objective_problem(f"{tmp_path / 'other.py'}:f", "0,1 -5,5", maximize=True)
    with pytest.raises(DataChangedError, match="resumes only with the objective it started"):
        load_loop(run, problem=other, quiet=True)


def test_a_module_objective_beside_the_user_that_is_not_importable_names_its_file_form(
    tmp_path, monkeypatch, capsys
):
    # `bo-online` (a console script) does not put the working directory on the import path, as
    # `python -m bo_online.cli` does: `--objective obj:f` beside obj.py said only "No module
    # named 'obj'".
    import os
    import sys

    (tmp_path / "obj_beside.py").write_text("def f(X):\n    return X.sum(-1)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    argv = ["bo", "--objective", "obj_beside:f", "--bounds", "0,1", "--out", str(tmp_path / "r")]
    code, err = _cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "No module named 'obj_beside'" in err
    assert "pass --objective obj_beside.py:f, or add . to PYTHONPATH" in err
    assert not (tmp_path / "r").exists()


def _bowl(X):
    return ((X - 0.3) ** 2).sum(-1)


def test_points_and_values_cross_to_an_executor_as_plain_data():
    # Tensors crossed to --workers processes through torch's file-descriptor sharing, whose
    # server thread printed an EOFError traceback under the one-line error when a failing
    # objective shut the pool down mid-transfer.
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    sent = []

    class Recording(ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            future = super().submit(fn, *args, **kwargs)
            sent.append((args, future))
            return future

    problem = CallableProblem(_bowl, bounds=[[0, 0], [1, 1]])
    kw = dict(n_init=4, acq="ts", acq_options={"num_candidates": 64}, q=2, seed=3)
    with Recording(max_workers=2) as pool:
        pooled = BayesOptLoop(problem, executor=pool, **kw).run(1)
    assert len(sent) == 6
    for args, future in sent:
        assert not any(torch.is_tensor(a) for a in args) and isinstance(future.result(), list)
    alone = BayesOptLoop(problem, **kw).run(1)  # the same values, to the last bit
    assert [r["y"] for r in pooled] == [r["y"] for r in alone]

    class RecordingProcesses(ProcessPoolExecutor):  # the problem's box is a tensor too
        def submit(self, fn, *args, **kwargs):
            sent.append((args, None))
            return super().submit(fn, *args, **kwargs)

    sent.clear()
    problem = CallableProblem(_Vectorised(_bowl), bounds=[[0, 0], [1, 1]])
    with RecordingProcesses(max_workers=1) as pool:
        processed = BayesOptLoop(problem, executor=pool, **kw).run(1)
    assert len(sent) == 6 and all(isinstance(args[0], bytes) for args, _ in sent)
    assert [r["y"] for r in processed] == [r["y"] for r in alone]


def test_cli_bounds_left_unquoted_are_told_to_be_quoted(tmp_path, capsys):
    r"""`--bounds 0,1 0,1 0,1` without quotes (the shell splits it) said only "Got unexpected
    extra argument(s) (0,1 0,1)", and `--bounds 0,1 -5,5` "No such option: -5": the pairs read
    as mistakes of their own, not of the quoting. The line now gives the quoted form."""
    (tmp_path / "obj.py").write_text("def f(X):\n    return X.sum(-1)\n")
    spec = f"{tmp_path / 'obj.py'}:f"
    pairs = ["0,1", "-5,5", "2,3"]
    for bounds in (["--bounds", *pairs], [f"--bounds={pairs[0]}", *pairs[1:]]):
        argv = ["bo", "--objective", spec, *bounds, "--steps", "1", "--out", str(tmp_path / "r")]
        code, err = _cli(argv + ["-Q"], capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert "--bounds takes one value: quote it, --bounds '0,1 -5,5 2,3'" in err, err
        assert not (tmp_path / "r").exists()
    pairs = ["0,1", "0,1", "2,3"]  # no negative number: "unexpected extra argument(s)"
    argv = ["bo", "--objective", spec, "--bounds", *pairs, "--out", str(tmp_path / "r")]
    code, err = _cli(argv, capsys)
    assert code == 2 and "unexpected extra argument" in err, err
    assert "quote it, --bounds '0,1 0,1 2,3'" in err and not (tmp_path / "r").exists()
    # another stray argument gets no advice about --bounds
    argv = ["bo", "--objective", spec, "--bounds", "0,1 -5,5", "stray", "--out", str(tmp_path)]
    code, err = _cli(argv, capsys)
    assert code == 2 and "unexpected extra argument" in err and "quote" not in err, err


def test_a_problem_without_objective_and_no_initial_data_says_to_pass_your_data(tmp_path):
    r"""``BayesOptLoop(CallableProblem(None, bounds)).ask()`` (ask/tell, no ``initial_data``)
    failed in ``ask`` with "evaluate the points of ask() yourself": the ask that raised it
    proposed nothing. The loop must evaluate its Sobol design before the first proposal, which
    needs an objective: the error says to start from points of your own, and nothing is
    written."""
    problem = CallableProblem(None, bounds=[[0.0, 0.0], [1.0, 1.0]])
    loop = BayesOptLoop(problem, quiet=True, out_dir=tmp_path / "run")
    with pytest.raises(ValueError) as e:
        loop.ask()
    message = str(e.value)
    assert "no objective to call" in message and "initial design of 5 Sobol points" in message
    assert "initial_data=(X, y), n_init=0" in message and "points of ask()" not in message
    assert not (tmp_path / "run").exists() and not loop.initialized
