"""WISKI's acquisition path: the posterior at a few points per batch with its gradient, read from
the cached ``M = R A^-1 R^T`` by ``bo_online.models.wiski.grid.interp_quad`` (hand-written
backward), against dense computations: ``W M W^T`` formed densely, and the literal dense SKI
posterior (n x n) built differentiably in the test points."""

from __future__ import annotations

import pytest
import torch
from wiski_reference import grid_kernel, noise_std

from bo_online.models import WISKI
from bo_online.models.wiski.grid import RegularGrid, interp_quad

DT = torch.float64


@pytest.mark.parametrize(
    "sizes, shape", [([12], (4, 3)), ([9, 8], (2, 3, 5)), ([8, 7, 9], (5, 3)), ([8, 7, 9], (2, 50))]
)
def test_interp_quad_and_its_gradient_match_dense_products(sizes, shape):
    g = torch.Generator().manual_seed(3)
    grid = RegularGrid(sizes, dtype=DT)
    m = grid.num_points
    A = torch.randn(m, m, generator=g, dtype=DT)
    M = A @ A.T
    X = torch.rand(*shape, len(sizes), generator=g, dtype=DT).requires_grad_(True)
    Wt = torch.randn(*shape, shape[-1], generator=g, dtype=DT)  # weights of the output entries
    out = interp_quad(*grid.interpolate(X), M)
    W = grid.dense_weights(X)
    ref = W @ M @ W.mT
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad((out * Wt).sum(), X)
    (grad_ref,) = torch.autograd.grad((ref * Wt).sum(), X)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-10)
    # chunked over the batch: the same result
    torch.testing.assert_close(interp_quad(*grid.interpolate(X), M, chunk=2 * m), out.detach())
    with pytest.raises(ValueError, match="constant"):
        interp_quad(*grid.interpolate(X), M.clone().requires_grad_(True))


def _dense_posterior_diff(model, X, Y, Xs):
    """Latent posterior (user-unit mean, standardised covariance) at ``Xs`` (``b x q x d``) from
    the n x n dense SKI covariance, differentiable in ``Xs`` (the dense weights are)."""
    with torch.no_grad():
        W = model.grid.dense_weights(model._features(X))
        K = grid_kernel(model)
        y = (Y.reshape(-1) - model.outcome_mean) / model.outcome_std
        L = torch.linalg.cholesky(W @ K @ W.T + torch.diag(noise_std(model, X.shape[0], None)))
        c = model.mean_module.constant.reshape(())
        alpha = torch.cholesky_solve((y - c).unsqueeze(-1), L).squeeze(-1)
    Ws = model.grid.dense_weights(model._features(Xs))  # b x q x m
    Kxs = Ws @ K @ W.T  # b x q x n
    mean = c + Kxs @ alpha
    V = torch.linalg.solve_triangular(L, Kxs.mT, upper=False)
    cov = Ws @ K @ Ws.mT - V.mT @ V
    return mean * model.outcome_std + model.outcome_mean, cov


@pytest.mark.parametrize("d, grid_size, q", [(2, 14, 3), (3, 10, 3), (3, 10, 1)])
def test_posterior_with_gradient_matches_dense_ski(d, grid_size, q):
    g = torch.Generator().manual_seed(11 + d + q)
    X = torch.rand(40, d, generator=g, dtype=DT)
    Y = torch.sin(4 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(40, 1, generator=g, dtype=DT)
    model = WISKI(X, Y, grid_size=grid_size)
    model.covar_module.lengthscale = torch.full((1, d), 0.3, dtype=DT)
    model.likelihood.noise = 0.05
    model.eval()
    assert model._shared.get("M") is None
    Xs = torch.rand(5, q, d, generator=g, dtype=DT).requires_grad_(True)
    wt = torch.randn(5, q, q, generator=g, dtype=DT)
    post = model.posterior(Xs)
    assert model._shared.get("M") is not None  # a gradient was asked for: M is built once
    mean, cov = _dense_posterior_diff(model, X, Y, Xs)
    sd2 = model.outcome_std.reshape(()) ** 2
    torch.testing.assert_close(post.mean.squeeze(-1), mean, rtol=1e-8, atol=1e-8)
    cov_w = post.mvn.covariance_matrix
    torch.testing.assert_close(cov_w / sd2, cov, rtol=1e-8, atol=1e-8)
    f = lambda mu, S: mu.sum() + (S * wt).sum()  # noqa: E731  (mean and covariance both count)
    (grad,) = torch.autograd.grad(f(post.mean.squeeze(-1), cov_w / sd2), Xs)
    (grad_ref,) = torch.autograd.grad(f(mean, cov), Xs)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-7, atol=1e-7)
    # Without a gradient, once M is cached, the same path; values equal the rows path's.
    with torch.no_grad():
        cached = model.posterior(Xs.detach()).mvn.covariance_matrix
        rows, _ = model._grid_root(*model._interp(Xs.detach()))
    torch.testing.assert_close(cached, cov_w.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cached, (rows @ rows.mT) * sd2, rtol=1e-10, atol=1e-10)


