r"""The WISKI paper's streaming experiments (Stanton, Maddox, Delbridge, Wilson, "Kernel
Interpolation for Scalable Online Gaussian Processes", AISTATS 2021, arXiv:2103.01454), Figs. 3
and 4, with bo_online's surrogates.

Fig. 3 setting (Sec. 5.1 of the paper): UCI regression (skillcraft, elevators, protein, kin40k),
one of the fixed 90/10 splits per trial (trial t uses split t and seed t), features scaled to a
box (the loops map the data's box to the unit cube; the paper uses [-1, 1]^d, an affine map of
it), targets standardised with the training rows' mean and standard deviation (so RMSE/NLL are in
standardised units as in the paper). Models, each with m = 256 inducing points:

* ``wiski`` -- a learned linear projection to 2-D, batch-norm and tanh
  (:class:`bo_online.models.wiski.projection.TanhProjection`) feeding the RBF-ARD kernel on a
  16 x 16 grid (256 points);
* ``exact`` -- the exact online GP (same kernel on the raw inputs), only where the training split
  has at most ``--exact-max`` rows (the paper also drops it on the large sets);
* ``tsvgp`` -- t-SVGP (256 inducing points), the sparse variational online baseline standing in
  for the paper's O-SVGP;
* ``decoupled`` -- decoupled SVGP with 256 mean and 256 covariance bases.

Schedule: pretraining on 5% of the training rows (``--pretrain-iters`` optimiser iterations),
then every new point is folded in with ``update`` followed by one optimisation step from the
current values (``refit_every = 1``, ``fit_max_iter = 1``, ``refit_from = "current"``: no
rebuild from the defaults, and WISKI's projection is fitted jointly with its kernel from the
current map, as in the paper). Test NLL and RMSE are recorded every ``--eval-every``
points and at the stream's end. The hindsight model of each method is the same model built on
all training rows of the stream but the last (a stream loop streams at least one) and fitted
(``--hindsight-iters``); it is drawn as a dotted line.

Fig. 4: banana (2-D, 400 training / 4,900 test rows), binary classification: the WISKI Dirichlet
classifier and t-SVGP with a Bernoulli likelihood, online (same schedule) and in hindsight; test
accuracy and NLL (log loss). The paper's second set, SVM Guide 1, is not available offline, so it
is not run.

The claim checked (Sec. 5.1): "the exact GP and WISKI overfit less to the initial examples than
the sparse variational online methods". Measured per set as the *early excess NLL*: the online
model's test NLL minus its own hindsight NLL, averaged over the first quarter of the evaluations;
the statement printed says, per pair (exact or WISKI vs t-SVGP or decoupled), whether the excess
is smaller (agrees with the claim) or not.

Every (set, model, trial) and hindsight fit is one job with its own result file under ``--out``
(existing results are reused: the experiment is resumable; a job that failed, or whose result
was made with another ``--eval-every`` / ``--pretrain-iters`` (online) or ``--hindsight-iters``
(hindsight), runs again, and ``--merge`` lists the failed jobs and leaves out, and lists, the
results made with other settings than its own). ``--part i --parts k`` runs only the
jobs with index = i mod k (to split over processes); ``--merge`` reads every result file of the
size given (``--max-stream``, ``--max-test``, ``--m``: runs at another size in the same ``--out``
are left out), lists the jobs with no result file (of the sets and models it found: a part
not run yet), writes ``summary.json``, the plots ``fig3_<set>.png`` / ``fig4_banana.png`` (means
with 2-SE bands over trials, hindsight dotted) and prints the comparison with the paper's claim.

    PYTHONPATH=. python experiments/stream_uci.py --part 0 --parts 2 &   # 3 trials
    PYTHONPATH=. python experiments/stream_uci.py --part 1 --parts 2
    PYTHONPATH=. python experiments/stream_uci.py --merge
    PYTHONPATH=. python experiments/stream_uci.py --full                 # 10 trials
    PYTHONPATH=. python experiments/stream_uci.py --max-stream 600 --max-test 500 --trials 1 # small

Data: ``$BO_ONLINE_DATA_DIR`` or ``--data-dir`` (``uci/<set>/`` and ``banana/``).

Measured (``--sets banana --trials 3``, full size, figure docs/figures/stream_fig4_banana.png):
WISKI final test NLL 0.243 / accuracy 0.902 (hindsight 0.239 / 0.903), t-SVGP 0.260 / 0.901
(hindsight 0.257 / 0.902); early excess NLL over its own hindsight 0.208 +- 0.028 (WISKI) vs
0.226 +- 0.025 (t-SVGP): agrees with the paper's claim that WISKI overfits less to the initial
examples, but within one standard error.

Fig. 3 (docs/results.md): skillcraft's whole split, one trial, WISKI, t-SVGP and the decoupled
SVGP all end at their hindsight models (test NLL 0.959 / 0.957, 0.925 / 0.924, 0.924 / 0.924);
WISKI's early excess NLL is 0.092 against 0.043 and 0.042, so on this set the claim does not
hold; WISKI ran 5.2x and 3.8x faster. The exact GP at this size (hours per job with one
optimisation step per point), the other sets and more trials were not run. Elevators, first
1,500 rows (``--max-stream 1500 --max-test 1000``, three trials): WISKI's early excess 0.155
+- 0.040 against t-SVGP's 0.213 +- 0.034, the decoupled SVGP's 0.209 +- 0.035 and the exact
GP's 0.214 +- 0.034 (the claim's direction for WISKI, within about one SE; the exact GP level
with the sparse models). Protein, first 1,500 rows, three trials: WISKI 0.081 +- 0.005 against
t-SVGP's 0.137 +- 0.014 and the decoupled SVGP's 0.110 +- 0.015 (the claim's direction on
every trial); the exact GP 0.169 +- 0.021 over three trials, the largest of the four on every
trial (against the claim). Kin40k, first 1,500 rows: WISKI
0.362 +- 0.060 against t-SVGP's 0.634 +- 0.032 and the decoupled SVGP's 0.379 +- 0.040 (three
trials each), while WISKI's 2-D map predicts worst throughout (final NLL 1.05 against 0.43);
the exact GP (trial 0) predicts best and has the largest early excess, 1.055, from the lowest
hindsight floor.
Skillcraft, first 1,500 rows, three trials: WISKI 0.317 +- 0.080 against t-SVGP's 0.112 +- 0.010
and the decoupled SVGP's 0.111 +- 0.010 (higher on every trial: the claim does not hold there).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bo_online.loops import StreamingLoop, history
from bo_online.problems import StreamProblem, banana_problem, uci_problem

REGRESSION_SETS = ("skillcraft", "elevators", "protein", "kin40k")
REGRESSION_MODELS = ("wiski", "exact", "tsvgp", "decoupled")
CLASSIFIERS = ("wiski", "tsvgp")
M = 256  # inducing points / grid points / bases for every method


def model_options(model: str, dim: int, m: int = M) -> dict[str, Any]:
    """Constructor options giving every method m (default 256) inducing points / bases; WISKI's
    2-D grid has round(sqrt(m)) points per side (at least 6) (16 x 16 for m = 256)."""
    if model == "wiski":
        options: dict[str, Any] = {"grid_size": max(6, round(math.sqrt(m)))}
        if dim > 2:  # the paper's learned projection to 2-D with batch-norm and tanh
            options["projection"] = {
                "__class__": "bo_online.models.wiski.projection.TanhProjection",
                "args": [dim],
                "kwargs": {"out_dim": 2, "seed": 0},
            }
        return options
    if model == "tsvgp":
        return {"inducing_points": m}
    if model == "decoupled":
        return {"num_mean_bases": m, "num_cov_bases": m}
    return {}


def standardised(prob: StreamProblem) -> StreamProblem:
    """Targets standardised with the training rows' mean and standard deviation."""
    mu, sd = prob.y_stream.mean(), prob.y_stream.std().clamp_min(1e-12)
    return StreamProblem(
        name=prob.name,
        X_stream=prob.X_stream,
        y_stream=(prob.y_stream - mu) / sd,
        X_test=prob.X_test,
        y_test=(prob.y_test - mu) / sd,
        bounds=prob.bounds,
    )


