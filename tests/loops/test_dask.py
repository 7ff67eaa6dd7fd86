"""Asynchronous BO and campaign sweeps on a real Dask LocalCluster (2 single-threaded worker
processes, shared by the module's tests)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import torch

distributed = pytest.importorskip("distributed")

from bo_online.loops import BayesOptLoop, history, load_loop  # noqa: E402
from bo_online.loops.async_bo import (  # noqa: E402
    AsyncBayesOptLoop,
    NoWorkers,
    SlowProblem,
    TooManyFailures,
)
from bo_online.problems import Problem, synthetic_problem  # noqa: E402
from bo_online.sweep import run_sweep  # noqa: E402

# The objectives below live in this test module, which the workers cannot import: ship by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

FAST = dict(
    n_init=5,
    refit_every=4,
    fit_max_iter=5,
    init_fit_max_iter=20,
    optimizer_options={"num_restarts": 2, "raw_samples": 32, "maxiter": 20},
)


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    with distributed.Client(cluster) as c:
        c.run(__import__, "bo_online.problems")  # warm the workers up once
        yield c
    cluster.close()


def _evaluations(records):
    return [r for r in records if r["step"] > 0 and "proposal" in r and not r["failed"]]


def _dense_posterior(model, X, Y, Xs):
    """Exact-GP posterior by hand (dense Cholesky) with ``model``'s hyperparameters."""
    with torch.no_grad():
        om, os_ = model.outcome_mean.reshape(()), model.outcome_std.reshape(())
        c = model.mean_module.constant.reshape(())
        noise = model.likelihood.noise.reshape(())
        K = model.covar_module(X).to_dense() + noise * torch.eye(X.shape[0], dtype=X.dtype)
        Ks = model.covar_module(Xs, X).to_dense()
        Kss = model.covar_module(Xs).to_dense()
        L = torch.linalg.cholesky(K)
        r = ((Y.reshape(-1) - om) / os_ - c).unsqueeze(-1)
        alpha = torch.cholesky_solve(r, L)
        mean = om + os_ * (c + Ks @ alpha).squeeze(-1)
        V = torch.linalg.solve_triangular(L, Ks.T, upper=False)
        var = os_**2 * (Kss.diagonal() - (V**2).sum(0))
    return mean, var


