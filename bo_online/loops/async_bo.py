r"""Asynchronous parallel BO on a Dask cluster.

Every worker of a ``distributed.Client`` is kept busy: whenever one is free, the loop proposes
one point with the points still being evaluated treated as pending, submits it, and folds each
result into the online surrogate the moment it arrives (``model.update``, in arrival order).

Pending points:

* ``qucb`` / ``qlognei``: BoTorch's ``X_pending`` (the MC acquisition is evaluated jointly over
  the candidate and the pending points, i.e. it integrates over their fantasised outcomes);
* ``ts``: each proposal is an independent joint posterior sample over fresh Sobol candidates, as
  in asynchronous Thompson sampling (Kandasamy, Krishnamurthy, Schneider, Poczos, "Parallelised
  Bayesian Optimisation via Thompson Sampling", AISTATS 2018); candidates that coincide with a
  pending point are excluded, so no point is evaluated twice at once.

Reproducibility: proposal ``k`` draws its randomness from ``(seed, k)`` and the observation noise
of the evaluation of proposal ``k`` from ``(seed, k, "noise")``, so a point resubmitted after the
driver was killed gives the same observation. The checkpoint holds the points in flight; a resumed
loop resubmits them before proposing new ones, and ends with the same number of evaluations.

Failures: a worker that dies mid-evaluation is handled by Dask (the scheduler reruns the task on
another worker); if Dask gives up (``KilledWorker``) the point is resubmitted. An objective that
raises, or returns NaN/inf or other than one value for the point, is recorded as a failed
evaluation (``"failed": true``) and the campaign goes on, until more
than ``max_failures`` evaluations have failed. A failed evaluation is a step as a folded-in one is
(``steps`` counts evaluations, each record after the initial design has a step of its own), but
adds no observation (``n``). A point of the initial design that fails is recorded so too (a
failed record of step 0, after the design's own) and the model starts from the others; with
none left (and no ``initial_data``) the run stops as the synchronous loop does.

A user objective (:func:`bo_online.objectives.objective_problem`) may be written for a batch or
for one point; each task evaluates one ``1 x d`` point, which cannot tell them apart. The first
evaluation that succeeds decides how the objective is called (until then the points go one at
a time), and every later task is sent with that decision: an objective that raises is called
once for the point, its own error recorded, not tried again the other way.

Example:
    >>> from distributed import Client, LocalCluster
    >>> client = Client(LocalCluster(n_workers=4, threads_per_worker=1, processes=True))
    >>> loop = AsyncBayesOptLoop(synthetic_problem("branin"), client, model="wiski", acq="qucb")
    >>> loop.run(steps=100)   # 100 evaluations after the initial design
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import time
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor
from torch.quasirandom import SobolEngine

from bo_online.loops import history
from bo_online.loops.bayesopt import BayesOptLoop
from bo_online.objectives import vectorised_objective, with_calling_convention
from bo_online.problems import Problem, checked_values, from_unit

__all__ = [
    "AsyncBayesOptLoop",
    "ASYNC_ACQUISITIONS",
    "TooManyFailures",
    "NoWorkers",
    "SlowProblem",
    "connect",
]

#: acquisitions that handle pending points (MC acquisitions with ``X_pending``, Thompson sampling).
ASYNC_ACQUISITIONS = ("qucb", "qlognei", "ts")


class TooManyFailures(RuntimeError):
    r"""More objective evaluations failed than the loop's ``max_failures`` allows.

    Attributes:
        failures: failed evaluations over the whole run.
        limit: the ``max_failures`` they exceed.
        last_error: the last failure's error, as recorded.
    """

    #: the advice that ends the message (the CLI words its own, with --max-failures and the
    #: command that resumes)
    ADVICE = "Fix the objective, then resume the run."

    def __init__(self, failures: int, limit: int, last_error: str) -> None:
        super().__init__(
            f"{failures} objective evaluations failed (more than max_failures={limit}); last "
            f"error: {last_error}. {self.ADVICE}"
        )
        self.failures, self.limit, self.last_error = failures, limit, last_error


class NoWorkers(RuntimeError):
    r"""The cluster has had no worker for the loop's ``no_workers_timeout`` while evaluations
    were in flight: they would wait forever.

    Attributes:
        seconds: how long the cluster had no worker.
        in_flight: evaluations in flight (kept in the checkpoint; a resume submits them again).
        saved: whether the run was saved (False: the initial design had not been evaluated,
            nothing was written, and the run is started again, not resumed).
    """

    #: the advice that ends the message (the CLI words its own, with the command that resumes)
    ADVICE = (
        "Start workers (or fix the objective; for a cluster that starts its workers slowly, "
        "give the loop a larger no_workers_timeout, or None to wait for good), then {then}."
    )

    def __init__(self, seconds: float, in_flight: int, saved: bool = True) -> None:
        #: what happened, without the advice (the CLI adds its own, with the resume command)
        self.situation = (
            f"The Dask cluster has had no worker for {seconds:.0f} s with {in_flight} "
            f"evaluation(s){'' if saved else ' of the initial design'} in flight, which would "
            "wait forever: its workers died (an objective that crashes its process, by os._exit "
            "or a segfault, can kill them faster than a cluster restarts them), were stopped or "
            "never started. "
            + (
                "The run is saved with the points in flight."
                if saved
                else "Nothing was kept (the initial design was not evaluated)."
            )
        )
        advice = self.ADVICE.format(then="resume the run" if saved else "run it again")
        super().__init__(f"{self.situation} {advice}")
        self.seconds, self.in_flight, self.saved = seconds, in_flight, saved


def _check_no_workers_timeout(value: Any) -> float | None:
    r"""``no_workers_timeout`` as the loop holds it: a positive number of seconds (a float), or
    None (also for ``inf``) to wait for workers forever; anything else is refused."""
    if value is None:
        return None
    # numbers.Real: NumPy scalars too (np.int64(300) from a config array was refused)
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok or math.isnan(value) or value <= 0:
        raise ValueError(
            "no_workers_timeout must be a positive number of seconds (how long the cluster may "
            f"have no worker while evaluations are in flight) or None to wait forever, got "
            f"{value!r}."
        )
    return None if math.isinf(value) else float(value)


def connect(address: str) -> Any:
    r"""A ``distributed.Client`` for ``local:N`` (a new ``LocalCluster`` of ``N`` single-threaded
    worker processes) or a scheduler address (``tcp://host:port``)."""
    from distributed import Client, LocalCluster

    if address.startswith("local:"):
        n = address.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"--dask local:N needs a worker count N >= 1, got {address!r}.")
        limit = 4 * (os.cpu_count() or 1)  # as --workers: each worker process loads torch
        if int(n) > limit:
            raise ValueError(
                f"--dask local:N starts N worker processes on this machine: N must be at most "
                f"4 x the CPU count ({limit}), got {address!r}; for more workers, start a Dask "
                "cluster and give its scheduler address (tcp://host:port)."
            )
        # Its workers print on this terminal: below CRITICAL, Dask logs every task that raised
        # (a failing objective, a campaign that cannot resume) as a "Compute Failed" report with
        # a raw traceback, on top of the failure record or one-line error the loop gives for it.
        cluster = LocalCluster(
            n_workers=int(n),
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.CRITICAL,
        )
        return Client(cluster)
    if "://" not in address:
        raise ValueError(
            "--dask must be local:N or a scheduler address such as tcp://host:8786, "
            f"got {address!r}."
        )
    from distributed.comm import parse_address
    from distributed.comm.addressing import parse_host_port

    # Checked before Client: a Client built from a malformed address raises, and then hangs
    # for 40 s when the interpreter collects it.
    try:
        scheme, location = parse_address(address)
        if scheme in ("tcp", "tls"):
            parse_host_port(location)
    except ValueError as e:
        raise ValueError(
            f"--dask {address!r} is not a scheduler address ({e}); give it as "
            "tcp://host:port, e.g. tcp://host:8786, or use local:N."
        ) from e
    try:
        return Client(address, timeout="20s")
    except OSError as e:
        raise ValueError(f"Cannot reach the Dask scheduler at {address!r}: {e}") from e


