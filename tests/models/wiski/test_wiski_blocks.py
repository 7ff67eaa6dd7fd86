r"""WISKI's statistics rebuilt from stored rows in blocks (``fit_projection``, the loops' refit
above 3 inputs): the same statistics, objective, gradients and fit as all rows at once (and as the
dense additive SKI reference), and a refit whose peak memory does not grow with n.

Peak memory is read from the torch profiler's CPU allocation events while a refit runs.
"""

from __future__ import annotations

import torch
from memory_profile import peak_allocated_bytes
from test_wiski_additive import _data, _dense_posterior_and_mll, _rel

from bo_online.models import WISKI

DT = torch.float64
ALL_ROWS = 2**40  # statistics_block_rows large enough for one block: the unblocked path


def _refit(n: int, rows: int, max_iter: int = 8) -> tuple[WISKI, torch.Tensor, torch.Tensor]:
    X, Y = _data(n)
    model = WISKI(X[:40], Y[:40], projection="pairs+tanh", grid_size=12)
    model.statistics_block_rows = rows
    model.fit_projection(X, Y, method="lbfgs", max_iter=max_iter)
    return model, X, Y


def _objective_and_grads(model: WISKI) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    mll = model.marginal_log_likelihood(include_priors=True)
    mll.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return mll.detach(), grads


def test_blocked_statistics_objective_and_gradients_equal_all_rows_and_dense() -> None:
    blocked, X, Y = _refit(700, 128)  # five full blocks of 128 and a rest of 60
    whole, _, _ = _refit(700, ALL_ROWS)
    for (name, p), q in zip(blocked.named_parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-8, atol=1e-10, msg=name)
    ours, ref = blocked.statistics(), whole.statistics()
    for name in ours:
        assert _rel(ours[name], ref[name]) < 1e-12, name
    # the same statistics as the all-rows rebuild on the blocked model's own (final) map
    zero = blocked._zero_statistics()
    y = Y.squeeze(-1)
    blocked.statistics_block_rows = ALL_ROWS
    blocked._set_statistics(X, torch.ones_like(y), y, zero)
    rebuilt = blocked.statistics()
    for name in ours:
        assert _rel(ours[name], rebuilt[name]) < 1e-12, name
    blocked.statistics_block_rows = 128
    blocked._set_statistics(X, torch.ones_like(y), y, zero)
    (ob, gb), (ow, gw) = _objective_and_grads(blocked), _objective_and_grads(whole)
    torch.testing.assert_close(ob, ow, rtol=1e-12, atol=1e-10)
    assert gb.keys() == gw.keys() and len(gb) > 4
    for name, g in gw.items():
        torch.testing.assert_close(gb[name], g, rtol=1e-10, atol=1e-10, msg=name)
    # and the objective is the dense additive SKI marginal likelihood of all 700 points
    Xs = torch.rand(7, 5, generator=torch.Generator().manual_seed(3), dtype=DT)
    mean_ref, cov_ref, mll_ref = _dense_posterior_and_mll(blocked, X, Y, Xs)
    with torch.no_grad():
        assert _rel(blocked.marginal_log_likelihood(include_priors=False), mll_ref) < 1e-9
        post = blocked.posterior(Xs)
    assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-9
    assert _rel(post.mvn.covariance_matrix / blocked.outcome_std**2, cov_ref) < 1e-9


def _refit_peak_bytes(n: int, rows: int) -> int:
    """Peak of the running sum of CPU allocations during one refit (``fit_projection`` as the
    loops call it) of an additive + projection WISKI holding n points."""
    X, Y = _data(n)
    model = WISKI(X[:40], Y[:40], projection="pairs+tanh", grid_size=12)
    model.statistics_block_rows = rows
    # the map's exact GP on a fixed subsample of at most 400 points is the same at every n and
    # dominates the time; keep the map (its batch norm still set on all rows) to keep this fast
    projection = model.projection
    projection.init_from_data = lambda X, y: projection.set_normalization(X)
    return peak_allocated_bytes(lambda: model.fit_projection(X, Y, method="lbfgs", max_iter=3))


def test_refit_peak_memory_does_not_grow_with_n() -> None:
    small, large = _refit_peak_bytes(500, 250), _refit_peak_bytes(3000, 250)
    assert large <= 1.2 * small, (small, large)
    # the measurement sees the working set: all 3,000 rows' weights at once cost far more
    assert _refit_peak_bytes(3000, ALL_ROWS) > 2 * large, (large,)