def test_async_bo_arrival_order_no_duplicates_and_dense_model(client):
    problem = SlowProblem(synthetic_problem("branin", noise_std=0.1), mean_duration=0.05, sigma=1.0)
    loop = AsyncBayesOptLoop(problem, client, model="exact", acq="qucb", seed=1, **FAST)
    records = loop.run(steps=10)
    evals = _evaluations(records)
    assert len(evals) == 10 and loop.step_count == 10
    assert loop.X.shape[0] == 5 + 10
    # Arrival order: the model's data are the records' points in record order, and records come
    # in the order the workers finished (worker clocks are the host's: same machine).
    got = torch.tensor([r["X"] for r in evals], dtype=torch.float64).reshape(-1, 2)
    torch.testing.assert_close(loop.X[5:], got, rtol=0, atol=0)
    finish = [r["finish_time"] for r in evals]
    assert all(b >= a - 0.02 for a, b in zip(finish, finish[1:]))
    assert len({r["worker"] for r in evals}) == 2  # both workers used
    # Every worker kept busy: each proposal filled the free slots (its joint batch plus the
    # points pending then make 2), except where the budget left fewer evaluations to start;
    # and no point was proposed while being evaluated.
    for r in evals:
        if r["proposal"] <= 8:  # the budget had >= 2 evaluations left to start
            assert len(r["pending"]) + r["batch"] == 2, r
    assert sum(len(r["pending"]) == 1 for r in evals) >= 3
    for r in evals:
        if r["pending"]:
            gap = torch.cdist(
                torch.tensor(r["X"]).reshape(1, 2), torch.tensor(r["pending"]).reshape(-1, 2)
            ).min()
            assert gap > 1e-6
    assert torch.pdist(loop.X).min() > 1e-9  # no duplicate evaluations
    # The surrogate built by online updates equals a dense exact GP on all results.
    Xs = torch.rand(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    U, Y = loop._training_data()
    mean, var = _dense_posterior(loop.model, U, Y, Xs)
    with torch.no_grad():
        post = loop.model.posterior(Xs)
    torch.testing.assert_close(post.mean.reshape(-1), mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(post.variance.reshape(-1), var, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("acq", ["qlognei", "ts"])
def test_async_bo_acquisitions_regret_comparable_to_sync(client, acq):
    """Equal evaluations, same seeds: the asynchronous loop's final regret is within 0.25 x the
    regret after the initial design of the synchronous loop's (branin, exact GP, 2 seeds)."""
    problem = synthetic_problem("branin")
    a, s, r0 = [], [], []
    for seed in (0, 1):
        loop = AsyncBayesOptLoop(problem, client, model="exact", acq=acq, seed=seed, **FAST)
        recs = loop.run(steps=10)
        a.append(recs[-1]["regret"])
        r0.append(recs[0]["regret"])
        sync = BayesOptLoop(problem, model="exact", acq=acq, seed=seed, **FAST).run(steps=10)
        s.append(sync[-1]["regret"])
        assert sync[0]["regret"] == recs[0]["regret"]  # same initial design
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    assert mean(a) <= mean(s) + 0.25 * mean(r0), (a, s, r0)


def test_resume_after_driver_killed(client, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "bo_online.cli",
        "bo",
        "--problem",
        "branin",
        "--noise",
        "0.1",
        "--model",
        "wiski",
        "--acq",
        "qucb",
        "--steps",
        "14",
        "--dask",
        client.scheduler.address,
        "--num-restarts",
        "2",
        "--raw-samples",
        "32",
        "--acqf-maxiter",
        "20",
        "--n-init",
        "5",
        "--out",
        str(out),
        "--quiet",
        "--no-plots",
        "--checkpoint-every",
        "1",  # a checkpoint per result, so the kill leaves points in flight
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    records_file = out / history.RECORDS_FILE
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if records_file.is_file() and len(records_file.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    ckpt = history.load_checkpoint(out / history.CHECKPOINT_FILE)
    in_flight = ckpt["state"]["in_flight"]
    assert 0 < len(in_flight) <= 2 and ckpt["step_count"] < 14
    loop = load_loop(out, client=client)
    records = loop.run()
    evals = _evaluations(records)
    assert loop.step_count == 14 and len(evals) == 14 and loop.X.shape[0] == 5 + 14
    pids = [r["proposal"] for r in evals]
    assert len(set(pids)) == 14  # nothing evaluated twice
    assert set(in_flight) <= set(pids)  # the points in flight were resubmitted and folded in
    assert history.read_records(out) == records  # file and memory agree, no duplicates
    for r in evals:  # observation noise seeded by (seed, proposal): reproducible on resubmission
        g = torch.Generator().manual_seed(history.step_seed(0, r["proposal"], "noise"))
        noise = 0.1 * float(torch.randn((), generator=g, dtype=torch.float64))
        assert r["y"][0] == pytest.approx(r["y_true"][0] + noise, abs=1e-12)


def test_async_run_releases_its_directory_counts_elapsed_and_checkpoints_on_a_signal(
    client, tmp_path
):
    """The async loop's run is OnlineLoop.run's: the run directory's lock is released when it
    returns (a later resume from another process was refused as "in use"), the elapsed time is
    kept, and SIGINT stops it with a checkpoint that holds every step recorded so far."""
    out = tmp_path / "run"
    problem = synthetic_problem("branin")
    loop = AsyncBayesOptLoop(problem, client, model="exact", acq="qucb", out_dir=out, **FAST)
    loop.run(steps=2)
    assert not (out / history.LOCK_FILE).exists()
    assert (
        loop.elapsed > 0 and history.load_checkpoint(out / history.CHECKPOINT_FILE)["elapsed"] > 0
    )

    def interrupt(record):
        if record["step"] == 3 and not record.get("failed"):
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        loop.run(steps=30, callback=interrupt)
    assert not (out / history.LOCK_FILE).exists()
    ckpt = history.load_checkpoint(out / history.CHECKPOINT_FILE)
    assert ckpt["step_count"] == loop.step_count >= 3  # not the last periodic checkpoint's
    resumed = load_loop(out, client=client)
    assert resumed.step_count == loop.step_count
    records, in_flight = history.read_records(out), dict(resumed.in_flight)
    resumed.run(steps=resumed.step_count)  # already there: nothing is submitted or recorded
    assert history.read_records(out) == records and resumed.in_flight.keys() == in_flight.keys()
    resumed.run(steps=loop.step_count + 1)
    assert resumed.step_count == loop.step_count + 1


class _Sleepy(Problem):
    """Branin whose evaluations, once armed, take 15 s."""

    def __init__(self, root: Path) -> None:
        inner = synthetic_problem("branin")
        self.inner, self.root = inner, str(root)
        self.bounds, self.noise_std, self.maximize = inner.bounds, 0.0, False
        self.optimal_value, self.name, self.spec = inner.optimal_value, "sleepy", None

    def evaluate_true(self, X):
        if os.path.exists(os.path.join(self.root, "armed")):
            time.sleep(15)
        return self.inner.evaluate_true(X)


def test_a_stop_signal_acts_while_evaluations_run(client, tmp_path):
    """Review finding: the async loop waited for the next evaluation to finish before it looked
    at the stop flag (past a batch scheduler's grace period); it now stops at once, with the
    points in flight in the checkpoint."""
    import threading

    out = tmp_path / "run"
    loop = AsyncBayesOptLoop(
        _Sleepy(tmp_path), client, model="exact", acq="qucb", out_dir=out, **FAST
    )
    loop.run(steps=0)
    (tmp_path / "armed").touch()
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    start = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run(steps=5)
    finally:
        timer.cancel()
    assert time.perf_counter() - start < 10  # not the 15 s of an evaluation
    ckpt = history.load_checkpoint(out / history.CHECKPOINT_FILE)
    assert ckpt["state"]["in_flight"] and ckpt["step_count"] == 0


class _Held(Problem):
    """Branin whose evaluations mark ``root/started`` and then wait (at most 8 s) for
    ``root/release``."""

    def __init__(self, root: Path) -> None:
        inner = synthetic_problem("branin")
        self.inner, self.root = inner, str(root)
        self.bounds, self.noise_std, self.maximize = inner.bounds, 0.0, False
        self.optimal_value, self.name, self.spec = inner.optimal_value, "held", None

    def evaluate_true(self, X):
        Path(self.root, "started").touch()
        deadline = time.monotonic() + 8
        while not os.path.exists(os.path.join(self.root, "release")):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return self.inner.evaluate_true(X)


def test_a_stop_signal_in_the_initial_design_stops_it_without_waiting(client, tmp_path):
    """A stop signal in the initial design (evaluated on the cluster) was acted on only once
    the design was done: a Ctrl-C in a terminal, which kills a local cluster's workers as well,
    left the run waiting for them until ``no_workers_timeout`` (2 minutes), which then blamed
    the objective. It now stops at once, as the run's own wait does, with nothing written (the
    next run evaluates the design again), and the loop runs again as a new one would."""
    import threading

    from torch.quasirandom import SobolEngine

    from bo_online.problems import from_unit

    out = tmp_path / "run"
    loop = AsyncBayesOptLoop(
        _Held(tmp_path), client, model="exact", acq="qucb", out_dir=out, **FAST
    )

    sent = []

    def interrupt():  # once an evaluation runs (the workers may be busy with earlier tasks)
        while not (tmp_path / "started").exists():
            time.sleep(0.02)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run(steps=1)
        elapsed = time.perf_counter() - sent[0]
    finally:
        (tmp_path / "release").touch()  # the workers' evaluations end
        thread.join(timeout=10)
    assert elapsed < 4  # not the 8 s an evaluation waits, nor the design's rounds of them
    assert not out.exists() and not loop.initialized and not loop.records
    records = loop.run(steps=1)  # the signal acted once: the loop runs as a new one
    X0 = from_unit(
        SobolEngine(2, scramble=True, seed=0).draw(5, dtype=torch.float64), loop.problem.bounds
    )
    torch.testing.assert_close(loop.X[:5], X0, rtol=0, atol=0)
    torch.testing.assert_close(loop.y[:5], loop.problem.inner.evaluate_true(X0), rtol=0, atol=0)
    assert [r["step"] for r in records] == [0, 1] and history.read_records(out) == records


class _Flaky(Problem):
    """Branin whose evaluations, counted across workers through files in ``root``, kill their
    worker process on call ``kill_at`` and raise on the calls in ``raise_at``."""

    def __init__(self, root: Path, kill_at: int, raise_at: tuple[int, ...]) -> None:
        inner = synthetic_problem("branin")
        self.inner, self.root, self.kill_at, self.raise_at = inner, str(root), kill_at, raise_at
        self.bounds, self.noise_std, self.maximize = inner.bounds, 0.0, False
        self.optimal_value, self.name, self.spec = inner.optimal_value, "flaky", None

    def evaluate_true(self, X):
        if not os.path.exists(os.path.join(self.root, "armed")):
            return self.inner.evaluate_true(X)
        i = 0
        while True:  # claim the next call number atomically
            try:
                os.close(os.open(os.path.join(self.root, f"call{i}"), os.O_CREAT | os.O_EXCL))
                break
            except FileExistsError:
                i += 1
        if i == self.kill_at:
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-evaluation
        if i in self.raise_at:
            raise RuntimeError(f"instrument fault at call {i}")
        return self.inner.evaluate_true(X)


def test_worker_killed_and_objective_raising(client, tmp_path):
    problem = _Flaky(tmp_path, kill_at=1, raise_at=(3, 9))
    loop = AsyncBayesOptLoop(
        problem, client, model="exact", acq="qucb", max_failures=1, out_dir=tmp_path / "run", **FAST
    )
    loop.initialize()
    (tmp_path / "armed").touch()
    loop.run(steps=6)
    fails = [r for r in loop.records if r.get("failed")]
    assert len(fails) == 1 and "instrument fault at call 3" in fails[0]["error"]
    # the campaign went on: 6 evaluations, the failed one among them, each its own step (the
    # failure's record repeated the step of the success before it)
    assert loop.step_count == 6 and len(_evaluations(loop.records)) == 5
    assert [r["step"] for r in loop.records if r["step"] > 0] == list(range(1, 7))
    assert fails[0]["n"] == loop.records[loop.records.index(fails[0]) - 1]["n"]  # no new data
    # Every proposal was either folded in or recorded as failed, the killed one included.
    pids = sorted(r["proposal"] for r in loop.records if "proposal" in r)
    assert pids == list(range(6))
    # 6 proposals, 7 calls: the evaluation whose worker was killed was run again (by Dask).
    assert len(list(tmp_path.glob("call*"))) == 7
    # One more failure than max_failures stops the campaign with a clear message.
    with pytest.raises(TooManyFailures, match="max_failures=1"):
        loop.run(steps=30)
    assert loop.failures == 2


class _BadValues(Problem):
    """Branin whose evaluations return NaN for x_1 > 12 and two values for x_0 > 8."""

    def __init__(self) -> None:
        inner = synthetic_problem("branin")
        self.inner, self.bounds, self.noise_std, self.maximize = inner, inner.bounds, 0.0, False
        self.optimal_value, self.name, self.spec = inner.optimal_value, "badvalues", None

    def evaluate_true(self, X):
        y = self.inner.evaluate_true(X)
        if float(X[0, 0]) > 8:
            return torch.cat([y, y])
        return torch.where(X[:, 1] > 12, torch.full_like(y, float("nan")), y)


def test_a_problem_returning_nan_or_several_values_is_a_failed_evaluation(client, tmp_path):
    r"""A problem of the user's (not a ``CallableProblem``, which checks its objective's values)
    that returned NaN stopped the asynchronous run with the model's error ("Y contains NaN" in
    the initial design, "tell() got NaN/inf" later, a ``tell`` the user never called), and
    every resume submitted the point again and stopped the same way; one that returned two
    values for the point had its first taken silently. Both are failed evaluations now, as an
    objective that raises: recorded with an error naming the problem, and the run goes on."""
    X0 = torch.tensor(
        [[-4.0, 1.0], [-3.0, 5.0], [-2.0, 13.0], [9.0, 3.0], [1.0, 2.0]], dtype=torch.float64
    )
    problem = _BadValues()
    good = X0[[0, 1, 4]]
    loop = AsyncBayesOptLoop(
        problem,
        client,
        model="exact",
        acq="ts",
        max_failures=100,
        initial_data=(good, problem.inner.evaluate_true(good)),
        out_dir=tmp_path / "run",
        **{**FAST, "n_init": 0},
    )
    records = loop.run(steps=8)
    assert loop.step_count == 8
    for r in records[1:]:  # every proposal folded in or failed, as its value says
        x = torch.tensor(r["X"], dtype=torch.float64).reshape(-1)
        if x[0] > 8:
            assert r["failed"] and "'badvalues' returned 2 values for 1 points" in r["error"], r
        elif x[1] > 12:
            assert r["failed"] and "'badvalues' returned nan" in r["error"], r
        else:
            assert not r["failed"], r
            assert r["y_true"] == problem.inner.evaluate_true(x.reshape(1, -1)).tolist()
    assert loop.failures == sum(r["failed"] for r in records[1:]) >= 1
    assert bool(torch.isfinite(loop.y).all()) and loop.X.shape[0] == 3 + 8 - loop.failures
    # A failed record says which worker evaluated the point and when, as a folded-in one does
    # (it had neither worker nor start and finish times).
    workers = set(client.nthreads())
    for r in records[1:]:
        assert r["worker"] in workers, r
        assert r["submit_time"] <= r["start_time"] <= r["finish_time"] <= r["arrival_time"], r
        assert r["time_evaluation"] == r["finish_time"] - r["start_time"], r
    # The initial design on the cluster too (its 5 Sobol points replaced by X0): its failed
    # points are recorded, the model built from the others.
    loop = AsyncBayesOptLoop(problem, client, model="exact", acq="ts", **FAST)
    evaluate = loop._evaluate_initial
    loop._evaluate_initial = lambda X: evaluate(X0)
    record = loop.initialize()
    failed = [r for r in loop.records if r.get("failed")]
    assert record["n"] == 3 and len(failed) == 2 and loop.failures == 2
    assert sorted(torch.tensor(r["X"]).reshape(-1).tolist()[0] for r in failed) == [-2.0, 9.0]
    assert all(r["worker"] in workers and r["start_time"] <= r["finish_time"] for r in failed)
    torch.testing.assert_close(loop.X, good, rtol=0, atol=0)


def test_a_failure_at_the_last_step_finishes_the_run_it_cannot_stop(client, tmp_path):
    r"""A failed evaluation is a step of its own: when the last step of the budget failed and
    took the failures over ``max_failures``, the loop raised :class:`TooManyFailures` though
    every step was done, and the advice that goes with it (resume with a higher limit) ran
    nothing, the target being reached. The run now finishes (the failure is in its records);
    a failure before the last step still stops it."""
    problem = _Flaky(tmp_path, kill_at=-1, raise_at=(1,))
    out = tmp_path / "run"
    loop = AsyncBayesOptLoop(
        problem,
        client,
        model="exact",
        acq="qucb",
        max_failures=0,
        max_in_flight=1,
        out_dir=out,
        **FAST,
    )
    loop.initialize()
    (tmp_path / "armed").touch()
    loop.run(steps=2)  # call 0: step 1 folded in; call 1: step 2 failed, the last one
    assert loop.step_count == 2 and loop.failures == 1
    assert [r.get("failed") for r in loop.records if r["step"] > 0] == [False, True]
    ckpt = history.load_checkpoint(out / history.CHECKPOINT_FILE)
    assert (ckpt["step_count"], ckpt["state"]["failures"]) == (2, 1)
    with pytest.raises(TooManyFailures, match="max_failures=0"):  # before the last: stopped
        problem.raise_at = (2,)
        loop.run(steps=4)
    assert loop.step_count == 3 and loop.failures == 2


class _Crashing(_Flaky):
    """Branin whose every evaluation, once armed, kills its worker process."""

    def evaluate_true(self, X):
        if os.path.exists(os.path.join(self.root, "armed")):
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner.evaluate_true(X)


def test_an_objective_that_always_kills_its_worker_is_a_failure_not_an_endless_retry(tmp_path):
    """Dask reports ``KilledWorker`` once its own retries are spent; the loop submitted the
    point again without limit (a run with a segfaulting objective never ended)."""
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        )
        with cluster, distributed.Client(cluster) as client:
            problem = _Crashing(tmp_path, kill_at=-1, raise_at=())
            loop = AsyncBayesOptLoop(
                problem, client, model="exact", acq="qucb", max_failures=0, max_in_flight=1, **FAST
            )
            loop.initialize()
            (tmp_path / "armed").touch()
            with pytest.raises(TooManyFailures, match="Dask gave up on this point 2 times"):
                loop.run(steps=3)
    assert loop.failures == 1 and loop.step_count == 1  # the failed evaluation is a step


def test_a_cluster_left_without_workers_stops_the_run_saved_instead_of_waiting(
    tmp_path, monkeypatch
):
    r"""An objective that killed its workers faster than the cluster restarted them left it
    with none: the futures in flight never finished and the driver polled for good, without a
    word. The run now stops with :class:`NoWorkers` once the cluster has had no worker for
    ``no_workers_timeout`` (a class attribute a user could not set: now an argument, saved with
    the run), its checkpoint holding the points in flight, and goes on when workers are back."""
    monkeypatch.setattr(AsyncBayesOptLoop, "WORKER_CHECK_SECONDS", 0.05)
    problem = SlowProblem(synthetic_problem("branin"), mean_duration=0.3, sigma=0.1)
    out = tmp_path / "run"
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    )
    with cluster, distributed.Client(cluster) as client:
        loop = AsyncBayesOptLoop(
            problem,
            client,
            model="exact",
            acq="qucb",
            max_in_flight=1,
            no_workers_timeout=1.0,
            out_dir=out,
            **FAST,
        )
        loop.initialize()

        def stop_the_workers(record):
            if record["step"] == 1:
                cluster.scale(0)

        with pytest.raises(NoWorkers, match="no worker for 1 s with 1 evaluation") as stopped:
            loop.run(steps=4, callback=stop_the_workers)
        assert "a larger no_workers_timeout, or None" in str(stopped.value)  # how to wait
        assert loop.step_count == 1 and len(loop.in_flight) == 1
        ckpt = history.load_checkpoint(out / history.CHECKPOINT_FILE)
        assert ckpt["step_count"] == 1 and len(ckpt["state"]["in_flight"]) == 1
        assert ckpt["config"]["no_workers_timeout"] == 1.0  # a resume keeps it
        assert load_loop(out, problem=problem, client=client).no_workers_timeout == 1.0
        cluster.scale(1)
        client.wait_for_workers(1, timeout=60)
        loop.run(steps=4)
    assert loop.step_count == 4 and loop.X.shape[0] == 5 + 4


def test_a_cluster_without_workers_in_the_initial_design_stops_instead_of_hanging(
    tmp_path, monkeypatch
):
    r"""The initial design waited for its evaluations without a limit: on a cluster with no
    worker (none started yet, or all dead) ``run`` hung for good, past ``no_workers_timeout``
    and past SIGTERM. It now stops with :class:`NoWorkers` after ``no_workers_timeout``, saying
    that nothing was kept (there is no run to resume, so no checkpoint is written), and runs
    again once workers are there."""
    monkeypatch.setattr(AsyncBayesOptLoop, "WORKER_CHECK_SECONDS", 0.05)
    out = tmp_path / "run"
    cluster = distributed.LocalCluster(
        n_workers=0, threads_per_worker=1, processes=False, dashboard_address=None
    )
    with cluster, distributed.Client(cluster) as client:
        loop = AsyncBayesOptLoop(
            synthetic_problem("branin"),
            client,
            model="exact",
            acq="qucb",
            no_workers_timeout=0.5,
            out_dir=out,
            **FAST,
        )
        start = time.monotonic()
        with pytest.raises(
            NoWorkers, match=r"with 5 evaluation\(s\) of the initial design"
        ) as stopped:
            loop.run(steps=1)
        assert time.monotonic() - start < 30
        assert not stopped.value.saved and "Nothing was kept" in str(stopped.value)
        assert str(stopped.value).endswith("then run it again.")
        assert loop.model is None and not loop.records
        assert not (out / history.CHECKPOINT_FILE).exists()
        cluster.scale(1)
        client.wait_for_workers(1, timeout=60)
        again = AsyncBayesOptLoop(
            synthetic_problem("branin"), client, model="exact", acq="qucb", out_dir=out, **FAST
        )
        again.run(steps=1)
    assert again.step_count == 1 and again.X.shape[0] == 5 + 1


def test_no_workers_is_timed_over_one_wait_not_across_results_and_acquisitions(client, monkeypatch):
    r"""The time without workers ran from the first check that saw none until a check saw
    some, through results that arrived (a worker had run them) and the acquisitions between:
    a cluster restarting a worker at the moment of two checks a slow acquisition apart (an
    objective killing its process on some inputs, the case the stop is for) stopped a working
    run with :class:`NoWorkers`. Only the time the driver waits without a result counts."""
    import time

    # one check per wait: an evaluation (0.2 s) ends before the next check is due
    monkeypatch.setattr(AsyncBayesOptLoop, "WORKER_CHECK_SECONDS", 0.6)
    problem = SlowProblem(synthetic_problem("branin"), mean_duration=0.2, sigma=0.02)
    loop = AsyncBayesOptLoop(
        problem, client, model="exact", acq="qucb", max_in_flight=1, no_workers_timeout=1, **FAST
    )
    loop.initialize()
    restarting = {"now": True}  # the check after each acquisition sees no worker
    real_nthreads, real_fill = client.nthreads, AsyncBayesOptLoop._fill

    def nthreads(*args, **kwargs):
        if restarting["now"]:
            restarting["now"] = False
            return {}
        return real_nthreads(*args, **kwargs)

    def slow_fill(self, completed):
        time.sleep(1.2)  # a slow acquisition, longer than no_workers_timeout
        real_fill(self, completed)
        restarting["now"] = True

    monkeypatch.setattr(client, "nthreads", nthreads)
    monkeypatch.setattr(AsyncBayesOptLoop, "_fill", slow_fill)
    loop.run(steps=3)
    assert loop.step_count == 3 and not loop.in_flight


@pytest.mark.parametrize("bad", [0, -5.0, float("nan"), "120", True])
def test_a_bad_no_workers_timeout_is_refused(client, bad):
    with pytest.raises(ValueError, match="no_workers_timeout must be a positive number of sec"):
        AsyncBayesOptLoop(synthetic_problem("branin"), client, no_workers_timeout=bad)


def test_a_numpy_no_workers_timeout_is_taken():
    r"""A NumPy scalar (a value read from a config array) is a number of seconds too."""
    import numpy as np

    from bo_online.loops.async_bo import _check_no_workers_timeout

    for value in (np.int64(300), np.float32(2.5)):
        assert _check_no_workers_timeout(value) == float(value)
    with pytest.raises(ValueError, match="no_workers_timeout must be a positive number of sec"):
        _check_no_workers_timeout(np.float64(-1.0))


def test_no_workers_timeout_none_or_inf_waits_for_workers_forever(client, monkeypatch):
    r"""None (or inf) never stops the run however long the cluster has no worker."""
    for forever in (None, float("inf")):
        loop = AsyncBayesOptLoop(
            synthetic_problem("branin"), client, no_workers_timeout=forever, **FAST
        )
        assert loop.no_workers_timeout is None and loop.config["no_workers_timeout"] is None
    monkeypatch.setattr(client, "nthreads", lambda *a, **k: {})
    loop._no_workers_since, loop._workers_checked = 0.0, -1e9
    loop._check_workers()  # a day without workers: no NoWorkers


def test_the_cli_passes_no_workers_timeout_to_the_async_loop(client, tmp_path, capsys, monkeypatch):
    r"""``bo --dask ... --no-workers-timeout SECONDS`` reaches the loop and its saved options,
    ``inf`` waits forever, a bad value is refused before a cluster starts, and ``resume
    --no-workers-timeout`` sets a new one."""
    import contextlib

    import bo_online.cli as cli

    seen = []

    def record_it(self, callback):
        seen.append(self.no_workers_timeout)

    monkeypatch.setattr(cli.running, "_dask_client", lambda a: contextlib.nullcontext(client))
    monkeypatch.setattr(AsyncBayesOptLoop, "_run_steps", record_it)
    out = tmp_path / "run"
    argv = ["bo", "--problem", "branin", "--steps", "2", "--out", str(out), "--dask", "local:2"]
    fast = ["--n-init", "3", "--fit-max-iter", "5", "--quiet", "--no-plots"]
    cli.main([*argv, *fast, "--no-workers-timeout", "3600"])
    assert seen == [3600.0]
    assert history.load_checkpoint(out / history.CHECKPOINT_FILE)["config"][
        "no_workers_timeout"
    ] == (3600.0)
    cli.main(["resume", str(out), "--dask", "local:2", "--quiet", "--no-plots"])
    assert seen[-1] == 3600.0  # kept by a resume
    cli.main(["resume", str(out), "--dask", "local:2", "--no-workers-timeout", "inf", "--quiet"])
    assert seen[-1] is None
    cli.main([*argv, *fast, "--no-workers-timeout", "inf", "--overwrite"])
    assert seen[-1] is None
    for bad in ("0", "-1", "nan"):
        with pytest.raises(SystemExit) as e:
            cli.main([*argv, *fast, "--no-workers-timeout", bad, "--overwrite"])
        err = capsys.readouterr().err
        assert e.value.code == 2, err
        assert "--no-workers-timeout must be a positive number of seconds" in err
    with pytest.raises(SystemExit):
        cli.main(["resume", str(out), "--no-workers-timeout", "60"])
    assert "applies to asynchronous runs: add --dask" in capsys.readouterr().err
    assert len(seen) == 4


def test_a_cluster_without_workers_on_the_cli_says_how_to_continue(
    client, tmp_path, capsys, monkeypatch
):
    r"""On the CLI, :class:`NoWorkers` is one line that ends with the command continuing the
    run on a cluster, and the run continues from it."""
    import contextlib
    import shlex

    import bo_online.cli as cli

    def no_workers(self, callback):
        self.save_checkpoint()
        raise NoWorkers(121.0, 2)

    monkeypatch.setattr(cli.running, "_dask_client", lambda a: contextlib.nullcontext(client))
    out = tmp_path / "run"
    argv = ["bo", "--problem", "branin", "--steps", "2", "--out", str(out), "--dask", "local:2"]
    fast = ["--n-init", "3", "--fit-max-iter", "5", "--num-restarts", "2", "--raw-samples", "32"]
    with monkeypatch.context() as mp:
        mp.setattr(AsyncBayesOptLoop, "_run_steps", no_workers)
        with pytest.raises(SystemExit) as e:
            cli.main([*argv, *fast, "--acq", "ts", "--quiet", "--no-plots"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1, err
    assert "no worker for 121 s with 2 evaluation(s) in flight" in err
    assert "add --no-workers-timeout with more seconds, or inf" in err  # the option that waits
    command = err.split("continue the run with `")[1].rstrip("`.")
    assert command.startswith(f"bo-online resume {out}") and "--dask local:2" in command
    cli.main(shlex.split(command)[1:] + ["--quiet", "--no-plots"])
    assert history.load_checkpoint(out / history.CHECKPOINT_FILE)["step_count"] == 2


def test_an_objective_from_a_file_runs_on_the_workers(client, tmp_path):
    """``--objective file.py:f`` with ``--dask``: the module made up for the file exists only in
    the driver; Dask pickled the task by reference to it, every worker failed to unpickle it and
    the run waited forever."""
    from bo_online.loops.async_bo import _evaluate_point
    from bo_online.objectives import objective_problem

    (tmp_path / "obj_on_workers.py").write_text("def f(X):\n    return (X ** 2).sum(-1) + 1.0\n")
    problem = objective_problem(f"{tmp_path / 'obj_on_workers.py'}:f", "[[0, 1], [0, 1]]")
    X = torch.tensor([[0.5, 0.25]], dtype=torch.float64)
    future = client.submit(_evaluate_point, problem, X, pure=False)
    assert future.result(timeout=30)["y_true"] == pytest.approx(1.3125)
    # the initial design's tasks: the problem's bound method
    future = client.submit(problem.evaluate_true, X, pure=False)
    assert float(future.result(timeout=30)[0]) == pytest.approx(1.3125)


_COUNTED_OBJECTIVE = """
import json, os

ROOT = {root!r}


def _called(X):
    x = X.reshape(-1).tolist()
    with open(os.path.join(ROOT, "calls.jsonl"), "a") as fh:  # O_APPEND: one line per call
        fh.write(json.dumps({{"shape": list(X.shape), "x": x}}) + "\\n")
    bad = os.path.join(ROOT, "bad-" + "_".join(f"{{v:.15g}}" for v in x))
    try:  # the first call once armed claims the fault for its point (atomically)
        os.rename(os.path.join(ROOT, "armed"), bad)
    except FileNotFoundError:
        pass
    if os.path.exists(bad):
        raise RuntimeError("instrument fault")


def batch(X):
    _called(X)
    return (X ** 2).sum(-1)


def per_point(x):
    _called(x)
    return float(x[0] ** 2 + x[1] ** 2)
"""


@pytest.mark.parametrize("kind", ["batch", "per_point"])
def test_a_failing_evaluation_calls_the_objective_once(client, tmp_path, kind):
    r"""Each task evaluates a ``1 x d`` batch, which cannot tell a batch objective from a
    per-point one: when the objective raised it was called again on the ``d``-vector (an
    expensive experiment run twice), and the record quoted both errors. The calling convention
    is now decided by the first evaluation that succeeds and shipped with every later one: a
    raise is that point's failure, with the objective's own error, after one call."""
    from bo_online.objectives import objective_problem

    path = tmp_path / f"counted_{kind}.py"
    path.write_text(_COUNTED_OBJECTIVE.format(root=str(tmp_path)))
    problem = objective_problem(f"{path}:{kind}", "[[-1, 1], [-1, 1]]")
    loop = AsyncBayesOptLoop(problem, client, model="exact", acq="qucb", **FAST)
    loop.initialize()
    (tmp_path / "armed").touch()
    records = loop.run(steps=4)
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    (failed,) = [r for r in records if r.get("failed")]
    assert failed["error"].count("instrument fault") == 1
    assert "one point at a time" not in failed["error"]
    x = torch.tensor(failed["X"], dtype=torch.float64).reshape(-1).tolist()
    assert sum(c["x"] == x for c in calls) == 1  # the failing point: one call
    # the campaign went on as after any failure: 4 evaluations, 3 folded in
    assert loop.step_count == 4 and loop.failures == 1 and len(_evaluations(records)) == 3
    assert loop.X.shape[0] == 5 + 3
    # every point is called once, but the first of a per-point objective: tried as a batch first
    first = 1 if kind == "per_point" else 0
    assert len(calls) == 5 + 4 + first
    shapes = {tuple(c["shape"]) for c in calls[first:]}
    assert shapes == ({(1, 2)} if kind == "batch" else {(2,)})
    # decided by the first success, saved with the run; the user's problem is left as it was
    assert loop._state()["objective_per_point"] is (kind == "per_point")
    assert problem.fn.per_point is None


def _spec(path: Path, seeds: list[int]) -> Path:
    path.write_text(
        "steps = 3\nproblems = ['branin']\nmodels = ['exact']\nacqs = ['qucb', 'ts']\n"
        f"seeds = {seeds}\n[options]\nn_init = 5\nrefit_every = 0\ninit_fit_max_iter = 10\n"
        "optimizer_options = {num_restarts = 2, raw_samples = 32, maxiter = 20}\n"
    )
    return path


def test_sweep_skips_finished_and_extends(client, tmp_path):
    spec, out = _spec(tmp_path / "spec.toml", [0]), tmp_path / "sweep"
    first = run_sweep(spec, out, client)
    assert [s["status"] for s in first] == ["ran", "ran"]
    assert all(s["evaluations"] == 8 for s in first)
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/records.jsonl")}
    again = run_sweep(spec, out, client)
    assert [s["status"] for s in again] == ["skipped", "skipped"]
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/records.jsonl")} == stamps
    assert [s["regret"] for s in again] == [s["regret"] for s in first]
    more = run_sweep(_spec(spec, [0, 1]), out, client)
    assert [(s["seed"], s["status"]) for s in more] == [
        (0, "skipped"),
        (1, "ran"),
        (0, "skipped"),
        (1, "ran"),
    ]
    # A campaign run by the sweep equals the same campaign run directly.
    direct = BayesOptLoop(
        synthetic_problem("branin"),
        model="exact",
        acq="qucb",
        seed=1,
        n_init=5,
        refit_every=0,
        init_fit_max_iter=10,
        optimizer_options=FAST["optimizer_options"],
    ).run(steps=3)
    swept = history.read_records(out / "branin-exact-qucb-s1")
    assert history.without_timing(swept) == history.without_timing(direct)


def test_a_relative_sweep_out_is_the_drivers_folder_on_workers_started_elsewhere(
    client, tmp_path, monkeypatch
):
    """A relative --out was sent to the campaigns' tasks as given, so a worker whose working
    directory is not the driver's (`dask worker` started elsewhere on a shared file system)
    wrote the campaign under its own folder, where the driver's skip, resume and plots never
    looked. Workers in another folder now write under the driver's --out."""
    spec = _spec(tmp_path / "spec.toml", [0])
    spec.write_text(spec.read_text().replace("steps = 3", "steps = 0").replace("'ts'", ""))
    (tmp_path / "driver").mkdir()
    (tmp_path / "workers").mkdir()
    before = client.run(os.getcwd)
    client.run(os.chdir, str(tmp_path / "workers"))
    try:
        monkeypatch.chdir(tmp_path / "driver")
        (summary,) = run_sweep(spec, "sweep", client)
    finally:
        for address, folder in before.items():
            client.run(os.chdir, folder, workers=[address])
    assert summary["status"] == "ran"
    assert (tmp_path / "driver" / "sweep" / summary["campaign"] / "checkpoint.pt").is_file()
    assert not (tmp_path / "workers" / "sweep").exists()
    (again,) = run_sweep(spec, "sweep", client)
    assert again["status"] == "skipped"


def test_sweep_refuses_campaigns_that_ran_with_other_options(tmp_path):
    """A campaign directory keeps the settings its run started with; a spec whose [options]
    changed (q = 1 -> 2) was skipped or resumed with the old ones, reported as the new."""
    from bo_online.sweep import _changed_settings, campaigns, load_spec, run_campaign

    spec, out = _spec(tmp_path / "spec.toml", [0]), tmp_path / "sweep"
    spec.write_text(spec.read_text().replace("steps = 3", "steps = 0").replace("'ts'", ""))
    (first,) = campaigns(load_spec(spec))
    run_campaign(first, out / first.name)  # in-process: the initial design only
    stamp = (out / first.name / "checkpoint.pt").stat().st_mtime_ns
    assert _changed_settings(first, out / first.name) == []  # the same spec: reused
    # a run saved by an earlier version lacks the settings added since (its resume fills them
    # with their defaults): not a change
    config_path = out / first.name / "config.json"
    config = json.loads(config_path.read_text())
    older = {k: v for k, v in config.items() if k not in ("refit_from", "n_initial_data")}
    config_path.write_text(json.dumps(older))
    assert _changed_settings(first, out / first.name) == []
    config_path.write_text(json.dumps(config))
    spec.write_text(spec.read_text().replace("[options]", "[options]\nq = 2"))
    with pytest.raises(ValueError, match=r"other settings \(branin-exact-qucb-s0: q: 1 -> 2\)"):
        run_sweep(spec, out, client=None)
    assert (out / first.name / "checkpoint.pt").stat().st_mtime_ns == stamp


def test_a_damaged_campaign_says_how_to_run_it_again_with_the_sweep(tmp_path):
    """A campaign whose checkpoint is damaged (or does not match its configuration) stopped
    the sweep with the advice of `bo-online resume`, "start the run again with --overwrite":
    the sweep has no such option. It now says to delete the campaign's directory and run the
    sweep again, which then runs that campaign afresh."""
    import dataclasses
    import shutil

    from bo_online.sweep import campaigns, load_spec, run_campaign

    spec, out = _spec(tmp_path / "spec.toml", [0]), tmp_path / "sweep"
    spec.write_text(spec.read_text().replace("steps = 3", "steps = 0").replace("'ts'", ""))
    (c,) = campaigns(load_spec(spec))
    run_dir = out / c.name
    run_campaign(c, run_dir)  # in-process: the initial design only
    checkpoint = run_dir / history.CHECKPOINT_FILE
    checkpoint.write_bytes(checkpoint.read_bytes()[:3000])
    with pytest.raises(history.RunFileError, match="damaged or truncated") as e:
        run_campaign(dataclasses.replace(c, steps=1), run_dir)
    message = str(e.value)
    assert "--overwrite" not in message
    assert f"delete {str(run_dir)!r} and run the sweep again" in message
    shutil.rmtree(run_dir)  # as the message says
    assert run_campaign(dataclasses.replace(c, steps=1), run_dir)["status"] == "ran"


def test_a_campaign_whose_checkpoint_was_removed_keeps_its_records(tmp_path):
    """A campaign directory whose checkpoint.pt was removed (to save space, say) but whose
    records go past step 0 was run again from scratch by the next sweep (it built the loop with
    overwrite=True), replacing those records without a word; `bo-online bo` refuses such a
    directory without --overwrite. The sweep now refuses it too, leaves its files as they are
    and says what to do; a campaign killed before its first checkpoint still starts again."""
    import dataclasses

    from bo_online.loops import RunDirectoryError
    from bo_online.sweep import campaigns, load_spec, run_campaign

    spec, out = _spec(tmp_path / "spec.toml", [0]), tmp_path / "sweep"
    spec.write_text(spec.read_text().replace("steps = 3", "steps = 1").replace("'ts'", ""))
    (c,) = campaigns(load_spec(spec))
    run_dir = out / c.name
    run_campaign(c, run_dir)  # in-process
    (run_dir / history.CHECKPOINT_FILE).unlink()
    files = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    with pytest.raises(RunDirectoryError) as e:
        run_campaign(dataclasses.replace(c, steps=2), run_dir)
    message = str(e.value)
    assert "--overwrite" not in message
    assert "holds the records of a run up to step 1 but no checkpoint" in message
    assert "its files are left as they are: restore its checkpoint" in message
    assert f"delete {str(run_dir)!r} (to start it afresh), then run the sweep again" in message
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == files
    # records up to step 0 only: a campaign killed before its first checkpoint, started again
    records = history.read_records(run_dir)
    history.rewrite_records(run_dir / history.RECORDS_FILE, records[:1])
    assert run_campaign(c, run_dir)["status"] == "ran"
    assert history.without_timing(history.read_records(run_dir)) == history.without_timing(records)


def _causes(error: BaseException, limit: int = 20) -> list[BaseException]:
    """``error``'s chain of ``__cause__``, as Dask's worker collects it to report a task's error
    (``distributed.core.collect_causes``, which follows it with no end: an error that is its own
    cause kept the worker in that loop, its memory growing, and the task never ended)."""
    chain = []
    while error.__cause__ is not None and len(chain) < limit:
        chain.append(error.__cause__)
        error = error.__cause__
    return chain


def test_a_campaign_whose_run_appears_after_it_was_looked_for_is_continued(tmp_path, monkeypatch):
    """Two sweeps on one --out: the second looked for a campaign's run before the first sweep's
    checkpoint of it appeared, so building its loop refused a directory that now holds a run,
    and raised that error from itself, a cycle in which its Dask worker hung (the sweep never
    ended, the worker's memory grew by gigabytes). The run found is now continued as any run
    found (the lock refuses it while the other sweep runs it), to the records of one run."""
    import dataclasses

    import bo_online.sweep as sweep
    from bo_online.sweep import campaigns, load_spec, run_campaign

    spec = _spec(tmp_path / "spec.toml", [0])
    spec.write_text(spec.read_text().replace("'ts'", ""))
    (c,) = campaigns(load_spec(spec))
    c1, c2 = dataclasses.replace(c, steps=1), dataclasses.replace(c, steps=2)
    run_campaign(c2, tmp_path / "whole")
    run_dir = tmp_path / "sweep" / c.name
    run_campaign(c1, run_dir)  # the other sweep's run, found after the look
    looks = iter([None])
    real = sweep._done_steps
    monkeypatch.setattr(sweep, "_done_steps", lambda d: next(looks, real(d)))
    assert run_campaign(c2, run_dir)["status"] == "resumed"
    whole, records = (history.read_records(d) for d in (tmp_path / "whole", run_dir))
    assert history.without_timing(records) == history.without_timing(whole)


def test_an_objective_error_of_the_initial_design_is_not_its_own_cause():
    """An objective failing in the initial design was raised ``from`` itself: its own
    ``__cause__``, on which a Dask worker reporting it (a loop run as a task) looped forever."""
    from bo_online.errors import ObjectiveError
    from bo_online.problems import CallableProblem

    def broken(X):
        raise RuntimeError("the lab is closed")

    loop = BayesOptLoop(CallableProblem(broken, bounds=[[0, 0], [1, 1]]), quiet=True, **FAST)
    with pytest.raises(ObjectiveError, match="the lab is closed") as e:
        loop.run(1)
    assert e.value not in _causes(e.value) and len(_causes(e.value)) < 20


def test_a_sweep_error_without_advice_to_add_is_raised_as_it_is(tmp_path):
    """A campaign's error that the sweep's advice leaves unchanged is raised as it was, not
    ``from`` itself (its own cause, as above)."""
    from bo_online.loops import RunDirectoryError
    from bo_online.sweep import _raise_advised

    error = RunDirectoryError("a message the sweep has no advice for")
    with pytest.raises(RunDirectoryError) as e:
        _raise_advised(error, tmp_path)
    assert e.value is error and _causes(e.value) == []


def test_a_campaign_directory_holding_other_files_says_to_move_them(tmp_path):
    """A campaign's directory (named by the sweep) that holds files of no run was refused with
    "Give a new or empty directory for the run", which a sweep user cannot do. It now says to
    move those files out and run the sweep again, and leaves them as they were."""
    import dataclasses

    from bo_online.loops import RunDirectoryError
    from bo_online.sweep import campaigns, load_spec, run_campaign

    spec, out = _spec(tmp_path / "spec.toml", [0]), tmp_path / "sweep"
    spec.write_text(spec.read_text().replace("steps = 3", "steps = 0").replace("'ts'", ""))
    (c,) = campaigns(load_spec(spec))
    run_dir = out / c.name
    run_dir.mkdir(parents=True)
    (run_dir / "notes.txt").write_text("mine")
    with pytest.raises(RunDirectoryError) as e:
        run_campaign(dataclasses.replace(c, steps=1), run_dir)
    message = str(e.value)
    assert "Give a new or empty directory" not in message
    assert f"Move those files out of {str(run_dir)!r}" in message
    assert "run the sweep again" in message
    assert [p.name for p in run_dir.iterdir()] == ["notes.txt"]
    assert (run_dir / "notes.txt").read_text() == "mine"


def test_a_campaign_warning_is_one_line_naming_the_campaign(tmp_path, capsys, monkeypatch):
    """A warning inside a sweep campaign (say GPyTorch's NumericalWarning about jitter) was
    printed by the cluster's worker in Python's two-line format, naming a package file and no
    campaign. It is now one line naming the campaign, and the warning display is restored."""
    import dataclasses
    import warnings

    from gpytorch.utils.warnings import NumericalWarning

    from bo_online.loops import BayesOptLoop
    from bo_online.sweep import campaigns, load_spec, run_campaign

    spec, out = _spec(tmp_path / "spec.toml", [0]), tmp_path / "sweep"
    spec.write_text(spec.read_text().replace("steps = 3", "steps = 0").replace("'ts'", ""))
    (c,) = campaigns(load_spec(spec))
    original = BayesOptLoop.run

    def run_with_a_warning(self, *args, **kwargs):
        warnings.warn("A not p.d., added jitter of 1.0e-08 to the diagonal", NumericalWarning)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BayesOptLoop, "run", run_with_a_warning)
    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        run_campaign(dataclasses.replace(c, steps=0), out / c.name)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"bo-online: warning: campaign {c.name}: A not p.d., added jitter of 1.0e-08 to the "
        "diagonal (NumericalWarning)"
    ], err
    assert warnings.showwarning is before


def test_campaign_warnings_in_threads_name_their_own_campaign(capsys):
    """Campaigns on a worker of several threads (a tcp:// cluster's default) overlap: the
    warning display was one process-wide function, so the later campaign's name went on the
    earlier one's warnings, the first to finish restored Python's display under the other, and
    the last left the first's display installed for good."""
    import threading
    import warnings

    from bo_online.sweep import _one_line_warnings

    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def campaign_a():
        with _one_line_warnings("A"):
            a_in.set()
            b_in.wait(10)
            warnings.warn("from A")
        a_out.set()

    def campaign_b():
        a_in.wait(10)
        with _one_line_warnings("B"):
            b_in.set()
            a_out.wait(10)
            warnings.warn("from B")

    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        threads = [threading.Thread(target=f) for f in (campaign_a, campaign_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "bo-online: warning: campaign A: from A (UserWarning)",
        "bo-online: warning: campaign B: from B (UserWarning)",
    ], err
    assert warnings.showwarning is before


def test_sweep_reads_a_longer_run_at_the_spec_steps(client, tmp_path):
    """A campaign that ran further than the spec's steps (lowered since, or seeds added with
    fewer steps) was tabulated at its last step: the mean over seeds mixed budgets."""
    import dataclasses

    from bo_online.sweep import campaigns, load_spec, plot_sweep, run_campaign

    spec, out = _spec(tmp_path / "spec.toml", [0]), tmp_path / "sweep"
    spec.write_text(spec.read_text().replace("steps = 3", "steps = 1").replace("'ts'", ""))
    (c,) = campaigns(load_spec(spec))
    longer = run_campaign(dataclasses.replace(c, steps=3), out / c.name)  # in-process
    assert longer["evaluations"] == 8
    (summary,) = run_sweep(spec, out, client)
    assert (summary["status"], summary["evaluations"]) == ("skipped", 6)
    at_1 = [r for r in history.read_records(out / c.name) if r["step"] == 1][0]
    assert summary["regret"] == at_1["regret"]
    assert plot_sweep([summary], out)[0].is_file()


def test_a_campaign_whose_records_file_is_gone_is_resumed_from_its_checkpoint(tmp_path):
    """A campaign directory holding its checkpoint but no records.jsonl (deleted, or not copied
    with the run) stopped the whole sweep with "No records at ..." and no word of what to do,
    though `bo-online resume` rewrites the records from the checkpoint. The sweep now resumes
    that campaign, which rewrites them: the same records as before, status "resumed"."""
    from bo_online.sweep import campaigns, load_spec, run_campaign

    spec, out = _spec(tmp_path / "spec.toml", [0]), tmp_path / "sweep"
    spec.write_text(spec.read_text().replace("steps = 3", "steps = 1").replace("'ts'", ""))
    (c,) = campaigns(load_spec(spec))
    first = run_campaign(c, out / c.name)  # in-process
    records = history.read_records(out / c.name)
    (out / c.name / history.RECORDS_FILE).unlink()
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    )
    with cluster, distributed.Client(cluster) as client:
        (summary,) = run_sweep(spec, out, client)
        assert (summary["status"], summary["regret"]) == ("resumed", first["regret"])
        assert history.read_records(out / c.name) == records
        assert run_sweep(spec, out, client)[0]["status"] == "skipped"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dask", "local:0"], "worker count N >= 1"),
        (["--dask", "somewhere"], "local:N or a scheduler address"),
        (["--dask", "local:2", "--q", "2"], "leave --q at 1"),
        (["--dask", "local:2", "--acq", "logei"], "--acq qucb, qlognei or ts"),
        (["--dask", "local:2", "--workers", "2"], "exclude each other"),
    ],
)
def test_cli_dask_errors(tmp_path, capsys, args, message):
    from bo_online.cli import main

    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["bo", "--problem", "branin", "--out", str(out), "--quiet", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("bo-online: error:") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_sweep_spec_errors(tmp_path):
    from bo_online.sweep import campaigns, load_spec

    bad = tmp_path / "bad.toml"
    bad.write_text(
        "steps = 3\nproblems = ['branin']\nmodels = ['exact']\nacqs = ['qucb']\n"
        "seeds = [0]\nsteps_per = 1\n"
    )
    with pytest.raises(ValueError, match="unknown key"):
        load_spec(bad)
    bad.write_text(
        "steps = 3\nproblems = ['nosuch']\nmodels = ['exact']\nacqs = ['qucb']\nseeds = [0]\n"
    )
    with pytest.raises(ValueError):
        campaigns(load_spec(bad))
    yml = tmp_path / "spec.yaml"
    yml.write_text(
        "steps: 2\nproblems: [branin, {name: hartmann, dim: 3}]\nmodels: [exact]\n"
        "acqs: [qucb]\nseeds: [0, 1]\n"
    )
    names = [c.name for c in campaigns(load_spec(yml))]
    assert names == [
        "branin-exact-qucb-s0",
        "branin-exact-qucb-s1",
        "hartmann3d-exact-qucb-s0",
        "hartmann3d-exact-qucb-s1",
    ]
    # an upper-case suffix is YAML too (it was read as TOML: "invalid TOML")
    upper = tmp_path / "SPEC.YML"
    upper.write_text(yml.read_text())
    assert [c.name for c in campaigns(load_spec(upper))] == names
    base = "steps = 3\nmodels = ['exact']\nacqs = ['qucb']\n"
    for body, message in [
        # two campaigns in one run directory: they raced and failed as "in use by process N"
        ("problems = ['branin']\nseeds = [0, 0]\n", "the same campaign more than once"),
        ("problems = ['branin', {name = 'branin', noise = 0.0}]\nseeds = [0]\n", "more than"),
        ("problems = ['branin']\nseeds = [-1]\n", "integers >= 0"),
        # bad [options] failed inside a worker, or as a raw TypeError
        ("problems = ['branin']\nseeds = [0]\n[options]\nbogus = 3\n", "bogus"),
        # a misspelt option is named with the one meant (as a misspelt model option is)
        (
            "problems = ['branin']\nseeds = [0]\n[options]\nrefit_evry = 3\n",
            r"'refit_evry' \(did you mean 'refit_every'\?\)",
        ),
        (
            "problems = ['branin']\nseeds = [0]\n[options]\ncheckpoint_evry = 3\n",
            r"'checkpoint_evry' \(did you mean 'checkpoint_every'\?\)",
        ),
        ("problems = ['branin']\nseeds = [0]\n[options]\nseed = 4\n", r"sets \['seed'\]"),
        (
            "problems = ['branin']\nseeds = [0]\n[options]\n"
            "optimizer_options = {num_restarts = 4, raw_samples = 2}\n",
            "raw_samples",
        ),
        # a dimension that is not an integer: the problem was built with int(dim) (3), the
        # campaign named for 3.5
        ("problems = [{name = 'levy', dim = 3.5}]\nseeds = [0]\n", "integer 'dim'"),
        ("problems = [{name = 'levy', dim = '3'}]\nseeds = [0]\n", "integer 'dim'"),
        ("problems = [{name = 'levy', dim = true}]\nseeds = [0]\n", "integer 'dim'"),
        # an option that must be a table, given a number or a list: a raw TypeError
        ("problems = ['branin']\nseeds = [0]\n[options]\nacq_options = 3\n", "a table"),
        ("problems = ['branin']\nseeds = [0]\n[options]\nacq_options = [1]\n", "a table"),
        ("problems = ['branin']\nseeds = [0]\n[options]\nmodel_options = 3\n", "a table"),
    ]:
        bad.write_text(base + body)
        with pytest.raises(ValueError, match=message):
            campaigns(load_spec(bad))
    # a boolean is no number of steps (TOML's true was taken as steps = 1)
    bad.write_text(
        base.replace("steps = 3", "steps = true") + "problems = ['branin']\nseeds = [0]\n"
    )
    with pytest.raises(ValueError, match="'steps' must be an integer"):
        load_spec(bad)
    # model options reach the model only when it is built: checked on a model of a few points
    bad.write_text(
        base + "problems = ['branin']\nseeds = [0]\n[options.model_options]\nbogus = 1\n"
    )
    with pytest.raises(ValueError, match="bogus"):
        campaigns(load_spec(bad))
    # the workers' device is theirs: a machine without one still submits the sweep
    good = base + "problems = ['branin']\nseeds = [0]\n[options]\ndevice = 'cuda'\n"
    bad.write_text(good)
    assert [c.options["device"] for c in campaigns(load_spec(bad))] == ["cuda"]


def test_sweep_plot_of_a_problem_without_a_known_optimum_shows_the_best_value(tmp_path):
    """hartmann at 4 inputs has no known optimum, so no record has a regret: the plot crashed
    with an IndexError after every campaign had run (and on every rerun)."""
    from bo_online.sweep import plot_sweep

    out = tmp_path / "sweep"
    summaries = []
    for seed in (0, 1):
        problem = synthetic_problem("hartmann", dim=4)
        assert problem.optimal_value is None
        name = f"hartmann4d-exact-qucb-s{seed}"
        loop = BayesOptLoop(
            problem, model="exact", acq="qucb", seed=seed, out_dir=out / name, quiet=True, **FAST
        )
        records = loop.run(steps=2)
        assert all(r.get("regret") is None for r in records)
        summaries.append(
            {
                "campaign": name,
                "problem": "hartmann4d",
                "model": "exact",
                "acq": "qucb",
                "seed": seed,
                "regret": None,
            }
        )
    (written,) = plot_sweep(summaries, out)
    assert written.is_file() and written.stat().st_size > 0


def _square_or_raise(x: int) -> int:
    if x == 3:
        raise RuntimeError("job 3 failed")
    time.sleep(0.05 * (5 - x))  # later jobs finish first: results must still come in job order
    return x * x


def test_map_on_cluster_keeps_job_order_and_stops_on_the_first_error(client):
    from bo_online.sweep import map_on_cluster

    seen = []
    results = map_on_cluster(
        client,
        _square_or_raise,
        [(0,), (1,), (2,), (4,)],
        on_result=lambda job, r: seen.append((job[0], r)),
    )
    assert results == [0, 1, 4, 16]
    assert sorted(seen) == [(0, 0), (1, 1), (2, 4), (4, 16)]
    with pytest.raises(RuntimeError, match="job 3 failed"):
        map_on_cluster(client, _square_or_raise, [(1,), (3,), (2,)])


def test_resume_max_failures_needs_an_asynchronous_run(tmp_path, capsys):
    from bo_online.cli import main

    out = tmp_path / "run"
    BayesOptLoop(synthetic_problem("branin"), model="exact", out_dir=out, quiet=True, **FAST).run(
        steps=1
    )
    with pytest.raises(SystemExit) as e:
        main(["resume", str(out), "--max-failures", "3", "--quiet"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--max-failures applies to asynchronous runs: add --dask" in err and err.count("\n") == 1


def test_an_interrupted_sweep_says_to_run_the_sweep_again(tmp_path, capsys, monkeypatch):
    """It advised `bo-online resume DIR`, which is for single runs."""
    import contextlib

    import bo_online.cli as cli
    import bo_online.sweep as sweep

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.running, "_dask_client", lambda address: contextlib.nullcontext(None))
    monkeypatch.setattr(sweep, "run_sweep", interrupted)
    monkeypatch.setattr(cli.running, "_ACTIVE_SWEEP", [])
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", str(_spec(tmp_path / "spec.toml", [0])), "--out", str(tmp_path / "o")])
    assert e.value.code == 130
    err = capsys.readouterr().err
    assert "interrupted; run the same `bo-online sweep` command again" in err

    class _Run:  # a later single run in the same process gets the single-run advice again
        out_dir = None

        def run(self, steps):
            pass

    cli.running._run(_Run(), 1)
    assert cli.running._ACTIVE_SWEEP == []


def test_a_task_that_raises_on_a_local_cluster_prints_no_dask_traceback(capfd):
    """On the CLI's LocalCluster (--dask local:N, and bo-online sweep), every task that raised
    (an objective failing, a campaign that cannot be resumed) made its worker log Dask's
    multi-line "Compute Failed" report with a raw traceback on the terminal, around the
    one-line error or failure record the loop gives for it."""
    from bo_online.loops.async_bo import connect

    client = connect("local:1")
    cluster = client.cluster
    try:
        future = client.submit(_square_or_raise, 3, pure=False)
        assert str(future.exception(timeout=60)) == "job 3 failed"
        assert client.submit(_square_or_raise, 2, pure=False).result(timeout=60) == 4
    finally:
        client.close()
        cluster.close()
    err = capfd.readouterr().err
    assert "Compute Failed" not in err and "Traceback" not in err


def test_too_many_failures_on_the_cli_says_how_to_resume_the_run(client, tmp_path, capsys):
    """`bo-online bo --dask ...` stopped by --max-failures ended with "Fix the objective, then
    resume the run.": no command, while resuming it needs --objective, --dask and a higher
    --max-failures (the count runs over the whole run, so the old limit stops it again at its
    next failure). The message now gives that command, which continues the run."""
    import contextlib
    import shlex

    import bo_online.cli as cli

    flag = tmp_path / "broken"
    objective = tmp_path / "sometimes.py"
    objective.write_text(
        "import os\n\n"
        "def f(X):\n"
        f"    if os.path.exists({str(flag)!r}):\n"
        "        raise RuntimeError('sensor offline')\n"
        "    return (X ** 2).sum(-1)\n"
    )
    spec, out = f"{objective}:f", tmp_path / "run"
    fast = ["--n-init", "3", "--fit-max-iter", "5", "--num-restarts", "2", "--raw-samples", "32"]
    fast += ["--acqf-maxiter", "20", "--acq", "ts", "--quiet", "--no-plots"]
    first = ["bo", "--objective", spec, "--bounds", "0,1 0,1", "--steps", "2", "--out", str(out)]
    # the CLI's cluster is the module's (started once): local:2 names it
    cli_client = lambda address: contextlib.nullcontext(client)  # noqa: E731
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli.running, "_dask_client", cli_client)
        cli.main([*first, "--dask", "local:2", "--checkpoint-seconds", "0", *fast])
        flag.touch()  # every evaluation after the first two steps fails
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            cli.main(
                [
                    "resume",
                    str(out),
                    "--objective",
                    spec,
                    "--steps",
                    "6",
                    "--dask",
                    "local:2",
                    "--max-failures",
                    "1",
                    "--quiet",
                    "--no-plots",
                ]
            )
        assert e.value.code == 1
        line = capsys.readouterr().err.strip().splitlines()[-1]  # (after any warnings)
        assert line.startswith("bo-online: error:") and "(more than --max-failures 1)" in line
        assert "max_failures" not in line  # the option, not the loop's Python argument
        assert line.count("`") == 2
        command = line.split("`")[1]
        failures = history.load_checkpoint(out / history.CHECKPOINT_FILE)["state"]["failures"]
        assert command == (
            f"bo-online resume {shlex.quote(str(out))} --objective {shlex.quote(spec)} "
            f"--dask local:2 --max-failures {failures + 1}"
        )
        flag.unlink()  # the objective fixed: the command continues the run
        argv = shlex.split(command)[1:]
        stopped_at = history.load_checkpoint(out / history.CHECKPOINT_FILE)["step_count"]
        assert stopped_at < 6  # (each failed evaluation is a step)
        cli.main([*argv, "--steps", "6", "--quiet", "--no-plots"])
    ckpt = history.load_checkpoint(out / history.CHECKPOINT_FILE)
    assert (ckpt["step_count"], ckpt["state"]["failures"]) == (6, failures)


def test_an_interrupted_asynchronous_run_says_to_resume_it_on_a_cluster(client, tmp_path, capsys):
    """Ctrl-C on `bo-online bo --dask ...` advised `bo-online resume DIR`, which an asynchronous
    run refuses without --dask. The advice now gives the cluster, and the command, run as
    written, finishes the run."""
    import contextlib
    import shlex

    import bo_online.cli as cli

    out = tmp_path / "run"
    argv = ["bo", "--problem", "branin", "--steps", "3", "--n-init", "3", "--acq", "ts"]
    argv += ["--fit-max-iter", "5", "--out", str(out), "--quiet", "--no-plots"]
    real_run = AsyncBayesOptLoop.run

    def interrupted_after_step_1(self, steps=None, callback=None):
        def stop(record):
            if record["step"] == 1:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: a checkpoint, then stop

        return real_run(self, steps, callback=stop)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli.running, "_dask_client", lambda address: contextlib.nullcontext(client))
        mp.setattr(AsyncBayesOptLoop, "run", interrupted_after_step_1)
        with pytest.raises(SystemExit) as e:
            cli.main([*argv, "--dask", "local:2"])
        assert e.value.code == 130
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith("bo-online: error: interrupted; continue the run with `"), line
        command = line.split("`")[1]
        assert command == f"bo-online resume {shlex.quote(str(out))} --dask local:2"
        mp.setattr(AsyncBayesOptLoop, "run", real_run)
        cli.main([*shlex.split(command)[1:], "--quiet", "--no-plots"])
    assert history.load_checkpoint(out / history.CHECKPOINT_FILE)["step_count"] == 3


def test_sweep_out_naming_a_file_is_refused_before_a_cluster_starts(tmp_path, capsys):
    """`bo-online sweep SPEC --out FILE` started its cluster and submitted every campaign, each
    of which then failed on a worker ("Cannot write to the run directory FILE/<campaign>")."""
    import bo_online.cli as cli

    out = tmp_path / "results.txt"
    out.write_text("mine")
    started = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli.running, "_dask_client", lambda address: started.append(address))
        with pytest.raises(SystemExit) as e:
            cli.main(["sweep", str(_spec(tmp_path / "spec.toml", [0])), "--out", str(out)])
    assert e.value.code == 2 and started == []
    err = capsys.readouterr().err
    assert err.startswith("bo-online: error: --out") and "is a file" in err, err
    assert err.count("\n") == 1 and out.read_text() == "mine"


