"""Per-trial generation time inside Ax: a bo_online surrogate vs Ax's default surrogate.

For each history length N (``--at``, default 50 and 400) two ``ax.api.Client`` s get the same
N - 1 completed Branin trials (Sobol points, attached by hand), then each generates and completes
one warm-up trial (for the bo_online client this is the rebuild + fit; afterwards Ax's per-trial
construction takes the incremental path), then ``--reps`` timed rounds follow, interleaved
(ours, Ax's, ours, Ax's, ...). One timed round = ``client.get_next_trials(1)`` (model
construction + fitting or scheduled refit + acquisition optimisation), followed by completing the
trial. Reported: median and min-max seconds per trial, and the ratio of the medians at the
largest vs the smallest N for each surrogate.

Both arms use the same acquisition function (``--acqf``, default qLogExpectedImprovement, whose
cost does not grow with N, unlike qLogNoisyExpectedImprovement's baseline) and optimiser settings.
The bo_online arm refits its hyperparameters every ``--refit-every`` new observations; the timed
rounds include those refits in proportion (``--reps`` consecutive trials). Ax's default arm is
Ax's ``SingleTaskGP`` with Ax's default transforms, rebuilt and refit every trial.

For the bo_online arm the seconds spent in the model's construction and refits are recorded
separately ("model s"); the rest is Ax's own work and the acquisition optimisation.
``--with-sobol`` adds a Sobol-only client, whose per-trial time is Ax's bookkeeping alone.

The check: the bo_online surrogate's ratio (largest N / smallest N) is printed beside the target
(1.5x, meant for WISKI; OnlineExactGP is O(n^2) per update and O(n^3) per refit, so it is run
now as the reference).

    python benchmarks/bench_ax.py                                  # OnlineExactGP, N = 50, 400
    python benchmarks/bench_ax.py --model WISKI --at 50 400 --reps 7
    python benchmarks/bench_ax.py --at 20 60 --reps 5 --skip-default   # quick
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
import warnings
from typing import Any, Callable

import torch
from botorch.test_functions import Branin

TARGET_RATIO = 1.5


def _client(gs: Any, seed: int) -> Any:
    from ax.api.client import Client
    from ax.api.configs import RangeParameterConfig

    client = Client(random_seed=seed)
    client.configure_experiment(
        parameters=[
            RangeParameterConfig(name="x0", parameter_type="float", bounds=(-5.0, 10.0)),
            RangeParameterConfig(name="x1", parameter_type="float", bounds=(0.0, 15.0)),
        ],
    )
    client.configure_optimization(objective="-y")
    client.set_generation_strategy(gs)
    return client


def _ax_default_strategy(acqf: type, optimizer_options: dict[str, Any], n_init: int) -> Any:
    """Ax's own choice ("fast": Sobol then MBM defaults = SingleTaskGP, default transforms), with
    the same acquisition function and optimiser settings as the bo_online arm."""
    from ax.adapter.registry import Generators
    from ax.generation_strategy.generation_strategy import GenerationNode, GenerationStrategy
    from ax.generation_strategy.generator_spec import GeneratorSpec
    from ax.generation_strategy.transition_criterion import MinTrials
    from ax.generators.torch.botorch_modular.surrogate import ModelConfig, SurrogateSpec

    return GenerationStrategy(
        name="Sobol+AxDefault",
        nodes=[
            GenerationNode(
                name="Sobol",
                generator_specs=[GeneratorSpec(generator_enum=Generators.SOBOL)],
                transition_criteria=[
                    MinTrials(threshold=n_init, transition_to="MBM", use_all_trials_in_exp=True)
                ],
            ),
            GenerationNode(
                name="MBM",
                generator_specs=[
                    GeneratorSpec(
                        generator_enum=Generators.BOTORCH_MODULAR,
                        generator_kwargs={
                            "surrogate_spec": SurrogateSpec(model_configs=[ModelConfig()]),
                            "botorch_acqf_class": acqf,
                            "default_model_gen_options": {
                                "optimizer_kwargs": dict(optimizer_options)
                            },
                        },
                    )
                ],
            ),
        ],
    )


def _fill(client: Any, X: torch.Tensor, f: Branin) -> None:
    for x in X:
        index = client.attach_trial({"x0": float(x[0]), "x1": float(x[1])})
        client.complete_trial(index, raw_data={"y": float(f(x.unsqueeze(0)))})


def _one_trial(client: Any, f: Branin) -> Callable[[], float]:
    def run() -> float:
        t0 = time.perf_counter()
        trials = client.get_next_trials(max_trials=1)
        elapsed = time.perf_counter() - t0
        assert len(trials) == 1
        for index, p in trials.items():
            x = torch.tensor([[p["x0"], p["x1"]]], dtype=torch.float64)
            client.complete_trial(index, raw_data={"y": float(f(x))})
        return elapsed

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="OnlineExactGP", help="bo_online model name")
    parser.add_argument(
        "--model-options", default="{}", help="JSON constructor options, e.g. '{\"grid_size\": 64}'"
    )
    parser.add_argument("--at", type=int, nargs="+", default=[50, 400], help="history lengths N")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--refit-every", type=int, default=10)
    parser.add_argument("--fit-max-iter", type=int, default=100)
    parser.add_argument("--acqf", default="qLogExpectedImprovement")
    parser.add_argument("--num-restarts", type=int, default=4)
    parser.add_argument("--raw-samples", type=int, default=128)
    parser.add_argument("--skip-default", action="store_true", help="only the bo_online arm")
    parser.add_argument(
        "--with-sobol",
        action="store_true",
        help="also time a Sobol-only client: Ax's own per-trial overhead at each N",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/bench_ax.json")
    args = parser.parse_args()

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # Ax logs every trial at INFO
    import ax
    import botorch
    import gpytorch
    from botorch import acquisition
    from torch.quasirandom import SobolEngine

    import bo_online.ax as boax

    acqf = getattr(acquisition, args.acqf)
    optimizer_options = {"num_restarts": args.num_restarts, "raw_samples": args.raw_samples}
    f = Branin()
    bounds = torch.tensor([[-5.0, 0.0], [10.0, 15.0]], dtype=torch.float64)
    arms = ["bo_online"] + ([] if args.skip_default else ["ax_default"])
    arms += ["ax_sobol"] if args.with_sobol else []
    rows = []
    print(f"model={args.model} acqf={args.acqf} refit_every={args.refit_every} reps={args.reps}")
    print(
        f"{'N':>5} {'arm':>10} {'median s/trial':>15} {'min-max':>17} {'rebuilds':>9} "
        f"{'model s (median)':>17}"
    )
    for n in args.at:
        boax.clear_sessions()
        X = SobolEngine(2, scramble=True, seed=args.seed).draw(n - 1).to(torch.float64)
        X = bounds[0] + (bounds[1] - bounds[0]) * X
        clients = {}
        for arm in arms:
            if arm == "bo_online":
                gs = boax.make_generation_strategy(
                    args.model,
                    botorch_acqf_class=acqf,
                    num_initial_trials=min(5, n - 1),
                    model_options=json.loads(args.model_options),
                    optimizer_options=optimizer_options,
                    refit_every=args.refit_every,
                    fit_options={"max_iter": args.fit_max_iter},
                    seed=args.seed,
                )
            elif arm == "ax_default":
                gs = _ax_default_strategy(acqf, optimizer_options, min(5, n - 1))
            else:
                from ax.adapter.registry import Generators
                from ax.generation_strategy.generation_strategy import (
                    GenerationNode,
                    GenerationStrategy,
                )
                from ax.generation_strategy.generator_spec import GeneratorSpec

                gs = GenerationStrategy(
                    name="SobolOnly",
                    nodes=[
                        GenerationNode(
                            name="Sobol",
                            generator_specs=[GeneratorSpec(generator_enum=Generators.SOBOL)],
                        )
                    ],
                )
            clients[arm] = _client(gs, args.seed)
            _fill(clients[arm], X, f)
        runners = {arm: _one_trial(clients[arm], f) for arm in arms}
        for arm in arms:  # warm-up: the bo_online arm builds and fits its model here
            runners[arm]()
        stats = boax.session_stats()
        rebuilds_before = stats.rebuilds
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        model_times: list[float] = []  # bo_online: construction + refit seconds per trial
        for _ in range(args.reps):  # interleaved
            for arm in arms:
                before = stats.construct_seconds + stats.fit_seconds
                times[arm].append(runners[arm]())
                if arm == "bo_online":
                    model_times.append(stats.construct_seconds + stats.fit_seconds - before)
        rebuilds = stats.rebuilds - rebuilds_before
        for arm in arms:
            t = times[arm]
            row = {
                "N": n,
                "arm": arm,
                "median_s": statistics.median(t),
                "min_s": min(t),
                "max_s": max(t),
                "times_s": t,
                "rebuilds_during_timing": rebuilds if arm == "bo_online" else None,
                "model_s_median": statistics.median(model_times) if arm == "bo_online" else None,
                "model_s": model_times if arm == "bo_online" else None,
            }
            rows.append(row)
            rebuilt = "" if row["rebuilds_during_timing"] is None else row["rebuilds_during_timing"]
            model_s = "" if row["model_s_median"] is None else f"{row['model_s_median']:.3f}"
            print(
                f"{n:>5} {arm:>10} {row['median_s']:>15.3f} "
                f"{row['min_s']:>8.3f}-{row['max_s']:<8.3f} {rebuilt:>9} {model_s:>17}"
            )

    ratios = {}
    lo, hi = min(args.at), max(args.at)
    for arm in arms:
        med = {r["N"]: r["median_s"] for r in rows if r["arm"] == arm}
        ratios[arm] = med[hi] / med[lo]
        note = f"  (target <= {TARGET_RATIO}x for WISKI)" if arm == "bo_online" else ""
        print(f"ratio N={hi} / N={lo}, {arm}: {ratios[arm]:.2f}x{note}")
    result = {
        "benchmark": "bench_ax",
        "settings": vars(args),
        "rows": rows,
        "ratios_hi_over_lo": ratios,
        "target_ratio": TARGET_RATIO,
        "environment": {
            "torch": torch.__version__,
            "botorch": botorch.__version__,
            "gpytorch": gpytorch.__version__,
            "ax": ax.__version__,
            "python": platform.python_version(),
            "dtype": "float64",
            "device": "cpu",
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
        },
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