def problem(name: str, trial: int, args: argparse.Namespace) -> StreamProblem:
    if name == "banana":
        return banana_problem(
            seed=trial, max_stream=args.max_stream, max_test=args.max_test, data_dir=args.data_dir
        )
    prob = uci_problem(
        name,
        split=trial % 10,
        seed=trial,
        max_stream=args.max_stream,
        max_test=args.max_test,
        data_dir=args.data_dir,
    )
    return standardised(prob)


def jobs(args: argparse.Namespace) -> list[tuple[str, str, int, str]]:
    """(set, model, trial, kind) for kind in online / hindsight."""
    out = []
    for trial in range(args.trials):
        for name in args.sets:
            models = CLASSIFIERS if name == "banana" else REGRESSION_MODELS
            for model in models:
                if model not in args.models:
                    continue
                for kind in ("online", "hindsight"):
                    out.append((name, model, trial, kind))
    return out


def run_job(name: str, model: str, trial: int, kind: str, args: argparse.Namespace) -> dict:
    prob = problem(name, trial, args)
    n = prob.X_stream.shape[0]
    if model == "exact" and n > args.exact_max:
        return {"skipped": f"exact GP not run: {n} training rows > --exact-max {args.exact_max}"}
    classify = prob.task == "classification"
    common = dict(model=model, model_options=model_options(model, prob.dim, args.m), seed=trial)
    t0 = time.perf_counter()
    if kind == "hindsight":
        loop = StreamingLoop(
            prob, n_init=n - 1, eval_every=1, init_fit_max_iter=args.hindsight_iters, **common
        )
        loop.run(0)
    else:
        n0 = max(2, math.ceil(0.05 * n))
        loop = StreamingLoop(
            prob,
            n_init=n0,
            eval_every=args.eval_every,
            refit_every=1,
            fit_max_iter=1,
            refit_from="current",  # one warm step from the current values (and map)
            init_fit_max_iter=args.pretrain_iters,
            **common,
        )
        loop.run()
    keys = ("test_accuracy", "test_nll") if classify else ("test_rmse", "test_nll")
    curve = [(r["n"], r[keys[0]], r[keys[1]]) for r in loop.records if r.get(keys[1]) is not None]
    return {
        "set": name,
        "model": model,
        "trial": trial,
        "kind": kind,
        "task": prob.task,
        "n_train": n,
        "n_test": int(prob.X_test.shape[0]),
        "seconds": time.perf_counter() - t0,
        "metric": keys[0],
        "curve": curve,
    }


