r"""Long BO campaigns: the WISKI paper's BO figure (Fig. 5a and Appendix C.2), and a whole BO step
flat in n.

Set-up of Stanton, Maddox, Delbridge, Wilson, "Kernel Interpolation for Scalable Online Gaussian
Processes" (AISTATS 2021, arXiv:2103.01454), Sec. 5 and App. C.2: noisy 3-D BoTorch test functions
(noise sd: Levy 10, Ackley 4, StyblinskiTang 20, Rastrigin 10, Griewank 4, Michalewicz 5), 5 initial
points, qUCB with q = 3, ``optimize_acqf`` with 10 restarts, 512 raw samples, batch limit 5,
200 L-BFGS-B iterations, the model refit (warm-started) after every step. Methods: WISKI (default
3-D grid, m = 1,000), OnlineExactGP (``exact``), BoTorch ``SingleTaskGP`` refit from scratch
(``singletaskgp``) and t-SVGP (``tsvgp``, the sparse variational online baseline). The initial
design is the loops' scrambled Sobol design (the paper draws it uniformly at random).

Each (function, method, seed) is one run directory of the project's BO loop
(``<out>/<function>/<method>/seed<k>``): a record after every step, a checkpoint at most every
30 s, at the end and where the time budget stops the run, so a run stopped by its time budget or
killed continues with ``bo-online resume DIR`` or by running this script again (a killed run
redoes the steps after its last checkpoint). ``--shard i/k`` runs every k-th run starting at i
(split over processes); ``--merge`` (alone, or after the runs) reads every run directory at
``--steps`` steps (alone without ``--steps``: the longest run's; a run that went further is read
at that length) and writes the JSON, the plots and the targets' PASS/FAIL. Every run under
``--out`` must share the settings (a call with other settings refuses to continue a run, a merge
of runs made with different ones is refused): give each setting its own ``--out``. A method
whose time per step grows with n (exact, SingleTaskGP) stops when its run's cumulative step time
passes ``--budget-s``; the JSON and the printout say how far it got.

Outputs (``--out``, default ``experiments/results/bo_long_campaign``): ``bo_long_campaign.json``
and per function ``<function>.png`` with three panels: simple regret (best noiseless value minus
the known optimum, log scale; the best value itself where no optimum is known) vs step, the same vs
cumulative wall time, and time per step vs n stacked (fit, acquisition, update), means over seeds.

Defaults (300 steps, 4 seeds, the six functions, 4 methods, a 120 s budget per exact-GP and
SingleTaskGP run; WISKI and t-SVGP run every step) are 96 runs; single-threaded on a loaded
2-core machine that is several hours, so split
them (``--shard``, or ``--dask local:2`` / ``--dask tcp://host:port`` to run them as tasks on a
Dask cluster) or select (``--functions levy --seeds 2``). The paper's length:
``--steps 1500 --budget-s 0`` (no budget; hours per exact-GP run).

    OMP_NUM_THREADS=1 PYTHONPATH=. python experiments/bo_long_campaign.py --functions levy \
        --seeds 2 --steps 150
    PYTHONPATH=. python experiments/bo_long_campaign.py --merge
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch
from torch.quasirandom import SobolEngine

from bo_online.loops import BayesOptLoop, load_loop
from bo_online.loops.core import RunDirectoryError
from bo_online.loops.history import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    RECORDS_FILE,
    RunFileError,
    read_records,
    to_jsonable,
)
from bo_online.problems import from_unit, synthetic_problem

ROOT = Path(__file__).resolve().parents[1]
#: Observation-noise standard deviations of the paper's Table 2 (App. C.2).
NOISE = {
    "levy": 10.0,
    "ackley": 4.0,
    "styblinskitang": 20.0,
    "rastrigin": 10.0,
    "griewank": 4.0,
    "michalewicz": 5.0,
}
METHODS = ("wiski", "exact", "singletaskgp", "tsvgp")
#: BO steps after the initial design when ``--steps`` is not given
DEFAULT_STEPS = 300
LABELS = {
    "wiski": "WISKI",
    "exact": "OnlineExactGP",
    "singletaskgp": "SingleTaskGP (scratch)",
    "tsvgp": "t-SVGP",
    "sobol": "Sobol",
}


#: Methods whose time per step grows with n, so that a run may not reach the full length in the
#: time allowed: only these stop at ``--budget-s`` (WISKI and t-SVGP always run every step).
BUDGETED_METHODS = ("exact", "singletaskgp")


class _Budget(Exception):
    pass


def run_dir(out: Path, fn: str, method: str, seed: int) -> Path:
    return out / fn / method / f"seed{seed}"


def make_loop(
    args: argparse.Namespace, fn: str, method: str, seed: int, path: Path | None
) -> BayesOptLoop:
    problem = synthetic_problem(fn, dim=3, noise_std=NOISE[fn])
    model_options: dict = {}
    if method == "wiski":
        # the paper's WISKI is SKI from the first point: the loops' exact regime at small n
        # would make steps 20-70 an exact GP's and the flat-step check meaningless
        model_options["exact_max_n"] = args.wiski_exact_max_n
        if args.wiski_grid:
            model_options["grid_size"] = args.wiski_grid
    return BayesOptLoop(
        problem,
        acq="qucb",
        optimizer_options={
            "num_restarts": args.num_restarts,
            "raw_samples": args.raw_samples,
            "batch_limit": 5,
            "maxiter": args.maxiter,
        },
        n_init=5,
        model=method,
        model_options=model_options,
        q=3,
        seed=seed,
        refit_every=1,
        fit_max_iter=args.fit_max_iter,
        out_dir=path,
        quiet=True,
        device=args.device or "cpu",
    )


#: configuration keys that do not change a run's results (or may differ by machine)
RUNTIME_KEYS = {"checkpoint_every", "checkpoint_seconds", "device"}
#: the flags that set a run's configuration (all runs of one ``--out`` share them)
SETTING_FLAGS = (
    "--num-restarts / --raw-samples / --maxiter (optimizer_options), --fit-max-iter "
    "(fit_max_iter), --wiski-grid / --wiski-exact-max-n (WISKI's model_options)"
)


def _settings(loop: BayesOptLoop) -> dict[str, Any]:
    """The loop's configuration and problem as JSON reads them back (tuples as lists)."""
    config = {**loop.config, "problem": loop.problem.spec}
    return json.loads(json.dumps(to_jsonable(config)))