def test_an_unwritable_sweep_out_is_refused_before_a_cluster_starts(tmp_path, capsys):
    """`bo-online sweep SPEC --out FILE/sweep` (or a read-only --out) started its cluster, then
    stopped at its first campaign ("Cannot write to the run directory ...", 27 s later on a
    one-worker cluster); it is now refused before a cluster starts."""
    import bo_online.cli as cli

    (tmp_path / "results.txt").write_text("mine")
    out = tmp_path / "results.txt" / "sweep"
    started = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli.running, "_dask_client", lambda address: started.append(address))
        with pytest.raises(SystemExit) as e:
            cli.main(["sweep", str(_spec(tmp_path / "spec.toml", [0])), "--out", str(out)])
    assert e.value.code == 2 and started == []
    err = capsys.readouterr().err
    assert err.startswith(f"bo-online: error: Cannot write to the run directory {str(out)!r}")
    assert "choose another --out" in err and err.count("\n") == 1
    assert (tmp_path / "results.txt").read_text() == "mine"


def test_a_sweep_that_cannot_write_its_plots_says_to_run_the_sweep_again(
    tmp_path, capsys, monkeypatch
):
    """A sweep whose plots could not be written (a full disk) ended with the advice of a run,
    "an interrupted run continues with `bo-online resume OUT_DIR`": the sweep's folder is no
    run, and `bo-online resume` refuses it. It now says to run the same sweep command again."""
    import contextlib
    import errno

    import bo_online.cli as cli
    import bo_online.sweep as sweep

    out = tmp_path / "sweep"

    def full(summaries, folder):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "plots"))

    monkeypatch.setattr(cli.running, "_dask_client", lambda a: contextlib.nullcontext(None))
    monkeypatch.setattr(sweep, "run_sweep", lambda spec, folder, client: [])
    monkeypatch.setattr(sweep, "plot_sweep", full)
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", str(_spec(tmp_path / "spec.toml", [0])), "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bo-online resume" not in err, err
    assert err.startswith(f"bo-online: error: No space left on device ({out / 'plots'}); ")
    assert "then try again (run the same `bo-online sweep` command again" in err


