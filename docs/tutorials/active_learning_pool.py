# %% [markdown]
# # Active learning on your own pool of points
#
# You have a finite set of candidate inputs (a pool) and labelling each one is expensive. Active
# learning chooses which to label so that a model of the whole input space gets good fast. Here the
# criterion is qNIPV (BoTorch's `qNegIntegratedPosteriorVariance`): label the points that most
# reduce the posterior variance integrated over where you will predict.
#
# Set `BO_ONLINE_TUTORIAL_SMALL=1` to run at toy size.

# %%
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from bo_online.loops import ActiveLearningLoop
from bo_online.problems import PoolProblem

SMALL = os.environ.get("BO_ONLINE_TUTORIAL_SMALL") == "1"
STEPS = 4 if SMALL else 60
FIGURES = Path(os.environ.get("BO_ONLINE_TUTORIAL_FIGURES", "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(1)

# %% [markdown]
# ## Your pool as a `PoolProblem`
#
# A `PoolProblem` holds the pool inputs and their outcomes (the loop reveals an outcome only when a
# point is chosen: in a real campaign, `tell` is where your lab result comes in), a held-out test
# set to measure progress, and the box that contains both. Here the pool is 3-d and clustered:
# most points lie in one corner, so choosing at random wastes labels there.

# %%
gen = torch.Generator().manual_seed(0)


def response(X: torch.Tensor) -> torch.Tensor:
    return torch.sin(5 * X[:, 0]) + X[:, 1] ** 2 - 0.5 * torch.cos(7 * X[:, 2])


def clustered(n: int) -> torch.Tensor:
    corner = 0.35 * torch.rand(int(0.8 * n), 3, generator=gen, dtype=torch.float64)
    rest = torch.rand(n - corner.shape[0], 3, generator=gen, dtype=torch.float64)
    return torch.cat([corner, rest])


X_pool, X_test = clustered(1500), torch.rand(400, 3, generator=gen, dtype=torch.float64)
noise = lambda X: 0.05 * torch.randn(X.shape[0], generator=gen, dtype=torch.float64)  # noqa: E731
problem = PoolProblem(
    name="my_pool",
    X_pool=X_pool,
    y_pool=response(X_pool) + noise(X_pool),
    X_test=X_test,
    y_test=response(X_test),
    bounds=torch.tensor([[0.0] * 3, [1.0] * 3], dtype=torch.float64),
)

# %% [markdown]
# ## qNIPV against random choice
#
# `selection="pool"` scores pool points directly (up to `num_pool_candidates` of them per step);
# `"snap"` instead optimises qNIPV over the box and labels the nearest free pool point.
# `integrate_over="test"` integrates the variance over a fixed random subset of the test inputs
# (where you will predict). Each record carries the test RMSE, the mean posterior variance and the
# test NLL.

# %%
runs = {}
for acq in ("qnipv", "random"):
    loop = ActiveLearningLoop(
        problem, acq=acq, selection="pool", num_mc_points=128, model="exact", n_init=8, q=2, seed=0
    )
    runs[acq] = loop.run(steps=STEPS)
    last = runs[acq][-1]
    print(
        f"{acq:>6}: {last['n']} labels, test RMSE {last['rmse']:.3f}, "
        f"mean variance {last['mean_var']:.4f}"
    )

# %% [markdown]
# ## Driving it yourself: ask and tell
#
# `ask()` returns the pool row indices to label next; `tell(indices)` labels them and updates the
# surrogate in place.

# %%
loop = ActiveLearningLoop(problem, acq="qnipv", selection="pool", model="exact", n_init=8, seed=1)
for _ in range(3):
    rows = loop.ask()
    print("label pool rows", rows.tolist(), "at", problem.X_pool[rows].numpy().round(2).tolist())
    loop.tell(rows)

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
for acq in runs:
    rec = [r for r in runs[acq] if r.get("rmse") is not None]
    axes[0].plot([r["n"] for r in rec], [r["rmse"] for r in rec], label=acq)
    axes[1].semilogy([r["n"] for r in rec], [r["mean_var"] for r in rec], label=acq)
axes[0].set_ylabel("test RMSE")
axes[1].set_ylabel("mean posterior variance (test)")
for ax in axes:
    ax.set_xlabel("labelled points")
    ax.legend()
fig.tight_layout()
fig.savefig(FIGURES / "active_learning_pool.png", dpi=110)

# %% [markdown]
# ![Test RMSE and posterior variance against labels](figures/active_learning_pool.png)
#
# qNIPV spreads its labels over the whole box instead of following the pool's crowded corner, so
# the variance over the test inputs falls faster. From the command line, a pool in a file runs
# the same loop: `bo-online active --pool pool.csv --target y --model exact` (CSV or NPZ; see
# [the bo-online command](../usage.md)).
