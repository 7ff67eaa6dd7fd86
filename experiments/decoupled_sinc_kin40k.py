r"""Decoupled vs coupled SVGP: the sinc toy of Cheng & Boots (2017, Fig. 1) and kin40k split 0.

Claims checked (issue 5):

* sinc (500 noisy points): decoupled (M_alpha=100, M_beta=10) has a test RMSE close to a coupled
  SVGP with M=100 and clearly better than a coupled SVGP with M=10.
* kin40k (split 0 of ``uci/kin40k``): decoupled with M_alpha >> M_beta beats a coupled SVGP with
  M = M_beta in test nMSE at comparable training wall time.

Every model is a :class:`bo_online.models.DecoupledSVGP` trained by the same three-stage procedure,
and the metric is reported after each stage:

1. ``after_init``: bases seeded from random data points; hyperparameters by the exact marginal
   likelihood of a random subset (``init_subset`` points, L-BFGS); ``a`` and ``B`` at their
   closed-form Gaussian optimum on ``warm`` data points.
2. ``after_adam``: ``iters`` Adam steps on the minibatch ELBO (all of ``a, L, beta, alpha`` and
   the hyperparameters; the paper's schedule ``lr_t = lr / (1 + 0.1 sqrt t)``; ``a^T K_alpha a``
   column-subsampled with ``kl_columns`` on kin40k). On sinc this is the paper's set-up: 2000
   full-batch steps with ONE step size for all parameters, gamma_0 in {1e-1, 1e-2, 1e-3} chosen
   by the ELBO after 100 steps (an earlier 300-step, lr 3e-3 / 3e-4 schedule left the decoupled
   model far from convergence: noise still rising, RMSE 0.045 instead of ~0.03).
3. ``after_refresh``: ``a`` and ``B`` re-solved in closed form for the trained hyperparameters and
   bases.

On sinc a fourth number, ``after_adam_fixed_hyper``, repeats stage 2 with the hyperparameters
frozen at stage 1. With few covariance bases (M_beta = 10) the ELBO's variance term
``sum_n var_q f(x_n) / (2 sigma^2)`` is large, and its converged optimum genuinely has a larger
noise and lengthscale than the exact GP's (checked: the ELBO at the learned hyperparameters is
far higher than at the exact-GP ones with a, L, bases re-optimised), which smooths the mean;
freezing the hyperparameters separates that effect from the variational fit. "Coupled" means
``num_mean_bases == num_cov_bases`` (alpha = beta), the standard SVGP in the paper's
parametrisation. The mean basis here contains the covariance basis (``Z = [beta; alpha]``, the
partially shared form of the paper's App. A; both seeded from the same data, as App. A.2 advises).

Defaults are bounded to run in a few minutes on a loaded 2-core machine (one torch thread): the
paper trains for 2000 Adam steps on minibatches of 1024 with M_alpha = 128^2; here kin40k uses 300
steps of 512, M_alpha = 1000, M_beta = 100, and the full 36,000-point training split (subsampled
only for the stage-1 exact-GP hyperparameters and the closed-form solves); the test split is
used whole.

Data: ``../shared/data`` relative to the project root, or ``$BO_ONLINE_DATA_DIR`` / ``--data-dir``.
Results: ``experiments/results/decoupled_sinc_kin40k.json`` and a printed table.

    PYTHONPATH=. python experiments/decoupled_sinc_kin40k.py            # both parts
    PYTHONPATH=. python experiments/decoupled_sinc_kin40k.py --only sinc   # ~6 min, 1 thread
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import math
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from bo_online.models import DecoupledSVGP

ROOT = Path(__file__).resolve().parents[1]
DT = torch.float64

# ---------------------------------------------------------------------- settings (defaults)
# sinc follows the paper's training set-up (Sec. 5 / App. C): T = 2000 Adam steps, one step size
# gamma_0 for every parameter chosen from {1e-1, 1e-2, 1e-3} by the ELBO improvement after 100
# steps, minibatch N_m = 1024 (> n, so full batch). The paper does not state Fig. 1's noise level,
# input range or training details; those below are ours.
SINC = dict(n=500, noise_std=0.1, x_range=20.0, iters=2000, lr_grid=(0.1, 0.01, 0.001),
            select_iters=100, batch=1024, lbfgs_iters=3000, init_subset=500, seed=0, n_test=1000)
KIN = dict(m_alpha=1000, m_beta=100, iters=300, batch=512, lr=0.003, lr_variational=0.0003,
           init_subset=500, seed=0, warm=4096, kl_columns=256)


def data_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    if os.environ.get("BO_ONLINE_DATA_DIR"):
        return Path(os.environ["BO_ONLINE_DATA_DIR"])
    return ROOT / ".." / "shared" / "data"


def load_uci(name: str, split: int, root: Path) -> tuple[np.ndarray, ...]:
    r"""``(X_train, y_train, X_test, y_test)`` of a UCI set with its fixed 90/10 split."""
    folder = root / "uci" / name
    files = [folder / "data.csv.gz", folder / "test_mask.csv.gz"]
    for f in files:
        if not f.exists():
            raise ValueError(
                f"Data file {f} not found. Point --data-dir or the BO_ONLINE_DATA_DIR environment "
                f"variable at the directory holding uci/{name}/ (default: ../shared/data relative "
                "to the project root)."
            )
    with gzip.open(files[0], "rt") as fh:
        data = np.loadtxt(fh, delimiter=",")
    with gzip.open(files[1], "rt") as fh:
        mask = np.loadtxt(fh, delimiter=",")
    test = mask[:, split].astype(bool)
    X, y = data[:, :-1], data[:, -1]
    return X[~test], y[~test], X[test], y[test]


def train(X, Y, m_alpha, m_beta, cfg, batch, evaluate, train_hyperparameters=True):
    r"""Seed bases, fit hyperparameters on an exact-GP subset + closed-form warm start (stage 1),
    then Adam on the minibatch ELBO (stage 2). Returns metrics after each stage and wall times."""
    t0 = time.perf_counter()
    model = DecoupledSVGP(X, Y, num_mean_bases=m_alpha, num_cov_bases=m_beta, seed=cfg["seed"],
                          warm_start_points=cfg.get("warm", 1024))
    model.fit(max_iter=0, init_hyperparameters=cfg["init_subset"], restandardize=False,
              compress=False)
    t1 = time.perf_counter()
    stage1 = evaluate(model)
    t2 = time.perf_counter()
    lr, lr_v = cfg.get("lr"), cfg.get("lr_variational")
    if lr is None:  # the paper's rule: the gamma_0 with the best ELBO after `select_iters` steps
        lr = lr_v = select_step_size(model, cfg, batch, train_hyperparameters)
    model.fit(method="adam", max_iter=cfg["iters"], lr=lr,
              lr_variational=lr_v,
              batch_size=batch, restandardize=False, compress=False,
              train_hyperparameters=train_hyperparameters, num_kl_columns=cfg.get("kl_columns"))
    t3 = time.perf_counter()
    stage2 = evaluate(model)
    with torch.no_grad():  # stage 3: closed-form (a, B) at the trained hyperparameters and bases
        model._warm_start(model.beta_points, model.alpha_points)
    model.invalidate_caches()
    t4 = time.perf_counter()
    return model, {"after_init": stage1, "after_adam": stage2, "after_refresh": evaluate(model),
                   "init_seconds": t1 - t0, "adam_seconds": t3 - t2, "refresh_seconds": t4 - t3,
                   "fit_seconds": (t1 - t0) + (t3 - t2) + (t4 - t3),
                   "noise": float(model.likelihood.noise.detach()),
                   "lengthscale": model.covar_module.lengthscale.detach().flatten().tolist(),
                   "elbo_per_point": elbo_per_point(model), "lr": lr, "lr_variational": lr_v}


def elbo_per_point(model) -> float:
    with torch.no_grad():
        idx = torch.randperm(model.num_data, generator=torch.Generator().manual_seed(1))[:4096]
        return float(model.elbo(idx) / model.num_data)


def select_step_size(model, cfg, batch, train_hyperparameters) -> float:
    r"""Step size gamma_0 from ``cfg["lr_grid"]`` whose ``select_iters`` Adam steps (one step
    size for all parameters, as in the paper) raise the ELBO most; trials run on copies."""
    best, best_lr = -math.inf, None
    for lr in cfg["lr_grid"]:
        trial = copy.deepcopy(model)
        trial.fit(method="adam", max_iter=cfg["select_iters"], lr=lr, lr_variational=lr,
                  batch_size=batch, restandardize=False, compress=False,
                  train_hyperparameters=train_hyperparameters)
        value = elbo_per_point(trial)
        if math.isfinite(value) and value > best:
            best, best_lr = value, lr
    return best_lr


def predict(model, X):
    with torch.no_grad():
        out = [model.posterior(Xb).mean.squeeze(-1) for Xb in X.split(2000)]
    return torch.cat(out)


def run_sinc(cfg: dict) -> dict:
    g = torch.Generator().manual_seed(cfg["seed"])
    r = cfg["x_range"]
    x = (torch.rand(cfg["n"], 1, generator=g, dtype=DT) * 2 - 1) * r
    f = lambda z: torch.sinc(z / torch.pi)  # noqa: E731  sin(z)/z
    y = f(x) + cfg["noise_std"] * torch.randn(cfg["n"], 1, generator=g, dtype=DT)
    xt = torch.linspace(-r, r, cfg["n_test"], dtype=DT).unsqueeze(-1)
    to_unit = lambda z: (z + r) / (2 * r)  # noqa: E731  models work on the unit cube
    rows = {}
    for name, (ma, mb) in {"coupled M=10": (10, 10), "decoupled Ma=100,Mb=10": (100, 10),
                           "coupled M=100": (100, 100)}.items():
        torch.manual_seed(cfg["seed"])
        def rmse(mdl):
            return float((predict(mdl, to_unit(xt)) - f(xt).squeeze(-1)).pow(2).mean().sqrt())

        model, res = train(to_unit(x), y, ma, mb, cfg, cfg["batch"], rmse)
        rows[name] = {"M_alpha": ma, "M_beta": mb, "test_rmse": res["after_adam"], **res}
        # Variant: Adam on the variational parameters and bases only (hyperparameters kept from
        # the exact-GP subset), separating the ELBO's noise inflation at small M_beta.
        _, res2 = train(to_unit(x), y, ma, mb, cfg, cfg["batch"], rmse,
                        train_hyperparameters=False)
        rows[name]["after_adam_fixed_hyper"] = res2["after_adam"]
        # Convergence reference: full-batch L-BFGS from stage 1, with and without the
        # hyperparameters. If the ELBO with learned hyperparameters is the higher one, their
        # larger noise / lengthscale is the objective's optimum, not an optimiser artefact.
        for tag, th in (("lbfgs", True), ("lbfgs_fixed_hyper", False)):
            ref = DecoupledSVGP(to_unit(x), y, num_mean_bases=ma, num_cov_bases=mb,
                                seed=cfg["seed"])
            ref.fit(max_iter=0, init_hyperparameters=cfg["init_subset"], restandardize=False,
                    compress=False)
            ref.fit(method="lbfgs", max_iter=cfg["lbfgs_iters"], restandardize=False,
                    compress=False, train_hyperparameters=th)
            rows[name][f"after_{tag}"] = rmse(ref)
            rows[name][f"elbo_per_point_{tag}"] = elbo_per_point(ref)
            rows[name][f"noise_{tag}"] = float(ref.likelihood.noise.detach())
        print(f"  sinc  {name:26s} RMSE after init {res['after_init']:.4f}, after Adam "
              f"{res['after_adam']:.4f} (gamma_0 {res['lr']:g}, noise {res['noise']:.3f}, ELBO/n "
              f"{res['elbo_per_point']:.4f}), after refresh "
              f"{res['after_refresh']:.4f}; Adam with fixed hyperparameters "
              f"{res2['after_adam']:.4f}   fit {res['fit_seconds']:5.1f} s")
        row = rows[name]
        print(f"        L-BFGS to convergence: RMSE {row['after_lbfgs']:.4f} (ELBO/n "
              f"{row['elbo_per_point_lbfgs']:.4f}, noise {row['noise_lbfgs']:.3f}); hyperparameters"
              f" fixed: RMSE {row['after_lbfgs_fixed_hyper']:.4f} (ELBO/n "
              f"{row['elbo_per_point_lbfgs_fixed_hyper']:.4f})")
    return rows


def run_kin40k(cfg: dict, root: Path) -> dict:
    Xtr, ytr, Xte, yte = load_uci("kin40k", 0, root)
    lo, hi = Xtr.min(0), Xtr.max(0)
    unit = lambda z: np.clip((z - lo) / (hi - lo), 0.0, 1.0)  # noqa: E731
    Xtr_t, Xte_t = torch.tensor(unit(Xtr), dtype=DT), torch.tensor(unit(Xte), dtype=DT)
    Ytr = torch.tensor(ytr, dtype=DT).unsqueeze(-1)
    yte_t = torch.tensor(yte, dtype=DT)
    rows = {}
    mb, ma = cfg["m_beta"], cfg["m_alpha"]
    configs = {f"coupled M={mb}": (mb, mb), f"decoupled Ma={ma},Mb={mb}": (ma, mb)}
    for name, (a, b) in configs.items():
        torch.manual_seed(cfg["seed"])
        def nmse(mdl):
            return float((predict(mdl, Xte_t) - yte_t).pow(2).mean() / yte_t.var())

        model, res = train(Xtr_t, Ytr, a, b, cfg, cfg["batch"], nmse)
        rows[name] = {"M_alpha": a, "M_beta": b, "test_nmse": res["after_adam"], **res}
        print(f"  kin40k {name:28s} nMSE after init {res['after_init']:.4f}, after Adam "
              f"{res['after_adam']:.4f}, after refresh {res['after_refresh']:.4f}   fit "
              f"{res['fit_seconds']:6.1f} s (init {res['init_seconds']:.1f} + Adam "
              f"{res['adam_seconds']:.1f} + refresh {res['refresh_seconds']:.1f})")
    rows["n_train"], rows["n_test"] = len(ytr), len(yte)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", choices=["sinc", "kin40k"], default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--sinc-iters", type=int, default=SINC["iters"])
    p.add_argument("--kin-iters", type=int, default=KIN["iters"])
    p.add_argument("--m-alpha", type=int, default=KIN["m_alpha"])
    p.add_argument("--m-beta", type=int, default=KIN["m_beta"])
    p.add_argument("--batch", type=int, default=KIN["batch"])
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1 avoids thread contention on a loaded machine)")
    p.add_argument(
        "--out", default=str(ROOT / "experiments" / "results" / "decoupled_sinc_kin40k.json")
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    SINC["iters"], KIN["iters"] = args.sinc_iters, args.kin_iters
    KIN["m_alpha"], KIN["m_beta"], KIN["batch"] = args.m_alpha, args.m_beta, args.batch
    results = {
        "settings": {"sinc": SINC, "kin40k": KIN},
        "env": {"torch": torch.__version__, "python": platform.python_version(), "dtype": "float64",
                "device": "cpu", "threads": torch.get_num_threads()},
    }
    checks = {}
    if args.only in (None, "sinc"):
        s = results["sinc"] = run_sinc(SINC)
        stages = ("after_init", "after_adam", "after_refresh", "after_adam_fixed_hyper",
                  "after_lbfgs", "after_lbfgs_fixed_hyper")
        for stage in stages:
            dec, c100, c10 = (s[k][stage] for k in
                              ("decoupled Ma=100,Mb=10", "coupled M=100", "coupled M=10"))
            key = f"sinc ({stage}): decoupled RMSE within 1.25x of coupled M=100"
            checks[key] = dec <= 1.25 * c100
            checks[f"sinc ({stage}): decoupled RMSE < 0.7x coupled M=10"] = dec < 0.7 * c10
    if args.only in (None, "kin40k"):
        k = results["kin40k"] = run_kin40k(KIN, data_dir(args.data_dir))
        mb, ma = KIN["m_beta"], KIN["m_alpha"]
        c, d = k[f"coupled M={mb}"], k[f"decoupled Ma={ma},Mb={mb}"]
        for stage in ("after_init", "after_adam", "after_refresh"):
            checks[f"kin40k ({stage}): decoupled nMSE < coupled nMSE"] = d[stage] < c[stage]
        key = "kin40k: decoupled fit time <= 2x coupled"
        checks[key] = d["fit_seconds"] <= 2 * c["fit_seconds"]
    results["checks"] = checks
    print("\nchecks:")
    for name, ok in checks.items():
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