def _sweep_refused_before_its_cluster(spec, tmp_path, capsys) -> str:
    """Run ``bo-online sweep spec``: it must exit with status 2 before a cluster starts or its
    output folder exists; returns the error printed."""
    import bo_online.cli as cli

    started = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli.running, "_dask_client", lambda address: started.append(address))
        with pytest.raises(SystemExit) as e:
            cli.main(["sweep", str(spec), "--out", str(tmp_path / "sweep")])
    assert e.value.code == 2 and started == []
    assert not (tmp_path / "sweep").exists()
    return capsys.readouterr().err


def test_a_sweep_of_a_dense_model_beyond_memory_is_refused_before_a_cluster_starts(
    tmp_path, capsys
):
    """`bo-online bo` refuses an exact GP whose n x n factor will not fit by the run's end; a
    sweep of the same campaign started its cluster and ran it until a worker ran out of
    memory. Refused with the campaign named, before anything starts (n = 5 + 3 x 10^6)."""

    spec = _spec(tmp_path / "spec.toml", [0])
    spec.write_text(spec.read_text().replace("steps = 3", "steps = 1000000"))
    err = _sweep_refused_before_its_cluster(spec, tmp_path, capsys)
    assert "--model exact holds an n x n factor" in err and "(n = 1,000,005)" in err, err
    assert "a smaller steps in the spec (campaign branin-exact-qucb-s0)" in err, err


