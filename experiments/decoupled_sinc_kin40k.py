r"""Decoupled vs coupled SVGP: the sinc toy of Cheng & Boots (2017, Fig. 1) and kin40k split 0.

Claims checked (Cheng & Boots, "Variational Inference for Gaussian Process Models with Linear
Complexity", NeurIPS 2017, arXiv:1711.10127):

* sinc (500 noisy points): decoupled (M_alpha=100, M_beta=10) has a test RMSE close to a coupled
  SVGP with M=100 and clearly better than a coupled SVGP with M=10.
* kin40k (split 0 of ``uci/kin40k``): decoupled with M_alpha >> M_beta beats a coupled SVGP with
  M = M_beta in test nMSE at matched training wall time.

Every model is a :class:`bo_online.models.DecoupledSVGP`; "coupled" means ``num_mean_bases ==
num_cov_bases`` (alpha = beta), the standard SVGP in the paper's parametrisation. The mean basis
contains the covariance basis (``Z = [beta; alpha]``, the partially shared form of the paper's
App. A, both seeded from the same data as App. A.2 advises).

sinc, the paper's set-up as far as the text gives it (Sec. 1.1, Sec. 4, App. C), over several
data seeds. f(x) = sin(x)/x, 500 training inputs uniform on [-20, 20], Gaussian noise std 0.1,
RMSE against f on 1000 equispaced test inputs (noise level, input range and test grid are not in
the paper; they are ours, fixed before any result). Kernel rho^2 exp(-|x-x'|^2 / 2 s^2) with rho
learned (GPyTorch ``ScaleKernel(RBFKernel())``), no hyperpriors (the paper has none); the paper's
initialisation (App. C.2): s = median pairwise distance, sigma^2 = variance of the outputs, rho = 1;
bases = random data points (Algorithm 1 with N_delta >= M: all bases added at the first step),
``a`` and ``B`` at their closed-form optimum for those initial hyperparameters. Stages per model:

1. ``paper``: T = 2000 full-batch (N_m = 1024 > n) Adam steps on the ELBO, one step size for
   every parameter, schedule gamma_t = gamma_0 / (1 + 0.1 sqrt t), gamma_0 in {1e-1, 1e-2, 1e-3}
   chosen by the ELBO after 100 steps (Sec. 4).
2. ``converged``: full-batch L-BFGS on the same ELBO (all parameters, hyperparameters included),
   restarted until the ELBO stops rising, from two starts: the stage-1 end point and the stage-3
   one; the higher ELBO is reported (the choice is made on the training objective, never on test
   error). This is the headline: the paper's schedule does not reach the optimum on this toy (the
   100-step rule picks gamma_0 = 1e-3, far too slow from sigma^2 = 1), and the ELBO has several
   local optima (L-BFGS from the stage-1 end point can stall in a worse one).
3. ``fixed_hyper`` (diagnostic): hyperparameters frozen at the exact GP's (marginal likelihood on
   all 500 points), variational parameters and bases by L-BFGS. If stage 2's ELBO is higher, the
   hyperparameters stage 2 learned are the ELBO's own optimum, not an optimiser artefact: with few
   covariance bases the ELBO's variance term sum_n var_q f(x_n) / (2 sigma^2) stays large, and the
   hyperparameters that shrink it (smaller rho^2, longer lengthscale, more noise) also smooth the
   mean, which is what separates decoupled (M_beta = 10) from coupled M = 100.

The exact GP (same kernel, marginal likelihood) is reported as the reference.

kin40k: hyperparameters from an exact GP on a 500-point subset, ``a, B`` at their closed-form
optimum on 4096 points, then minibatch Adam (``lr_t = lr / (1 + 0.1 sqrt t)``, batch 512,
``a^T K_alpha a`` column-subsampled). The decoupled model (M_alpha = 1000, M_beta = 100) trains
``iters`` steps; its training wall time (initialisation + Adam) is the budget, and the coupled
M = 100 model gets the same budget (Adam runs until the budget is spent: it takes more, cheaper
steps). Both are also trained at 0.5x and 2x that budget (nMSE vs seconds; at 0.5x initialisation
takes most of the budget, and one Adam step from the closed-form start of 1000 mean bases is a
transient with a large error, so the checks are made at >= 1x). The closed-form
``refresh`` of ``a, B`` after Adam is reported separately (not counted in the budget). The full
36,000-point training split is used (subsampled only for the exact-GP init and closed-form solves);
the test split is used whole. Wall time on a shared machine is noisy; the budget is honoured to
within one Adam step.

Data: ``../shared/data`` relative to the project root, or ``$BO_ONLINE_DATA_DIR`` / ``--data-dir``.
Results: ``experiments/results/decoupled_sinc_kin40k.json`` (or ``--out``) and printed tables.

    PYTHONPATH=. python experiments/decoupled_sinc_kin40k.py                 # both parts
    PYTHONPATH=. python experiments/decoupled_sinc_kin40k.py --only sinc     # ~8 min per seed
    PYTHONPATH=. python experiments/decoupled_sinc_kin40k.py --only kin40k   # ~4 min
    # seeds split over two processes, then one summary:
    PYTHONPATH=. python experiments/decoupled_sinc_kin40k.py --only sinc --seeds 0 1 2 --out a.json
    PYTHONPATH=. python experiments/decoupled_sinc_kin40k.py --only sinc --seeds 3 4 --out b.json
    PYTHONPATH=. python experiments/decoupled_sinc_kin40k.py --merge-sinc a.json b.json
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood

from bo_online.models import DecoupledSVGP, OnlineExactGP
from bo_online.models.decoupled import median_lengthscale

ROOT = Path(__file__).resolve().parents[1]
DT = torch.float64

# ---------------------------------------------------------------------- settings (defaults)
SINC = dict(
    n=500,
    noise_std=0.1,
    x_range=20.0,
    n_test=1000,
    seeds=(0, 1, 2, 3, 4),
    iters=2000,
    lr_grid=(0.1, 0.01, 0.001),
    select_iters=100,
    batch=1024,
    lbfgs_iters=2000,
    lbfgs_rounds=3,
)
SINC_MODELS = {
    "coupled M=10": (10, 10),
    "decoupled Ma=100,Mb=10": (100, 10),
    "coupled M=100": (100, 100),
}
KIN = dict(
    m_alpha=1000,
    m_beta=100,
    iters=300,
    batch=512,
    lr=0.003,
    lr_variational=0.0003,
    init_subset=500,
    seed=0,
    warm=4096,
    kl_columns=256,
    budget_factors=(0.5, 2.0),
)


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


def predict(model, X):
    with torch.no_grad():
        out = [model.posterior(Xb).mean.squeeze(-1) for Xb in X.split(2000)]
    return torch.cat(out)


def elbo_per_point(model, max_points: int | None = None) -> float:
    r"""ELBO / n in standardised units (full data, or a fixed random subset of ``max_points``)."""
    with torch.no_grad():
        idx = None
        if max_points is not None and model.num_data > max_points:
            g = torch.Generator().manual_seed(1)
            idx = torch.randperm(model.num_data, generator=g)[:max_points]
        return float(model.elbo(idx) / model.num_data)


def hypers(model) -> dict:
    ck = model.covar_module
    base = ck.base_kernel if isinstance(ck, ScaleKernel) else ck
    return {
        "noise": float(model.likelihood.noise.detach()),
        "lengthscale": base.lengthscale.detach().flatten().tolist(),
        "outputscale": float(ck.outputscale.detach()) if isinstance(ck, ScaleKernel) else 1.0,
    }


# ---------------------------------------------------------------------- sinc


def sinc_data(cfg: dict, seed: int):
    r"""Training inputs/targets and test grid/true values, inputs mapped to the unit interval."""
    g = torch.Generator().manual_seed(seed)
    r = cfg["x_range"]
    x = (torch.rand(cfg["n"], 1, generator=g, dtype=DT) * 2 - 1) * r
    f = lambda z: torch.sinc(z / torch.pi)  # noqa: E731  sin(z)/z
    y = f(x) + cfg["noise_std"] * torch.randn(cfg["n"], 1, generator=g, dtype=DT)
    xt = torch.linspace(-r, r, cfg["n_test"], dtype=DT).unsqueeze(-1)
    unit = lambda z: (z + r) / (2 * r)  # noqa: E731
    return unit(x), y, unit(xt), f(xt).squeeze(-1)


def paper_modules(x: torch.Tensor) -> tuple[ScaleKernel, GaussianLikelihood]:
    r"""rho^2 * SE kernel and Gaussian likelihood without priors, at the paper's initialisation
    (App. C.2): median pairwise distance lengthscale, rho = 1, sigma^2 = 1 (= the variance of the
    standardised outputs)."""
    kernel = ScaleKernel(RBFKernel()).to(DT)
    likelihood = GaussianLikelihood().to(DT)
    with torch.no_grad():
        kernel.base_kernel.lengthscale = median_lengthscale(x).reshape(1, 1)
        kernel.outputscale = torch.tensor(1.0, dtype=DT)
        likelihood.noise = torch.tensor([1.0], dtype=DT)
    return kernel, likelihood


def sinc_model(x, y, ma: int, mb: int, seed: int) -> DecoupledSVGP:
    kernel, likelihood = paper_modules(x)
    return DecoupledSVGP(
        x,
        y,
        num_mean_bases=ma,
        num_cov_bases=mb,
        covar_module=kernel,
        likelihood=likelihood,
        seed=seed,
    )


def adam(model, iters: int, lr: float, batch: int, **kw) -> None:
    model.fit(
        method="adam",
        max_iter=iters,
        lr=lr,
        lr_variational=lr,
        batch_size=batch,
        restandardize=False,
        compress=False,
        **kw,
    )


def lbfgs_to_convergence(model, cfg: dict, **kw) -> int:
    r"""Full-batch L-BFGS, restarted (fresh curvature memory) while the ELBO still rises by more
    than 1e-6 per point; returns the number of rounds run."""
    before = elbo_per_point(model)
    for rnd in range(1, cfg["lbfgs_rounds"] + 1):
        model.fit(
            method="lbfgs", max_iter=cfg["lbfgs_iters"], restandardize=False, compress=False, **kw
        )
        after = elbo_per_point(model)
        if after - before < 1e-6:
            return rnd
        before = after
    return cfg["lbfgs_rounds"]


def run_sinc(cfg: dict) -> dict:
    out = {"per_seed": {}}
    for seed in cfg["seeds"]:
        x, y, xt, ft = sinc_data(cfg, seed)

        def rmse(mdl):
            return float((predict(mdl, xt) - ft).pow(2).mean().sqrt())

        kernel, likelihood = paper_modules(x)
        exact = OnlineExactGP(x, y, covar_module=kernel, likelihood=likelihood)
        exact.fit(max_iter=1000)
        rows = {"exact GP": {"rmse": rmse(exact), **hypers(exact)}}
        exact_state = {k: v.detach().clone() for k, v in exact.named_parameters()}
        print(f"seed {seed}: exact GP RMSE {rows['exact GP']['rmse']:.4f}", flush=True)
        for name, (ma, mb) in SINC_MODELS.items():
            torch.manual_seed(seed)
            base = sinc_model(x, y, ma, mb, seed)
            row = {"M_alpha": ma, "M_beta": mb}
            # Stage 1: the paper's schedule, gamma_0 by the ELBO after `select_iters` steps.
            t0 = time.perf_counter()
            scores = {}
            for lr in cfg["lr_grid"]:
                trial = copy.deepcopy(base)
                adam(trial, cfg["select_iters"], lr, cfg["batch"])
                scores[lr] = elbo_per_point(trial)
            lr = max((v, k) for k, v in scores.items() if math.isfinite(v))[1]
            model = copy.deepcopy(base)
            adam(model, cfg["iters"], lr, cfg["batch"])
            row["paper"] = {
                "rmse": rmse(model),
                "elbo_per_point": elbo_per_point(model),
                "gamma_0": lr,
                "seconds": time.perf_counter() - t0,
                **hypers(model),
            }
            # Stage 3: hyperparameters frozen at the exact GP's; variational part to convergence.
            fixed = sinc_model(x, y, ma, mb, seed)
            with torch.no_grad():
                for k, p in fixed.named_parameters():
                    if k in exact_state:
                        p.copy_(exact_state[k])
                fixed._warm_start(fixed.beta_points, fixed.alpha_points)
            fixed.invalidate_caches()
            lbfgs_to_convergence(fixed, cfg, train_hyperparameters=False)
            row["fixed_hyper"] = {
                "rmse": rmse(fixed),
                "elbo_per_point": elbo_per_point(fixed),
                **hypers(fixed),
            }
            # Stage 2: the same objective (hyperparameters learned) optimised to convergence from
            # two starts, the stage-1 end point and the stage-3 one; the higher ELBO is reported.
            t0 = time.perf_counter()
            starts = {}
            for start, mdl in (("from_paper", model), ("from_fixed_hyper", copy.deepcopy(fixed))):
                rounds = lbfgs_to_convergence(mdl, cfg)
                starts[start] = {
                    "rmse": rmse(mdl),
                    "elbo_per_point": elbo_per_point(mdl),
                    "lbfgs_rounds": rounds,
                    **hypers(mdl),
                }
            best = max(starts, key=lambda k: starts[k]["elbo_per_point"])
            row["converged"] = {
                **starts[best],
                "start": best,
                "starts": starts,
                "seconds": time.perf_counter() - t0,
            }
            rows[name] = row
            p, c, fx = row["paper"], row["converged"], row["fixed_hyper"]
            print(
                f"  {name:24s} paper {p['rmse']:.4f} (gamma_0 {p['gamma_0']:g}, ELBO/n "
                f"{p['elbo_per_point']:.4f}) | converged {c['rmse']:.4f} (ELBO/n "
                f"{c['elbo_per_point']:.4f}; noise {c['noise']:.3f}, ls "
                f"{c['lengthscale'][0]:.4f}, rho^2 {c['outputscale']:.3f}) | exact-GP hypers "
                f"{fx['rmse']:.4f} (ELBO/n {fx['elbo_per_point']:.4f})",
                flush=True,
            )
        e = rows["exact GP"]
        print(
            f"  {'exact GP':24s} {e['rmse']:.4f} (noise {e['noise']:.3f}, ls "
            f"{e['lengthscale'][0]:.4f}, rho^2 {e['outputscale']:.3f})",
            flush=True,
        )
        out["per_seed"][str(seed)] = rows
    out["summary"] = summarize_sinc(out["per_seed"])
    return out


def summarize_sinc(per_seed: dict) -> dict:
    r"""Mean / min / max / std of the test RMSE over seeds, per model and stage; printed."""
    summary = {}
    for name in list(SINC_MODELS) + ["exact GP"]:
        for stage in ("paper", "converged", "fixed_hyper", None):
            if (name == "exact GP") != (stage is None):
                continue
            vals = [
                r[name]["rmse"] if stage is None else r[name][stage]["rmse"]
                for r in per_seed.values()
            ]
            summary[name if stage is None else f"{name} / {stage}"] = {
                "mean": statistics.fmean(vals),
                "min": min(vals),
                "max": max(vals),
                "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                "per_seed": vals,
            }
    for stage in ("paper", "converged", "fixed_hyper"):  # per-seed RMSE ratios
        for other in ("coupled M=100", "coupled M=10"):
            vals = [
                r["decoupled Ma=100,Mb=10"][stage]["rmse"] / r[other][stage]["rmse"]
                for r in per_seed.values()
            ]
            summary[f"ratio decoupled / {other} / {stage}"] = {
                "mean": statistics.fmean(vals),
                "min": min(vals),
                "max": max(vals),
                "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                "per_seed": vals,
            }
    print(f"\nsinc test RMSE over seeds {list(per_seed)} (mean [min, max], then per seed):")
    for key, v in summary.items():
        print(
            f"  {key:48s} {v['mean']:.4f} [{v['min']:.4f}, {v['max']:.4f}]  "
            + " ".join(f"{z:.4f}" for z in v["per_seed"])
        )
    return summary


def _sinc_settings(part: dict) -> dict:
    """The settings of a result file's sinc part that its seeds share with other files'."""
    sinc = {k: v for k, v in part["settings"]["sinc"].items() if k != "seeds"}
    return {"sinc": sinc, "sinc_models": part["settings"]["sinc_models"]}


def merge_sinc(paths: list[str]) -> dict:
    r"""The sinc seeds of the result files ``paths`` in one result (settings of the first, the
    summary over every seed). ``SystemExit`` with one line for a file that is missing, holds no
    sinc part or was made with other sinc settings, and for a seed held by two files (a part
    run twice): each would have been mixed in silently, or its seed replaced by the last."""
    parts, owner = [], {}
    for path in paths:
        try:
            part = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"decoupled_sinc_kin40k: error: cannot read {path!r} ({e}).") from e
        if not isinstance(part, dict) or "sinc" not in part or "settings" not in part:
            raise SystemExit(
                f"decoupled_sinc_kin40k: error: {path!r} holds no sinc results (a file of "
                "--only kin40k, or another file); give the files of the sinc runs."
            )
        if parts and _sinc_settings(part) != _sinc_settings(parts[0]):
            a, b = _sinc_settings(parts[0]), _sinc_settings(part)
            diff = [
                f"{k}: {a['sinc'].get(k)!r} vs {b['sinc'].get(k)!r}"
                for k in sorted(set(a["sinc"]) | set(b["sinc"]))
                if a["sinc"].get(k) != b["sinc"].get(k)
            ] or [f"sinc_models: {a['sinc_models']!r} vs {b['sinc_models']!r}"]
            raise SystemExit(
                f"decoupled_sinc_kin40k: error: {paths[0]!r} and {path!r} were made with other "
                f"sinc settings ({'; '.join(diff)}); merge runs of one setting."
            )
        for seed in part["sinc"]["per_seed"]:
            if seed in owner:
                raise SystemExit(
                    f"decoupled_sinc_kin40k: error: seed {seed} is in both {owner[seed]!r} and "
                    f"{path!r}; give each seed once."
                )
            owner[seed] = path
        parts.append(part)
    per_seed = {k: v for part in parts for k, v in part["sinc"]["per_seed"].items()}
    settings = json.loads(json.dumps(parts[0]["settings"]))
    settings["sinc"]["seeds"] = sorted(int(k) for k in per_seed)  # every file's
    return {
        "settings": settings,
        "env": parts[0]["env"],
        "merged_from": list(paths),
        "sinc": {"per_seed": per_seed, "summary": summarize_sinc(per_seed)},
    }


def sinc_checks(sinc: dict) -> dict:
    sm, seeds, checks = sinc["summary"], sinc["per_seed"].values(), {}
    dec = "decoupled Ma=100,Mb=10"
    # The ``paper`` stage (the literal schedule) is a diagnostic: it does not reach the optimum on
    # this toy (module docstring), so its RMSEs are reported in the tables but not checked.
    for stage in ("converged", "fixed_hyper"):
        d, c100, c10 = (
            sm[f"{k} / {stage}"]["mean"] for k in (dec, "coupled M=100", "coupled M=10")
        )
        checks[f"sinc ({stage}): mean decoupled RMSE < 0.7x coupled M=10"] = d < 0.7 * c10
        checks[f"sinc ({stage}): mean decoupled RMSE within 1.2x of coupled M=100"] = (
            d <= 1.2 * c100
        )
    checks["sinc: converged ELBO >= paper-schedule ELBO (every model and seed)"] = all(
        r[k]["converged"]["elbo_per_point"] >= r[k]["paper"]["elbo_per_point"] - 1e-9
        for r in seeds
        for k in SINC_MODELS
    )
    checks[
        "sinc: decoupled ELBO at learned hypers > at exact-GP hypers (every seed), i.e. "
        "the learned hyperparameters are the objective's optimum"
    ] = all(
        r[dec]["converged"]["elbo_per_point"] > r[dec]["fixed_hyper"]["elbo_per_point"]
        for r in seeds
    )
    return checks


# ---------------------------------------------------------------------- kin40k


def train_kin(X, Y, m_alpha, m_beta, cfg, evaluate, budget: float | None = None) -> dict:
    r"""Exact-subset hyperparameters + closed-form warm start, then Adam for ``cfg["iters"]``
    steps or, with ``budget``, until init + Adam have used ``budget`` seconds."""
    torch.manual_seed(cfg["seed"])
    t0 = time.perf_counter()
    model = DecoupledSVGP(
        X,
        Y,
        num_mean_bases=m_alpha,
        num_cov_bases=m_beta,
        seed=cfg["seed"],
        warm_start_points=cfg["warm"],
    )
    model.fit(
        max_iter=0, init_hyperparameters=cfg["init_subset"], restandardize=False, compress=False
    )
    init_s = time.perf_counter() - t0
    iters, timeout = cfg["iters"], None
    if budget is not None:
        iters, timeout = 10**9, max(budget - init_s, 0.0)
    t1 = time.perf_counter()
    model.fit(
        method="adam",
        max_iter=iters,
        lr=cfg["lr"],
        lr_variational=cfg["lr_variational"],
        batch_size=cfg["batch"],
        restandardize=False,
        compress=False,
        num_kl_columns=cfg["kl_columns"],
        timeout_sec=timeout,
    )
    adam_s = time.perf_counter() - t1
    nmse = evaluate(model)
    t2 = time.perf_counter()
    with torch.no_grad():  # closed-form (a, B) at the trained hyperparameters and bases
        model._warm_start(model.beta_points, model.alpha_points)
    model.invalidate_caches()
    refresh_s = time.perf_counter() - t2
    return {
        "nmse": nmse,
        "nmse_after_refresh": evaluate(model),
        "train_seconds": init_s + adam_s,
        "init_seconds": init_s,
        "adam_seconds": adam_s,
        "adam_steps": model.last_fit_steps,
        "refresh_seconds": refresh_s,
        "budget": budget,
        **hypers(model),
    }


def run_kin40k(cfg: dict, root: Path) -> dict:
    Xtr, ytr, Xte, yte = load_uci("kin40k", 0, root)
    lo, hi = Xtr.min(0), Xtr.max(0)
    unit = lambda z: np.clip((z - lo) / (hi - lo), 0.0, 1.0)  # noqa: E731
    Xtr_t, Xte_t = torch.tensor(unit(Xtr), dtype=DT), torch.tensor(unit(Xte), dtype=DT)
    Ytr = torch.tensor(ytr, dtype=DT).unsqueeze(-1)
    yte_t = torch.tensor(yte, dtype=DT)

    def nmse(mdl):
        return float((predict(mdl, Xte_t) - yte_t).pow(2).mean() / yte_t.var())

    mb, ma = cfg["m_beta"], cfg["m_alpha"]
    dec, cou = f"decoupled Ma={ma},Mb={mb}", f"coupled M={mb}"
    runs = []
    ref = train_kin(Xtr_t, Ytr, ma, mb, cfg, nmse)  # the decoupled model's default run
    budget = ref["train_seconds"]
    runs.append({"model": dec, "factor": 1.0, **ref})
    runs.append({"model": cou, "factor": 1.0, **train_kin(Xtr_t, Ytr, mb, mb, cfg, nmse, budget)})
    for factor in cfg["budget_factors"]:
        for name, (a, b) in ((dec, (ma, mb)), (cou, (mb, mb))):
            runs.append(
                {
                    "model": name,
                    "factor": factor,
                    **train_kin(Xtr_t, Ytr, a, b, cfg, nmse, factor * budget),
                }
            )
    runs.sort(key=lambda r: (r["factor"], r["model"]))
    print(
        f"\nkin40k split 0 (n_train {len(ytr)}, n_test {len(yte)}), budget = decoupled's "
        f"{cfg['iters']}-step training time {budget:.1f} s:"
    )
    print(
        f"  {'model':28s} {'budget':>7s} {'train s':>8s} {'steps':>6s} {'nMSE':>7s} "
        f"{'nMSE+refresh':>12s}"
    )
    for r in runs:
        print(
            f"  {r['model']:28s} {r['factor']:6.1f}x {r['train_seconds']:8.1f} "
            f"{r['adam_steps']:6d} {r['nmse']:7.4f} {r['nmse_after_refresh']:12.4f}"
        )
    return {"runs": runs, "budget_seconds": budget, "n_train": len(ytr), "n_test": len(yte)}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", choices=["sinc", "kin40k"], default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seeds", type=int, nargs="+", default=list(SINC["seeds"]))
    p.add_argument("--sinc-iters", type=int, default=SINC["iters"])
    p.add_argument("--kin-iters", type=int, default=KIN["iters"])
    p.add_argument("--m-alpha", type=int, default=KIN["m_alpha"])
    p.add_argument("--m-beta", type=int, default=KIN["m_beta"])
    p.add_argument("--batch", type=int, default=KIN["batch"])
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1 avoids thread contention on a loaded machine)",
    )
    p.add_argument(
        "--out", default=str(ROOT / "experiments" / "results" / "decoupled_sinc_kin40k.json")
    )
    p.add_argument(
        "--merge-sinc",
        nargs="+",
        default=None,
        metavar="JSON",
        help="combine the sinc seeds of earlier result files (e.g. runs split over "
        "processes) into one summary and checks in --out; runs nothing",
    )
    args = p.parse_args()
    if args.merge_sinc:
        merged = merge_sinc(args.merge_sinc)
        merged["checks"] = sinc_checks(merged["sinc"])
        for name, ok in merged["checks"].items():
            print(f"  [{'PASS' if ok else 'FAIL'}] {name}")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(merged, indent=2))
        print(f"\nwrote {args.out}")
        return
    torch.set_num_threads(args.threads)
    SINC["iters"], SINC["seeds"], KIN["iters"] = args.sinc_iters, tuple(args.seeds), args.kin_iters
    KIN["m_alpha"], KIN["m_beta"], KIN["batch"] = args.m_alpha, args.m_beta, args.batch
    results = {
        "settings": {"sinc": SINC, "sinc_models": SINC_MODELS, "kin40k": KIN},
        "env": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "dtype": "float64",
            "device": "cpu",
            "threads": torch.get_num_threads(),
        },
    }
    checks = {}
    if args.only in (None, "sinc"):
        results["sinc"] = run_sinc(SINC)
        checks.update(sinc_checks(results["sinc"]))
    if args.only in (None, "kin40k"):
        k = results["kin40k"] = run_kin40k(KIN, data_dir(args.data_dir))
        mb, ma = KIN["m_beta"], KIN["m_alpha"]
        for factor in sorted({r["factor"] for r in k["runs"] if r["factor"] >= 1.0}):
            at = {r["model"]: r for r in k["runs"] if r["factor"] == factor}
            d, c = at[f"decoupled Ma={ma},Mb={mb}"], at[f"coupled M={mb}"]
            checks[f"kin40k ({factor:g}x budget): decoupled nMSE < coupled nMSE"] = (
                d["nmse"] < c["nmse"]
            )
            checks[f"kin40k ({factor:g}x budget): coupled train time within 10% of budget"] = (
                c["train_seconds"] <= 1.1 * c["budget"] if c["budget"] else False
            )
    results["checks"] = checks
    print("\nchecks:")
    for name, ok in checks.items():
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
