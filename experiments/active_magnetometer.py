"""Active learning of the magnetometer field with WISKI and qNIPV (WISKI paper, Sec. 5.4 / C.3).

The setting of the paper: WISKI on a 30 x 30 grid with a Matern-1/2 kernel, batches of q = 6 chosen
by qNIPV (BoTorch's ``qNegIntegratedPosteriorVariance``), 50 steps, RMSE on a 10,000-point held-out
test set after every step. qNIPV integrates the fantasy posterior variance over ``--num-mc-points``
of the held-out inputs; WISKI's fast path (docs/math.md §1) makes that variance O(m^2 q + m q N)
per candidate batch (here O(4^d (m + N) q): the rank-q correction reads rows of ``R L_A^-T`` and
``R A^-1 R^T`` cached once per step, and the mc_points' rows are cached across candidate batches).

Checks (exit status 1 if one fails): the run completes all steps, and the final test RMSE is below
the initial design's. Prints RMSE and time per step; writes JSON to experiments/results/.

    BO_ONLINE_DATA_DIR=/path/to/data python experiments/active_magnetometer.py
    python experiments/active_magnetometer.py --steps 10 --selection snap --test-size 2000
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import botorch
import gpytorch
import torch

from bo_online.loops.active import ActiveLearningLoop
from bo_online.problems import magnetometer_problem


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data-dir", default=None)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--q", type=int, default=6)
    p.add_argument("--grid-size", type=int, default=30)
    p.add_argument("--test-size", type=int, default=10_000)
    p.add_argument("--pool-size", type=int, default=None)
    p.add_argument("--selection", choices=("pool", "snap"), default="pool")
    p.add_argument("--num-mc-points", type=int, default=1024)
    p.add_argument("--num-pool-candidates", type=int, default=2048)
    p.add_argument("--n-init", type=int, default=10)
    p.add_argument("--refit-every", type=int, default=10)
    p.add_argument("--fit-max-iter", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "active_magnetometer.json")
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)

    problem = magnetometer_problem(
        test_size=args.test_size, pool_size=args.pool_size, seed=args.seed, data_dir=args.data_dir
    )
    matern12 = {
        "__class__": "gpytorch.kernels.ScaleKernel",
        "args": [{"__class__": "gpytorch.kernels.MaternKernel", "kwargs": {"nu": 0.5}}],
    }
    loop = ActiveLearningLoop(
        problem,
        model="wiski",
        model_options={"grid_size": args.grid_size, "covar_module": matern12},
        acq="qnipv",
        selection=args.selection,
        q=args.q,
        n_init=args.n_init,
        seed=args.seed,
        num_mc_points=args.num_mc_points,
        num_pool_candidates=args.num_pool_candidates,
        refit_every=args.refit_every,
        fit_max_iter=args.fit_max_iter,
    )
    print(
        f"magnetometer: pool {problem.X_pool.shape[0]}, test {problem.X_test.shape[0]}; WISKI "
        f"{args.grid_size}x{args.grid_size} Matern-1/2; qNIPV ({args.selection}), q={args.q}, "
        f"{args.num_mc_points} mc_points; torch {torch.__version__}, "
        f"botorch {botorch.__version__}, gpytorch {gpytorch.__version__}, float64, cpu, "
        f"{torch.get_num_threads()} thread(s)"
    )
    print(
        f"{'step':>4} {'n':>5} {'rmse':>9} {'mean_var':>9} "
        f"{'t_acq':>7} {'t_fit':>7} {'t_upd':>7} {'t_step':>7}"
    )
    t_start = time.perf_counter()

    def show(r: dict) -> None:
        print(
            f"{r['step']:>4} {r['n']:>5} {r['rmse']:>9.4f} {r['mean_var']:>9.4f} "
            f"{r['time_acquisition']:>7.3f} {r['time_fit']:>7.3f} {r['time_update']:>7.4f} "
            f"{r['time_step']:>7.3f}",
            flush=True,
        )

    records = loop.run(args.steps, callback=show)
    total = time.perf_counter() - t_start
    rmse = [r["rmse"] for r in records]
    steps = [r["time_step"] for r in records[1:]]
    acq = [r["time_acquisition"] for r in records[1:]]
    checks = {
        "completed": records[-1]["step"] == args.steps,
        "rmse_falls": rmse[-1] < rmse[0],
    }
    summary = {
        "args": vars(args),
        "versions": {
            "torch": torch.__version__,
            "botorch": botorch.__version__,
            "gpytorch": gpytorch.__version__,
            "python": platform.python_version(),
        },
        "rmse": rmse,
        "time_step": steps,
        "median_time_acquisition": statistics.median(acq) if acq else None,
        "total_wall_s": total,
        "checks": checks,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(
        f"RMSE {rmse[0]:.4f} -> {rmse[-1]:.4f}; "
        f"median acquisition {summary['median_time_acquisition']:.3f} s/step; "
        f"total {total:.1f} s; checks {checks}; wrote {args.out}"
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