def test_a_sweep_of_thompson_sampling_beyond_memory_is_refused_before_a_cluster_starts(
    tmp_path, capsys
):
    """`bo-online bo --acq ts` refuses a candidate count whose joint posterior sample does not
    fit in memory; a sweep's campaign of it started its cluster and failed at its first step.
    Refused with the campaign named, before anything starts (10^6 candidates: 96 TB)."""

    spec = _spec(tmp_path / "spec.toml", [0])
    spec.write_text(spec.read_text() + "acq_options = {num_candidates = 1000000}\n")
    err = _sweep_refused_before_its_cluster(spec, tmp_path, capsys)
    assert "--acq ts samples jointly over its 1,000,000 candidates" in err, err
    assert "or fewer (campaign branin-exact-ts-s0)." in err, err


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "already holds a run"),  # --out names an existing run, no --overwrite
        (["--overwrite", "--model-option", "bogus=1"], "bogus"),
    ],
)
def test_bo_dask_options_are_checked_before_the_cluster_starts(tmp_path, capsys, args, message):
    """`bo-online bo --dask ...` built its loop, which checks the options and the run
    directory, only once the cluster had started (seconds to minutes): a user mistake was
    reported after that wait, and with a LocalCluster started for nothing."""
    import bo_online.cli as cli

    out = tmp_path / "run"
    BayesOptLoop(synthetic_problem("branin"), out_dir=out, quiet=True, **FAST).run(steps=0)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    started = []
    argv = ["bo", "--problem", "branin", "--dask", "local:2", "--out", str(out), "-Q", *args]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli.running, "_dask_client", lambda address: started.append(address))
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
    assert e.value.code == 2 and started == []
    err = capsys.readouterr().err
    assert err.startswith("bo-online: error:") and message in err and err.count("\n") == 1, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_sweep_spec_entries_of_the_wrong_type_are_one_line_errors(tmp_path, capsys):
    """A model or problem name that is not a string ended in a traceback (AttributeError: 'int'
    object has no attribute 'lower'), a noise given as text in "could not convert string to
    float: 'high'" naming neither spec nor problem, and a seed beyond 2**63 - 1 in "Overflow
    when unpacking long long"."""
    from bo_online.cli import main

    spec = tmp_path / "spec.toml"
    base = "steps = 1\nacqs = ['qucb']\n"
    for body, message in [
        ("problems = ['branin']\nmodels = [1]\nseeds = [0]\n", "'models' must be .* names"),
        ("problems = [{name = 3}]\nmodels = ['exact']\nseeds = [0]\n", "name .* a string"),
        (
            "problems = [{name = 'branin', noise = 'high'}]\nmodels = ['exact']\nseeds = [0]\n",
            "'branin'.* 'noise'",
        ),
        ("problems = ['branin']\nmodels = ['exact']\nseeds = [9223372036854775808]\n", "2\\*\\*63"),
    ]:
        spec.write_text(base + body)
        with pytest.raises(SystemExit) as e:
            main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--quiet"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith("bo-online: error:") and re.search(message, err), err
        assert not (tmp_path / "out").exists()


