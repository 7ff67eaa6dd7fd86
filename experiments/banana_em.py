"""Variational EM on the banana classification data: t-SVGP's tighter M-step vs q-SVGP.

The paper's Fig. 1-2 claim (Adam, Chang, Khan & Solin, "Dual Parameterization of Sparse
Variational Gaussian Processes", NeurIPS 2021, arXiv:2111.03412, Sec. 3.1 and 5): with
E- and M-steps each run to convergence, EM on the t-SVGP bound (sites frozen, q rebuilt with the new
hyperparameters, Eq. 15) reaches the hyperparameter fixed point in about 2 outer iterations from a
poor start, while q-SVGP (q(u) frozen in its own -- whitened -- parameterisation during the M-step)
needs more than 5.

Both methods here share everything else: probit Bernoulli likelihood, ScaleKernel(RBF) started at a
poor lengthscale, a constant mean, the same m inducing inputs (pivoted-Cholesky selection, kept
fixed), E-steps = natural-gradient steps with rho = 1 until q stops moving (t-SVGP: ``e_step``;
q-SVGP: GPyTorch's ``NaturalVariationalDistribution`` + ``gpytorch.optim.NGD`` at lr = 1), M-steps =
Adam over the learned hyperparameters (default the lengthscale alone, as in the paper's Fig. 2;
the outputscale and the constant mean stay at 1 and 0: on these nearly separable data a learned
outputscale grows without bound under both bounds) with the same settings. After EM both predict the
test set; accuracies are compared.

Converged at outer iteration t: from t on, every log-hyperparameter within ``--tol`` of the EM
fixed point (t-SVGP's value after ``--outer`` iterations; at a fixed point both bounds have the
same gradient, so it is q-SVGP's fixed point as well); "None" = not within ``--outer`` iterations.

    BO_ONLINE_DATA_DIR=/path/to/data python experiments/banana_em.py
    python experiments/banana_em.py --data-dir ../shared/data --m 25 --outer 8 --init-lengthscale 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import gpytorch
import numpy as np
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel

from bo_online.likelihoods import Bernoulli
from bo_online.models.tsvgp import TSVGP, TSVGPFitSettings, select_inducing_points

DT = torch.float64
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def load_banana(data_dir: str | None) -> tuple[torch.Tensor, ...]:
    """Train/test inputs and {0, 1} labels from ``<data_dir>/banana``."""
    root = Path(
        data_dir or os.environ.get("BO_ONLINE_DATA_DIR") or PROJECT_ROOT / ".." / "shared" / "data"
    )
    folder = root / "banana"
    names = ["banana_train_x.txt", "banana_train_y.txt", "banana_test_x.txt", "banana_test_y.txt"]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise ValueError(
            f"Banana data not found: {', '.join(missing)} missing in {folder.resolve()}. Point "
            "--data-dir or the BO_ONLINE_DATA_DIR environment variable at the folder that holds "
            "banana/ (the shared data directory)."
        )
    arrs = [np.loadtxt(folder / n, delimiter=",", ndmin=1) for n in names]
    Xtr, ytr, Xte, yte = (torch.as_tensor(a, dtype=DT) for a in arrs)
    return Xtr, (ytr > 0).to(DT), Xte, (yte > 0).to(DT)


def make_kernel(lengthscale: float) -> ScaleKernel:
    k = ScaleKernel(RBFKernel()).to(DT)
    k.base_kernel.lengthscale = lengthscale
    k.outputscale = 1.0
    return k


def hypers(kernel: ScaleKernel, mean: gpytorch.means.ConstantMean) -> list[float]:
    return [
        float(kernel.base_kernel.lengthscale.detach()),
        float(kernel.outputscale.detach()),
        float(mean.constant.detach()),
    ]


def freeze(kernel: ScaleKernel, mean: gpytorch.means.ConstantMean, args) -> None:
    """Learn only the hyperparameters named in ``--learn`` (the paper's Fig. 2: the lengthscale)."""
    kernel.outputscale = args.outputscale
    kernel.raw_outputscale.requires_grad_("outputscale" in args.learn)
    mean.raw_constant.requires_grad_("mean" in args.learn)
    kernel.base_kernel.raw_lengthscale.requires_grad_("lengthscale" in args.learn)


# ------------------------------------------------------------------------------ t-SVGP


def run_tsvgp(X, y, Z, args) -> tuple[TSVGP, list[list[float]], list[float]]:
    model = TSVGP(
        X,
        y.unsqueeze(-1),
        inducing_points=Z,
        likelihood=Bernoulli("probit"),
        covar_module=make_kernel(args.init_lengthscale),
        num_init_e_steps=0,
    )
    model.inducing_points.requires_grad_(False)
    freeze(model.covar_module, model.mean_module, args)
    traj, times = [hypers(model.covar_module, model.mean_module)], []
    for _ in range(args.outer):
        t0 = time.perf_counter()
        e_step_to_convergence(model, args.e_steps)
        m_step = TSVGPFitSettings(
            method="adam", max_iter=args.m_steps, lr=args.lr, include_priors=False
        )
        model._m_step(m_step, learn_z=False)
        times.append(time.perf_counter() - t0)
        traj.append(hypers(model.covar_module, model.mean_module))
    e_step_to_convergence(model, args.e_steps)
    return model, traj, times


def e_step_to_convergence(model: TSVGP, max_steps: int, tol: float = 1e-7) -> None:
    for _ in range(max_steps):
        old = model.v.clone()
        model.e_step(rho=1.0)
        if (model.v - old).abs().max() < tol:
            break


# ------------------------------------------------------------------------------ q-SVGP


class QSVGP(gpytorch.models.ApproximateGP):
    """GPyTorch's SVGP (whitened VariationalStrategy) with natural variational parameters."""

    def __init__(self, Z: torch.Tensor, lengthscale: float) -> None:
        dist = gpytorch.variational.NaturalVariationalDistribution(Z.shape[0], mean_init_std=0.0)
        strat = gpytorch.variational.VariationalStrategy(
            self, Z, dist, learn_inducing_locations=False
        )
        super().__init__(strat)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = make_kernel(lengthscale)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def run_qsvgp(X, y, Z, args):
    model = QSVGP(Z, args.init_lengthscale).to(DT)
    lik = gpytorch.likelihoods.BernoulliLikelihood().to(DT)
    n = X.shape[0]
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=n)
    freeze(model.covar_module, model.mean_module, args)
    hyper = [
        p
        for p in list(model.mean_module.parameters()) + list(model.covar_module.parameters())
        if p.requires_grad
    ]
    traj, times = [hypers(model.covar_module, model.mean_module)], []

    def e_step():
        ngd = gpytorch.optim.NGD(model.variational_parameters(), num_data=n, lr=1.0)
        for _ in range(args.e_steps):
            old = [p.detach().clone() for p in model.variational_parameters()]
            ngd.zero_grad()
            (-mll(model(X), y)).backward()
            ngd.step()
            if (
                max(float((p - o).abs().max()) for p, o in zip(model.variational_parameters(), old))
                < 1e-7
            ):
                break

    model.train()
    for _ in range(args.outer):
        t0 = time.perf_counter()
        e_step()
        adam = torch.optim.Adam(hyper, lr=args.lr)
        for _ in range(args.m_steps):  # the standard M-step: q(u) frozen in its parameters
            adam.zero_grad()
            (-mll(model(X), y)).backward()
            adam.step()
        times.append(time.perf_counter() - t0)
        traj.append(hypers(model.covar_module, model.mean_module))
    e_step()
    model.eval()
    return model, traj, times


