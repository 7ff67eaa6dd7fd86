"""QSGP while it holds at most ``exact_max_n`` points (default m): the exact GP of its kernel, at
more than 3 inputs, against Gaussian conditioning computed densely by hand with the model's own
hyperparameters, and its fit against BoTorch's ``SingleTaskGP``; past ``exact_max_n`` it carries
on in weight space, equal to a model that never left it."""

from __future__ import annotations

import warnings

import pytest
import torch

from bo_online.models import QSGP

DT = torch.float64
D = 6


def _data(n: int, seed: int = 0, d: int = D) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    y = torch.sin(3 * X).sum(-1) + X[:, 0] * X[:, 1] + 0.05 * torch.randn(n, generator=g, dtype=DT)
    return X, y.unsqueeze(-1)


def _model(n: int = 40, **kw) -> QSGP:
    X, Y = _data(n)
    model = QSGP(X, Y, **kw)
    with torch.no_grad():  # hyperparameters away from the defaults, set by hand
        model.basis.kernel.base_kernel.lengthscale = torch.linspace(0.4, 1.4, D, dtype=DT)
        model.likelihood.noise = 0.02
        model.mean_constant.fill_(0.3)
    return model


def _dense(model: QSGP, X: torch.Tensor, y: torch.Tensor, noise: torch.Tensor, Xs: torch.Tensor):
    r"""Mean (user units) and covariance (user units) at ``Xs`` of the exact GP with the model's
    kernel, noise and constant mean on ``(X, y)`` (``y`` in user units), by hand."""
    k = model.basis.kernel
    sd, mu = model.outcome_std, model.outcome_mean
    c = model.mean_constant
    ys = (y.reshape(-1) - mu) / sd
    with torch.no_grad():
        K = k(X).to_dense() + torch.diag(noise.expand(X.shape[0]))
        Ks = k(Xs, X).to_dense()
        mean = c + Ks @ torch.linalg.solve(K, ys - c)
        cov = k(Xs).to_dense() - Ks @ torch.linalg.solve(K, Ks.T)
    return mean * sd + mu, cov * sd**2


def _noise(model: QSGP) -> torch.Tensor:
    return model.likelihood.noise.detach().reshape(())


def test_posterior_is_the_exact_gp_of_the_kernel_at_six_inputs():
    model = _model()
    assert model.exact_max_n == model.num_features == 512 and model.is_exact_gp_on_data()
    X, Y = _data(40)
    Xs = torch.rand(7, D, generator=torch.Generator().manual_seed(1), dtype=DT)
    mean, cov = _dense(model, X, Y, _noise(model), Xs)
    with torch.no_grad():
        post = model.posterior(Xs)
        torch.testing.assert_close(post.mean.squeeze(-1), mean, atol=1e-9, rtol=0)
        torch.testing.assert_close(post.covariance_matrix, cov, atol=1e-9, rtol=0)
        # the weight-space posterior of the same model differs (512 random features)
        model._exact_max_n = 0
        far = model.posterior(Xs).mean.squeeze(-1)
    assert float((far - mean).abs().max()) > 1e-3


def test_many_points_predict_and_a_batch_of_candidate_sets():
    model = _model()
    X, Y = _data(40)
    Xs = torch.rand(600, D, generator=torch.Generator().manual_seed(2), dtype=DT)
    mean, cov = _dense(model, X, Y, _noise(model), Xs)
    with torch.no_grad():
        post = model.posterior(Xs)  # 600 > dense_posterior_max_q: a lazy covariance
        torch.testing.assert_close(post.variance.squeeze(-1), cov.diagonal(), atol=1e-9, rtol=0)
        torch.testing.assert_close(post.mean.squeeze(-1), mean, atol=1e-9, rtol=0)
        p_mean, p_var = model.predict(Xs, batch_size=128)
        torch.testing.assert_close(p_mean, mean, atol=1e-9, rtol=0)
        torch.testing.assert_close(p_var, cov.diagonal(), atol=1e-9, rtol=0)
        batch = model.posterior(Xs[:12].reshape(4, 3, D))  # b x q x d
        torch.testing.assert_close(batch.mean.reshape(-1), mean[:12], atol=1e-9, rtol=0)
        torch.testing.assert_close(batch.covariance_matrix[2], cov[6:9, 6:9], atol=1e-9, rtol=0)