def test_acquisition_path_after_updates_uses_the_carried_gram_and_matches_dense():
    g = torch.Generator().manual_seed(5)
    d = 2
    X = torch.rand(30, d, generator=g, dtype=DT)
    Y = torch.cos(3 * X).sum(-1, keepdim=True)
    model = WISKI(X, Y, grid_size=12)
    model.likelihood.noise = 0.02
    model.eval()
    Xs = torch.rand(4, 3, d, generator=g, dtype=DT).requires_grad_(True)
    model.posterior(Xs).mean.sum().backward()  # builds M
    for _ in range(5):  # M is carried by rank-q algebra through the updates
        Xq = torch.rand(3, d, generator=g, dtype=DT)
        Yq = torch.cos(3 * Xq).sum(-1, keepdim=True)
        model.update(Xq, Yq)
        X, Y = torch.cat([X, Xq]), torch.cat([Y, Yq])
        assert model._shared.get("M") is not None
    post = model.posterior(Xs)
    mean, cov = _dense_posterior_diff(model, X, Y, Xs)
    sd2 = model.outcome_std.reshape(()) ** 2
    torch.testing.assert_close(post.mean.squeeze(-1), mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(post.mvn.covariance_matrix / sd2, cov, rtol=1e-8, atol=1e-8)
    variance = post.mvn.covariance_matrix.diagonal(dim1=-2, dim2=-1)
    (grad,) = torch.autograd.grad(variance.sum() / sd2, Xs)
    (grad_ref,) = torch.autograd.grad(cov.diagonal(dim1=-2, dim2=-1).sum(), Xs)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-7, atol=1e-7)


def _dense_posterior_extra(model, X, Y, Xs, X2, Y2, noise2):
    """As :func:`_dense_posterior_diff` with observations ``(X2, Y2)`` (standardised ``noise2``)
    appended, differentiable in ``Xs`` (``N x d``)."""
    with torch.no_grad():
        W = torch.cat([model.grid.dense_weights(X), model.grid.dense_weights(X2)])
        K = grid_kernel(model)
        y = (torch.cat([Y, Y2]).reshape(-1) - model.outcome_mean) / model.outcome_std
        noise = torch.cat([noise_std(model, X.shape[0], None), noise2])
        L = torch.linalg.cholesky(W @ K @ W.T + torch.diag(noise))
        c = model.mean_module.constant.reshape(())
        alpha = torch.cholesky_solve((y - c).unsqueeze(-1), L).squeeze(-1)
    Ws = model.grid.dense_weights(Xs)
    Kxs = Ws @ K @ W.T
    V = torch.linalg.solve_triangular(L, Kxs.mT, upper=False)
    return (c + Kxs @ alpha) * model.outcome_std + model.outcome_mean, Ws @ K @ Ws.mT - V.mT @ V


def test_conditioned_posterior_at_few_points_with_gradient_matches_dense():
    from botorch.sampling import SobolQMCNormalSampler

    g = torch.Generator().manual_seed(8)
    X = torch.rand(25, 2, generator=g, dtype=DT)
    Y = torch.sin(4 * X).sum(-1, keepdim=True)
    model = WISKI(X, Y, grid_size=12)
    model.likelihood.noise = 0.03
    model.eval()
    Xf = torch.rand(5, 3, 2, generator=g, dtype=DT)
    fm = model.fantasize(Xf, SobolQMCNormalSampler(torch.Size([4]), seed=0))  # batch 4 x 5
    Xm = torch.rand(5, 1, 2, generator=g, dtype=DT)
    Ym = torch.randn(4, 5, 1, 1, generator=g, dtype=DT)
    cm = fm.condition_on_observations(Xm, Ym)  # chained: 4 pending points per batch
    Xt = torch.rand(5, 4, 2, generator=g, dtype=DT).requires_grad_(True)  # one batch per fantasy
    wt = torch.randn(5, 4, 4, generator=g, dtype=DT)
    sd2 = model.outcome_std.reshape(()) ** 2
    noise = model.likelihood.noise.reshape(()).expand(4)
    for m in (fm, cm):
        post = m.posterior(Xt)
        assert post.mean.shape == (4, 5, 4, 1)
        cov = post.mvn.covariance_matrix / sd2
        total = post.mean.sum() + (cov * wt).sum()
        (grad,) = torch.autograd.grad(total, Xt)
        total_ref = 0.0
        for s in range(4):
            for b in range(5):
                X2 = Xf[b] if m is fm else torch.cat([Xf[b], Xm[b]])
                Y2 = m.d_y[s, b, -X2.shape[0] :].reshape(-1, 1)
                mean_ref, cov_ref = _dense_posterior_extra(
                    model, X, Y, Xt[b], X2, Y2, noise[: X2.shape[0]]
                )
                torch.testing.assert_close(
                    post.mean[s, b].squeeze(-1), mean_ref, rtol=1e-8, atol=1e-8
                )
                torch.testing.assert_close(cov[s, b], cov_ref, rtol=1e-8, atol=1e-8)
                total_ref = total_ref + mean_ref.sum() + (cov_ref * wt[b]).sum()
        (grad_ref,) = torch.autograd.grad(total_ref, Xt)
        torch.testing.assert_close(grad, grad_ref, rtol=1e-7, atol=1e-7)
