"""Hindsight reference for a stream: an exact SingleTaskGP fitted on the first N stream rows of a
UCI set (the `bo-online stream` default split and order) and a constant predictor; test RMSE/NLL.

Usage: python benchmarks/stream_hindsight_reference.py elevators 2000
"""

import math
import sys

import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Standardize
from gpytorch.mlls import ExactMarginalLogLikelihood

from bo_online.problems import uci_problem

torch.set_num_threads(1)

name = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
p = uci_problem(name, max_stream=n)  # data: $BO_ONLINE_DATA_DIR or ../shared/data
X, y = p.X_stream[:n].double(), p.y_stream[:n].double()
lo, hi = p.bounds


def U(Z):
    return (Z - lo) / (hi - lo)


gp = SingleTaskGP(U(X), y.unsqueeze(-1), outcome_transform=Standardize(1))
fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
with torch.no_grad():
    post = gp.posterior(U(p.X_test.double()), observation_noise=True)
mu, var = post.mean.squeeze(-1), post.variance.squeeze(-1)
yt = p.y_test.double()
rmse = ((mu - yt) ** 2).mean().sqrt()
nll = (0.5 * torch.log(2 * math.pi * var) + 0.5 * (yt - mu) ** 2 / var).mean()
c_mu, c_var = y.mean(), y.var()
cnll = (0.5 * math.log(2 * math.pi * c_var) + 0.5 * (yt - c_mu) ** 2 / c_var).mean()
c_rmse = ((yt - c_mu) ** 2).mean().sqrt()
print(
    f"{name}: hindsight exact GP n={n}: test rmse {rmse:.4f} nll {nll:.4f}; "
    f"constant: rmse {c_rmse:.4f} nll {cnll:.4f}; ntest {yt.numel()}"
)
