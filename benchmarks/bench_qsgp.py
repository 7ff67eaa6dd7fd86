r"""QSGP benchmarks: per-SGD-step time versus m, and control-variate gradient variance.

1. Per-step time (the paper's central claim, Table 1: O(1) per iteration in n and m): one
   QSGP-0 model per m in ``--ms`` (default 1e4, 1e5, 1e6 random Fourier features) on the same
   data, the same minibatch sizes (n~, m~, n_bar), runs of ``--steps`` SGD steps, interleaved
   (m1 m2 m3 m1 m2 m3 ...) for ``--reps`` repetitions after a warm-up; per-step times come from
   the step callback. Check: median step time at the largest m within 1.3x of the smallest.
2. Control variates (Fig. 1 / issue check): on kin40k (``../shared/data/uci/kin40k`` or
   ``$BO_ONLINE_DATA_DIR``; skipped with a message if absent), m = 1e4 RFF with SE-ARD
   hyperparameters from an exact GP on 1000 random training points, mu a prior draw,
   m~ = n~ = 500; element-averaged gradient variance of the Thm 1 Phi-quadratic term with and
   without the Eq. 3 / Prop. 3 control variate at each ``--cv-ranks``. Check: >= 5x at n_bar = 300.

Run:  PYTHONPATH=. python benchmarks/bench_qsgp.py            (a few minutes on 2 cores)
      PYTHONPATH=. python benchmarks/bench_qsgp.py --ms 10000 100000 1000000 10000000
Writes benchmarks/results/bench_qsgp.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from bo_online.models import QSGP
from bo_online.models.qsgp.estimators import control_variate_gradient_variance

ROOT = Path(__file__).resolve().parents[1]
DT = torch.float64


def _env() -> dict:
    import botorch
    import gpytorch

    return {
        "torch": torch.__version__,
        "botorch": botorch.__version__,
        "gpytorch": gpytorch.__version__,
        "dtype": str(DT),
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def step_times(ms, n, d, n_tilde, m_tilde, n_bar, steps, reps, warmup):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(4 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    models = {m: QSGP(X, Y, num_features=m, family="mean_field") for m in ms}
    per = {m: [] for m in ms}

    def run(m):
        stamps = []
        models[m].fit_sgd(
            max_iter=steps,
            num_rows=n_tilde,
            num_cols=m_tilde,
            cv_rank=n_bar,
            freeze_iters=0,
            seed=len(per[m]),
            callback=lambda t, loss: stamps.append(time.perf_counter()),
        )
        diffs = [b - a for a, b in zip(stamps[:-1], stamps[1:])]
        return statistics.median(diffs)

    for _ in range(warmup):
        for m in ms:
            run(m)
    for _ in range(reps):
        for m in ms:  # interleaved
            per[m].append(run(m))
    rows = []
    for m in ms:
        v = per[m]
        rows.append({"m": m, "median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)})
    return rows


def load_kin40k(data_dir: Path, split: int = 0):
    import numpy as np

    folder = data_dir / "uci" / "kin40k"
    data_f, mask_f = folder / "data.csv.gz", folder / "test_mask.csv.gz"
    for f in (data_f, mask_f):
        if not f.exists():
            raise FileNotFoundError(
                f"{f} not found. Put the shared data at ../shared/data relative to the project "
                "root or set BO_ONLINE_DATA_DIR to the folder holding uci/kin40k."
            )
    D = np.loadtxt(data_f, delimiter=",")
    test = np.loadtxt(mask_f, delimiter=",")[:, split] == 1
    X, y = torch.tensor(D[:, :-1], dtype=DT), torch.tensor(D[:, -1:], dtype=DT)
    return X[~test], y[~test], X[test], y[test]


def exact_gp_hypers(X, Y, num_points=1000, seed=0):
    r"""SE-ARD hyperparameters of an exact GP on a random subset (the paper's initialisation)."""
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.kernels import RBFKernel, ScaleKernel
    from gpytorch.mlls import ExactMarginalLogLikelihood

    g = torch.Generator().manual_seed(seed)
    sub = torch.randperm(X.shape[0], generator=g)[:num_points]
    gp = SingleTaskGP(
        X[sub],
        Y[sub],
        covar_module=ScaleKernel(RBFKernel(ard_num_dims=X.shape[-1])),
        outcome_transform=None,
    )
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    return (
        gp.covar_module.base_kernel.lengthscale.detach(),
        gp.covar_module.outputscale.detach(),
        gp.likelihood.noise.detach(),
    )


def cv_variance(data_dir, m, m_tilde, n_tilde, ranks, reps):
    from gpytorch.kernels import RBFKernel, ScaleKernel

    Xtr, Ytr, _, _ = load_kin40k(data_dir)
    mu_x, sd_x = Xtr.mean(0), Xtr.std(0)
    X = (Xtr - mu_x) / sd_x
    Y = (Ytr - Ytr.mean()) / Ytr.std()
    ls, os_, noise = exact_gp_hypers(X, Y)
    k = ScaleKernel(RBFKernel(ard_num_dims=X.shape[-1])).to(DT)
    k.base_kernel.lengthscale, k.outputscale = ls, os_
    model = QSGP(X, Y, num_features=m, family="mean_field", kernel=k, standardize=False)
    model.likelihood.noise = noise
    model.var_mean = torch.randn(m, generator=torch.Generator().manual_seed(1), dtype=DT)
    rows = []
    for r in ranks:
        v0, v1 = control_variate_gradient_variance(model, n_tilde, m_tilde, r, reps=reps, seed=2)
        rows.append({"n_bar": r, "var_without": v0, "var_with": v1, "reduction": v0 / v1})
    return rows, {
        "lengthscale": ls.squeeze().tolist(),
        "outputscale": float(os_),
        "noise": float(noise),
    }


def conditioning_times(ks: list[int], reps: int) -> list[dict]:
    r"""Time one in-place update (q = 1) and one 64-point posterior after ``k`` updates since the
    last fit, for each ``k``: with the conditioned state kept in weight space both cost
    O(m^2), whatever k is."""
    from bo_online.benchmarking import time_interleaved
    from bo_online.models import QSGP

    g = torch.Generator().manual_seed(0)
    d = 4

    def f(X):
        return torch.sin(5 * X).sum(-1, keepdim=True)

    X0 = torch.rand(100, d, generator=g, dtype=torch.float64)
    rows = []
    for k in ks:
        model = QSGP(X0, f(X0))
        Xk = torch.rand(k, d, generator=g, dtype=torch.float64)
        for i in range(0, k, 50):
            model.update(Xk[i : i + 50], f(Xk[i : i + 50]))
        x_new = torch.rand(1, d, generator=g, dtype=torch.float64)
        Xt = torch.rand(64, d, generator=g, dtype=torch.float64)
        state = {
            key: v.clone() if torch.is_tensor(v) else v for key, v in model.state_dict().items()
        }

        def update() -> None:
            model.load_state_dict(state)  # same k every repetition
            model.update(x_new, f(x_new))

        def posterior() -> None:
            with torch.no_grad():
                p = model.posterior(Xt)
                p.mean, p.variance

        t = time_interleaved({"update": update, "posterior": posterior}, reps=reps)
        rows.append({"k": k, "update": t["update"], "posterior": t["posterior"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ms", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--d", type=int, default=8)
    ap.add_argument("--n-tilde", type=int, default=200)
    ap.add_argument("--m-tilde", type=int, default=500)
    ap.add_argument("--n-bar", type=int, default=100)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cv-ranks", type=int, nargs="*", default=[0, 50, 100, 300, 500])
    ap.add_argument("--cv-reps", type=int, default=200)
    ap.add_argument("--cv-m", type=int, default=10_000)
    ap.add_argument("--cv-m-tilde", type=int, default=500)
    ap.add_argument("--cv-n-tilde", type=int, default=500)
    ap.add_argument(
        "--cond-ks",
        type=int,
        nargs="+",
        default=[100, 2000],
        help="points conditioned on since the last fit, for the conditioning table (at least 2 "
        "distinct values; sorted, duplicates dropped)",
    )
    ap.add_argument("--skip-cv", action="store_true")
    ap.add_argument("--skip-cond", action="store_true")
    ap.add_argument("--skip-steps", action="store_true")
    ap.add_argument("--data-dir", type=Path, default=None)
    args = ap.parse_args()
    args.cond_ks = sorted(set(args.cond_ks))  # the check compares the largest k with the smallest
    if not args.skip_cond and args.cond_ks and args.cond_ks[0] < 1:
        ap.error(f"--cond-ks must be positive numbers of points, got {args.cond_ks}")
    if not args.skip_cond and len(args.cond_ks) < 2:
        ap.error(
            f"--cond-ks needs at least 2 distinct values (got {args.cond_ks}): the check "
            "compares the costs at the largest k with those at the smallest"
        )
    torch.set_num_threads(args.threads)
    out = {
        "env": _env(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    ok = True

    if not args.skip_steps:
        t0 = time.time()
        rows = step_times(
            args.ms,
            args.n,
            args.d,
            args.n_tilde,
            args.m_tilde,
            args.n_bar,
            args.steps,
            args.reps,
            args.warmup,
        )
        base = rows[0]["median_s"]
        print(
            f"\nPer-step SGD time, QSGP-0, n={args.n}, d={args.d}, n~={args.n_tilde}, "
            f"m~={args.m_tilde}, n_bar={args.n_bar}; median of {args.reps} interleaved runs of "
            f"{args.steps} steps (min-max)"
        )
        print(f"{'m':>10} {'ms/step':>9} {'min':>7} {'max':>7} {'ratio':>6}")
        for r in rows:
            r["ratio_to_smallest_m"] = r["median_s"] / base
            print(
                f"{r['m']:>10} {1e3 * r['median_s']:>9.2f} {1e3 * r['min_s']:>7.2f} "
                f"{1e3 * r['max_s']:>7.2f} {r['ratio_to_smallest_m']:>6.2f}"
            )
        worst = max(r["ratio_to_smallest_m"] for r in rows)
        flat = worst <= 1.3
        ok &= flat
        print(
            f"CHECK per-step time flat within 1.3x over m: {'PASS' if flat else 'FAIL'} "
            f"(largest ratio {worst:.2f}); {time.time() - t0:.0f} s"
        )
        out["step_time"] = rows

    if not args.skip_cond:
        rows = conditioning_times(args.cond_ks, args.reps)
        k0 = rows[0]
        print(
            f"\nConditioning since the last fit (default QSGP, m = 512 RFF, d = 4): one update of "
            f"q = 1 and a 64-point posterior, median of {args.reps} (min-max)"
        )
        print(f"{'k':>6} {'update ms':>22} {'posterior ms':>24}")
        for r in rows:
            u, p = r["update"], r["posterior"]
            print(
                f"{r['k']:>6} {1e3 * u.median:8.2f} [{1e3 * u.min:.2f},{1e3 * u.max:.2f}] "
                f"{1e3 * p.median:10.2f} [{1e3 * p.min:.2f},{1e3 * p.max:.2f}]"
            )
        last = rows[-1]
        ratio_u = last["update"].median / k0["update"].median
        ratio_p = last["posterior"].median / k0["posterior"].median
        flat = ratio_u <= 1.5 and ratio_p <= 1.5
        ok &= flat
        print(
            f"CHECK update and posterior independent of k (k = {last['k']} vs {k0['k']} within "
            f"1.5x): {'PASS' if flat else 'FAIL'} (update {ratio_u:.2f}x, posterior {ratio_p:.2f}x)"
        )
        out["conditioning"] = [
            {"k": r["k"], "update": r["update"].__dict__, "posterior": r["posterior"].__dict__}
            for r in rows
        ]

    if not args.skip_cv:
        data_dir = args.data_dir or Path(
            os.environ.get("BO_ONLINE_DATA_DIR", ROOT.parent / "shared" / "data")
        )
        try:
            t0 = time.time()
            cv_rows, hyp = cv_variance(
                data_dir, args.cv_m, args.cv_m_tilde, args.cv_n_tilde, args.cv_ranks, args.cv_reps
            )
        except FileNotFoundError as e:
            print(f"\nControl-variate check skipped: {e}")
        else:
            print(
                f"\nControl variates on kin40k (split 0 train), m={args.cv_m} RFF, "
                f"m~={args.cv_m_tilde}, n~={args.cv_n_tilde}, {args.cv_reps} draws; "
                f"gradient variance of the Thm 1 Phi-quadratic term (element average)"
            )
            print(f"{'n_bar':>6} {'without':>12} {'with':>12} {'reduction':>10}")
            for r in cv_rows:
                print(
                    f"{r['n_bar']:>6} {r['var_without']:>12.4g} {r['var_with']:>12.4g} "
                    f"{r['reduction']:>10.2f}"
                )
            at300 = [r for r in cv_rows if r["n_bar"] == 300]
            if at300:
                good = at300[0]["reduction"] >= 5.0
                ok &= good
                print(
                    f"CHECK >= 5x at n_bar = 300: {'PASS' if good else 'FAIL'} "
                    f"({at300[0]['reduction']:.2f}x); {time.time() - t0:.0f} s"
                )
            out["control_variates"] = {"rows": cv_rows, "hypers": hyp}

    res = ROOT / "benchmarks" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "bench_qsgp.json").write_text(json.dumps(out, indent=2))
    print(f"\nwrote {res / 'bench_qsgp.json'}; all checks {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