def _evaluate_point(problem: Problem, x: Tensor) -> dict[str, Any]:
    r"""Worker task: the noiseless objective at ``x`` (``1 x d``) with who ran it and when, and
    ``per_point``: how a user objective's wrapper called it (see
    :func:`bo_online.objectives.vectorised_objective`): ``True`` one point at a time (``fn(x:
    d)``), ``False`` on the ``1 x d`` row as given; None for a problem without such a wrapper."""
    from bo_online.objectives import vectorised_objective

    try:
        from distributed import get_worker

        worker = get_worker().address
    except ValueError:  # not on a worker (in-process fallback)
        worker = "local"
    start = time.time()
    try:
        # One finite value, else the objective's failure (a failed evaluation), as a user
        # objective's own checks make it: a problem of the user's returning NaN stopped the run
        # with the model's error, and again on every resume, which submitted the point again.
        y = checked_values(getattr(problem, "name", "objective"), x, problem.evaluate_true(x))
    except Exception as error:
        # Who ran it and when, for the failure's record (an exception's attributes travel
        # with it to the driver); a failed record had no worker or evaluation times.
        try:
            error.bo_online_evaluation = {
                "worker": worker,
                "start_time": start,
                "finish_time": time.time(),
            }
        except AttributeError:  # an exception that takes no attributes: its record has none
            pass
        raise
    wrapper = vectorised_objective(problem)
    return {
        "y_true": float(y[0]),
        "worker": worker,
        "start_time": start,
        "finish_time": time.time(),
        # undecided after a success: the 1 x d row gave one value, so rows work
        "per_point": None if wrapper is None else bool(wrapper.per_point),
    }


