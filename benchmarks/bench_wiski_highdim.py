"""WISKI above 3 inputs at its defaults in BO, against BoTorch's SingleTaskGP and Sobol.

For each function and seed, ``BayesOptLoop(model="wiski")`` (default projection, refit every step)
and ``BayesOptLoop(model="singletaskgp")`` run in turn from the same Sobol design; Sobol gets the
same total budget. Prints mean final regret +- standard error per function and method, and the
per-step time ratio wiski / singletaskgp measured in the same process (median over seeds,
min-max). Usage::

    python benchmarks/bench_wiski_highdim.py --seeds 4 --steps 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.quasirandom import SobolEngine

from bo_online.loops import BayesOptLoop
from bo_online.loops.bayesopt import default_n_init
from bo_online.problems import from_unit, synthetic_problem

FUNCTIONS = [
    ("hartmann6", None),
    ("ackley", 5),
    ("rosenbrock", 4),
    ("styblinskitang", 4),
    ("michalewicz", 5),
]


def run(name: str, dim: int | None, model: str, seed: int, steps: int) -> tuple[float, float]:
    problem = synthetic_problem(name, dim=dim)
    loop = BayesOptLoop(problem, model=model, seed=seed, refit_every=1)
    loop.initialize()
    t0 = time.perf_counter()
    loop.run(steps)
    return loop.records[-1]["regret"], (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--functions", default=",".join(f for f, _ in FUNCTIONS))
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.set_num_threads(1)
    out = {}
    for name, dim in FUNCTIONS:
        if name not in a.functions.split(","):
            continue
        res = {"wiski": [], "singletaskgp": [], "sobol": []}
        ratios = []
        for seed in range(a.seeds):
            rw, tw = run(name, dim, "wiski", seed, a.steps)
            rs, ts = run(name, dim, "singletaskgp", seed, a.steps)
            problem = synthetic_problem(name, dim=dim)
            n = default_n_init(problem.dim) + a.steps
            U = SobolEngine(problem.dim, scramble=True, seed=1000 + seed).draw(n).double()
            best = float(problem.evaluate_true(from_unit(U, problem.bounds)).min())
            res["wiski"].append(rw)
            res["singletaskgp"].append(rs)
            res["sobol"].append(best - problem.optimal_value)
            ratios.append(tw / ts)
            print(
                f"  {name} seed {seed}: wiski {rw:.4g}  stgp {rs:.4g}  sobol {res['sobol'][-1]:.4g}"
                f"  step-time ratio {tw / ts:.2f}",
                flush=True,
            )
        row = {}
        for k, v in res.items():
            se = statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else float("nan")
            row[k] = (statistics.mean(v), se)
        out[name] = {"regret": row, "time_ratio": ratios}
        print(
            f"{name:16s} "
            + "  ".join(f"{k} {m:.4g}+-{s:.2g}" for k, (m, s) in row.items())
            + f"  wiski/stgp {row['wiski'][0] / row['singletaskgp'][0]:.2f}x"
            + f"  time ratio median {statistics.median(ratios):.2f} "
            f"[{min(ratios):.2f}, {max(ratios):.2f}]",
            flush=True,
        )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