def changed_settings(run: BayesOptLoop, wanted: BayesOptLoop) -> list[str]:
    """``"key: run's -> wanted"`` for each setting in which ``run`` differs from ``wanted``
    (only keys both hold: a run saved by an earlier version lacks the settings added since)."""
    a, b = _settings(run), _settings(wanted)
    keys = sorted((set(a) & set(b)) - RUNTIME_KEYS)
    return [f"{k}: {a[k]!r} -> {b[k]!r}" for k in keys if a[k] != b[k]]


def run_one(args: argparse.Namespace, fn: str, method: str, seed: int) -> dict[str, Any]:
    """Run (or continue) one campaign until ``args.steps`` or the time budget; returns a status."""
    path = run_dir(Path(args.out), fn, method, seed)
    if (path / CHECKPOINT_FILE).exists():
        # --device moves a run (e.g. one copied from a GPU machine); without it, its own
        moved = {} if args.device is None else {"device": args.device}
        loop = load_loop(path, quiet=True, **moved)
        changed = changed_settings(loop, make_loop(args, fn, method, seed, None))
        if changed:  # it would go on with its own settings, under this call's in the JSON
            raise RunDirectoryError(
                f"The run in {str(path)!r} was made with other settings ({'; '.join(changed)}): "
                f"a run keeps the settings it started with. Give this call's {SETTING_FLAGS} as "
                "the run had them, or another --out for these."
            )
    else:
        loop = make_loop(args, fn, method, seed, path)

    budget = args.budget_s if method in BUDGETED_METHODS else 0.0

    def stop_on_budget(record: dict[str, Any]) -> None:
        if budget and loop.wall_time > budget and loop.step_count < args.steps:
            # the checkpoint is otherwise due only every 30 s: without this one the next call
            # resumed from an earlier step and spent the budget again on the same steps
            loop.save_checkpoint()
            raise _Budget

    stopped = False
    if budget and loop.wall_time > budget:
        stopped = loop.step_count < args.steps
    elif loop.step_count >= args.steps:
        pass  # ran this far already (a longer earlier run): nothing to do
    else:
        try:
            loop.run(args.steps, callback=stop_on_budget)
        except _Budget:
            stopped = True
    status = {
        "function": fn,
        "method": method,
        "seed": seed,
        "steps": loop.step_count,
        "wall_time": loop.wall_time,
        "stopped_by_budget": stopped,
    }
    print(
        f"{fn:>15} {LABELS[method]:>24} seed {seed}: {loop.step_count} steps, "
        f"{loop.wall_time:8.1f} s" + ("  (stopped by the time budget)" if stopped else ""),
        flush=True,
    )
    return status


