"""WISKI's ``prior_variance="exact"`` posterior (the SKI posterior plus the diagonal
``k(x, x) - w_x^T K_UU w_x`` at test points) against a dense computation: the dense SKI
posterior of ``wiski_reference`` and the kernel evaluated directly at the test points."""

from __future__ import annotations

import pytest
import torch
from wiski_reference import dense_posterior, grid_kernel

from bo_online.models import WISKI

DT = torch.float64


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a).detach(), torch.as_tensor(b).detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _data(n: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = 0.5 * torch.rand(n, d, generator=g, dtype=DT)  # data in one corner of the box
    Y = torch.sin(4 * X).sum(-1, keepdim=True) + 0.05 * torch.randn(n, 1, generator=g, dtype=DT)
    return X, Y


def _dense_gap(model: WISKI, Xs: torch.Tensor) -> torch.Tensor:
    r"""``k(x, x) + jitter - w_x^T (K_UU + jitter I) w_x`` per test point, from the kernel
    evaluated at the points themselves and dense interpolation weights (one grid)."""
    with torch.no_grad():
        K = grid_kernel(model)
        jitter = K[0, 0] - model.covar_module(model.grid.points()[:1], diag=True).reshape(())
        kss = model.covar_module(Xs, diag=True) + jitter
        W = model.grid.dense_weights(model._features(Xs))
        return (kss - ((W @ K) * W).sum(-1)).clamp_min(0.0)


def _fitted(X, Y, **options):
    model = WISKI(X, Y, grid_size=12, **options)
    model.fit(max_iter=20)
    return model


def test_exact_prior_variance_adds_the_interpolation_gap_to_the_dense_ski_posterior():
    X, Y = _data(30, 2)
    Xs = torch.rand(7, 2, generator=torch.Generator().manual_seed(3), dtype=DT)
    model = _fitted(X, Y, prior_variance="exact")
    mean_ref, cov_ref = dense_posterior(model, X, Y, None, Xs)
    gap = _dense_gap(model, Xs)
    assert float(gap.max()) > 1e-4  # the SKI prior variance really dips between the nodes
    with torch.no_grad():
        post = model.posterior(Xs)
    cov = post.mvn.covariance_matrix / model.outcome_std**2
    assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-9
    assert _rel(cov, cov_ref + torch.diag(gap)) < 1e-9
    # the default keeps the plain SKI posterior (same hyperparameters)
    plain = WISKI(X, Y, grid_size=12)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        cov_plain = plain.posterior(Xs).mvn.covariance_matrix / plain.outcome_std**2
    assert _rel(cov_plain, cov_ref) < 1e-9


def test_far_from_data_the_exact_prior_variance_does_not_favour_grid_nodes():
    r"""Along a line through grid nodes far from the data, the interpolated variance swings
    between nodes; with ``"exact"`` it is the kernel's own variance everywhere (to 1e-6)."""
    X, Y = _data(30, 2)
    model = _fitted(X, Y, prior_variance="exact")
    plain = WISKI(X, Y, grid_size=12)
    plain.load_state_dict(model.state_dict())
    line = torch.stack([torch.linspace(0.8, 1.0, 41, dtype=DT), torch.full((41,), 0.95)], -1)
    with torch.no_grad():
        v_exact = model.posterior(line).variance.squeeze(-1) / model.outcome_std**2
        v_plain = plain.posterior(line).variance.squeeze(-1) / plain.outcome_std**2
        kss = model.covar_module(line[:1], diag=True).reshape(())
    assert float((v_plain.max() - v_plain.min()) / v_plain.max()) > 0.02
    assert float((v_exact - kss).abs().max() / kss) < 1e-3


def test_exact_prior_variance_in_batches_on_the_lazy_path_and_after_conditioning():
    X, Y = _data(30, 2)
    model = _fitted(X, Y, prior_variance="exact")
    g = torch.Generator().manual_seed(4)
    Xb = torch.rand(3, 4, 2, generator=g, dtype=DT)  # b x q x d
    with torch.no_grad():
        cov_b = model.posterior(Xb).mvn.covariance_matrix
        for i in range(3):
            cov_i = model.posterior(Xb[i]).mvn.covariance_matrix
            assert _rel(cov_b[i], cov_i) < 1e-10
        # many points: the lazy root operator; its diagonal and a dense block agree
        Xm = torch.rand(100, 2, generator=g, dtype=DT)
        var_lazy = model.posterior(Xm).variance.squeeze(-1)
        var_dense = torch.cat([model.posterior(Xm[i : i + 10]).variance for i in range(0, 100, 10)])
        assert _rel(var_lazy, var_dense.squeeze(-1)) < 1e-9
    # conditioned on two more points: the dense SKI posterior on all of them plus the same gap
    X2 = torch.rand(2, 2, generator=g, dtype=DT)
    Y2 = torch.sin(4 * X2).sum(-1, keepdim=True)
    cond = model.condition_on_observations(X2, Y2)
    noise = model.likelihood.noise.reshape(()).expand(2)
    Xs = torch.rand(5, 2, generator=g, dtype=DT)
    _, cov_ref = dense_posterior(model, X, Y, None, Xs, extra=(X2, Y2, noise))
    with torch.no_grad():
        cov = cond.posterior(Xs).mvn.covariance_matrix / model.outcome_std**2
    assert _rel(cov, cov_ref + torch.diag(_dense_gap(model, Xs))) < 1e-8


def test_exact_prior_variance_gradient_matches_finite_differences():
    X, Y = _data(30, 2)
    model = _fitted(X, Y, prior_variance="exact")
    x = torch.tensor([[0.71, 0.33]], dtype=DT, requires_grad=True)
    model.posterior(x).variance.sum().backward()
    eps, fd = 1e-6, []
    with torch.no_grad():
        for k in range(2):
            e = torch.zeros(1, 2, dtype=DT)
            e[0, k] = eps
            hi, lo = model.posterior(x + e).variance, model.posterior(x - e).variance
            fd.append(float((hi - lo).sum() / (2 * eps)))
    assert _rel(x.grad.reshape(-1), torch.tensor(fd, dtype=DT)) < 1e-5


def test_additive_model_sums_the_components_gaps():
    r"""All-pairs additive WISKI on 4 inputs: the gap is ``sum_j (k_j(0) - w_j^T K_j w_j)``,
    computed here component by component from each pair's own grid and kernel."""
    X, Y = _data(40, 4)
    model = WISKI(X, Y, projection="all-pairs", prior_variance="exact")
    model.fit(max_iter=10)
    plain = WISKI(X, Y, projection="all-pairs")
    plain.load_state_dict(model.state_dict())
    Xs = torch.rand(6, 4, generator=torch.Generator().manual_seed(5), dtype=DT)
    K_all = grid_kernel(model).detach()
    jitter = (
        K_all[0, 0] - model.covar_module.kernels[0](model.grid.grids[0].points()[:1]).to_dense()
    )
    gap = torch.zeros(6, dtype=DT)
    with torch.no_grad():
        for grid, group, kern in zip(
            model.grid.grids, model.input_groups, model.covar_module.kernels
        ):
            K = kern(grid.points()).to_dense() + jitter.reshape(()) * torch.eye(
                grid.num_points, dtype=DT
            )
            W = grid.dense_weights(Xs[:, group])
            gap += kern(Xs[:, group], diag=True) + jitter.reshape(()) - ((W @ K) * W).sum(-1)
        cov = model.posterior(Xs).mvn.covariance_matrix
        cov_plain = plain.posterior(Xs).mvn.covariance_matrix
    diff = (cov - cov_plain) / model.outcome_std**2
    assert _rel(diff, torch.diag(gap.clamp_min(0.0))) < 1e-8


def test_prior_variance_option_is_checked():
    X, Y = _data(10, 2)
    with pytest.raises(ValueError, match="prior_variance"):
        WISKI(X, Y, prior_variance="dtc")
