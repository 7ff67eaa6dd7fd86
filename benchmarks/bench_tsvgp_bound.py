"""t-SVGP's Gaussian M-step: the one-pass collapsed bound against the general two-pass ELBO.

A Gaussian t-SVGP's M-step maximises the collapsed SGPR bound. ``TSVGP.elbo`` computes it from
the whitened site summaries in one pass over the stored points (docs/math.md §2); the general
path, which non-Gaussian likelihoods need, makes a second pass for the expected log-likelihood
under the marginals once q is known (:func:`two_pass_bound` below, the exact sites substituted:
what a Gaussian model ran before). Both are the same function of the hyperparameters, so the
same fit from the same state lands on the same model; this script times ``fit(max_iter=...)``
with each, interleaved, from one fitted starting state, on the first rows of a UCI set
(``BO_ONLINE_DATA_DIR`` or ``--data-dir``), and prints the fit times, their ratio and the test
RMSE / NLL of both results. Measured (kin40k, 5,000 rows, m = 512, 30 iterations, one thread,
loaded 2-core machine, 2 repetitions): 93.4 s against 193.7 s (2.07x), test RMSE 0.2654 / NLL
0.1042 for both::

    python benchmarks/bench_tsvgp_bound.py --dataset kin40k --rows 5000 --m 512 --iters 30
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

from bo_online.loops.active import predictive_metrics
from bo_online.models.tsvgp import TSVGP
from bo_online.problems import to_unit, uci_problem


def two_pass_bound(model: TSVGP) -> Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]:
    """The general ELBO path of ``TSVGP.elbo`` (``_sites_elbo``) with the exact Gaussian sites:
    the summaries in one pass over the row blocks, ``sum_i E_q[log p(y_i | f_i)]`` in a second,
    minus the KL. A drop-in for ``model._collapsed_bound``."""

    def bound(L_K: Tensor, X: Tensor, y: Tensor, noise: Tensor | None) -> Tensor:
        return model._sites_elbo(L_K, X, y, noise, *model._exact_sites(y, noise))

    return bound


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="kin40k")
    p.add_argument("--rows", type=int, default=5000)
    p.add_argument("--test-rows", type=int, default=2000)
    p.add_argument("--m", type=int, default=512, help="inducing points")
    p.add_argument("--iters", type=int, default=30, help="L-BFGS iterations per timed fit")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-dir", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    prob = uci_problem(
        a.dataset, split=0, seed=0, max_stream=a.rows, max_test=a.test_rows, data_dir=a.data_dir
    )
    U = to_unit(prob.X_stream, prob.bounds).double()
    Ut = to_unit(prob.X_test, prob.bounds).double()
    start = TSVGP(U, prob.y_stream.reshape(-1, 1).double(), inducing_points=a.m)
    start.fit(max_iter=5)  # a common state past the defaults
    times: dict[str, list[float]] = {"one-pass": [], "two-pass": []}
    for _ in range(a.reps):
        for name in times:
            model = copy.deepcopy(start)
            if name == "two-pass":
                model._collapsed_bound = two_pass_bound(model)
            t0 = time.perf_counter()
            model.fit(max_iter=a.iters)
            times[name].append(time.perf_counter() - t0)
            r = predictive_metrics(model, Ut, prob.y_test.double())
            print(
                f"{name}: fit {times[name][-1]:.1f} s, test RMSE {r['rmse']:.4f} "
                f"NLL {r['nll']:.4f}",
                flush=True,
            )
    one, two = (statistics.median(times[k]) for k in ("one-pass", "two-pass"))
    print(f"median fit: one-pass {one:.1f} s, two-pass {two:.1f} s, ratio {two / one:.2f}x")
    return times


if __name__ == "__main__":
    main()
