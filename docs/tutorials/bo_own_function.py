# %% [markdown]
# # Bayesian optimisation of your own function
#
# This tutorial minimises a function you write yourself, first by calling `run`, then step by
# step with `ask` and `tell` (the form to use when your evaluations happen somewhere else: a lab,
# a simulator, a queue). Then it reads the records the loop keeps and plots them.
#
# Set `BO_ONLINE_TUTORIAL_SMALL=1` to run everything at toy size (the test suite does).

# %%
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from bo_online.loops import BayesOptLoop, read_records, resume
from bo_online.plotting import plot_runs
from bo_online.problems import CallableProblem

SMALL = os.environ.get("BO_ONLINE_TUTORIAL_SMALL") == "1"
STEPS = 4 if SMALL else 40
FIGURES = Path(os.environ.get("BO_ONLINE_TUTORIAL_FIGURES", "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(1)

# %% [markdown]
# ## The objective
#
# Any function that takes an `n x d` float64 tensor (problem units) and returns `n` values will do.
# Here: a shifted, rotated quadratic bowl with a ripple, in four dimensions, minimum 0 at `x*`.
# `CallableProblem` wraps it with its box; `optimal_value` is optional and only used to report
# regret.

# %%
x_star = torch.tensor([0.3, -0.5, 1.2, 0.0], dtype=torch.float64)


def my_objective(X: torch.Tensor) -> torch.Tensor:
    Z = X - x_star
    return (Z**2).sum(-1) + 0.3 * (1 - torch.cos(3 * Z)).sum(-1)


problem = CallableProblem(
    my_objective,
    bounds=[[-2.0] * 4, [2.0] * 4],
    maximize=False,
    noise_std=0.01,  # the loop adds this Gaussian noise to each evaluation
    optimal_value=0.0,
    name="bowl",
)

# %% [markdown]
# ## `run`: the whole campaign in one call
#
# The loop starts from a scrambled Sobol design (`n_init`, default `max(5, 2 d)` points), then
# each step maximises the acquisition with BoTorch's `optimize_acqf`, evaluates the batch and folds
# it into the surrogate in place. `out_dir` makes the run durable: one JSON record per step in
# `records.jsonl` and a checkpoint, from which a killed run continues (see *Resuming* below).

# %%
loop = BayesOptLoop(
    problem,
    model="exact",  # any registered surrogate: "wiski", "tsvgp", "decoupled", "qsgp", ...
    acq="logei",
    seed=0,
    out_dir="runs/bowl_exact",
    overwrite=True,
)
records = loop.run(steps=STEPS)
last = records[-1]
print(
    f"step {last['step']}: n = {last['n']}, best observed {last['best_value']:.4f}, "
    f"regret of the best true value {last['regret']:.4f}"
)

# %% [markdown]
# Each record is a plain dictionary. Among its keys: `step`, `n` (evaluations so far),
# `best_value` (best noisy observation), `best_true_value` and `regret` (when the optimum is known),
# and the time the step spent in each phase.

# %%
print(sorted(last))

# %% [markdown]
# ## Resuming the run
#
# The objective here is a Python function, which the run directory does not hold, so
# `bo-online resume runs/bowl_exact` cannot rebuild it (it stops with an error that says so).
# Resume such a run from Python, passing the same problem again:
# `bo_online.loops.resume("runs/bowl_exact", problem=problem)` continues a killed run to its
# target, and `steps=` sets a new target (a problem whose box or direction differs from the
# run's is refused). A run started on the command line with `--objective file.py:function`
# resumes there, with `bo-online resume DIR --objective file.py:function`.

# %%
records = resume("runs/bowl_exact", steps=STEPS + 2, problem=problem)
print(f"resumed to step {records[-1]['step']}: best observed {records[-1]['best_value']:.4f}")

# %% [markdown]
# ## `ask` / `tell`: you do the evaluation
#
# `ask()` returns the next batch (`q x d`, problem units); you evaluate it however you like and
# hand the values back with `tell(X, y)`. The surrogate is updated in place, and the record of the
# step comes back. The initial design is run by `initialize()` (with the problem's own function).
#
# `y` is what you observed (noise included); it is what the surrogate learns from and what
# `best_value` reports. When you also know the noise-free values, pass them as
# `tell(X, y, y_true=f)`: `best_true_value` and `regret` are computed from them (without
# `y_true` they are computed from the noisy `y`).

# %%
manual = BayesOptLoop(problem, model="exact", acq="qucb", q=2, seed=1)
manual.initialize()
for _ in range(STEPS // 2):
    X = manual.ask()  # 2 x 4
    f = my_objective(X)  # noise-free
    y = f + 0.01 * torch.randn(X.shape[0], dtype=torch.float64)  # what a measurement gives
    record = manual.tell(X, y, y_true=f)
print(
    f"ask/tell: n = {record['n']}, best observed {record['best_value']:.4f}, "
    f"regret {record['regret']:.4f}"
)

# %% [markdown]
# ## Starting from data you already have
#
# If you have measurements from before, pass them as `initial_data=(X, y)` (problem units, values
# in the problem's sense) with `n_init=0`: nothing is evaluated before the first `ask`. A problem
# made as `CallableProblem(None, bounds)` has no objective at all, so every value comes from your
# `tell`.

# %%
X_old = torch.rand(8, 4, dtype=torch.float64) * 4 - 2
y_old = my_objective(X_old)
lab = CallableProblem(None, bounds=[[-2.0] * 4, [2.0] * 4], maximize=False, name="lab")
loop = BayesOptLoop(lab, initial_data=(X_old, y_old), n_init=0, model="exact", acq="logei", seed=2)
for _ in range(STEPS // 2):
    X = loop.ask()
    record = loop.tell(X, my_objective(X))  # your measurement goes here
print(f"from {len(y_old)} old points: n = {record['n']}, best observed {record['best_value']:.4f}")

# %% [markdown]
# ## Reading the records back and plotting
#
# `read_records(out_dir)` reads a run directory (also one written by the `bo-online` command);
# `bo_online.plotting.plot_runs` draws every plot that applies (`bo-online plot` does the same).

# %%
records = read_records("runs/bowl_exact")
steps = [r["step"] for r in records]
regret = [r["regret"] for r in records]

fig, ax = plt.subplots(figsize=(5, 3.2))
ax.semilogy(steps, regret, marker="o", ms=3)
ax.set_xlabel("step")
ax.set_ylabel("regret of the best point")
ax.set_title("qLogEI + OnlineExactGP on a 4-d bowl")
fig.tight_layout()
fig.savefig(FIGURES / "bo_own_function_regret.png", dpi=110)

written = plot_runs(["runs/bowl_exact"], out_dir="runs/plots")
print([p.name for p in written])

# %% [markdown]
# ![Regret against step](figures/bo_own_function_regret.png)
#
# The command line runs the same loop on a function in your own file:
# `bo-online bo --objective my_objective.py:my_objective
# --bounds '[[-2, 2], [-2, 2], [-2, 2], [-2, 2]]' --out runs/bowl` writes the same kind of run
# directory, and `bo-online plot runs/bowl_exact` draws these plots for any run directory (see
# [the bo-online command](../usage.md)).