def sobol_best(fn: str, seed: int, num: int) -> list[float]:
    """Best noisy-observation-free value of a scrambled Sobol sequence, after each point."""
    problem = synthetic_problem(fn, dim=3, noise_std=NOISE[fn])
    U = SobolEngine(3, scramble=True, seed=10_000 + seed).draw(num, dtype=torch.float64)
    y = problem.evaluate_true(from_unit(U, problem.bounds)).reshape(-1)
    return torch.cummin(y, 0).values.tolist()  # the test functions are minimised


# ---------------------------------------------------------------------------------- merge


def _mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def load_runs(
    out: Path, steps: int | None = None
) -> dict[str, dict[str, dict[int, list[dict[str, Any]]]]]:
    """Every run's records under ``out`` by function, method and seed, up to step ``steps``
    (a run that went further, in an earlier call with more steps, is read at ``steps``, as
    every other run of the merge)."""
    runs: dict[str, dict[str, dict[int, list[dict[str, Any]]]]] = {}
    for rec_file in sorted(out.glob(f"*/*/seed*/{RECORDS_FILE}")):
        seed_dir = rec_file.parent
        method, fn = seed_dir.parent.name, seed_dir.parent.parent.name
        records = read_records(rec_file)
        if steps is not None:
            records = [r for r in records if r["step"] <= steps]
        if records:
            runs.setdefault(fn, {}).setdefault(method, {})[int(seed_dir.name[4:])] = records
    return runs


#: configuration keys that differ between the runs of one campaign
PER_RUN_KEYS = RUNTIME_KEYS | {"seed", "model", "problem", "model_options"}


def run_settings(out: Path, runs: dict[str, Any]) -> dict[str, Any]:
    """The settings the runs share, as the script's flags; ``SystemExit`` naming two runs and
    a setting where they differ (shards run with other flags in one ``--out``: their merge
    would mix settings in one table, under the flags of one call)."""
    first: dict[str, tuple[str, dict[str, Any]]] = {}  # "" (shared) or method -> run, values
    for fn, methods in runs.items():
        for method, seeds in methods.items():
            for seed in seeds:
                path = run_dir(out, fn, method, seed)
                try:
                    config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue  # rewritten from the checkpoint when the run goes on
                name = f"{fn}/{method}/seed{seed}"
                shared = {k: v for k, v in config.items() if k not in PER_RUN_KEYS}
                own = {"model_options": config.get("model_options", {})}
                for group, values in (("", shared), (method, own)):
                    ref_name, ref = first.setdefault(group, (name, values))
                    diff = [k for k in sorted(set(ref) & set(values)) if ref[k] != values[k]]
                    if diff:
                        k = diff[0]
                        raise SystemExit(
                            f"bo_long_campaign: error: the runs under {str(out)!r} were made "
                            f"with other settings: {k} {ref[k]!r} in {ref_name}, {values[k]!r} "
                            f"in {name} ({SETTING_FLAGS}); merge runs of one setting (give each "
                            "setting its own --out)."
                        )
    shared = first.get("", ("", {}))[1]
    optimizer = shared.get("optimizer_options", {})
    wiski = first.get("wiski", ("", {}))[1].get("model_options", {})
    return {
        "num_restarts": optimizer.get("num_restarts"),
        "raw_samples": optimizer.get("raw_samples"),
        "maxiter": optimizer.get("maxiter"),
        "fit_max_iter": shared.get("fit_max_iter"),
        "wiski_grid": wiski.get("grid_size", 0) if "wiski" in first else None,
        "wiski_exact_max_n": wiski.get("exact_max_n") if "wiski" in first else None,
    }