class SlowProblem(Problem):
    r"""A problem whose evaluations take a random time: log-normal with mean ``mean_duration``
    seconds and log-scale std ``sigma`` (heavy-tailed), drawn from the point itself so the
    duration of a point is reproducible. For benchmarks and tests of asynchronous loops."""

    def __init__(self, problem: Problem, mean_duration: float = 1.0, sigma: float = 1.0) -> None:
        if mean_duration < 0 or sigma < 0:
            raise ValueError("mean_duration and sigma must be >= 0.")
        self.inner, self.mean_duration, self.sigma = problem, float(mean_duration), float(sigma)
        self.bounds, self.noise_std = problem.bounds, problem.noise_std
        self.maximize, self.optimal_value = problem.maximize, problem.optimal_value
        self.name = f"slow-{problem.name}"
        self.spec = None  # a wrapper: resume with problem=

    def duration(self, X: Tensor) -> float:
        seed = history.step_seed(0, hash(tuple(X.reshape(-1).tolist())) & 0x7FFFFFFF, "duration")
        z = torch.randn((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        # E[exp(mu + sigma z)] = exp(mu + sigma^2 / 2) = mean_duration
        return self.mean_duration * math.exp(self.sigma * float(z) - self.sigma**2 / 2)

    def evaluate_true(self, X: Tensor) -> Tensor:
        time.sleep(self.duration(X))
        return self.inner.evaluate_true(X)


class AsyncBayesOptLoop(BayesOptLoop):
    r"""Asynchronous BO: one point per free worker, results folded in as they arrive.

    A *step* is one evaluation, folded in or failed (a failed one adds no observation);
    ``run(steps)`` ends after ``steps`` evaluations following the initial design (which is
    evaluated on the cluster too).

    Args:
        problem: the objective (see :class:`bo_online.loops.BayesOptLoop`).
        client: a ``distributed.Client`` (its workers' threads are the evaluation slots).
        acq: ``qucb``, ``qlognei`` or ``ts``.
        max_failures: stop with :class:`TooManyFailures` once more evaluations than this have
            raised (a failure at the last step of ``run``'s budget stops nothing: the run
            finishes).
        max_in_flight: evaluations at once (default: the cluster's worker threads); a resumed
            run keeps it.
        no_workers_timeout: seconds the cluster may have no worker at all while evaluations are
            in flight before the run stops with :class:`NoWorkers` (checkpointed; default 120,
            which a LocalCluster restarting a dead worker stays well within); raise it for a
            cluster that scales from zero in a batch queue, or None to wait forever. A resumed
            run keeps it.
        **kwargs: the other options of :class:`bo_online.loops.BayesOptLoop` (``q`` must be 1).
    """

    kind = "bo_async"

    #: Dask reports ``KilledWorker`` once the workers running a task have died several times
    #: (``distributed.scheduler.allowed-failures``); the point is then submitted once more (a
    #: worker lost to something else) and after that counted as a failed evaluation.
    WORKER_DEATH_ATTEMPTS: ClassVar[int] = 2
    #: how often the driver looks for finished evaluations (and for a stop signal)
    POLL_SECONDS: ClassVar[float] = 0.02
    #: how often the driver looks for workers while it waits (see ``no_workers_timeout``)
    WORKER_CHECK_SECONDS: ClassVar[float] = 2.0

    def __init__(
        self,
        problem: Problem,
        client: Any,
        acq: str = "qucb",
        max_failures: int = 10,
        max_in_flight: int | None = None,
        no_workers_timeout: float | None = 120.0,
        **kwargs: Any,
    ) -> None:
        if acq.lower() not in ASYNC_ACQUISITIONS:
            raise ValueError(
                f"Asynchronous BO needs an acquisition that handles pending points: one of "
                f"{', '.join(ASYNC_ACQUISITIONS)}; got {acq!r}."
            )
        if kwargs.get("q", 1) != 1:
            raise ValueError("Asynchronous BO proposes one point per free worker: use q=1.")
        if int(max_failures) != max_failures or max_failures < 0:
            raise ValueError(f"max_failures must be an integer >= 0, got {max_failures}.")
        if client is None or not hasattr(client, "submit"):
            raise ValueError("AsyncBayesOptLoop needs a distributed.Client (client=...).")
        if max_in_flight is not None and (int(max_in_flight) != max_in_flight or max_in_flight < 1):
            raise ValueError(f"max_in_flight must be an integer >= 1, got {max_in_flight}.")
        no_workers_timeout = _check_no_workers_timeout(no_workers_timeout)
        super().__init__(problem, acq=acq, executor=client, **kwargs)
        self.client = client
        # as an int: a whole float (2.0) passed the check and failed later in range()
        self.max_in_flight = None if max_in_flight is None else int(max_in_flight)
        self.config["max_failures"] = int(max_failures)
        self.config["max_in_flight"] = self.max_in_flight  # kept by a resume, as max_failures
        self.no_workers_timeout = no_workers_timeout
        self.config["no_workers_timeout"] = no_workers_timeout  # kept by a resume too
        self.in_flight: dict[int, dict[str, Any]] = {}  # proposal id -> X, submit time, pending
        self.next_proposal = 0
        self.failures = 0
        # How a user objective's wrapper calls it (objectives._Vectorised.per_point): decided on
        # the driver, when the wrapper already knows, or by the first evaluation that succeeds,
        # and shipped with every task after it. Undecided, a 1 x d task that raised was tried
        # again on the d-vector: a failing point called the objective twice.
        wrapper = vectorised_objective(problem)
        self.objective_per_point = None if wrapper is None else wrapper.per_point
        self._shipped: tuple[Problem, bool, Problem] | None = None
        self._futures: dict[Any, int] = {}
        # (X 1 x d, error, worker and times): for initialize
        self._initial_failures: list[tuple[Tensor, str, dict[str, Any]]] = []
        self._hold_checkpoint = False
        self._run_t0 = time.perf_counter()
        self._wall0 = 0.0

    # ------------------------------------------------------------------ proposals

    def slots(self) -> int:
        """How many evaluations run at once: one while a user objective's calling convention is
        undecided (:meth:`convention_decided`), so that the first success decides it for all
        the others."""
        if not self.convention_decided():
            return 1
        if self.max_in_flight is not None:
            return self.max_in_flight
        return max(1, sum(self.client.nthreads().values()))

    def propose_point(self, pid: int, X_pending: Tensor, k: int = 1) -> Tensor:
        r"""Proposals ``pid, ..., pid + k - 1`` (``k x d``, problem units, optimised jointly)
        given the pending points ``X_pending`` (``p x d``, problem units), with randomness seeded
        by ``(seed, pid)``."""
        name = self.config["acq"]
        U_pending = self._unit(X_pending) if X_pending.shape[0] else None
        self.model.eval()
        with history.seeded(self.config["seed"], pid, "ask_async", self.device):
            if name == "ts":
                U = self._thompson(U_pending, k)
            else:
                U = self._maximize_acquisition(k, U_pending)
        return from_unit(U.detach().cpu().to(torch.float64), self.problem.bounds)

    def _thompson(self, U_pending: Tensor | None, k: int) -> Tensor:
        from botorch.generation.sampling import MaxPosteriorSampling

        d = self.problem.dim
        n_cand = int(self.config["acq_options"].get("num_candidates", 1000))
        seed = int(torch.randint(0, 2**31 - 1, (1,)))
        cands = SobolEngine(d, scramble=True, seed=seed).draw(n_cand, dtype=torch.float64)
        cands = cands.to(**self.tkwargs)
        if U_pending is not None:  # never re-propose a point being evaluated
            keep = torch.cdist(cands, U_pending).min(-1).values > 1e-9
            cands = cands[keep]
        with torch.no_grad():
            return MaxPosteriorSampling(self.model, replacement=False)(cands, num_samples=k)

    def convention_decided(self) -> bool:
        r"""Whether every task calls the objective one way only: the problem has one calling
        convention, or its user objective's (batch or per point) is decided."""
        return self.objective_per_point is not None or vectorised_objective(self.problem) is None

    def _learn_convention(self, result: dict[str, Any]) -> None:
        r"""Adopt the calling convention a successful evaluation ``result`` reports, if the
        loop has none yet (later tasks are sent with it)."""
        if self.objective_per_point is None and result.get("per_point") is not None:
            self.objective_per_point = bool(result["per_point"])

    def _shipped_problem(self) -> Problem:
        r"""The problem sent to the workers: with its user objective's calling convention
        decided, once the loop knows it (a copy, made once; :attr:`problem` is left as it
        is)."""
        if self.objective_per_point is None:
            return self.problem
        cached = self._shipped
        if cached is None or cached[0] is not self.problem or cached[1] != self.objective_per_point:
            shipped = with_calling_convention(self.problem, self.objective_per_point)
            self._shipped = cached = (self.problem, self.objective_per_point, shipped)
        return cached[2]

    def _pending_X(self) -> Tensor:
        if not self.in_flight:
            return torch.empty(0, self.problem.dim, dtype=torch.float64)
        return torch.cat([v["X"] for _, v in sorted(self.in_flight.items())])

    def _submit(self, pid: int) -> Any:
        entry = self.in_flight[pid]
        entry["submit_time"] = time.time()
        future = self.client.submit(
            _evaluate_point, self._shipped_problem(), entry["X"], pure=False
        )
        self._futures[future] = pid
        return future

    def _fill(self, completed: Any) -> None:
        """Propose and submit until every slot is busy or the budget is covered. When several
        slots are free at once (the start, or results that arrived while the driver was busy),
        their points are proposed jointly as one q-batch, with the other points in flight
        pending: fewer acquisition optimisations when the driver is the bottleneck."""
        k = min(
            self.slots() - len(self.in_flight),
            self.target_steps - self.step_count - len(self.in_flight),
        )
        if k <= 0:
            return
        pid = self.next_proposal
        pending = self._pending_X()
        t0 = self._now()
        X = self.propose_point(pid, pending, k)
        t_acq = (self._now() - t0) / k
        for i in range(k):
            self.in_flight[pid + i] = {
                "X": X[i : i + 1],
                "pending": pending,
                "batch": k,
                "time_acquisition": t_acq,
            }
        self.next_proposal += k
        for i in range(k):
            completed.add(self._submit(pid + i))

    def _evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Observed and noiseless values of ``X`` (``n x d``) on the cluster, one task per
        point, the noise as the synchronous loop draws it (:meth:`step` driven by hand); a
        failed point raises its error (the first in row order)."""
        values, errors = self._evaluate_on_cluster(X)
        if errors:
            error = errors[min(errors)]
            if self._gave_up(error):
                raise self._as_objective_error(error, "a point") from error
            raise error
        y_true = torch.tensor([values[i] for i in range(X.shape[0])], dtype=torch.float64)
        noise = torch.randn(y_true.shape, generator=self.noise_generator, dtype=torch.float64)
        return y_true + self.problem.noise_std * noise, y_true

    def _evaluate_initial(self, X0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""The initial design ``X0`` (``n0 x d``) on the cluster: the points that did not fail
        and their observed and noiseless values (noise drawn for every point, as the
        synchronous loop does, so a failure changes no other observation). Each failed point
        is kept for :meth:`initialize`, which records it as a failed evaluation; a failure no
        longer discards the whole design (11 good evaluations of 12 were thrown away with one).

        Raises:
            ObjectiveError: every point failed and there is no ``initial_data``: no observation
                to build the model on (the synchronous loop stops on any failure of its design
                the same way, before anything is written).
        """
        from bo_online.errors import ObjectiveError

        n = X0.shape[0]
        values, errors = self._evaluate_on_cluster(X0)
        noise = torch.randn(n, generator=self.noise_generator, dtype=torch.float64)
        self._initial_failures = [
            (
                X0[i : i + 1],
                self._failure_text(errors[i], initial=True),
                getattr(errors[i], "bo_online_evaluation", None) or {},
            )
            for i in sorted(errors)
        ]
        good = [i for i in range(n) if i in values]
        if not good and self._initial_data is None:
            name, first = self.problem.name, errors[min(errors)]
            said = str(first) if isinstance(first, ObjectiveError) else self._initial_failures[0][1]
            raise ObjectiveError(
                f"Objective {name!r}: all {n} points of the initial design failed, so there is "
                f"no observation to build the model on; the first error: {said}",
                name,
            ) from first
        rows = torch.tensor(good, dtype=torch.long)
        y_true = torch.tensor([values[i] for i in good], dtype=torch.float64)
        return X0[rows], y_true + self.problem.noise_std * noise[rows], y_true

    def initialize(self) -> dict[str, Any]:
        r"""As :meth:`OnlineLoop.initialize`, on the cluster. A point of the initial design
        that failed adds no observation: it is recorded as a failed evaluation (``"failed":
        true`` and its ``error``, a record of step 0 after the design's own, since the steps
        count evaluations after the initial design) and counts towards ``max_failures``, as a
        failure later in the run does; one checkpoint holds them all.

        Raises:
            ObjectiveError: every point of the initial design failed (see
                :meth:`_evaluate_initial`).
            TooManyFailures: under :meth:`run`, more points failed than ``max_failures``
                allows (the run is saved: a resume with a higher limit continues it).
        """
        self._initial_failures = []
        self._hold_checkpoint = True
        try:
            record = super().initialize()
            for X, error, evaluation in self._initial_failures:
                self.failures += 1
                failure = {
                    "step": 0,
                    "X": X,
                    **self._summary_fields(),
                    **evaluation,  # worker, start_time, finish_time (not after a worker died)
                    "failed": True,
                    "error": error,
                    "refit": False,
                    "wall_time": self.wall_time,
                }
                for key in ("time_fit", "time_acquisition", "time_evaluation", "time_update"):
                    failure[key] = 0.0
                failure["time_step"] = 0.0
                self._commit(failure)
        finally:
            self._hold_checkpoint = False
        failures, self._initial_failures = self._initial_failures, []
        if self.out_dir is not None:
            self.save_checkpoint()
        unfinished = self.target_steps is not None and self.step_count < self.target_steps
        if failures and self.failures > self.config["max_failures"] and unfinished:
            raise TooManyFailures(self.failures, self.config["max_failures"], failures[-1][1])
        return record

    def _failure_text(self, error: BaseException, attempts: int = 1, initial: bool = False) -> str:
        r"""A failed evaluation's ``error``, as its record holds it: the exception, and for
        Dask's ``KilledWorker`` what it means (``attempts``: how often Dask gave up on the
        point; ``initial``: a point of the initial design, which is not submitted again)."""
        if not self._gave_up(error):
            return f"{type(error).__name__}: {error}"
        if initial:
            return str(self._as_objective_error(error))
        return (
            f"{type(error).__name__}: {error} (Dask gave up on this point {attempts} times, "
            "each after its workers died repeatedly: the objective may crash its process, e.g. "
            "a segfault, os._exit or running out of memory)"
        )

    def _as_objective_error(
        self, error: BaseException, what: str = "a point of the initial design"
    ) -> Exception:
        r"""Dask's ``KilledWorker`` for ``what`` as the objective's failure, as a dead worker of
        a process pool is, not Dask's traceback (a task key, no objective named)."""
        from bo_online.errors import ObjectiveError

        name = self.problem.name
        return ObjectiveError(
            f"Objective {name!r}: Dask gave up on {what}, whose workers died repeatedly (the "
            "objective may crash its process, e.g. a segfault, os._exit or running out of "
            "memory)",
            name,
        )

    @staticmethod
    def _gave_up(error: BaseException) -> bool:
        from distributed import KilledWorker

        return isinstance(error, KilledWorker)

    def _evaluate_on_cluster(self, X: Tensor) -> tuple[dict[int, float], dict[int, BaseException]]:
        r"""The noiseless value of each row of ``X`` (``n x d``) on the cluster, one task per
        row: ``(values, errors)``, each by row index, every row in one of them. While a user
        objective's calling convention is undecided the rows go one at a time, until one
        succeeds and decides it for the others (see :meth:`slots`)."""
        X = X.detach().to(device="cpu", dtype=torch.float64)
        values: dict[int, float] = {}
        errors: dict[int, BaseException] = {}
        rows = list(range(X.shape[0]))
        while rows:
            batch = rows if self.convention_decided() else rows[:1]
            rows = rows[len(batch) :]
            futures = {
                i: self.client.submit(
                    _evaluate_point, self._shipped_problem(), X[i : i + 1], pure=False
                )
                for i in batch
            }
            try:
                # polled, as the run's own wait: a cluster without workers (none started yet,
                # or all dead) stops after no_workers_timeout, where it waited forever
                self._no_workers_since, self._workers_checked = None, time.monotonic()
                while not all(future.done() for future in futures.values()):
                    if self._stop_signal is not None:
                        # Stopped as the run's wait stops (the points in flight are evaluated
                        # again by the next run): a Ctrl-C in a terminal reaches the workers
                        # of a local cluster too, which die of it, and the initial design
                        # waited for them until no_workers_timeout, then blamed the objective.
                        self._stop_now()
                    self._check_workers(len(futures), saved=self.model is not None)
                    time.sleep(self.POLL_SECONDS)
            finally:
                for future in futures.values():
                    if not future.done():
                        future.cancel()
            for i, future in futures.items():
                if future.status == "error":
                    errors[i] = future.exception()
                else:
                    result = future.result()
                    self._learn_convention(result)
                    values[i] = result["y_true"]
        return values, errors

    # ------------------------------------------------------------------ folding results

    def _noise(self, pid: int) -> float:
        if self.problem.noise_std == 0:
            return 0.0
        g = torch.Generator().manual_seed(history.step_seed(self.config["seed"], pid, "noise"))
        return self.problem.noise_std * float(torch.randn((), generator=g, dtype=torch.float64))

    def _handle(self, future: Any) -> dict[str, Any] | None:
        r"""Fold one finished evaluation in (or record its failure); returns its record, or
        None when the point was resubmitted."""
        from distributed import KilledWorker

        pid = self._futures.pop(future)
        entry = self.in_flight[pid]
        arrival = time.time()
        meta = {
            "proposal": pid,
            "submit_time": entry["submit_time"],
            "arrival_time": arrival,
            "pending": entry["pending"],
            "batch": entry.get("batch", 1),
        }
        if future.status == "error":
            exc = future.exception()
            attempts = entry.get("attempts", 1)
            if isinstance(exc, KilledWorker):  # Dask gave up after worker deaths
                if attempts < self.WORKER_DEATH_ATTEMPTS:  # a worker lost to something else
                    entry["attempts"] = attempts + 1
                    return None
            error = self._failure_text(exc, attempts)
            evaluation = getattr(exc, "bo_online_evaluation", None) or {}
            del self.in_flight[pid]
            self.failures += 1
            # an evaluation of the budget, and a step of its own: numbered as the last folded-in
            # one, two records had one step (plots, sweeps and resumes go by step)
            self.step_count += 1
            record = {
                "step": self.step_count,
                "X": entry["X"],
                **self._summary_fields(),
                **meta,
                **evaluation,  # worker, start_time, finish_time (not after a worker died)
                "failed": True,
                "error": error,
                "refit": False,
                "time_acquisition": entry["time_acquisition"],
            }
            if evaluation:
                record["time_evaluation"] = evaluation["finish_time"] - evaluation["start_time"]
            return self._finish_record(record)
        result = future.result()
        del self.in_flight[pid]
        self._learn_convention(result)
        y_true = torch.tensor([result["y_true"]], dtype=torch.float64)
        y = y_true + self._noise(pid)
        self._meta = {
            **meta,
            "worker": result["worker"],
            "start_time": result["start_time"],
            "finish_time": result["finish_time"],
            "failed": False,
        }
        self._pending = {
            "time_acquisition": entry["time_acquisition"],
            "time_evaluation": result["finish_time"] - result["start_time"],
        }
        try:
            return self.tell(entry["X"], y, y_true)
        finally:
            self._meta = None

    def _finish_record(self, record: dict[str, Any]) -> dict[str, Any]:
        meta = getattr(self, "_meta", None)
        if meta:
            record.update(meta)
        for key in ("time_fit", "time_acquisition", "time_evaluation", "time_update"):
            record.setdefault(key, 0.0)
        record["time_step"] = float(
            sum(record[k] for k in ("time_fit", "time_acquisition", "time_update"))
        )
        # Wall time is real elapsed time (evaluations overlap), continued across resume.
        self.wall_time = self._wall0 + time.perf_counter() - self._run_t0
        record["wall_time"] = self.wall_time
        return self._commit(record)

    def save_checkpoint(self) -> None:
        if not self._hold_checkpoint:
            super().save_checkpoint()

    # ------------------------------------------------------------------ driver

    def run(
        self, steps: int | None = None, callback: Callable[[dict[str, Any]], None] | None = None
    ) -> list[dict[str, Any]]:
        r"""Evaluate until ``steps`` evaluations after the initial design are done, folded in or
        failed (as :meth:`OnlineLoop.run`: the run directory is locked while it runs, SIGINT /
        SIGTERM stop it after the result being folded in and write the checkpoint, with the
        points still in flight, which a resume submits again; in the initial design they stop
        it at once, before anything is written, and the next run evaluates the design again)."""
        self._run_t0, self._wall0 = time.perf_counter(), self.wall_time
        return super().run(steps, callback)

    def _run_steps(self, callback: Callable[[dict[str, Any]], None] | None) -> None:
        from distributed import as_completed

        if self.step_count >= self.target_steps:
            return  # nothing to do: the points still in flight stay in the checkpoint
        completed = as_completed()
        self._no_workers_since, self._workers_checked = None, time.monotonic()
        for pid in sorted(self.in_flight):  # points in flight when the run was interrupted
            completed.add(self._submit(pid))
        try:
            with self._progress() as advance:
                if self.step_count < self.target_steps:
                    self._fill(completed)
                # Fold in every result that has arrived (in arrival order), then fill the free
                # slots with one joint proposal. Polled, not blocking: a stop signal acts while
                # evaluations run (the points in flight go into the checkpoint run() writes).
                while not completed.is_empty() and self._stop_signal is None:
                    batch = completed.next_batch(block=False)
                    if not batch:
                        self._check_workers()
                        time.sleep(self.POLL_SECONDS)
                        continue
                    # A result came back: the cluster had a worker. Only a wait without one
                    # counts towards no_workers_timeout, not the folds and acquisitions after.
                    self._no_workers_since = None
                    for future in batch:
                        self._fold(future, completed, advance, callback)
                    if self.step_count >= self.target_steps:
                        if self.out_dir is not None:
                            self.save_checkpoint()
                        break
                    if self._stop_signal is not None:
                        break
                    self._fill(completed)
                    if self.out_dir is not None and self._checkpoint_due():
                        self.save_checkpoint()  # with the new in-flight set
        finally:
            for future in list(self._futures):
                future.cancel()
            self._futures.clear()

    def _check_workers(self, in_flight: int | None = None, saved: bool = True) -> None:
        r"""Stop with :class:`NoWorkers` (after a checkpoint with the points in flight) once
        the cluster has had no worker for :attr:`no_workers_timeout`: its futures would never
        finish and the run waited without a word (an objective calling ``os._exit`` on some
        inputs left a LocalCluster without workers, and the driver polling for good).
        ``in_flight``: the evaluations waited for (default: :attr:`in_flight`'s); ``saved``:
        False while the initial design is evaluated, before there is a run to save."""
        if self.no_workers_timeout is None:  # waits for workers for good, as asked
            return
        now = time.monotonic()
        if now - self._workers_checked < self.WORKER_CHECK_SECONDS:
            return
        self._workers_checked = now
        try:
            workers = len(self.client.nthreads())
        except (OSError, TimeoutError):  # the scheduler is gone too: no worker either
            workers = 0
        if workers:
            self._no_workers_since = None
        elif self._no_workers_since is None:
            self._no_workers_since = now
        elif now - self._no_workers_since >= self.no_workers_timeout:
            if self.out_dir is not None and saved:
                self.save_checkpoint()
            waiting = len(self.in_flight) if in_flight is None else in_flight
            raise NoWorkers(now - self._no_workers_since, waiting, saved)

    def _fold(self, future: Any, completed: Any, advance: Any, callback: Any) -> None:
        """Handle one finished future: fold it in, record a failure, or resubmit its point."""
        self._hold_checkpoint = True  # checkpoint once the in-flight set is refilled
        try:
            record = self._handle(future)
        finally:
            self._hold_checkpoint = False
        if record is None:  # Dask gave up after worker deaths: resubmit the point
            completed.add(self._submit(self._pending_pid_of_resubmit()))
            return
        # A failed evaluation is a step: the last step of the budget finishes the run whatever
        # it did (stopped, it said to resume with a higher limit, which had nothing left to do).
        unfinished = self.step_count < self.target_steps
        if record.get("failed") and self.failures > self.config["max_failures"] and unfinished:
            if self.out_dir is not None:
                self.save_checkpoint()
            raise TooManyFailures(self.failures, self.config["max_failures"], record["error"])
        advance()
        if callback is not None:
            callback(record)

    def _pending_pid_of_resubmit(self) -> int:
        # The one in-flight point without a live future is the one to resubmit.
        live = set(self._futures.values())
        return next(pid for pid in sorted(self.in_flight) if pid not in live)

    # ------------------------------------------------------------------ checkpoint / resume

    def _state(self) -> dict[str, Any]:
        return {
            **super()._state(),
            "in_flight": {
                pid: {
                    k: v for k, v in e.items() if k in ("X", "pending", "batch", "time_acquisition")
                }
                for pid, e in self.in_flight.items()
            },
            "next_proposal": self.next_proposal,
            "failures": self.failures,
            "objective_per_point": self.objective_per_point,
        }

    def _restore_state(self, state: dict[str, Any]) -> None:
        super()._restore_state(state)
        self.in_flight = {int(k): dict(v) for k, v in state["in_flight"].items()}
        self.next_proposal = int(state["next_proposal"])
        self.failures = int(state["failures"])
        decided = state.get("objective_per_point")  # absent in older runs: learnt again
        if decided is not None:
            self.objective_per_point = bool(decided)

    @classmethod
    def from_checkpoint(
        cls,
        ckpt: dict[str, Any],
        out_dir: str | Path | None,
        problem: Problem | None = None,
        data_dir: str | None = None,
        client: Any = None,
        **overrides: Any,
    ) -> "AsyncBayesOptLoop":
        r"""Rebuild the loop from a checkpoint; ``client`` is the cluster to continue on."""
        if client is None:
            raise ValueError(
                "This is an asynchronous (Dask) run: resume it with a cluster "
                "(bo-online resume RUN --dask local:N or --dask tcp://host:port)."
            )
        overrides.pop("executor", None)
        return super().from_checkpoint(
            ckpt,
            out_dir,
            problem=problem,
            data_dir=data_dir,
            client=client,
            max_failures=ckpt["config"]["max_failures"],
            max_in_flight=ckpt["config"].get("max_in_flight"),  # absent in older runs
            # absent in older runs as well; a resume may set another
            no_workers_timeout=overrides.pop(
                "no_workers_timeout", ckpt["config"].get("no_workers_timeout", 120.0)
            ),
            **overrides,
        )
