r"""One BO step's parts, side by side: fit, acquisition, update (+ the next posterior).

For each n (default 100, 1,000, 3,000, 10,000) the three surrogates of the long BO campaign
(``experiments/bo_long_campaign.py``) are built on n random points of the noisy 3-D Levy function
(noise sd 10, the WISKI paper's App. C.2) and timed on the parts of one step of the loop
(``bo_online.loops.BayesOptLoop``), interleaved (method after method, median of ``--reps`` after
a warm-up, min-max printed):

* ``fit``: one warm-started refit after the step's q = 3 new points (``model.update`` on a copy,
  untimed, then ``model.fit(max_iter=--fit-max-iter)``, timed: the loop's ``refit_every=1``);
  ``SingleTaskGP`` refits from its current values too (BoTorch's ``fit_gpytorch_mll`` on the
  model rebuilt from all data);
* ``acquisition``: ``optimize_acqf`` of qUCB, q = 3, with the paper's settings (10 restarts, 512 raw
  samples, batch limit 5, 200 L-BFGS-B iterations; ``--restarts`` etc. to change), through the
  loop's own ``build_acquisition`` and ``propose``;
* ``update``: ``model.update`` with q = 3 new points plus the next posterior at 3 points (what the
  next acquisition starts with), on a copy of the model each repetition.

A method whose single warm-up call of a part at some n takes longer than ``--budget-s`` is not run
at larger n (the table says "skipped (budget)"). Writes JSON (``--out``) and prints a table with
the ratios to WISKI.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_bo_step.py
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_bo_step.py --ns 100 1000 --reps 5
    PYTHONPATH=. python benchmarks/bench_bo_step.py --device cuda   # every tensor on the GPU
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch

from bo_online.acquisition import build_acquisition, propose
from bo_online.benchmarking import Timing, write_results
from bo_online.models.registry import get_model_class
from bo_online.problems import synthetic_problem, to_unit

DT = torch.float64
METHODS = {"wiski": "WISKI", "exact": "OnlineExactGP", "singletaskgp": "SingleTaskGP"}
PARTS = ("fit", "acquisition", "update")


def _sync(device: torch.device) -> None:
    """Wait for the device's queued kernels, so that a wall-clock time covers them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    problem = synthetic_problem("levy", dim=3, noise_std=10.0)
    g = torch.Generator().manual_seed(seed)
    U = torch.rand(n, 3, generator=g, dtype=DT)
    X = problem.bounds[0] + U * (problem.bounds[1] - problem.bounds[0])
    y = problem.evaluate_true(X).reshape(-1) + 10.0 * torch.randn(n, generator=g, dtype=DT)
    return to_unit(X, problem.bounds), (-y).reshape(-1, 1)  # the model maximises


def _build(method: str, X: torch.Tensor, Y: torch.Tensor, fit_iter: int):
    model = get_model_class(method)(X, Y)
    model.fit(max_iter=4 * fit_iter)  # as the loop's initial fit
    model.eval()
    return model