def _step_time(r: dict[str, Any]) -> float:
    return float(
        r.get("time_fit", 0.0) + r.get("time_acquisition", 0.0) + r.get("time_update", 0.0)
    )


def summarise(runs, target_steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"functions": {}, "targets": {}}
    for fn, methods in runs.items():
        fsum: dict[str, Any] = {}
        for method, seeds in methods.items():
            per_seed = {}
            for seed, recs in seeds.items():
                steps = [r for r in recs if r["step"] > 0]
                per_seed[seed] = {
                    "steps": len(steps),
                    "finished": len(steps) >= target_steps,
                    "n": [r["n"] for r in recs],
                    "best": [r["best_true_value"] for r in recs],
                    "regret": [r.get("regret") for r in recs],
                    "wall_time": [r["wall_time"] for r in recs],
                    "time_fit": [r.get("time_fit", 0.0) for r in recs],
                    "time_acquisition": [r.get("time_acquisition", 0.0) for r in recs],
                    "time_update": [r.get("time_update", 0.0) for r in recs],
                    "step_time": [_step_time(r) for r in recs],
                }
            fsum[method] = per_seed
        num = max(len(s["n"]) for m in fsum.values() for s in m.values())
        n_points = 5 + 3 * (num - 1)
        fsum["sobol"] = {}
        optimum = synthetic_problem(fn, dim=3).optimal_value
        for seed in sorted({s for m in methods.values() for s in m}):
            curve = sobol_best(fn, seed, n_points)
            fsum["sobol"][seed] = {
                "best_final": curve[-1],
                "n": n_points,
                "best": curve,
                "regret": [b - optimum for b in curve] if optimum is not None else None,
            }
        out["functions"][fn] = fsum
    out["targets"] = targets(out["functions"], target_steps)
    return out


def _window_mean(values: list[float], lo: int, hi: int) -> float:
    w = values[lo:hi]
    return sum(w) / len(w) if w else float("nan")


