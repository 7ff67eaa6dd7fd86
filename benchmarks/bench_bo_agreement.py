"""Does a bo_online loop decide as plain BoTorch would, on the same data?

Two BO runs that differ by round-off part after a few steps (the multi-start optimiser lands in
another local optimum) and from there are two different trajectories, so a gap in mean final
regret between a loop and the BoTorch reference can be chance over any number of seeds. This
script asks the question that decides whether a gap is a loop or fit defect: along the loop's own
trajectory (``BayesOptLoop`` at its defaults, as in ``bench_bo_suite.py``), before each step
BoTorch's reference step proposes a batch on the data the loop holds (``SingleTaskGP`` with
``Standardize`` refit from its defaults by ``fit_gpytorch_mll``, the same acquisition,
``optimize_acqf`` settings and seeded random stream as the loop's ask: ``bench_bo_suite``'s
``run_botorch`` step); then the loop takes its step. Per step it reports:

* the distance between the two batches as sets (rows matched by ``linear_sum_assignment``; unit
  cube, max over coordinates) -- the same batch below ``--tol``;
* BoTorch's acquisition value at both batches (the same acquisition object, so the same MC base
  samples). Where the batches differ, the values are equal (within ``1e-4 max(1, |value|)``)
  when the batches differ only in points that do not reach the batch's maximum (qUCB's value is
  the expected best of the batch, so such points are free), else the loop's batch is higher or
  lower by BoTorch's own measure.

Check (PASS/FAIL), a sign test: the loop's batch is lower no more often than higher, beyond two
standard deviations of a fair coin (``lower - higher <= 2 sqrt(lower + higher)``). A loop or fit
defect shows as batches that are lower systematically; chance, as lower about as often as higher.

    OMP_NUM_THREADS=1 python benchmarks/bench_bo_agreement.py --function branin --q 3 \
        --method tsvgp --seeds 0,1 --steps 30 --out runs/agreement
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from scipy.optimize import linear_sum_assignment

from bo_online.acquisition import build_acquisition, optimizer_kwargs
from bo_online.loops import BayesOptLoop, history
from bo_online.problems import to_unit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_bo_suite import EXTRA_FUNCTIONS, FUNCTIONS, acquisition_name, make_problem  # noqa: E402


def set_distance(A: torch.Tensor, B: torch.Tensor) -> float:
    r"""The largest coordinate difference between batches ``A`` and ``B`` (``q x d``) once their
    rows are matched (an optimal assignment: the order of a batch does not matter)."""
    cost = torch.cdist(A, B, p=float("inf"))
    rows, cols = linear_sum_assignment(cost.numpy())
    return float(cost[rows, cols].max())


def botorch_proposal(
    U: torch.Tensor, Y: torch.Tensor, acq_name: str, q: int, step: int, seed: int, noisy: bool
) -> tuple[torch.Tensor, Any]:
    r"""BoTorch's reference step on the loop's data (``n x d`` unit cube, ``n x 1`` maximised):
    its batch (``q x d``) and its acquisition function."""
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.outcome import Standardize
    from botorch.optim import optimize_acqf
    from gpytorch.mlls import ExactMarginalLogLikelihood

    d = U.shape[-1]
    model = SingleTaskGP(U, Y, outcome_transform=Standardize(m=1))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(U)
    with history.seeded(seed, step - 1, "ask", torch.device("cpu")):
        acq = build_acquisition(
            acq_name, model, q=q, step=step, dim=d, X_observed=U, Y_observed=Y, noisy=noisy
        )
        batch, _ = optimize_acqf(acq, bounds=bounds, q=q, **optimizer_kwargs(None))
    return batch.detach(), acq


def run_seed(function: str, method: str, q: int, seed: int, steps: int) -> list[dict[str, Any]]:
    r"""One loop's trajectory, each step compared with BoTorch's step on the same data."""
    problem = make_problem(function)
    acq_name = acquisition_name(problem, q)
    loop = BayesOptLoop(problem, model=method, acq=acq_name, q=q, seed=seed, quiet=True)
    loop.initialize()
    rows = []
    for step in range(1, steps + 1):
        U, Y = loop._training_data()
        theirs, acq = botorch_proposal(U, Y, acq_name, q, step, seed, problem.noise_std > 0)
        record = loop.step()
        ours = to_unit(torch.as_tensor(record["X"], dtype=U.dtype), problem.bounds)
        with torch.no_grad():
            value_theirs, value_ours = (float(acq(b.unsqueeze(0))) for b in (theirs, ours))
        rows.append(
            {
                "seed": seed,
                "step": step,
                "n": U.shape[0],
                "distance": set_distance(ours, theirs),
                "acq_botorch": value_theirs,
                "acq_loop": value_ours,
                "regret": record["regret"],
            }
        )
    return rows


def classify(row: dict[str, Any], tol: float) -> str:
    r"""``"same batch"``, ``"same value"`` (other points, equal value), ``"higher"`` or
    ``"lower"`` (the loop's batch by BoTorch's acquisition value)."""
    if row["distance"] <= tol:
        return "same batch"
    ours, theirs = row["acq_loop"], row["acq_botorch"]
    if abs(ours - theirs) <= 1e-4 * max(1.0, abs(theirs)):
        return "same value"
    return "higher" if ours > theirs else "lower"


def summarise(rows: list[dict[str, Any]], tol: float) -> dict[str, Any]:
    r"""Counts of each kind of step (:func:`classify`) and the sign test."""
    kinds = [classify(r, tol) for r in rows]
    counts = {k: kinds.count(k) for k in ("same batch", "same value", "higher", "lower")}
    lower, higher = counts["lower"], counts["higher"]
    shortfalls = [r["acq_botorch"] - r["acq_loop"] for r, k in zip(rows, kinds) if k == "lower"]
    return {
        "steps": len(rows),
        **{k.replace(" ", "_"): v for k, v in counts.items()},
        "largest_shortfall": max(shortfalls, default=0.0),
        "passed": lower - higher <= 2 * (lower + higher) ** 0.5,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--function", default="branin", choices=[*FUNCTIONS, *EXTRA_FUNCTIONS])
    parser.add_argument("--method", default="tsvgp", help="a bo_online surrogate (loop default)")
    parser.add_argument("--q", type=int, default=3, choices=(1, 3))
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--tol", type=float, default=1e-3, help="agreement distance (unit cube)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    rows: list[dict[str, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BoTorch's optimiser retries, jitter notices
        for seed in seeds:
            for row in run_seed(args.function, args.method, args.q, seed, args.steps):
                rows.append(row)
                print(
                    f"seed {row['seed']:>3} step {row['step']:>3} n {row['n']:>4}  "
                    f"distance {row['distance']:.1e}  acquisition BoTorch {row['acq_botorch']:.6g}"
                    f" / loop {row['acq_loop']:.6g}  regret {row['regret']:.3g}",
                    flush=True,
                )
    summary = {
        "function": args.function,
        "method": args.method,
        "q": args.q,
        "seeds": seeds,
        **summarise(rows, args.tol),
    }
    print(
        f"{args.method} on {args.function}, q = {args.q}, {summary['steps']} steps: the same "
        f"batch as BoTorch's (to {args.tol:g}) on {summary['same_batch']}, another of the same "
        f"value on {summary['same_value']}; by BoTorch's acquisition value the loop's batch is "
        f"higher on {summary['higher']} and lower on {summary['lower']} (largest shortfall "
        f"{summary['largest_shortfall']:.3g}): {'PASS' if summary['passed'] else 'FAIL'}"
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"{args.function}_q{args.q}_{args.method}.json"
        (args.out / name).write_text(json.dumps({"summary": summary, "steps": rows}, indent=1))
    return summary


if __name__ == "__main__":
    sys.exit(0 if main()["passed"] else 1)
