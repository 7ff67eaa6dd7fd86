"""Dense SKI reference computations for the WISKI tests (built explicitly: W K W^T + sigma^2 D).

Everything here forms the n x m interpolation matrix and n x n covariances densely, from the
grid's points and weights (the weights are tested against GPyTorch's in test_grid.py) and the
model's kernel module, independently of WISKI's statistics, factors and update formulas.
"""

from __future__ import annotations

import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import RBFKernel, ScaleKernel


def grid_kernel(model) -> torch.Tensor:
    """The model's jittered grid kernel ``K_UU + jitter`` (m x m), built densely.

    For a single grid and an RBF kernel (optionally scaled) the model puts the jitter on each
    dimension's factor, ``kron_j (K_j + jitter * k_j(0) I)``; the factors are written out here
    from the lengthscales (and checked to multiply to the kernel on the grid). Otherwise the
    jitter is ``grid_jitter * mean(diag K) I``."""
    points = model.grid.points()
    K = model.covar_module(points).to_dense()
    factors = _rbf_factors(model, points)
    if factors is None:
        jitter = model.grid_jitter * torch.diagonal(K).mean()
        return K + jitter * torch.eye(K.shape[-1], dtype=K.dtype)
    raw = factors[0]
    for F in factors[1:]:
        raw = torch.kron(raw, F)
    torch.testing.assert_close(raw, K, rtol=1e-10, atol=1e-12)  # the kernel does factor
    out = torch.ones(1, 1, dtype=K.dtype)
    for F in factors:
        out = torch.kron(
            out, F + model.grid_jitter * F[0, 0] * torch.eye(F.shape[0], dtype=F.dtype)
        )
    return out


def grid_kernel_root(model) -> torch.Tensor:
    """A lower-triangular root ``R`` of :func:`grid_kernel` (``R R^T``): for the per-factor
    jitter the Kronecker product of the jittered factors' own Cholesky factors (the dense
    product is too ill-conditioned, smallest eigenvalue about jitter^d, for a dense Cholesky
    factor to be accurate), else the Cholesky factor of the dense kernel."""
    factors = _rbf_factors(model, model.grid.points())
    if factors is None:
        return torch.linalg.cholesky(grid_kernel(model))
    R = torch.ones(1, 1, dtype=factors[0].dtype)
    for F in factors:
        jittered = F + model.grid_jitter * F[0, 0] * torch.eye(F.shape[0], dtype=F.dtype)
        R = torch.kron(R, torch.linalg.cholesky(jittered))
    return R


def _rbf_factors(model, points):
    """Per-dimension RBF factors on the grid's coordinates (the outputscale in the first), or
    None where the model's kernel is not a single grid's RBF kernel on every input (or the
    model keeps the scalar jitter of states saved before the per-factor one)."""
    kernel, scale = model.covar_module, None
    if type(kernel) is ScaleKernel and kernel.active_dims is None:
        kernel, scale = kernel.base_kernel, kernel.outputscale.reshape(())
    if (
        model.input_groups is not None
        or type(kernel) is not RBFKernel
        or kernel.active_dims is not None
        or kernel.batch_shape != torch.Size()
        or not bool(model.jitter_per_factor)
    ):
        return None
    lengthscale = kernel.lengthscale.reshape(-1).expand(points.shape[-1])
    factors = []
    for j, size in enumerate(model.grid.inner_sizes):
        coords = torch.unique(points[:, j])
        assert coords.numel() == size
        diff = (coords[:, None] - coords[None, :]) / lengthscale[j]
        factors.append(torch.exp(-0.5 * diff**2))
    if scale is not None:
        factors[0] = scale * factors[0]
    return factors


def noise_std(model, n: int, Yvar: torch.Tensor | None) -> torch.Tensor:
    """Standardised noise variances of the training points."""
    if Yvar is None:
        return model.likelihood.noise.reshape(()).expand(n)
    return Yvar.reshape(-1) / model.outcome_std.reshape(()) ** 2


def dense_mll(model, X, Y, Yvar=None) -> torch.Tensor:
    """log p(y_std) / n for the SKI GP, differentiable in the hyperparameters."""
    W = model.grid.dense_weights(model._features(X)).detach()
    K = grid_kernel(model)
    n = X.shape[0]
    C = W @ K @ W.T + torch.diag(noise_std(model, n, Yvar))
    y = ((Y.reshape(-1) - model.outcome_mean) / model.outcome_std).reshape(-1)
    mean = model.mean_module.constant.reshape(()) * torch.ones(n, dtype=X.dtype)
    return MultivariateNormal(mean, C).log_prob(y) / n


def dense_posterior(model, X, Y, Yvar, Xs, extra=None):
    """Latent posterior mean (user units) and covariance (standardised units) at Xs.

    ``extra``: optional (X2, Y2, noise2_std) appended observations, noise in standardised units.
    """
    with torch.no_grad():
        W = model.grid.dense_weights(model._features(X))
        K = grid_kernel(model)
        y = (Y.reshape(-1) - model.outcome_mean) / model.outcome_std
        N = noise_std(model, X.shape[0], Yvar)
        if extra is not None:
            X2, Y2, N2 = extra
            W = torch.cat([W, model.grid.dense_weights(model._features(X2))])
            y = torch.cat([y, (Y2.reshape(-1) - model.outcome_mean) / model.outcome_std])
            N = torch.cat([N, N2.reshape(-1)])
        C = W @ K @ W.T + torch.diag(N)
        Ws = model.grid.dense_weights(model._features(Xs))
        Kxs = Ws @ K @ W.T
        c = model.mean_module.constant.reshape(())
        L = torch.linalg.cholesky(C)
        alpha = torch.cholesky_solve((y - c).unsqueeze(-1), L).squeeze(-1)
        mean = c + Kxs @ alpha
        V = torch.linalg.solve_triangular(L, Kxs.T, upper=False)
        cov = Ws @ K @ Ws.T - V.T @ V
        return mean * model.outcome_std + model.outcome_mean, cov


def dense_posterior_woodbury(model, X, Y, Yvar, Xs):
    """The dense SKI posterior for LARGE n: W (n x m) is formed explicitly from the inputs and
    (W K W^T + N)^-1 applied through the Woodbury identity with a fresh Cholesky of
    I + R^T W^T N^-1 W R (R R^T = K). Independent of WISKI's statistics and incremental factor;
    the identity itself is checked against the n x n computation in the small-n tests."""
    with torch.no_grad():
        W = model.grid.dense_weights(model._features(X))
        K = grid_kernel(model)
        R = grid_kernel_root(model)
        y = (Y.reshape(-1) - model.outcome_mean) / model.outcome_std
        Ninv = 1.0 / noise_std(model, X.shape[0], Yvar)
        c = model.mean_module.constant.reshape(())
        B = W @ R  # n x m
        M = torch.eye(R.shape[0], dtype=X.dtype) + B.T @ (Ninv[:, None] * B)
        LM = torch.linalg.cholesky(M)

        def cinv(V):  # (W K W^T + N)^-1 V
            NV = Ninv[:, None] * V
            return NV - Ninv[:, None] * (B @ torch.cholesky_solve(B.T @ NV, LM))

        Ws = model.grid.dense_weights(model._features(Xs))
        Kxs = Ws @ K @ W.T
        mean = c + Kxs @ cinv((y - c)[:, None]).squeeze(-1)
        cov = Ws @ K @ Ws.T - Kxs @ cinv(Kxs.T)
        return mean * model.outcome_std + model.outcome_mean, cov
