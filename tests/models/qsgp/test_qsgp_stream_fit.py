"""QSGP's closed-form fit on long streams: the evidence of a row subset (hyperparameters) and
q(w) on all rows, checked against dense computations."""

import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel

from bo_online.models.qsgp import QSGP

DT = torch.float64


def _data(n: int, d: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(5 * X[:, :1]) + X[:, 1:2] ** 2 + 0.05 * torch.randn(n, 1, generator=g, dtype=DT)
    return X, Y


def _kernel(d: int) -> ScaleKernel:
    k = ScaleKernel(RBFKernel(ard_num_dims=d)).to(DT)
    k.base_kernel.lengthscale = torch.full((1, d), 0.3, dtype=DT)
    k.outputscale = torch.tensor(1.3, dtype=DT)
    return k


@pytest.mark.parametrize("num_rows", [25, 60])  # n-space (rows < m) and weight-space forms
@pytest.mark.parametrize("fixed_noise", [False, True])
def test_log_marginal_of_rows_matches_dense(num_rows, fixed_noise):
    X, Y = _data(80)
    Yvar = torch.full_like(Y, 0.02) if fixed_noise else None
    model = QSGP(X, Y, Yvar, num_features=40, family="full", kernel=_kernel(2))
    if not fixed_noise:
        model.likelihood.noise = torch.tensor([0.03], dtype=DT)
    rows = torch.randperm(80, generator=torch.Generator().manual_seed(1))[:num_rows]
    with torch.no_grad():
        Phi = model.basis.features(model.train_X[rows])  # S = I for RFF
        noise = model.train_noise[rows] if fixed_noise else torch.full((num_rows,), 0.03, dtype=DT)
        ref = torch.distributions.MultivariateNormal(
            torch.zeros(num_rows, dtype=DT), Phi @ Phi.T + torch.diag(noise)
        ).log_prob(model.train_y[rows])
        got = model.exact_log_marginal(rows)
    assert abs(float(got) - float(ref)) < 1e-8


def test_fit_on_row_subset_sets_q_on_all_rows():
    X, Y = _data(120)
    model = QSGP(X, Y, num_features=40, family="full", kernel=_kernel(2))
    model.fit(max_iter=20, hyper_rows=50)
    # q(w) is the exact posterior of the weights on ALL 120 rows at the fitted hyperparameters
    # (and the fitted constant prior mean c: f = c + phi^T w).
    with torch.no_grad():
        Phi = model.basis.features(model.train_X)
        noise = float(model.likelihood.noise)
        A = torch.eye(40, dtype=DT) + Phi.T @ Phi / noise
        mu = torch.linalg.solve(A, Phi.T @ (model.train_y - model.mean_constant) / noise)
        cov = torch.linalg.inv(A)
    assert torch.allclose(model.var_mean, mu, atol=1e-8)
    C = model.dense_C()
    assert torch.allclose(C @ C.T, cov, atol=1e-8)
    # ... while the hyperparameters maximise the evidence of a 50-row subset, not of all rows.
    model_all = QSGP(X, Y, num_features=40, family="full", kernel=_kernel(2))
    model_all.fit(max_iter=20, hyper_rows=None)
    assert not torch.allclose(model.likelihood.noise, model_all.likelihood.noise, rtol=1e-3)