def test_conditioning_update_and_a_chain_equal_dense_conditioning():
    model = _model()
    X, Y = _data(40)
    g = torch.Generator().manual_seed(3)
    Xn, Yn = torch.rand(3, D, generator=g, dtype=DT), torch.randn(3, 1, generator=g, dtype=DT)
    Xm, Ym = torch.rand(2, D, generator=g, dtype=DT), torch.randn(2, 1, generator=g, dtype=DT)
    Xs = torch.rand(5, D, generator=g, dtype=DT)
    mean, cov = _dense(model, torch.cat([X, Xn, Xm]), torch.cat([Y, Yn, Ym]), _noise(model), Xs)
    with torch.no_grad():
        child = model.condition_on_observations(Xn, Yn).condition_on_observations(Xm, Ym)
        assert child.num_data == 45 and child.is_exact_gp_on_data()
        post = child.posterior(Xs)
        torch.testing.assert_close(post.mean.squeeze(-1), mean, atol=1e-9, rtol=0)
        torch.testing.assert_close(post.covariance_matrix, cov, atol=1e-9, rtol=0)
        model.update(Xn, Yn).update(Xm, Ym)  # in place: the factor bordered twice
        post = model.posterior(Xs)
        torch.testing.assert_close(post.mean.squeeze(-1), mean, atol=1e-9, rtol=0)
        torch.testing.assert_close(post.covariance_matrix, cov, atol=1e-9, rtol=0)
        # the bordered caches equal those rebuilt from scratch
        model.__dict__["_kernel_cache"] = None
        torch.testing.assert_close(model.posterior(Xs).mean.squeeze(-1), mean, atol=1e-9, rtol=0)


def test_fantasies_equal_dense_conditioning_and_shared_points_form_no_per_candidate_covariance():
    from botorch.sampling import SobolQMCNormalSampler
    from memory_profile import LargestAllocation

    model = _model()
    X, Y = _data(40)
    g = torch.Generator().manual_seed(4)
    s, b, q, k = 2, 64, 2, 48
    Xf = torch.rand(b, q, D, generator=g, dtype=DT)
    Xs = torch.rand(k, D, generator=g, dtype=DT)
    with torch.no_grad():
        fm = model.fantasize(Xf, SobolQMCNormalSampler(torch.Size([s]), seed=0))
        fm.posterior(Xs[:2]).variance  # caches built outside the measurement
        with LargestAllocation() as largest:
            var = fm.posterior(Xs).variance
        assert var.shape == (s, b, k, 1)
        assert largest.numel < b * k * k // 4, (largest.numel, b * k * k)
        post = fm.posterior(Xs)
        Yf = fm.train_targets[..., -q:]  # s x b x q, user units
    for i, j in ((0, 0), (s - 1, b - 1), (1, 40)):
        mean, cov = _dense(
            model, torch.cat([X, Xf[j]]), torch.cat([Y.reshape(-1), Yf[i, j]]), _noise(model), Xs
        )
        torch.testing.assert_close(post.mean[i, j].squeeze(-1), mean, atol=1e-9, rtol=0)
        torch.testing.assert_close(var[i, j].squeeze(-1), cov.diagonal(), atol=1e-9, rtol=0)


