r"""TSVGP's sums over the stored points in row blocks: the same bound, gradients, sites and fit as
all rows at once (and as dense SGPR), and a refit whose peak memory does not grow with n.

Peak memory is read from the torch profiler's CPU allocation events while a refit (or a bound and
its gradient) runs; the sites themselves (O(n) floats) are the only part allowed to grow.
"""

from __future__ import annotations

import pytest
import torch
from memory_profile import peak_allocated_bytes

from bo_online.likelihoods import Bernoulli
from bo_online.models.tsvgp import TSVGP

DT = torch.float64
M = 32
ALL_ROWS = 2**40  # summary_block_elements large enough for one block: the unblocked path


def _data(n: int, d: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    return X, Y


def _with_blocks(model: TSVGP, rows: int) -> TSVGP:
    model.summary_block_elements = rows * model.num_inducing
    return model


def _bound_and_grads(model: TSVGP) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    bound = model.elbo()
    bound.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return bound.detach(), grads


def _dense_collapsed_bound(model: TSVGP) -> torch.Tensor:
    r"""Titsias' collapsed bound written densely: ``log N(y | c, Q + s2 I) - tr(K - Q) / (2 s2)``,
    ``Q = K_fu K_uu^-1 K_uf`` (standardised units)."""
    k, X, Z = model.covar_module, model.train_X, model.inducing_points.detach()
    y, c = model.train_y, model.mean_module.constant.detach()
    s2 = model.likelihood.noise.detach().reshape(())
    with torch.no_grad():
        Kuu, Kuf = k(Z).to_dense(), k(Z, X).to_dense()
        Q = Kuf.T @ torch.linalg.solve(Kuu, Kuf)
        n = X.shape[0]
        mvn = torch.distributions.MultivariateNormal(c.expand(n), Q + s2 * torch.eye(n, dtype=DT))
        return mvn.log_prob(y) - 0.5 * (k(X, diag=True) - Q.diagonal()).sum() / s2


def test_blocked_bound_and_gradients_equal_all_rows_and_dense_sgpr() -> None:
    X, Y = _data(700)
    model = TSVGP(X, Y, inducing_points=M)
    assert len(_with_blocks(model, 128)._row_blocks(700)) == 6  # five full blocks and a rest
    blocked, g_blocked = _bound_and_grads(model)
    whole, g_whole = _bound_and_grads(_with_blocks(model, ALL_ROWS))
    assert len(model._row_blocks(700)) == 1
    torch.testing.assert_close(blocked, _dense_collapsed_bound(model), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(blocked, whole, rtol=1e-12, atol=1e-10)
    assert g_blocked.keys() == g_whole.keys() and "inducing_points" in g_blocked
    for name, g in g_whole.items():
        torch.testing.assert_close(g_blocked[name], g, rtol=1e-10, atol=1e-10, msg=name)


def test_blocked_caches_and_fit_equal_all_rows() -> None:
    X, Y = _data(600)
    blocked = _with_blocks(TSVGP(X, Y, inducing_points=M), 100)
    whole = _with_blocks(TSVGP(X, Y, inducing_points=M), ALL_ROWS)
    for model in (blocked, whole):
        model.fit(max_iter=8)
    for (name, p), q in zip(blocked.named_parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-8, atol=1e-10, msg=name)
    for name in ("chol_B", "lam_w", "v"):
        torch.testing.assert_close(getattr(blocked, name), getattr(whole, name), msg=name)
    Xt = _data(20, seed=1)[0]
    pb, pw = blocked.posterior(Xt), whole.posterior(Xt)
    torch.testing.assert_close(pb.mean, pw.mean, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(pb.variance, pw.variance, rtol=1e-8, atol=1e-10)


def _dense_bound_per_output(model: TSVGP) -> torch.Tensor:
    r"""Titsias' collapsed bound with per-point noise, densely and differentiably, summed over
    outputs: ``sum_j log N(y_j | c_j, Q_j + S_j) - 1/2 sum_i (K_j,ii - Q_j,ii) / s2_ji``."""
    X, Z, y = model._kx(model.train_X), model.inducing_points, model.train_y
    s2 = model.likelihood._var(model._point_noise(y.shape, model.train_noise)).expand(y.shape)
    k = model.covar_module
    Kuu, Kuf, kdiag = k(Z).to_dense(), k(Z, X).to_dense(), k(X, diag=True)
    Q = Kuf.transpose(-1, -2) @ torch.linalg.solve(Kuu, Kuf)
    mean = model._const()  # (out x 1) or a scalar
    mvn = torch.distributions.MultivariateNormal(mean.expand(y.shape), Q + torch.diag_embed(s2))
    trace = ((kdiag - torch.diagonal(Q, dim1=-2, dim2=-1)) / s2).sum(-1)
    return (mvn.log_prob(y) - 0.5 * trace).sum()


@pytest.mark.parametrize("outputs, fixed_noise", [(1, True), (2, False), (2, True)])
def test_one_pass_gaussian_bound_and_gradients_equal_dense_sgpr(outputs, fixed_noise) -> None:
    r"""The Gaussian bound in one pass over the row blocks (:meth:`TSVGP._collapsed_bound`)
    against Titsias' bound written densely, with per-point noise and independent outputs: the
    value and the gradients in every hyperparameter and the inducing inputs."""
    X, Y = _data(300)
    g = torch.Generator().manual_seed(5)
    Y = torch.cat([Y, torch.cos(4 * X[:, :1]) + 0.05 * torch.randn(300, 1, generator=g)], -1)
    Y = Y[:, :outputs]
    Yvar = 0.01 + 0.02 * torch.rand(300, outputs, generator=g, dtype=DT) if fixed_noise else None
    model = _with_blocks(TSVGP(X, Y, train_Yvar=Yvar, inducing_points=24), 70)
    model.fit(max_iter=3)  # hyperparameters away from their defaults
    model.inducing_points.requires_grad_(True)
    assert len(model._row_blocks(300)) >= 5  # the blocked path (narrower with two outputs)
    bound, grads = _bound_and_grads(model)
    model.zero_grad()
    dense = _dense_bound_per_output(model)
    dense.backward()
    torch.testing.assert_close(bound, dense.detach(), rtol=1e-9, atol=1e-9)
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-7, atol=1e-8, msg=name)
    assert "inducing_points" in grads and (fixed_noise or any("noise" in k for k in grads))


def test_gaussian_bound_whitens_each_row_block_once_per_pass() -> None:
    r"""An M-step evaluation (bound and gradient) of a Gaussian model whitens each row block
    once forward and once in the backward recomputation; the general path (a second pass for
    the expected log-likelihood once q is known) whitened each block twice as often."""
    X, Y = _data(400)
    model = _with_blocks(TSVGP(X, Y, inducing_points=M), 100)
    calls = []
    whiten = model._whiten

    def counting(L_K: torch.Tensor, Xb: torch.Tensor) -> torch.Tensor:
        calls.append(Xb.shape[-2])
        return whiten(L_K, Xb)

    model._whiten = counting
    _bound_and_grads(model)
    assert calls == [100] * 8  # four blocks, forward then recomputed in the backward pass


def test_blocked_e_step_and_bernoulli_bound_equal_all_rows() -> None:
    X, Y = _data(500)
    labels = (Y > Y.median()).to(DT)
    blocked = _with_blocks(TSVGP(X, labels, likelihood=Bernoulli(), inducing_points=M), 90)
    whole = _with_blocks(
        TSVGP(X, labels, likelihood=Bernoulli(), inducing_points=M, num_init_e_steps=0), ALL_ROWS
    )
    whole.set_sites(*blocked.sites)  # the same starting sites, then one full-batch E-step each
    for model in (blocked, whole):
        model.e_step(rho=0.6)
    for a, b in zip(blocked.sites, whole.sites, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    (eb, gb), (ew, gw) = _bound_and_grads(blocked), _bound_and_grads(whole)
    torch.testing.assert_close(eb, ew, rtol=1e-12, atol=1e-10)
    for name, g in gw.items():
        torch.testing.assert_close(gb[name], g, rtol=1e-10, atol=1e-10, msg=name)


def _refit_peak_bytes(n: int, rows: int, m: int = 64) -> int:
    """Peak of the running sum of CPU allocations during one refit (L-BFGS, inducing inputs
    learned) of a model holding n points."""
    model = _with_blocks(TSVGP(*_data(n), inducing_points=m), rows)
    return peak_allocated_bytes(lambda: model.fit(max_iter=3))


def test_refit_peak_memory_does_not_grow_with_n() -> None:
    small, large = _refit_peak_bytes(500, 250), _refit_peak_bytes(2000, 250)
    assert large <= 1.2 * small, (small, large)
    # what still grows is O(n) (sites, targets and their few n-vectors in the graph), a few
    # floats per point, not the m = 64 floats per point of an m x n matrix
    assert (large - small) / 1500 <= 16 * 8, (small, large)
    # the measurement sees the working set: all 2,000 rows at once cost several times more
    assert _refit_peak_bytes(2000, ALL_ROWS) > 3 * small