def _parts(method: str, model, n: int, args) -> dict:
    g = torch.Generator().manual_seed(n)
    Xq, Yq = torch.rand(3, 3, generator=g, dtype=DT), torch.randn(3, 1, generator=g, dtype=DT)
    Xp = torch.rand(3, 3, generator=g, dtype=DT)
    device = torch.device(args.device)
    Xq, Yq, Xp = Xq.to(device), Yq.to(device), Xp.to(device)
    opts = {
        "num_restarts": args.restarts,
        "raw_samples": args.raw_samples,
        "batch_limit": 5,
        "maxiter": args.maxiter,
    }

    def fit() -> float:
        m = copy.deepcopy(model)
        m.update(Xq, Yq)  # the step's new points arrive, then the warm-started refit
        _sync(device)
        t0 = time.perf_counter()
        m.fit(max_iter=args.fit_max_iter)
        m.eval()
        _sync(device)
        return time.perf_counter() - t0  # the copy and the update are not timed

    def acquisition() -> None:
        acq = build_acquisition("qucb", model, q=3, step=n // 3, dim=3)
        propose(acq, 3, 3, opts, dtype=DT, device=device)

    def update() -> None:
        m = copy.deepcopy(model)
        _sync(device)
        t0 = time.perf_counter()
        m.update(Xq, Yq)
        m.posterior(Xp).mean.sum()
        _sync(device)
        return time.perf_counter() - t0  # the copy is not timed

    return {"fit": fit, "acquisition": acquisition, "update": update}


def run(args) -> dict:
    results: dict = {"rows": [], "skipped": {}}
    active = list(args.methods)
    device = torch.device(args.device)
    for n in args.ns:
        X, Y = (t.to(device) for t in _data(n, seed=0))
        models, fns = {}, {}
        for m in list(active):
            # Building (with the loop's initial fit) is set-up, not a part of a step: untimed.
            models[m] = _build(m, X, Y, args.fit_max_iter)
            fns[m] = _parts(m, models[m], n, args)
        samples = {(m, p): [] for m in fns for p in PARTS}
        over = set()
        for rep in range(args.reps + 1):  # the first round is the warm-up
            for p in PARTS:
                for m in fns:
                    if (m, p) in over:
                        continue
                    _sync(device)
                    t0 = time.perf_counter()
                    inner = fns[m][p]()
                    _sync(device)
                    dt = inner if isinstance(inner, float) else time.perf_counter() - t0
                    if rep == 0:
                        if dt > args.budget_s:
                            over.add((m, p))
                            samples[(m, p)].append(dt)
                        continue
                    samples[(m, p)].append(dt)
        for m in fns:
            row = {"n": n, "method": m}
            for p in PARTS:
                v = samples[(m, p)]
                row[p] = Timing(statistics.median(v), min(v), max(v), len(v)) if v else None
            results["rows"].append(row)
            if any((m, p) in over for p in PARTS) and m in active:
                active.remove(m)
                results["skipped"][m] = (
                    f"n > {n}: one call took more than {args.budget_s} s (timed once, not repeated)"
                )
        _print(results, n)
    return results


def _print(results: dict, n: int) -> None:
    rows = [r for r in results["rows"] if r["n"] == n]
    w = next((r for r in rows if r["method"] == "wiski"), None)
    print(f"\nn = {n}")
    print(
        f"{'method':>14} "
        + " ".join(f"{p + ' (ms)':>32}" for p in PARTS)
        + f" {'step / WISKI':>13}"
    )
    for r in rows:
        cells = []
        for p in PARTS:
            t = r[p]
            cells.append(
                f"{t.median * 1e3:10.1f} [{t.min * 1e3:.1f}, {t.max * 1e3:.1f}] x{t.reps}"
                if t
                else "-"
            )
        step = sum(r[p].median for p in PARTS if r[p])
        ratio = "" if w is None else f"{step / sum(w[p].median for p in PARTS if w[p]):13.2f}"
        print(f"{METHODS[r['method']]:>14} " + " ".join(f"{c:>32}" for c in cells) + f" {ratio}")
    if w is not None:
        for r in rows:
            if r["method"] != "wiski":
                print(
                    "   "
                    + METHODS[r["method"]]
                    + " / WISKI: "
                    + ", ".join(
                        f"{p} {r[p].median / w[p].median:.2f}x" for p in PARTS if r[p] and w[p]
                    )
                )
    for m, why in results["skipped"].items():
        print(f"   {METHODS[m]} skipped at larger n ({why})")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ns", type=int, nargs="+", default=[100, 1000, 3000, 10000])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--restarts", type=int, default=10)
    ap.add_argument("--raw-samples", type=int, default=512)
    ap.add_argument("--maxiter", type=int, default=200)
    ap.add_argument("--fit-max-iter", type=int, default=50)
    ap.add_argument(
        "--budget-s",
        type=float,
        default=30.0,
        help="a method whose single call of a part exceeds this is not run at larger n",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (every tensor on it)")
    ap.add_argument("--out", default="benchmarks/results/bench_bo_step.json")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: CUDA is not available on this machine")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    results = {
        "benchmark": "bo_step",
        "dtype": "float64",
        "device": args.device,
        "args": vars(args),
        **run(args),
    }
    print(f"\nresults: {write_results(args.out, results)}")


if __name__ == "__main__":
    main()