def targets(functions: dict[str, Any], target_steps: int) -> dict[str, Any]:
    """Requirement 2 of the campaign (WISKI flat in n, as good as the exact GP and better than
    Sobol, much faster at n = 3000, sooner to the exact GP's final value)."""
    res: dict[str, Any] = {}
    for fn, f in functions.items():
        t: dict[str, Any] = {}
        wiski, exact, stgp = f.get("wiski", {}), f.get("exact", {}), f.get("singletaskgp", {})
        # 1. flat: mean step time over the last 50 steps vs over steps 20-70, mean over seeds.
        flat = [
            (_window_mean(s["step_time"], -50, None), _window_mean(s["step_time"], 20, 71))
            for s in wiski.values()
            if s["steps"] >= 120
        ]
        if flat:
            ratio = sum(a for a, _ in flat) / sum(b for _, b in flat)
            t["wiski_flat_ratio"] = {"value": ratio, "pass": ratio <= 1.5}
        # 2. final best within 2 SE of the exact GP's (where it finished) and better than Sobol.
        if wiski:
            w_mean, w_se = _mean_se([s["best"][-1] for s in wiski.values()])
            # Sobol at the same number of evaluations as each WISKI run.
            sob_mean, _ = _mean_se(
                [f["sobol"][k]["best"][s["n"][-1] - 1] for k, s in wiski.items()]
            )
            t["wiski_better_than_sobol"] = {
                "wiski": w_mean,
                "sobol": sob_mean,
                "pass": w_mean < sob_mean,
            }
            if exact and all(s["finished"] for s in exact.values()):
                e_mean, e_se = _mean_se([s["best"][-1] for s in exact.values()])
                se = math.sqrt(w_se**2 + e_se**2) if not math.isnan(w_se + e_se) else float("nan")
                t["wiski_vs_exact_final"] = {
                    "wiski": w_mean,
                    "exact": e_mean,
                    "se": se,
                    "pass": None if math.isnan(se) else abs(w_mean - e_mean) <= 2 * se,
                }
            else:
                t["wiski_vs_exact_final"] = {"pass": None, "note": "the exact GP did not finish"}

        # 3. step time at n = 3000 (the step whose model holds about 3000 points).
        def at_n(seeds: dict[str, Any], n: int = 3000) -> float | None:
            vals = []
            for s in seeds.values():
                idx = [i for i, k in enumerate(s["n"]) if abs(k - n) <= 30]
                if idx:
                    vals.append(sum(s["step_time"][i] for i in idx) / len(idx))
            return sum(vals) / len(vals) if vals else None

        tw, te, ts = at_n(wiski), at_n(exact), at_n(stgp)
        t["n3000"] = {
            "wiski": tw,
            "exact": te,
            "singletaskgp": ts,
            "exact_over_wiski": None if not (tw and te) else te / tw,
            "singletaskgp_over_wiski": None if not (tw and ts) else ts / tw,
        }
        t["n3000"]["pass"] = None if not (tw and te and ts) else te / tw >= 20 and ts / tw >= 100
        # 4. cumulative wall time to reach the exact GP's final best value (mean over seeds).
        common = sorted(set(wiski) & set(exact))
        if common:
            # Per seed: the exact GP's final best value, and when each method first reached it.
            def first_hit(s, goal):
                hit = [w for b, w in zip(s["best"], s["wall_time"]) if b <= goal]
                return hit[0] if hit else float("inf")

            goals = [exact[k]["best"][-1] for k in common]
            tw_ = sum(first_hit(wiski[k], g) for k, g in zip(common, goals)) / len(common)
            te_ = sum(first_hit(exact[k], g) for k, g in zip(common, goals)) / len(common)
            t["time_to_exact_final"] = {"wiski": tw_, "exact": te_, "pass": tw_ < te_}
        res[fn] = t
    return res