def test_hyperparameters_changed_by_hand_rebuild_the_caches():
    model = _model()
    X, Y = _data(40)
    Xs = torch.rand(4, D, generator=torch.Generator().manual_seed(5), dtype=DT)
    with torch.no_grad():
        model.posterior(Xs)
        model.basis.kernel.base_kernel.lengthscale = torch.full((D,), 0.7, dtype=DT)
        model.likelihood.noise = 0.1
        mean, cov = _dense(model, X, Y, _noise(model), Xs)
        post = model.posterior(Xs)
    torch.testing.assert_close(post.mean.squeeze(-1), mean, atol=1e-9, rtol=0)
    torch.testing.assert_close(post.covariance_matrix, cov, atol=1e-9, rtol=0)


def test_past_exact_max_n_the_model_carries_on_in_weight_space():
    r"""An update that takes the model past ``exact_max_n`` leaves the kernel regime: from
    then on its posterior equals that of the same model kept in weight space throughout."""
    kernel_first, weight_space = _model(exact_max_n=41), _model(exact_max_n=0)
    g = torch.Generator().manual_seed(6)
    Xn, Yn = torch.rand(3, D, generator=g, dtype=DT), torch.randn(3, 1, generator=g, dtype=DT)
    Xs = torch.rand(5, D, generator=g, dtype=DT)
    with torch.no_grad():
        for model in (kernel_first, weight_space):
            model.set_optimal_variational()
            model.invalidate_caches()
        assert kernel_first.is_exact_gp_on_data() and not weight_space.is_exact_gp_on_data()
        kernel_first.update(Xn[:1], Yn[:1])  # 41 points: still the exact GP
        assert kernel_first.is_exact_gp_on_data()
        kernel_first.update(Xn[1:], Yn[1:])
        weight_space.update(Xn, Yn)
        assert not kernel_first.is_exact_gp_on_data()
        a, b = kernel_first.posterior(Xs), weight_space.posterior(Xs)
    torch.testing.assert_close(a.mean, b.mean, atol=1e-9, rtol=0)
    torch.testing.assert_close(a.covariance_matrix, b.covariance_matrix, atol=1e-9, rtol=0)


def test_sample_paths_have_the_exact_gps_moments():
    model = _model()
    X, Y = _data(40)
    Xs = torch.rand(4, D, generator=torch.Generator().manual_seed(7), dtype=DT)
    mean, cov = _dense(model, X, Y, _noise(model), Xs)
    with torch.no_grad():
        paths = model.sample_paths(4000, generator=torch.Generator().manual_seed(8))
        draws = paths(Xs)  # 4000 x 4
        torch.testing.assert_close(paths(Xs), draws, atol=0, rtol=0)  # deterministic
    sd = cov.diagonal().sqrt()
    # Monte Carlo: the mean (the exact GP's: the update is exact) within 5 standard errors; the
    # variance within 25% (Monte Carlo 2%; the prior draws come from 512 random features, so the
    # paths' covariance is the exact GP's only approximately: 1-16% off here)
    assert bool(((draws.mean(0) - mean).abs() < 5 * sd / 4000**0.5).all())
    assert bool(((draws.var(0) / cov.diagonal() - 1).abs() < 0.25).all())


