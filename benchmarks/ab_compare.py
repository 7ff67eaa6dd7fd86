r"""Two source trees of bo_online side by side: the same WISKI in-loop measurement, interleaved.

A before/after comparison of a change needs both versions timed in one run on the same machine
state. This driver starts one worker process per tree (``PYTHONPATH`` set to that tree), lets each
build its models and warm up, then asks them in turn (A, B, A, B, ...) for one repetition; it
prints the median of ``--reps`` with the min-max spread for every quantity and version, and the
ratios. Quantities (``--task``):

* ``acq``: one ``optimize_acqf`` of the loop's acquisition (``--acq qucb`` with q = 3 or
  ``logei`` with q = 1; 10 restarts, 512 raw samples, batch limit 5, 200 iterations) for WISKI
  and OnlineExactGP at the loop's default options, on ``--n`` points of noisy 3-D Levy (as
  ``benchmarks/bench_bo_step.py``), each from a new state (caches dropped first, as after the
  loop's refit, so their rebuild counts); the ratio WISKI / exact within each version.
* ``update``: ``update`` of q = 3 points plus the next posterior at 3 points, WISKI and
  OnlineExactGP at ``--n`` (as ``bench_bo_step.py``'s update part), each on a fresh copy, after
  a posterior with a gradient on the same state (as the acquisition leaves it); WISKI at the
  loop's default grid or ``--grid-size`` points per dimension (12: m = 1,000).
* ``fit``: the warm-started refit of the loop's ``refit_every=1`` (``fit(max_iter=50)``) after
  ``update`` of q = 3 points (untimed), WISKI (loop default grid or ``--grid-size``) and
  OnlineExactGP at ``--n``, each on a fresh copy of the model fitted on the ``--n`` points.
* ``cond``: WISKI at ``--m`` = 1,000 grid points (3-D, 12^3 grid incl. padding) on ``--n``
  points, caches built by a first fantasy; per repetition ``update`` of q = 3 points, then the
  first conditioning on 3 points plus the posterior at 50 points on the new state
  (``first_cond``, split into ``first_condition_only`` and ``first_posterior50``), a second one
  (``second_cond``), and the same after the caches are dropped and rebuilt (``rebuild_cond``);
  ``rel_err``: the first conditioned posterior against the rebuilt one.
* ``chol``: rank-3 Cholesky update of an m x m factor (``cholesky_update``, whatever path the
  tree takes by default, labelled ``blocked``; the factor as ``torch.linalg.cholesky`` returns
  it), q rank-one sweeps (``linalg._sweeps``) and the floor, one read plus one write of the
  factor (``L.clone()``); each sample is the best of ``--inner`` calls.

    OMP_NUM_THREADS=1 python benchmarks/ab_compare.py --a OLD_TREE --b . --task acq --n 100
    OMP_NUM_THREADS=1 python benchmarks/ab_compare.py --a OLD_TREE --b . --task cond --reps 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DT_NAME = "float64"


# ---------------------------------------------------------------------------------- worker side


def _levy(n: int, seed: int):
    import torch

    from bo_online.problems import synthetic_problem, to_unit

    problem = synthetic_problem("levy", dim=3, noise_std=10.0)
    g = torch.Generator().manual_seed(seed)
    U = torch.rand(n, 3, generator=g, dtype=torch.float64)
    X = problem.bounds[0] + U * (problem.bounds[1] - problem.bounds[0])
    noise = 10.0 * torch.randn(n, generator=g, dtype=torch.float64)
    y = problem.evaluate_true(X).reshape(-1) + noise
    return to_unit(X, problem.bounds), (-y).reshape(-1, 1)


def _task_acq(args):
    import torch

    from bo_online.acquisition import build_acquisition, propose
    from bo_online.models.registry import get_model_class

    X, Y = _levy(args.n, 0)
    models = {}
    for name in ("wiski", "exact"):
        model = get_model_class(name)(X, Y)
        model.fit(max_iter=200)
        model.eval()
        models[name] = model
    q = 3 if args.acq == "qucb" else 1
    opts = {"num_restarts": 10, "raw_samples": 512, "batch_limit": 5, "maxiter": 200}
    extra = {} if args.acq == "qucb" else {"X_observed": X, "Y_observed": Y}

    def run():
        out = {}
        for name, model in models.items():
            torch.manual_seed(0)
            model.invalidate_caches()  # a new state, as after the loop's refit
            t0 = time.perf_counter()
            acq = build_acquisition(args.acq, model, q=q, step=args.n // 3, dim=3, **extra)
            propose(acq, q, 3, opts, dtype=torch.float64, device="cpu")
            out[name] = time.perf_counter() - t0
        out["wiski/exact"] = out["wiski"] / out["exact"]
        return out

    return run


def _step_setup(args):
    """The step's q = 3 new points and values, 3 prediction points, and WISKI (the loop's default
    grid or ``--grid-size``) and OnlineExactGP fitted on ``--n`` Levy points."""
    import torch

    from bo_online.models.registry import get_model_class

    X, Y = _levy(args.n, 0)
    g = torch.Generator().manual_seed(1)
    Xq = torch.rand(3, 3, generator=g, dtype=torch.float64)
    Yq = torch.randn(3, 1, generator=g, dtype=torch.float64)
    Xp = torch.rand(3, 3, generator=g, dtype=torch.float64)
    models = {}
    for name in ("wiski", "exact"):
        kw = {"grid_size": args.grid_size} if (name == "wiski" and args.grid_size) else {}
        model = get_model_class(name)(X, Y, **kw)
        model.fit(max_iter=200)
        models[name] = model
    return Xq, Yq, Xp, models


def _task_update(args):
    import copy

    import torch

    Xq, Yq, Xp, models = _step_setup(args)
    for model in models.values():
        model.eval()
        # as in the loop: the acquisition ran on this state (posterior with a gradient)
        Xg = torch.rand(5, 3, 3, dtype=torch.float64, requires_grad=True)
        model.posterior(Xg).mean.sum().backward()

    def run():
        out = {}
        for name, model in models.items():
            m = copy.deepcopy(model)
            t0 = time.perf_counter()
            m.update(Xq, Yq)
            m.posterior(Xp).mean.sum()
            out[name] = time.perf_counter() - t0
        out["wiski/exact"] = out["wiski"] / out["exact"]
        return out

    return run


def _task_fit(args):
    import copy

    Xq, Yq, _, models = _step_setup(args)

    def run():
        out = {}
        for name, model in models.items():
            m = copy.deepcopy(model)
            m.update(Xq, Yq)  # the step's new points, untimed
            t0 = time.perf_counter()
            m.fit(max_iter=50)
            out[name] = time.perf_counter() - t0
        out["wiski/exact"] = out["wiski"] / out["exact"]
        return out

    return run


def _task_cond(args):
    import torch

    from bo_online.models import WISKI

    g = torch.Generator().manual_seed(0)
    d = 3
    X = torch.rand(args.n, d, generator=g, dtype=torch.float64)
    noise = 0.1 * torch.randn(args.n, 1, generator=g, dtype=torch.float64)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + noise
    side = round(args.m ** (1 / 3)) + 2
    model = WISKI(X, Y, grid_size=side)
    assert model.num_grid_points == args.m, model.num_grid_points
    model.covar_module.lengthscale = torch.full((1, d), 0.2, dtype=torch.float64)
    model.likelihood.noise = 0.01
    model.eval()
    Xn = torch.rand(1, 3, d, generator=g, dtype=torch.float64)
    Yn = torch.randn(1, 3, 1, generator=g, dtype=torch.float64)
    Xs = torch.rand(50, d, generator=g, dtype=torch.float64)

    def cond():
        with torch.no_grad():
            t0 = time.perf_counter()
            cm = model.condition_on_observations(Xn, Yn)
            t1 = time.perf_counter()
            post = cm.posterior(Xs)
            mean, var = post.mean, post.variance
            return mean, var, t1 - t0, time.perf_counter() - t1

    cond()  # builds the caches of this state

    def run():
        Xq = torch.rand(3, d, generator=g, dtype=torch.float64)
        Yq = torch.randn(3, 1, generator=g, dtype=torch.float64)
        t0 = time.perf_counter()
        model.update(Xq, Yq)
        t1 = time.perf_counter()
        mean, var, t_cond, t_post = cond()
        t2 = time.perf_counter()
        _, _, t_cond2, t_post2 = cond()
        model.invalidate_caches()
        t3 = time.perf_counter()
        mean_r, var_r, _, _ = cond()  # rebuilds every cache from the statistics
        t4 = time.perf_counter()
        err = max(
            float((mean - mean_r).abs().max() / mean_r.abs().max()),
            float((var - var_r).abs().max() / var_r.abs().max()),
        )
        return {
            "update": t1 - t0,
            "first_cond": t2 - t1,
            "first_condition_only": t_cond,
            "first_posterior50": t_post,
            "second_cond": t_cond2 + t_post2,
            "rebuild_cond": t4 - t3,
            "rel_err": err,
        }

    return run


def _task_chol(args):
    import torch

    from bo_online.linalg import _sweeps, cholesky_update

    g = torch.Generator().manual_seed(3)
    m, q = args.m, 3
    A = torch.randn(m, m, generator=g, dtype=torch.float64)
    L = torch.linalg.cholesky(A @ A.T + m * torch.eye(m, dtype=torch.float64))
    U = torch.randn(m, q, generator=g, dtype=torch.float64)

    def timed(f):  # best of --inner calls: on a shared machine the others' load only adds
        best = float("inf")
        for _ in range(args.inner):
            t0 = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - t0)
        return best

    def run():
        out = {
            "blocked": timed(lambda: cholesky_update(L, U)),
            "sweeps": timed(lambda: _sweeps(L, U, 1.0)),
            "copy": timed(lambda: L.clone()),
        }
        out["blocked/copy"] = out["blocked"] / out["copy"]
        out["sweeps/blocked"] = out["sweeps"] / out["blocked"]
        return out

    return run


TASKS = {
    "acq": _task_acq,
    "update": _task_update,
    "fit": _task_fit,
    "cond": _task_cond,
    "chol": _task_chol,
}


def worker(args) -> None:
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    run = TASKS[args.task](args)
    run()  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        print(json.dumps(run()), flush=True)


# ---------------------------------------------------------------------------------- driver side


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--a", default=None, help="source tree A (the version before)")
    ap.add_argument("--b", default=".", help="source tree B (the version after)")
    ap.add_argument("--task", choices=list(TASKS), required=True)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--m", type=int, default=1000)
    ap.add_argument("--acq", choices=["qucb", "logei"], default="qucb")
    ap.add_argument("--grid-size", type=int, default=0, help="update: WISKI grid (0: default)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--inner", type=int, default=3, help="chol: calls per sample (best of)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    trees = {"A": args.a, "B": args.b} if args.a else {"B": args.b}
    procs = {}
    for label, tree in trees.items():
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), OMP_NUM_THREADS="1")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            "--task",
            args.task,
            "--n",
            str(args.n),
            "--m",
            str(args.m),
            "--acq",
            args.acq,
            "--inner",
            str(args.inner),
            "--grid-size",
            str(args.grid_size),
        ]
        procs[label] = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
    for label, p in procs.items():
        if p.stdout.readline().strip() != "ready":
            raise SystemExit(f"worker {label} failed to start")
    samples: dict = {label: {} for label in procs}
    for _ in range(args.reps):
        for label, p in procs.items():  # interleaved: A, B, A, B, ...
            p.stdin.write("go\n")
            p.stdin.flush()
            for k, v in json.loads(p.stdout.readline()).items():
                samples[label].setdefault(k, []).append(v)
    for p in procs.values():
        p.stdin.close()
        p.wait()
    print(
        f"task {args.task}  n={args.n} m={args.m} acq={args.acq}  reps={args.reps} "
        f"(after a warm-up), {DT_NAME}, 1 thread; trees: "
        + ", ".join(f"{k}={v}" for k, v in trees.items())
    )
    med = {}
    for label in procs:
        for k, v in samples[label].items():
            med[(label, k)] = statistics.median(v)  # of an even count: the mean of the middle two
            scale, unit = (1.0, "") if ("/" in k or k == "rel_err") else (1e3, " ms")
            print(
                f"  {label} {k:>14}: median {med[(label, k)] * scale:10.4g}{unit}  "
                f"[{min(v) * scale:.4g}, {max(v) * scale:.4g}]"
            )
    if len(procs) == 2:
        for k in samples["A"]:
            if "/" not in k and k != "rel_err" and ("B", k) in med:
                print(f"  {k}: A / B = {med[('A', k)] / med[('B', k)]:.2f}")


if __name__ == "__main__":
    main()