def test_a_sweep_noise_integer_beyond_float_range_is_a_one_line_error(tmp_path, capsys):
    """TOML and YAML integers have no size limit: a noise of 10**400 ended in a traceback
    ('OverflowError: int too large to convert to float') where every other bad noise is one line
    naming the problem."""
    from bo_online.cli import main

    spec = tmp_path / "spec.toml"
    spec.write_text(
        "steps = 1\nacqs = ['qucb']\nmodels = ['exact']\nseeds = [0]\n"
        f"problems = [{{name = 'branin', noise = {10**400}}}]\n"
    )
    with pytest.raises(SystemExit) as e:
        main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("bo-online: error:") and re.search("'branin'.* 'noise'", err), err
    assert not (tmp_path / "out").exists()


def test_a_campaign_shows_each_warning_text_once_on_one_line(capsys):
    """A library warning raised at every step of a campaign (BoTorch's five-line advice against
    --acq ei) was printed in full each time; each text is now one line, once per campaign."""
    import warnings

    from bo_online.sweep import _one_line_warnings

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        for name in ("A", "B"):
            with _one_line_warnings(name):
                for _ in range(3):
                    warnings.warn("advice\n\n\t old \t --> \t new \n\nthe end")
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"bo-online: warning: campaign {name}: advice old --> new the end (UserWarning)"
        for name in ("A", "B")
    ], err


