r"""TSVGP's sums over the stored points in row blocks: the same bound, gradients, sites and fit as
all rows at once (and as dense SGPR), and a refit whose peak memory does not grow with n.

Peak memory is read from the torch profiler's CPU allocation events while a refit (or a bound and
its gradient) runs; the sites themselves (O(n) floats) are the only part allowed to grow.
"""

from __future__ import annotations

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