def test_default_fit_is_singletaskgps_at_a_hundred_points_in_six_dimensions():
    r"""At n = 100 (past m / 8, where the weight-space fit would take the basis's evidence) the
    default fit maximises the exact GP's evidence, as ``SingleTaskGP``'s fit: the same
    hyperparameters and the same predictions on held-out points."""
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.outcome import Standardize
    from gpytorch.mlls import ExactMarginalLogLikelihood

    X, Y = _data(100, seed=9)
    model = QSGP(X, Y).fit()
    ref = SingleTaskGP(X, Y, outcome_transform=Standardize(m=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_gpytorch_mll(ExactMarginalLogLikelihood(ref.likelihood, ref))
    ref.eval()
    ls = model.basis.kernel.base_kernel.lengthscale.detach().reshape(-1)
    torch.testing.assert_close(
        ls, ref.covar_module.lengthscale.detach().reshape(-1), rtol=0.03, atol=0
    )
    Xs = torch.rand(200, D, generator=torch.Generator().manual_seed(10), dtype=DT)
    with torch.no_grad():
        a, b = model.posterior(Xs), ref.posterior(Xs)
    spread = float(Y.std())
    assert float((a.mean - b.mean).abs().max()) < 0.01 * spread
    assert float((a.variance.sqrt() - b.variance.sqrt()).abs().max()) < 0.01 * spread


def test_the_kernel_regime_is_for_an_rff_basis_with_a_gaussian_likelihood():
    X, Y = _data(20)
    assert not QSGP(X, Y, basis="inducing").is_exact_gp_on_data()
    assert not QSGP(X, (Y > 0).to(DT), likelihood="logistic").is_exact_gp_on_data()
    assert not QSGP(X, Y, num_features=16).is_exact_gp_on_data()  # 20 > m
    assert QSGP(X, Y, num_features=16, exact_max_n=20).is_exact_gp_on_data()
    assert QSGP(X, Y, num_features=4096).exact_max_n == 2048
    for bad in (-1, 2.5, "10"):
        with pytest.raises((ValueError, TypeError), match="exact_max_n"):
            QSGP(X, Y, exact_max_n=bad)


def test_state_dict_round_trip_and_float32():
    model = _model()
    g = torch.Generator().manual_seed(11)
    Xn, Yn = torch.rand(2, D, generator=g, dtype=DT), torch.randn(2, 1, generator=g, dtype=DT)
    Xs = torch.rand(5, D, generator=g, dtype=DT)
    with torch.no_grad():
        model.update(Xn, Yn)
        expected = model.posterior(Xs)
        fresh = QSGP(*_data(40))
        fresh.load_state_dict(model.state_dict())
        got = fresh.posterior(Xs)
        torch.testing.assert_close(got.mean, expected.mean, atol=1e-9, rtol=0)
        torch.testing.assert_close(
            got.covariance_matrix, expected.covariance_matrix, atol=1e-9, rtol=0
        )
        model.float()
        low = model.posterior(Xs.float())
    assert low.mean.dtype == torch.float32
    torch.testing.assert_close(low.mean.double(), expected.mean, atol=1e-3, rtol=0)


def test_a_conditioned_model_of_a_conditioned_model_borders_without_copying_the_factor():
    r"""A chain of conditionings over a batch of candidate sets (multi-step lookahead's pattern):
    the grandchild keeps its parent's borders and adds its own, so no ``b x N x N`` factor is
    formed (it was: 1 GB at n = 500, 256 + 256 points), and its posterior equals dense
    conditioning on all rows per batch element."""
    from memory_profile import LargestAllocation

    model = _model(200)
    X, Y = _data(200)
    g = torch.Generator().manual_seed(12)
    b, p, k = 64, 2, 5
    X1, Y1 = torch.rand(b, p, D, generator=g, dtype=DT), torch.randn(b, p, 1, generator=g, dtype=DT)
    X2, Y2 = torch.rand(b, p, D, generator=g, dtype=DT), torch.randn(b, p, 1, generator=g, dtype=DT)
    Xs = torch.rand(k, D, generator=g, dtype=DT)
    with torch.no_grad():
        child = model.condition_on_observations(X1, Y1)
        with LargestAllocation() as largest:
            grandchild = child.condition_on_observations(X2, Y2)
            post = grandchild.posterior(Xs)
            var = post.variance
    N = 200 + 2 * p  # the weight-space state's b x m x 2p terms (131,072) stay below b N^2 / 4
    assert largest.numel < b * N * N // 4, (largest.numel, b * N * N)
    for j in (0, 37, b - 1):
        rows, ys = torch.cat([X, X1[j], X2[j]]), torch.cat([Y, Y1[j], Y2[j]])
        mean, cov = _dense(model, rows, ys, _noise(model), Xs)
        torch.testing.assert_close(post.mean[j].squeeze(-1), mean, atol=1e-9, rtol=0)
        torch.testing.assert_close(var[j].squeeze(-1), cov.diagonal(), atol=1e-9, rtol=0)