def plot(functions: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for fn, f in functions.items():
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        methods = [m for m in METHODS if m in f]
        # Simple regret (best noiseless value - the known optimum) on a log scale where every
        # record has one: near the optimum the best values differ by orders of magnitude.
        use_regret = all(
            s.get("regret") and None not in s["regret"] for m in methods for s in f[m].values()
        ) and all(s.get("regret") for s in f["sobol"].values())
        key = "regret" if use_regret else "best"
        for m in methods:
            seeds = list(f[m].values())
            L = min(len(s[key]) for s in seeds)
            vals = torch.tensor([s[key][:L] for s in seeds])
            wall = torch.tensor([s["wall_time"][:L] for s in seeds]).mean(0)
            mean = vals.mean(0)
            steps = torch.arange(L)
            label = f"{LABELS[m]} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"
            (line,) = axes[0].plot(steps, mean, label=label)
            # the spread over seeds: min to max (a mean +- 2 sd band crosses zero on a log scale)
            axes[0].fill_between(
                steps, vals.min(0).values, vals.max(0).values, color=line.get_color(), alpha=0.15
            )
            axes[1].plot(wall, mean, label=label)
        sob = [s["regret"][-1] if use_regret else s["best_final"] for s in f["sobol"].values()]
        axes[0].axhline(
            sum(sob) / len(sob), color="k", ls=":", label=f"Sobol (final, {len(sob)} seeds)"
        )
        # lower is better on both: the functions are minimised
        what = "simple regret" if use_regret else "best noiseless value"
        ylabel = f"{what} (mean over seeds; band: min-max)"
        yscale = "log" if use_regret else "linear"
        axes[0].set(xlabel="step", ylabel=ylabel, yscale=yscale, title=f"{fn} (3-D)")
        axes[1].set(
            xlabel="cumulative wall time (s, mean over seeds)",
            xscale="log",
            ylabel=f"{what} (mean over seeds)",
            yscale=yscale,
        )
        axes[0].legend(fontsize=7)
        # time per step vs n, stacked fit / acquisition / update, for WISKI and the exact GP.
        styles = {"time_fit": "fit", "time_acquisition": "acquisition", "time_update": "update"}
        for m, alpha in (("wiski", 0.8), ("exact", 0.35)):
            if m not in f:
                continue
            seeds = list(f[m].values())
            L = min(len(s["n"]) for s in seeds)
            n = seeds[0]["n"][1:L]
            parts = [torch.tensor([s[k][1:L] for s in seeds]).mean(0) for k in styles]
            axes[2].stackplot(
                n, *parts, alpha=alpha, labels=[f"{LABELS[m]} {v}" for v in styles.values()]
            )
        axes[2].set(xlabel="n", ylabel="time per step (s)", yscale="linear")
        axes[2].legend(fontsize=7)
        fig.tight_layout()
        path = out / f"{fn}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def merge(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    steps = args.steps
    if steps is None:  # --merge alone: at the length of the longest run
        runs = load_runs(out)
        steps = max(
            (r[-1]["step"] for m in runs.values() for s in m.values() for r in s.values()),
            default=0,
        )
        print(f"merging at {steps} steps (the longest run; --steps N to choose)")
    runs = load_runs(out, steps)
    if not runs:
        raise SystemExit(f"bo_long_campaign: error: no runs under {out}; run the campaign first.")
    settings = run_settings(out, runs)
    summary = summarise(runs, steps)
    # what the runs were made with (not this call's flags, which --merge alone leaves at their
    # defaults)
    summary["config"] = {
        "steps": steps,
        "functions": list(runs),
        "methods": [m for m in METHODS if any(m in f for f in runs.values())],
        "seeds": sorted({s for f in runs.values() for m in f.values() for s in m}),
        **settings,
        "out": str(out),
    }
    summary["noise_std"] = NOISE
    path = out / "bo_long_campaign.json"
    path.write_text(json.dumps(summary, indent=1, default=float))
    if not args.no_plots:
        plot(summary["functions"], out)
    print(
        f"\n{'function':>15} {'method':>24} {'seeds':>5} {'steps (min-max)':>15} "
        f"{'final best mean +- se':>24} {'wall s':>8}"
    )
    for fn, f in summary["functions"].items():
        for m in METHODS:
            if m not in f:
                continue
            seeds = list(f[m].values())
            mean, se = _mean_se([s["best"][-1] for s in seeds])
            st = [s["steps"] for s in seeds]
            wall = sum(s["wall_time"][-1] for s in seeds) / len(seeds)
            print(
                f"{fn:>15} {LABELS[m]:>24} {len(seeds):>5} {min(st):>7}-{max(st):<7} "
                f"{mean:>14.4g} +- {se:<7.3g} {wall:8.1f}"
            )
        sob = [s["best_final"] for s in f["sobol"].values()]
        print(f"{fn:>15} {'Sobol':>24} {len(sob):>5} {'':>15} {sum(sob) / len(sob):>14.4g}")
    short = [
        f"{fn} {LABELS[m]} seed {k} ({s['steps']})"
        for fn, f in summary["functions"].items()
        for m in METHODS
        for k, s in f.get(m, {}).items()
        if not s["finished"]
    ]
    if short:
        print(
            f"short of {steps} steps (stopped by the time budget, or not run to the end yet): "
            + "; ".join(short)
        )
    print("\nTargets (requirement 2):")
    for fn, t in summary["targets"].items():
        for name, v in t.items():
            verdict = {True: "PASS", False: "FAIL", None: "n/a"}[v.get("pass")]
            detail = ", ".join(
                f"{k} {x:.4g}" if isinstance(x, float) else f"{k} {x}"
                for k, x in v.items()
                if k != "pass"
            )
            print(f"  {fn:>15} {name:>24}: {verdict}  ({detail})")
    print(f"\nresults: {path}")
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--functions", nargs="+", default=list(NOISE), choices=list(NOISE))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seeds", type=int, default=4, help="seeds 0 .. N-1")
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"BO steps after the 5 initial points (default {DEFAULT_STEPS}; with --merge alone, "
        "the longest run's: runs that went further are read at --steps)",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=120.0,
        help="per-run cap on cumulative step time in seconds of the methods whose step time "
        "grows with n (exact, singletaskgp; 0: none)",
    )
    ap.add_argument("--num-restarts", type=int, default=10)
    ap.add_argument("--raw-samples", type=int, default=512)
    ap.add_argument("--maxiter", type=int, default=200)
    ap.add_argument(
        "--fit-max-iter",
        type=int,
        default=50,
        help="iterations of each warm-started refit (every step)",
    )
    ap.add_argument(
        "--wiski-grid",
        type=int,
        default=0,
        help="WISKI grid size per dimension (0: the default, m = 1000 in 3-D)",
    )
    ap.add_argument(
        "--wiski-exact-max-n",
        type=int,
        default=0,
        help="WISKI is the exact GP of its kernel up to this many points (0: SKI from the "
        "first point, the paper's model; the loops' default is 256)",
    )
    ap.add_argument(
        "--device",
        default=None,
        help="torch device of new runs (default cpu); given when runs are continued, they "
        "continue there instead of on their own (e.g. runs copied from a GPU machine)",
    )
    ap.add_argument("--shard", default="0/1", help="i/k: run every k-th run starting at i")
    ap.add_argument("--merge", action="store_true", help="only merge existing runs")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument(
        "--dask",
        default=None,
        metavar="ADDRESS",
        help="run each (function, method, seed) as a task on a Dask cluster: local:N "
        "(a LocalCluster of N single-threaded workers) or tcp://host:port",
    )
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bo_long_campaign"))
    args = ap.parse_args(argv)
    # absolute: with --dask each task is given it, which a worker started in another folder
    # (dask worker on a shared file system) would read against its own
    args.out = str(Path(args.out).absolute())
    if args.steps is None and not args.merge:
        args.steps = DEFAULT_STEPS
    for name in ("seeds", "steps", "num_restarts", "raw_samples", "maxiter"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        i, k = (int(x) for x in args.shard.split("/"))
        assert 0 <= i < k
    except (ValueError, AssertionError):
        ap.error(f"--shard must be i/k with 0 <= i < k, got {args.shard!r}")
    if not args.merge:
        jobs = [
            (fn, m, s) for fn in args.functions for s in range(args.seeds) for m in args.methods
        ]
        try:
            if args.dask:
                from bo_online.sweep import dask_client, map_on_cluster

                with dask_client(args.dask) as client:
                    if (
                        __name__ != "__main__"
                    ):  # imported (tests): make this module importable there
                        client.upload_file(__file__)
                    map_on_cluster(
                        client,
                        run_one,
                        [(args, *job) for job in jobs[i::k]],
                        on_result=lambda job, _: print(f"done {job[1:]}", flush=True),
                    )
            else:
                for fn, m, s in jobs[i::k]:
                    run_one(args, fn, m, s)
        except (RunDirectoryError, RunFileError) as e:  # a damaged run file, too
            print(f"bo_long_campaign: error: {e}", file=sys.stderr)
            raise SystemExit(2)
        if k > 1:
            print("shard done; merge with --merge once every shard has finished.")
            return
    try:
        merge(args)
    except RunFileError as e:  # a damaged records file
        print(f"bo_long_campaign: error: {e}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