def _size(args: argparse.Namespace) -> str:
    return f"s{args.max_stream}-t{args.max_test}-m{args.m}"


def _path(out: Path, job: tuple[str, str, int, str], args: argparse.Namespace) -> Path:
    name, model, trial, kind = job
    return out / f"{name}-{model}-{kind}-trial{trial}-{_size(args)}.json"


def _settings(kind: str, args: argparse.Namespace) -> dict[str, int]:
    """The options that shape a job's result beyond its file name's sizes: a result made with
    others is run again (and left out of a merge) rather than mixed with this call's."""
    if kind == "hindsight":
        return {"hindsight_iters": args.hindsight_iters}
    return {"eval_every": args.eval_every, "pretrain_iters": args.pretrain_iters}


def _made_otherwise(result: dict, kind: str, args: argparse.Namespace) -> str | None:
    """How ``result`` (of a job of ``kind``) was made, where that differs from this call's
    settings (None if it does not, or if the result predates recorded settings)."""
    made = result.get("settings")
    if made is None or made == _settings(kind, args):
        return None
    return ", ".join(f"{k.replace('_', '-')} {v}" for k, v in made.items())


def _mean_se(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = np.nanmean(values, axis=0)
    k = np.sum(~np.isnan(values), axis=0)
    se = (
        np.nanstd(values, axis=0, ddof=1) / np.sqrt(k)
        if values.shape[0] > 1
        else np.zeros_like(mean)
    )
    return mean, np.nan_to_num(se)


def _missing_jobs(paths: list[Path], args: argparse.Namespace) -> list[tuple[str, str, int, str]]:
    """(set, model, trial, kind) of the jobs with no result file among ``paths`` (this size's),
    for every (set, model) with one (its online run and hindsight fit, trials ``0 .. --trials -
    1`` and any found): a part of a split run (``--parts``) that has not run, which the merge
    would leave out unsaid. Read from the names (a skipped job's file holds no job fields)."""
    found = set()
    for path in paths:
        name, model, kind, trial = path.name.removesuffix(f"-{_size(args)}.json").split("-")
        found.add((name, model, int(trial.removeprefix("trial")), kind))
    pairs = sorted({(n, m) for n, m, _, _ in found})
    trials = set(range(getattr(args, "trials", 0))) | {t for _, _, t, _ in found}
    return [
        (n, m, t, k)
        for n, m in pairs
        for t in sorted(trials)
        for k in ("online", "hindsight")
        if (n, m, t, k) not in found
    ]


def merge(args: argparse.Namespace) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # only the results of this size (a run at another --max-stream, --max-test or --m in the
    # same folder is another experiment: its trials must not be averaged with these)
    paths = sorted(args.out.glob(f"*-{_size(args)}.json"))
    results = [json.loads(p.read_text()) for p in paths]
    missing = _missing_jobs(paths, args)
    if missing:
        print(
            "missing, no result file: "
            + "; ".join(f"{n} {m} {k} trial {t}" for n, m, t, k in missing)
            + " (a part not run yet, or not this far: run it, then merge again)"
        )
    failed = [r for r in results if "error" in r]
    results = [r for r in results if "curve" in r]
    other = [(r, _made_otherwise(r, r["kind"], args)) for r in results]
    if any(how for _, how in other):
        left = [
            f"{r['set']} {r['model']} {r['kind']} trial {r['trial']} ({how})"
            for r, how in other
            if how
        ]
        print(
            "left out, made with other settings than this merge's: "
            + "; ".join(left)
            + " (merge with the flags they were run with, or run them again with these)"
        )
    results = [r for r, how in other if how is None]
    summary: dict[str, Any] = {"sets": {}, "claim": {}, "failed": failed}
    summary["missing"] = [dict(zip(("set", "model", "trial", "kind"), job)) for job in missing]
    for name in sorted({r["set"] for r in results}):
        rows = [r for r in results if r["set"] == name]
        metric = rows[0]["metric"]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        per_model: dict[str, Any] = {}
        for i, model in enumerate(sorted({r["model"] for r in rows})):
            online = sorted(
                (r for r in rows if r["model"] == model and r["kind"] == "online"),
                key=lambda r: r["trial"],
            )
            if not online:
                continue
            # The hindsight models of the same trials as the online runs (a trial whose online
            # run has not finished must not move the hindsight line or the excess).
            hind_of = {
                r["trial"]: r for r in rows if r["model"] == model and r["kind"] == "hindsight"
            }
            hind = [hind_of[r["trial"]] for r in online if r["trial"] in hind_of]
            length = min(len(r["curve"]) for r in online)
            ns = np.array([c[0] for c in online[0]["curve"][:length]])
            colour = f"C{i}"
            entry: dict[str, Any] = {"trials": len(online)}
            regression = rows[0]["task"] != "classification"
            units = " (standardised targets)" if regression else ""
            labels = (f"test NLL{units}", f"test RMSE{units}" if regression else "test accuracy")
            for ax, col, label in ((axes[0], 2, labels[0]), (axes[1], 1, labels[1])):
                vals = np.array([[c[col] for c in r["curve"][:length]] for r in online], float)
                mean, se = _mean_se(vals)
                trials = f"{len(online)} trial{'s' if len(online) > 1 else ''}"
                ax.plot(ns, mean, color=colour, label=f"{model} (online, {trials})")
                ax.fill_between(ns, mean - 2 * se, mean + 2 * se, color=colour, alpha=0.2)
                if hind:
                    h = float(np.mean([r["curve"][-1][col] for r in hind]))
                    trials = f"{len(hind)} trial{'s' if len(hind) > 1 else ''}"
                    hlabel = f"{model} (hindsight, {trials})"
                    ax.axhline(h, color=colour, linestyle=":", label=hlabel)
                    entry[f"hindsight_{'nll' if col == 2 else metric[5:]}"] = h
                ax.set_xlabel("points seen")
                ax.set_ylabel(label)
                entry[f"final_{'nll' if col == 2 else metric[5:]}"] = float(mean[-1])
                if col == 2:
                    early = vals[:, : max(1, length // 4)].mean(axis=1)
                    own = {r["trial"]: r["curve"][-1][2] for r in hind}
                    with_own = [k for k, r in enumerate(online) if r["trial"] in own]
                    if with_own:
                        # each trial against its own hindsight model (trials without one: left
                        # out, not set against the other trials' hindsight models)
                        hs = np.array([own[online[k]["trial"]] for k in with_own])
                        excess = early[with_own] - hs
                        entry["early_excess_trials"] = len(with_own)
                        entry["early_excess_nll"] = float(excess.mean())
                        entry["early_excess_nll_se"] = float(
                            excess.std(ddof=1) / math.sqrt(len(excess)) if len(excess) > 1 else 0.0
                        )
            per_model[model] = entry
        axes[0].legend(fontsize=7)
        title = "Fig. 4" if rows[0]["task"] == "classification" else "Fig. 3"
        fig.suptitle(f"{title} setting: {name} (mean, 2-SE bands over trials; dotted: hindsight)")
        fig.tight_layout()
        fname = args.out / f"{'fig4' if title == 'Fig. 4' else 'fig3'}_{name}.png"
        fig.savefig(fname, dpi=110)
        plt.close(fig)
        summary["sets"][name] = {"models": per_model, "plot": str(fname)}
        summary["claim"][name] = claim_statements(name, per_model)
    history.write_json(args.out / "summary.json", summary)
    for name, lines in summary["claim"].items():
        print(f"\n{name}:")
        for model, entry in summary["sets"][name]["models"].items():
            print(
                f"  {model:<10} "
                + ", ".join(
                    f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in entry.items()
                )
            )
        for line in lines:
            print(f"  - {line}")
    for r in failed:
        print(f"failed: {r['set']} {r['model']} {r['kind']} trial {r['trial']}: {r['error']}")
    print("\nSVM Guide 1 (the paper's second Fig. 4 set) is not available offline and was not run.")
    print(f"summary: {args.out / 'summary.json'}")
    return summary


def claim_statements(name: str, models: dict[str, Any]) -> list[str]:
    """How each curve compares with the paper's claim (early excess NLL over its hindsight)."""
    good = [m for m in ("exact", "wiski") if "early_excess_nll" in models.get(m, {})]
    sparse = [m for m in ("tsvgp", "decoupled") if "early_excess_nll" in models.get(m, {})]
    lines = []
    for a in good:
        for b in sparse:
            ea, eb = models[a]["early_excess_nll"], models[b]["early_excess_nll"]
            verdict = "agrees with" if ea < eb else "does not agree with"
            lines.append(
                f"{a} early excess NLL {ea:.3f} vs {b} {eb:.3f}: {verdict} the claim that "
                f"{a} overfits less to the initial examples"
            )
    if not lines:
        lines.append("not enough models to compare with the claim")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default=",".join(REGRESSION_SETS + ("banana",)))
    p.add_argument("--models", default=",".join(REGRESSION_MODELS))
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--full", action="store_true", help="10 trials")
    p.add_argument(
        "--max-stream", type=int, default=None, help="use the first this many training rows"
    )
    p.add_argument("--max-test", type=int, default=None, help="use the first this many test rows")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--m", type=int, default=M, help="inducing points for every method (small runs)")
    p.add_argument("--pretrain-iters", type=int, default=100)
    p.add_argument("--hindsight-iters", type=int, default=200)
    p.add_argument("--exact-max", type=int, default=4000)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("experiments/results/stream_uci"))
    p.add_argument("--part", type=int, default=0)
    p.add_argument("--parts", type=int, default=1)
    p.add_argument("--merge", action="store_true", help="only merge the results in --out")
    args = p.parse_args()
    args.sets = [s for s in args.sets.split(",") if s]
    args.models = [m for m in args.models.split(",") if m]
    if args.full:
        args.trials = 10
    if not 0 <= args.part < args.parts:
        p.error(f"--part must be in 0..{args.parts - 1}")
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.merge:
        for index, job in enumerate(jobs(args)):
            if index % args.parts != args.part:
                continue
            path = _path(args.out, job, args)
            if path.is_file():
                old = json.loads(path.read_text())
                how = None if "error" in old else _made_otherwise(old, job[3], args)
                if "error" not in old and how is None:
                    continue  # done (a failed job runs again)
                if how is not None:
                    print(f"... rerun, the result there was made with {how}", flush=True)
            print(f"... {' '.join(map(str, job))}", flush=True)
            try:
                result = run_job(*job, args)
            except Exception as e:  # one failing model must not stop the others; recorded
                result = {
                    "set": job[0],
                    "model": job[1],
                    "trial": job[2],
                    "kind": job[3],
                    "error": f"{type(e).__name__}: {e}",
                }
                print(f"    failed: {result['error']}", flush=True)
            history.write_json(path, {**result, "settings": _settings(job[3], args)})
        if args.parts > 1:
            print("part done; run with --merge when every part has finished.")
            return
    merge(args)


if __name__ == "__main__":
    main()