# ------------------------------------------------------------------------------ main


def iterations_to_converge(traj: list[list[float]], tol: float, final: list[float]) -> int | None:
    """First outer iteration from which on the log-hyperparameters stay within tol of ``final``
    (None: not within the iterations run)."""

    def close(h):
        return (
            all(abs(math.log(a) - math.log(b)) < tol for a, b in zip(h[:2], final[:2]))
            and abs(h[2] - final[2]) < tol
        )

    for t, h in enumerate(traj):
        if all(close(g) for g in traj[t:]):
            return t
    return None


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data-dir", default=None)
    p.add_argument("--m", type=int, default=25, help="inducing points (fixed, shared)")
    p.add_argument("--init-lengthscale", type=float, default=3.0)
    p.add_argument(
        "--learn",
        nargs="+",
        default=["lengthscale"],
        choices=["lengthscale", "outputscale", "mean"],
        help="hyperparameters the M-steps move (the others stay at their start)",
    )
    p.add_argument("--outputscale", type=float, default=1.0, help="(initial) kernel outputscale")
    p.add_argument("--outer", type=int, default=10, help="EM outer iterations")
    p.add_argument("--e-steps", type=int, default=30, help="max natural-gradient steps per E-step")
    p.add_argument("--m-steps", type=int, default=150, help="Adam steps per M-step")
    p.add_argument("--lr", type=float, default=0.1, help="Adam learning rate (M-step)")
    p.add_argument("--tol", type=float, default=0.05, help="convergence tolerance (log scale)")
    p.add_argument(
        "--out", default=str(PROJECT_ROOT / "experiments" / "results" / "banana_em.json")
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    Xtr, ytr, Xte, yte = load_banana(args.data_dir)
    Z = select_inducing_points(
        Xtr, make_kernel(0.5), args.m, bounds=torch.stack([Xtr.min(0).values, Xtr.max(0).values])
    )

    t_model, t_traj, t_times = run_tsvgp(Xtr, ytr, Z, args)
    q_model, q_traj, q_times = run_qsvgp(Xtr, ytr, Z, args)

    with torch.no_grad():
        t_mean = t_model.posterior(Xte).mean.squeeze(-1)
        q_mean = q_model(Xte).mean
    t_acc = float(((t_mean > 0).to(DT) == yte).to(DT).mean())
    q_acc = float(((q_mean > 0).to(DT) == yte).to(DT).mean())
    # Reference: the EM fixed point, i.e. t-SVGP's final hyperparameters (at a fixed point both
    # bounds have the same gradient, so it is q-SVGP's fixed point too).
    t_conv = iterations_to_converge(t_traj, args.tol, t_traj[-1])
    q_conv = iterations_to_converge(q_traj, args.tol, t_traj[-1])
    t_elbo = float(t_model.elbo())

    print(
        f"banana: n_train={Xtr.shape[0]} n_test={Xte.shape[0]} m={args.m} "
        f"init lengthscale={args.init_lengthscale}; E-steps to convergence (NGD, rho=1), "
        f"M-step = {args.m_steps} Adam steps at lr={args.lr}"
    )
    print(
        f"{'iter':>4} | {'t-SVGP lengthscale':>18} {'outputscale':>11} {'mean':>7} | "
        f"{'q-SVGP lengthscale':>18} {'outputscale':>11} {'mean':>7}"
    )
    for t, (a, b) in enumerate(zip(t_traj, q_traj)):
        print(
            f"{t:>4} | {a[0]:>18.4f} {a[1]:>11.4f} {a[2]:>7.3f} | "
            f"{b[0]:>18.4f} {b[1]:>11.4f} {b[2]:>7.3f}"
        )
    print(
        f"outer iterations to converge (tol {args.tol} in log hyperparameters): "
        f"t-SVGP {t_conv}, q-SVGP {q_conv}"
    )
    print(
        f"test accuracy: t-SVGP {t_acc:.4f}, q-SVGP (GPyTorch SVGP) {q_acc:.4f}; "
        f"t-SVGP final ELBO {t_elbo:.3f}"
    )
    print(
        f"time per outer iteration (median s): t-SVGP {np.median(t_times):.3f}, "
        f"q-SVGP {np.median(q_times):.3f}"
    )
    checks = {
        "tsvgp_converges_within_3": t_conv is not None and t_conv <= 3,
        "qsvgp_needs_more_than_5": q_conv is None or q_conv > 5,
        "accuracy_matches_within_0.01": abs(t_acc - q_acc) <= 0.01,
    }
    print("checks:", ", ".join(f"{k}={'PASS' if v else 'FAIL'}" for k, v in checks.items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "settings": vars(args),
                "tsvgp_trajectory": t_traj,
                "qsvgp_trajectory": q_traj,
                "tsvgp_iters_to_converge": t_conv,
                "qsvgp_iters_to_converge": q_conv,
                "tsvgp_test_accuracy": t_acc,
                "qsvgp_test_accuracy": q_acc,
                "checks": checks,
                "tsvgp_seconds_per_outer": t_times,
                "qsvgp_seconds_per_outer": q_times,
                "versions": {
                    "torch": torch.__version__,
                    "gpytorch": gpytorch.__version__,
                    "python": platform.python_version(),
                },
                "dtype": "float64",
                "device": "cpu",
                "threads": torch.get_num_threads(),
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