def test_a_campaign_that_raises_stops_the_sweep_with_one_line_naming_it(
    tmp_path, capsys, monkeypatch
):
    """A campaign that raised mid-sweep stopped it with a traceback of the task's own error (or
    Dask's KilledWorker, which names a task key): no word of which campaign failed or what to
    do. It now stops the sweep with one line naming the campaign and its run directory, and
    saying to run the sweep again."""
    import contextlib
    import logging

    import bo_online.cli as cli
    import bo_online.sweep as sweep

    def run(campaign, run_dir):
        if campaign.acq == "ts":
            raise RuntimeError("the model broke")
        return sweep._summary(campaign, [{"n": 5, "regret": 1.0, "wall_time": 0.1}], "ran")

    # worker threads of this process, which see the patched campaign body
    cluster = distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        dashboard_address=None,
        silence_logs=logging.CRITICAL,
    )
    with cluster, distributed.Client(cluster) as client:
        monkeypatch.setattr(sweep, "_run_campaign", run)
        monkeypatch.setattr(
            cli.running, "_dask_client", lambda address: contextlib.nullcontext(client)
        )
        spec, out = _spec(tmp_path / "spec.toml", [0]), tmp_path / "sweep"
        with pytest.raises(SystemExit) as e:
            cli.main(["sweep", str(spec), "--out", str(out), "--quiet", "--no-plots"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (
        f"Campaign branin-exact-ts-s0 (in {str(out / 'branin-exact-ts-s0')!r}) failed: "
        "RuntimeError: the model broke; the sweep stopped." in err
    )
    assert "run the sweep again" in err


def test_a_campaign_error_ending_in_a_full_stop_reads_as_one_sentence(tmp_path):
    """A campaign's error that ends in a full stop (every RunFileError does) was followed by
    "; the sweep stopped", printing "... free space.; the sweep stopped."."""
    from bo_online.errors import CampaignError
    from bo_online.sweep import _campaign_error, campaigns, load_spec

    c = campaigns(load_spec(_spec(tmp_path / "spec.toml", [0])))[0]
    error = history.RunFileError("Cannot write to the run directory 'x' (Read-only file system).")
    message = str(_campaign_error(c, tmp_path, error))
    assert isinstance(_campaign_error(c, tmp_path, error), CampaignError)
    assert ".;" not in message
    assert message.startswith(f"Campaign {c.name} (in {str(tmp_path / c.name)!r}) failed: ")
    assert "(Read-only file system); the sweep stopped. Fix the cause" in message


def test_an_initial_design_point_that_kills_its_workers_is_the_objectives_failure(tmp_path):
    """The initial design runs on the cluster too: an objective that crashed its worker there
    ended the run with Dask's KilledWorker traceback (a task key, no objective named), where a
    dead process-pool worker or a later point is the objective's failure."""
    import dask

    from bo_online.errors import ObjectiveError

    (tmp_path / "armed").touch()
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        )
        with cluster, distributed.Client(cluster) as client:
            problem = _Crashing(tmp_path, kill_at=-1, raise_at=())
            loop = AsyncBayesOptLoop(problem, client, model="exact", acq="qucb", **FAST)
            with pytest.raises(ObjectiveError, match="Objective 'flaky': Dask gave up on a point"):
                loop.run(steps=1)
    assert loop.step_count == 0 and not loop.records


def test_a_failure_in_the_initial_design_keeps_the_good_evaluations(client, tmp_path):
    r"""One failed point of the asynchronous initial design discarded the whole design (11 good
    evaluations of 12 were thrown away with it, and the run stopped). The good ones now build
    the first model, the failed one is recorded as a failed evaluation (a record of step 0
    after the design's own) and counts towards ``max_failures`` as a later failure does: over
    the limit, the run stops saved, and a resume continues it."""
    from torch.quasirandom import SobolEngine

    from bo_online.problems import from_unit

    problem = _Flaky(tmp_path, kill_at=-1, raise_at=(2,))
    (tmp_path / "armed").touch()
    out = tmp_path / "run"
    loop = AsyncBayesOptLoop(
        problem, client, model="exact", acq="qucb", max_failures=0, out_dir=out, **FAST
    )
    with pytest.raises(TooManyFailures, match="max_failures=0"):
        loop.run(steps=2)
    assert loop.failures == 1 and loop.step_count == 0
    design, failure = loop.records
    assert design["step"] == 0 and design["n"] == 4 and not design.get("failed")
    assert failure["step"] == 0 and failure["failed"] and failure["n"] == 4
    assert "RuntimeError: instrument fault at call 2" in failure["error"]
    # The model holds the 4 good points of the Sobol design, with their values.
    X0 = from_unit(
        SobolEngine(2, scramble=True, seed=0).draw(5, dtype=torch.float64), problem.bounds
    )
    bad = torch.tensor(failure["X"], dtype=torch.float64).reshape(1, 2)
    keep = (X0 - bad).abs().sum(-1) > 0
    assert int(keep.sum()) == 4
    torch.testing.assert_close(loop.X, X0[keep], rtol=0, atol=0)
    torch.testing.assert_close(loop.y, problem.inner.evaluate_true(X0[keep]), rtol=0, atol=0)
    U, Y = loop._training_data()
    assert U.shape[0] == 4
    Xs = torch.rand(10, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mean, var = _dense_posterior(loop.model, U, Y, Xs)
    with torch.no_grad():
        post = loop.model.posterior(Xs)
    torch.testing.assert_close(post.mean.reshape(-1), mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(post.variance.reshape(-1), var, rtol=1e-5, atol=1e-8)
    # saved with its failure; a resume goes on (the limit stops the run at the next failure)
    ckpt = history.load_checkpoint(out / history.CHECKPOINT_FILE)
    assert ckpt["state"]["failures"] == 1 and history.read_records(out) == loop.records
    resumed = load_loop(out, problem=problem, client=client)
    records = resumed.run(steps=2)
    assert resumed.step_count == 2 and len(_evaluations(records)) == 2
    assert resumed.X.shape[0] == 4 + 2 and resumed.failures == 1


def test_an_initial_design_that_all_failed_says_so_and_writes_nothing(client, tmp_path):
    r"""With every point of the initial design failed there is nothing to build a model on:
    the run stops with the objective's error as the synchronous loop's does, saying that all
    points failed, before anything is written."""
    from bo_online.errors import ObjectiveError

    problem = _Flaky(tmp_path, kill_at=-1, raise_at=tuple(range(5)))
    (tmp_path / "armed").touch()
    out = tmp_path / "run"
    loop = AsyncBayesOptLoop(problem, client, model="exact", acq="qucb", out_dir=out, **FAST)
    with pytest.raises(ObjectiveError, match="all 5 points of the initial design failed") as e:
        loop.run(steps=2)
    assert "RuntimeError: instrument fault at call" in str(e.value)
    assert not loop.records and loop.model is None
    assert not (out / history.RECORDS_FILE).exists()
    assert not (out / history.CHECKPOINT_FILE).exists()


def test_an_initial_design_that_all_failed_on_the_cli_says_what_to_do(
    client, tmp_path, capsys, monkeypatch
):
    """The CLI's line for a design without a good point: what failed and what to do."""
    import contextlib

    import bo_online.cli as cli

    monkeypatch.setattr(cli.running, "_dask_client", lambda a: contextlib.nullcontext(client))
    (tmp_path / "always_fails.py").write_text(
        "def f(X):\n    raise RuntimeError('no instrument')\n"
    )
    out = tmp_path / "run"
    argv = ["bo", "--objective", f"{tmp_path / 'always_fails.py'}:f", "--bounds", "0,1 0,1"]
    argv += ["--steps", "2", "--out", str(out), "--dask", "local:2", "--n-init", "3"]
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--quiet", "--no-plots"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1, err
    assert "all 3 points of the initial design failed" in err
    assert "RuntimeError: no instrument" in err
    assert err.endswith("fix the objective, then run the same command again (nothing was kept)")


def test_a_resumed_run_keeps_its_max_in_flight(client, tmp_path):
    """``max_in_flight`` was not saved: a run limited to one evaluation at a time resumed with
    one per worker of the cluster (and load_loop takes no such option), so its later points
    were proposed with pending points it never had."""
    out = tmp_path / "run"
    loop = AsyncBayesOptLoop(
        synthetic_problem("branin"),
        client,
        model="exact",
        acq="qucb",
        max_in_flight=1,
        out_dir=out,
        quiet=True,
        **FAST,
    )
    loop.run(steps=2)
    resumed = load_loop(out, client=client)
    assert resumed.max_in_flight == 1 and resumed.slots() == 1 < len(client.nthreads())
    records = resumed.run(steps=5)
    assert len(_evaluations(records)) == 5
    assert all(len(r["pending"]) == 0 for r in _evaluations(records))  # one at a time
    with pytest.raises(ValueError, match="max_in_flight must be an integer >= 1, got 1.5"):
        AsyncBayesOptLoop(synthetic_problem("branin"), client, max_in_flight=1.5)


def test_sweep_summary_counts_the_seeds_of_a_problem_without_a_known_optimum():
    """The table over seeds counted only campaigns with a regret: a problem without a known
    optimum (hartmann at 4 inputs) was reported as run on 0 seeds."""
    import math

    from bo_online.sweep import summarize

    rows = summarize(
        [
            {"problem": p, "model": "exact", "acq": "qucb", "regret": r}
            for p, r in [
                ("hartmann4d", None),
                ("hartmann4d", None),
                ("branin", 1.0),
                ("branin", 3.0),
            ]
        ]
    )
    assert [(r["problem"], r["seeds"]) for r in rows] == [("hartmann4d", 2), ("branin", 2)]
    assert math.isnan(rows[0]["mean_regret"]) and math.isnan(rows[0]["se_regret"])
    assert rows[1]["mean_regret"] == 2.0 and rows[1]["se_regret"] == pytest.approx(1.0)


def test_dask_local_with_more_workers_than_the_machine_takes_is_refused(monkeypatch):
    """``--dask local:N`` had no upper limit (``--workers`` has 4 x the CPU count): a slip such
    as local:1000 started a thousand worker processes, each loading torch."""
    from bo_online.loops.async_bo import connect

    def started(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(distributed, "LocalCluster", started)
    limit = 4 * (os.cpu_count() or 1)
    with pytest.raises(ValueError, match=rf"at most 4 x the CPU count \({limit}\), got 'local:"):
        connect(f"local:{limit + 1}")


@pytest.mark.parametrize("address", ["tcp://", "tcp://host", "tcp://host:port"])
def test_a_malformed_scheduler_address_is_refused_naming_dask_without_a_client(
    address, monkeypatch
):
    """``--dask tcp://`` ended in Dask's own 'missing port number in address' (no word of
    --dask), and the half-built Client then hung the interpreter's exit for 40 s."""
    from bo_online.loops.async_bo import connect

    def built(*args, **kwargs):
        raise AssertionError("a Client was built")

    monkeypatch.setattr(distributed, "Client", built)
    with pytest.raises(ValueError, match=rf"--dask '{address}' is not a scheduler address .*"):
        connect(address)


def test_a_whole_number_float_max_in_flight_runs(client):
    """``max_in_flight=2.0`` passed the integer check and was kept as a float: the first fill of
    the free slots raised ``TypeError`` in ``range(2.0)``. It is held (and saved) as the int 2."""
    loop = AsyncBayesOptLoop(
        synthetic_problem("branin"),
        client,
        model="exact",
        acq="qucb",
        max_in_flight=2.0,
        quiet=True,
        **FAST,
    )
    assert loop.slots() == 2 and type(loop.slots()) is int
    assert type(loop.config["max_in_flight"]) is int
    assert len(_evaluations(loop.run(steps=3))) == 3


def _hand_made_campaigns(out: Path, regrets: dict[int, list[float | None]], problem="branin"):
    r"""Run directories of campaigns of one (problem, model, acq) with the given regret per step
    (records written by hand: no cluster), and their summaries as ``run_sweep`` gives them."""
    summaries = []
    for seed, values in regrets.items():
        name = f"{problem}-exact-qucb-s{seed}"
        (out / name).mkdir(parents=True)
        for step, value in enumerate(values):
            record = {"step": step, "n": 5 + step, "regret": value, "wall_time": 0.5 * (step + 1)}
            history.append_record(out / name / history.RECORDS_FILE, record)
        summaries.append(
            {
                "campaign": name,
                "problem": problem,
                "model": "exact",
                "acq": "qucb",
                "seed": seed,
                "steps": len(values) - 1,
                "evaluations": 5 + len(values) - 1,
                "regret": values[-1],
                "wall_time": 0.5 * len(values),
                "status": "ran",
            }
        )
    return summaries


def test_sweep_summary_file_holds_every_campaign_and_the_table_over_seeds(tmp_path):
    """With --quiet a sweep's results were only in each campaign's records: no file held the
    table. summary.json holds the campaigns and the mean +- SE over seeds (null where a problem
    has no known optimum)."""
    from bo_online.sweep import SUMMARY_FILE, write_summary

    out = tmp_path / "sweep"
    summaries = _hand_made_campaigns(out, {0: [2.0, 1.0], 1: [4.0, 3.0], 2: [5.0, 5.0]})
    summaries += _hand_made_campaigns(out, {0: [None, None]}, problem="hartmann4d")
    path = write_summary(summaries, out)
    assert path == out / SUMMARY_FILE
    saved = json.loads(path.read_text())  # strict JSON: no bare NaN
    assert saved["campaigns"] == summaries
    branin, hartmann = saved["over_seeds"]
    mean = (1.0 + 3.0 + 5.0) / 3
    se = (sum((v - mean) ** 2 for v in (1.0, 3.0, 5.0)) / 2 / 3) ** 0.5
    assert branin["seeds"] == 3 and branin["mean_regret"] == pytest.approx(mean)
    assert branin["se_regret"] == pytest.approx(se)
    assert hartmann["seeds"] == 1 and hartmann["mean_regret"] is None
    assert hartmann["se_regret"] is None


def _plot_sweep_figures(summaries, out):
    r"""``plot_sweep(summaries, out)``'s written paths and the matplotlib figures it drew."""
    from bo_online import plotting
    from bo_online.sweep import plot_sweep

    figures = []
    real = plotting._save

    def save(fig, path):
        figures.append(fig)
        return real(fig, path)

    plotting._save, saved = save, plotting._save
    try:
        written = plot_sweep(summaries, out)
    finally:
        plotting._save = saved
    return written, figures


def test_sweep_plot_band_stops_at_the_lowest_seed_on_the_log_axis(tmp_path):
    """Two seeds with spread regrets put the mean minus 2 SE below zero; the band was clipped
    at 1e-12, which stretched the log axis over twelve decades and squashed the curves."""
    out = tmp_path / "sweep"
    summaries = _hand_made_campaigns(out, {0: [3.0, 0.5, 0.2], 1: [9.0, 6.0, 4.0]})
    (written,), figures = _plot_sweep_figures(summaries, out)
    assert written.is_file()
    for ax in figures[0].axes:
        low, high = ax.get_ylim()
        assert 0.05 < low <= 0.2 and high >= 9.0, (low, high)


def test_the_sweep_table_shows_whole_campaign_names(tmp_path, capsys, monkeypatch):
    """Rich cut the campaign column to fit 80 columns (the width of a pipe or a log file):
    `hartmann6d-exact-qucb…` twice, with different numbers, the seed that tells them apart cut
    off. The names are printed whole; so are the numbers beside them."""
    import contextlib

    import bo_online.cli as cli
    import bo_online.sweep as sweep

    out = tmp_path / "o"
    summaries = _hand_made_campaigns(out, {0: [3.0, 2.5], 1: [4.0, 1.25]}, "styblinskitang7d")
    monkeypatch.setattr(cli.running, "_dask_client", lambda address: contextlib.nullcontext(None))
    monkeypatch.setattr(sweep, "run_sweep", lambda *args: summaries)
    monkeypatch.setenv("COLUMNS", "80")
    cli.main(["sweep", str(_spec(tmp_path / "spec.toml", [0])), "--out", str(out), "--no-plots"])
    lines = capsys.readouterr().out.splitlines()
    for seed, regret in ((0, "2.5"), (1, "1.25")):
        (row,) = [line for line in lines if f"styblinskitang7d-exact-qucb-s{seed} " in line]
        assert f" {regret} " in row and " ran " in row, row
    assert not any("…" in line for line in lines)


def test_sweep_plot_vs_wall_time_averages_every_seed_from_its_first_point(tmp_path):
    """The wall-time panel started where the fastest seed's initial design ended: until the
    other seeds' first records it drew that one seed's regret as the "mean over 2 seeds" (and
    a band of width 0), then the curve dropped or rose as the others came in, which read as
    progress. The curves now start once every seed has a value: there, the mean of all."""
    out = tmp_path / "sweep"
    summaries = _hand_made_campaigns(out, {0: [3.0, 1.0], 1: [9.0, 5.0]})
    path = out / summaries[1]["campaign"] / history.RECORDS_FILE
    late = [{**r, "wall_time": r["wall_time"] + 2.0} for r in history.read_records(path.parent)]
    path.write_text("".join(json.dumps(r) + "\n" for r in late))  # seed 1 starts at 2.5 s
    _, figures = _plot_sweep_figures(summaries, out)
    by_n, by_t = (ax.get_lines()[0] for ax in figures[0].axes)
    # by evaluations both start at n = 5; by wall time at 2.5 s, where seed 0 (done at 1 s)
    # holds its last value
    for line, start, first in ((by_n, 5.0, (3.0 + 9.0) / 2), (by_t, 2.5, (1.0 + 9.0) / 2)):
        x, y = line.get_xdata(), line.get_ydata()
        assert x[0] == pytest.approx(start) and y[0] == pytest.approx(first), (x, y)
        assert y[-1] == pytest.approx((1.0 + 5.0) / 2)
