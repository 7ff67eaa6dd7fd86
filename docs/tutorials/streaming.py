# %% [markdown]
# # Streaming regression and classification
#
# In a stream, observations arrive in an order you do not choose and each is seen once. The
# streaming loop is *prequential*: every batch is first predicted (and scored), then folded into
# the surrogate in place. This tutorial runs a regression stream you build yourself and the banana
# classification stream.
#
# Set `BO_ONLINE_TUTORIAL_SMALL=1` to run at toy size (then the classification stream is a small
# synthetic set, so the tutorial needs no data files).

# %%
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from bo_online.datasets import DataNotFoundError
from bo_online.loops import StreamingLoop
from bo_online.problems import StreamProblem, banana_problem

SMALL = os.environ.get("BO_ONLINE_TUTORIAL_SMALL") == "1"
N_STREAM = 300 if SMALL else 3000
FIGURES = Path(os.environ.get("BO_ONLINE_TUTORIAL_FIGURES", "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)

# %% [markdown]
# ## Regression: your own stream
#
# A `StreamProblem` holds the stream in arrival order, a test set and the box containing every
# input. Here a 2-d signal is observed along a drifting path: early points cover one region, later
# ones another, so the model must keep learning.


# %%
def signal(X: torch.Tensor) -> torch.Tensor:
    return torch.sin(3 * X[:, 0]) * torch.exp(-X[:, 1]) + 0.3 * X[:, 1]


t = torch.linspace(0, 1, N_STREAM, dtype=torch.float64)
X_stream = torch.stack([t * 2.0, torch.rand(N_STREAM, generator=gen, dtype=torch.float64)], -1)
X_stream[:, 0] += 0.2 * torch.rand(N_STREAM, generator=gen, dtype=torch.float64)
X_test = torch.rand(500, 2, generator=gen, dtype=torch.float64) * torch.tensor([2.2, 1.0])
regression = StreamProblem(
    name="drift",
    X_stream=X_stream,
    y_stream=signal(X_stream) + 0.05 * torch.randn(N_STREAM, generator=gen, dtype=torch.float64),
    X_test=X_test,
    y_test=signal(X_test),
    bounds=torch.tensor([[0.0, 0.0], [2.2, 1.0]], dtype=torch.float64),
    task="regression",
)

# %% [markdown]
# WISKI and t-SVGP both keep a fixed-size summary of the stream, so a step costs the same however
# long the stream has run. `q` points arrive per step; the test metrics are recorded every
# `eval_every` steps.

# %%
reg_records = {}
for model in ("wiski", "tsvgp"):
    loop = StreamingLoop(regression, model=model, n_init=50, q=10, eval_every=5, seed=0)
    reg_records[model] = loop.run()  # default: until the stream is exhausted
    last = [r for r in reg_records[model] if r.get("test_rmse") is not None][-1]
    print(
        f"{model}: {last['n']} points seen, test RMSE {last['test_rmse']:.3f}, "
        f"test NLL {last['test_nll']:.3f}"
    )

# %% [markdown]
# ## Classification: the banana stream
#
# `banana_problem()` reads the banana set (2-d, two classes) from the data directory: the
# `data_dir` argument, else `$BO_ONLINE_DATA_DIR`, else `../shared/data` next to the project. If
# the files are not there, this tutorial says so and uses a synthetic two-class set of the same
# shape instead (in small mode it always does).


# %%
def synthetic_banana(n_stream: int, n_test: int) -> StreamProblem:
    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        X = 4 * torch.rand(n, 2, generator=gen, dtype=torch.float64) - 2
        p = torch.sigmoid(4 * (X[:, 1] - 0.6 * X[:, 0] ** 2 + 0.5))
        return X, (torch.rand(n, generator=gen, dtype=torch.float64) < p).double()

    (Xs, ys), (Xt, yt) = draw(n_stream), draw(n_test)
    return StreamProblem(
        name="synthetic_banana",
        X_stream=Xs,
        y_stream=ys,
        X_test=Xt,
        y_test=yt,
        bounds=torch.tensor([[-2.0, -2.0], [2.0, 2.0]], dtype=torch.float64),
        task="classification",
    )


if SMALL:
    classification = synthetic_banana(120, 200)
else:
    try:
        classification = banana_problem(seed=0)
    except DataNotFoundError as err:
        print(f"The banana data are missing ({err}); using a synthetic two-class set instead.")
        classification = synthetic_banana(400, 2000)
print(
    f"{classification.name}: {classification.X_stream.shape[0]} stream points, "
    f"{classification.X_test.shape[0]} test points"
)

# %% [markdown]
# A classification stream needs a surrogate that can classify: `tsvgp` (t-SVGP with a Bernoulli
# likelihood, probit link) or `wiski` (WISKI's Dirichlet-based classifier). Test accuracy and NLL
# are recorded; the loop keeps the prequential accuracy of its predictions before each update.

# %%
cls_records = {}
for model in ("tsvgp", "wiski"):
    loop = StreamingLoop(classification, model=model, n_init=20, q=5, eval_every=4, seed=0)
    cls_records[model] = loop.run()
    last = [r for r in cls_records[model] if r.get("test_accuracy") is not None][-1]
    print(f"{model}: {last['n']} points seen, test accuracy {last['test_accuracy']:.3f}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
for model, rec in reg_records.items():
    rec = [r for r in rec if r.get("test_rmse") is not None]
    axes[0].plot([r["n"] for r in rec], [r["test_rmse"] for r in rec], label=model)
for model, rec in cls_records.items():
    rec = [r for r in rec if r.get("test_accuracy") is not None]
    axes[1].plot([r["n"] for r in rec], [r["test_accuracy"] for r in rec], label=model)
axes[0].set_title(f"regression stream ({regression.name})")
axes[0].set_ylabel("test RMSE")
axes[1].set_title(f"classification stream ({classification.name})")
axes[1].set_ylabel("test accuracy")
for ax in axes:
    ax.set_xlabel("points seen")
    ax.legend()
fig.tight_layout()
fig.savefig(FIGURES / "streaming.png", dpi=110)

# %% [markdown]
# ![Test RMSE and test accuracy along the streams](figures/streaming.png)
#
# The test inputs cover the whole box while the stream drifts across it, so the regression error
# stays high (in the run shown it even rises at first, while the models fit the region seen so
# far) until the stream has covered the box, and then falls. The command-line equivalents are
# `bo-online stream --problem banana --model tsvgp` and, for the UCI regression streams,
# `--problem` with a data-set name; a stream in your own file is
# `bo-online stream --data stream.csv --target y --task regression` (see
# [the bo-online command](../usage.md)).
