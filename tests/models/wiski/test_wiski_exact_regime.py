r"""WISKI's exact regime: while it holds at most ``exact_max_n`` points it is the exact GP of the
kernel its grid interpolates (posterior, conditioning, evidence and fit), and past it the SKI
model of its statistics, unchanged.

The references are independent: BoTorch's ``SingleTaskGP`` and GPyTorch's
``ExactMarginalLogLikelihood`` on the same data and hyperparameters (one grid), a Gaussian
computed by hand with each component's GPyTorch kernel call (the additive model, whose kernel the
regime writes out), and WISKI with ``exact_max_n=0`` on the same data (past the regime)."""

from __future__ import annotations

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Standardize
from gpytorch.mlls import ExactMarginalLogLikelihood
from memory_profile import peak_allocated_bytes

from bo_online.models.wiski import WISKI
from bo_online.models.wiski.model import LOOP_EXACT_MAX_N

DT = torch.float64


def _data(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(4 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    return X, Y


def _botorch_twin(model: WISKI, X: torch.Tensor, Y: torch.Tensor) -> SingleTaskGP:
    r"""``SingleTaskGP`` (BoTorch's default RBF kernel and priors, ``Standardize``) with WISKI's
    hyperparameters: the same model class as WISKI's exact regime on one grid."""
    gp = SingleTaskGP(X, Y, outcome_transform=Standardize(m=1)).to(DT)
    gp.covar_module.lengthscale = model.covar_module.lengthscale.detach()
    gp.likelihood.noise = model.likelihood.noise.detach()
    gp.mean_module.constant.data.fill_(float(model.mean_module.constant.detach()))
    gp.eval()
    return gp


def test_one_grid_is_botorchs_exact_gp_at_the_same_hyperparameters():
    """Posterior (latent and with noise), batched and for a fantasy, and the marginal
    likelihood with priors equal ``SingleTaskGP``'s at the same hyperparameters."""
    X, Y = _data(25, 2, seed=0)
    model = WISKI(X, Y, exact_max_n=50)
    model.fit(max_iter=20)
    assert model.is_exact_gp_on_data()
    gp = _botorch_twin(model, X, Y)
    Xt = torch.rand(4, 3, 2, dtype=DT)
    with torch.no_grad():
        for noise in (False, True):
            ours, ref = (
                model.posterior(Xt, observation_noise=noise),
                gp.posterior(Xt, observation_noise=noise),
            )
            torch.testing.assert_close(ours.mean, ref.mean, rtol=0, atol=1e-10)
            torch.testing.assert_close(
                ours.mvn.covariance_matrix, ref.mvn.covariance_matrix, rtol=0, atol=1e-10
            )
        # evidence (GPyTorch's ExactMarginalLogLikelihood: log p(y) + log priors, over n)
        gp.train()
        mll = ExactMarginalLogLikelihood(gp.likelihood, gp)
        y_std = gp.outcome_transform(Y)[0].squeeze(-1)
        ref_mll = mll(gp(X), y_std)
        # Standardize's std is the same as WISKI's; log p in standardised units on both sides
        torch.testing.assert_close(model.marginal_log_likelihood(), ref_mll, rtol=0, atol=1e-10)
        gp.eval()
        # conditioning on fantasies: BoTorch's condition_on_observations on the same rows
        Xf, Yf = torch.rand(2, 3, 2, dtype=DT), torch.randn(2, 3, 1, dtype=DT)
        cond = model.condition_on_observations(Xf, Yf)
        gp.posterior(X)  # BoTorch conditions a model whose caches exist
        ref_cond = gp.condition_on_observations(Xf, Yf)  # both take user units
        ours, ref = cond.posterior(Xt[:2]), ref_cond.posterior(Xt[:2])
        torch.testing.assert_close(ours.mean, ref.mean, rtol=0, atol=1e-9)
        torch.testing.assert_close(ours.variance, ref.variance, rtol=0, atol=1e-9)


def test_fit_in_the_regime_reaches_botorchs_fit():
    """From the same defaults, ``fit`` maximises the exact GP's evidence: hyperparameters and
    marginal likelihood of ``SingleTaskGP`` + ``fit_gpytorch_mll`` (smooth data: lengthscales
    far above WISKI's grid-spacing floor, so the two problems are the same)."""
    X, Y = _data(30, 2, seed=1)
    model = WISKI(X, Y, exact_max_n=50).fit()
    gp = SingleTaskGP(X, Y, outcome_transform=Standardize(m=1))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    torch.testing.assert_close(
        model.covar_module.lengthscale.detach(),
        gp.covar_module.lengthscale.detach(),
        rtol=2e-3,
        atol=0,
    )
    torch.testing.assert_close(
        model.likelihood.noise.detach(), gp.likelihood.noise.detach(), rtol=1e-2, atol=0
    )
    assert float(model.covar_module.lengthscale.detach().min()) > 3 * model.lengthscale_floor


@pytest.mark.parametrize("d", [4, 5])
def test_additive_model_is_the_exact_additive_gp(d):
    """The loops' all-pairs model at 4-5 inputs: posterior (dense and lazy, many points), after an
    update and for fantasies, equal to a Gaussian by hand whose kernel is the sum of the
    components' own GPyTorch kernel calls on their pairs of inputs."""
    X, Y = _data(30, d, seed=2)
    model = WISKI(X, Y, **WISKI.loop_default_options(d))
    assert model.exact_max_n == LOOP_EXACT_MAX_N and model.input_groups is not None
    model.fit(max_iter=15)
    Xn, Yn = _data(3, d, seed=3)
    model.update(Xn, Yn)
    Xa, Ya = torch.cat([X, Xn]), torch.cat([Y, Yn])

    def k(A, B):
        return sum(
            kernel(A[:, g], B[:, g]).to_dense()
            for kernel, g in zip(model.covar_module.kernels, model.input_groups)
        )

    def by_hand(Xh, Yh, Xt):
        with torch.no_grad():
            sd, mu = model.outcome_std, model.outcome_mean
            c = model.mean_module.constant
            r = (Yh.squeeze(-1) - mu) / sd - c
            A = k(Xh, Xh) + model.likelihood.noise * torch.eye(len(Xh), dtype=DT)
            Ks = k(Xh, Xt)
            mean = c + Ks.T @ torch.linalg.solve(A, r)
            cov = k(Xt, Xt) - Ks.T @ torch.linalg.solve(A, Ks)
            return mean * sd + mu, cov * sd**2

    with torch.no_grad():
        for q in (5, 80):  # dense covariance, lazy
            Xt = torch.rand(q, d, dtype=DT)
            post = model.posterior(Xt)
            mean, cov = by_hand(Xa, Ya, Xt)
            torch.testing.assert_close(post.mean.squeeze(-1), mean, rtol=0, atol=1e-9)
            torch.testing.assert_close(post.variance.squeeze(-1), cov.diagonal(), rtol=0, atol=1e-9)
            if q == 5:
                torch.testing.assert_close(post.mvn.covariance_matrix, cov, rtol=0, atol=1e-9)
        Xf, Yf = torch.rand(2, 2, d, dtype=DT), torch.randn(2, 2, 1, dtype=DT)
        cond = model.condition_on_observations(Xf, Yf)
        Xt = torch.rand(4, d, dtype=DT)
        post = cond.posterior(Xt)
        for b in range(2):
            mean, cov = by_hand(torch.cat([Xa, Xf[b]]), torch.cat([Ya, Yf[b]]), Xt)
            torch.testing.assert_close(post.mean[b].squeeze(-1), mean, rtol=0, atol=1e-9)
            torch.testing.assert_close(post.mvn.covariance_matrix[b], cov, rtol=0, atol=1e-9)


def test_additive_posterior_at_many_points_costs_memory_linear_in_their_number(monkeypatch):
    """At 6 inputs (15 pairs) the regime's posterior at q points formed the J k x q x q
    differences of every pair at once, about 75 q x q matrices: ``.variance`` at 10,000 points
    needed 60 GB and Thompson sampling over 4,000 candidates 9.6 GB. ``.variance`` now costs
    memory linear in q (twice the points, at most 2.5 times the peak allocation; quadratic is
    4), and the dense covariance, whose differences are formed a block of rows at a time,
    equals a Gaussian by hand with each component's GPyTorch kernel call."""
    from bo_online.models.wiski import exact_regime

    d = 6
    X, Y = _data(20, d, seed=4)
    model = WISKI(X, Y, **WISKI.loop_default_options(d))
    assert model.is_exact_gp_on_data() and len(model.input_groups) == 15
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        model.posterior(X[:2]).variance  # the caches, built outside the measurement
        peaks = []
        for q in (1000, 2000):
            Xt = torch.rand(q, d, generator=g, dtype=DT)
            peaks.append(peak_allocated_bytes(lambda: model.posterior(Xt).variance))
        assert peaks[1] < 2.5 * peaks[0], peaks  # was 2.4 GB at 2,000 points, 4x 1,000's

        def k(A, B):
            return sum(
                kernel(A[:, g], B[:, g]).to_dense()
                for kernel, g in zip(model.covar_module.kernels, model.input_groups)
            )

        sd, mu, c = model.outcome_std, model.outcome_mean, model.mean_module.constant
        A = k(X, X) + model.likelihood.noise * torch.eye(len(X), dtype=DT)
        Xt = torch.rand(90, d, generator=g, dtype=DT)  # q > 64: the lazy covariance
        Ks = k(X, Xt)
        mean = c + Ks.T @ torch.linalg.solve(A, (Y.squeeze(-1) - mu) / sd - c)
        cov = k(Xt, Xt) - Ks.T @ torch.linalg.solve(A, Ks)
        # blocks of 7 rows (7 x 90 x 15 x 2 differences) for the prior and the cross-covariance
        monkeypatch.setattr(exact_regime, "_STACKED_BLOCK_NUMEL", 7 * 90 * 30)
        post = model.posterior(Xt)
        torch.testing.assert_close(post.mean.squeeze(-1), mean * sd + mu, rtol=0, atol=1e-9)
        torch.testing.assert_close(
            post.variance.squeeze(-1), cov.diagonal() * sd**2, rtol=0, atol=1e-9
        )
        torch.testing.assert_close(post.mvn.covariance_matrix, cov * sd**2, rtol=0, atol=1e-9)


@pytest.mark.parametrize("d", [2, 4])
def test_past_exact_max_n_the_model_is_ski_on_its_statistics(d):
    """The update that takes the model past ``exact_max_n`` drops the held rows; the model is
    then WISKI with ``exact_max_n=0`` on the same data and hyperparameters (its statistics were
    kept all along), and a state saved before and loaded after keeps the regime it had."""
    X, Y = _data(20, d, seed=4)
    options = {**WISKI.loop_default_options(d), "exact_max_n": 24, "grid_size": 10}
    model = WISKI(X, Y, **options)
    model.fit(max_iter=10)
    Xn, Yn = _data(4, d, seed=5)
    model.update(Xn, Yn)  # n = 24: still exact
    assert model.is_exact_gp_on_data() and model.exact_X.shape == (24, d)
    saved = model.state_dict()
    Xm, Ym = _data(3, d, seed=6)
    model.update(Xm, Ym)  # n = 27
    assert not model.is_exact_gp_on_data() and model.exact_X is None
    # the same model with SKI from the first point: the same hyperparameters, the same rows
    ski = WISKI(X, Y, **{**options, "exact_max_n": 0})
    names = {name for name, _ in ski.named_parameters()}
    params = {k: v for k, v in model.state_dict().items() if k in names}
    ski.load_state_dict({**params, "outcome_mean": model.outcome_mean}, strict=False)
    ski.load_state_dict({"outcome_std": model.outcome_std}, strict=False)
    ski.update(Xn, Yn)
    ski.update(Xm, Ym)
    Xt = torch.rand(6, d, dtype=DT)
    with torch.no_grad():
        a, b = model.posterior(Xt), ski.posterior(Xt)
        torch.testing.assert_close(a.mean, b.mean, rtol=0, atol=1e-9)
        torch.testing.assert_close(a.variance, b.variance, rtol=0, atol=1e-9)
    loaded = WISKI(X, Y, **options)
    loaded.load_state_dict(saved)
    assert loaded.is_exact_gp_on_data() and loaded.exact_X.shape == (24, d)


def test_loaded_model_predicts_bit_for_bit():
    """A state saved in the regime (after an update, whose factor is bordered) loads into a model
    that predicts bit for bit as the original, without refactorising."""
    X, Y = _data(20, 2, seed=7)
    model = WISKI(X, Y, exact_max_n=40)
    model.fit(max_iter=10)
    model.posterior(torch.rand(2, 2, dtype=DT))
    model.update(*_data(3, 2, seed=8))
    loaded = WISKI(X[:4], Y[:4], exact_max_n=40)
    loaded.load_state_dict(model.state_dict())
    Xt = torch.rand(7, 2, dtype=DT)
    with torch.no_grad():
        a, b = model.posterior(Xt), loaded.posterior(Xt)
    assert torch.equal(a.mean, b.mean)
    assert torch.equal(a.mvn.covariance_matrix, b.mvn.covariance_matrix)


def test_loop_defaults_and_bad_values():
    """The loops' options hold the regime for every structure (above 6 inputs with a kernel of
    its own: test_wiski_ard_regime.py), a user's ``exact_max_n`` wins, and a bad value is
    refused before anything is built."""
    assert WISKI.loop_default_options(2) == {"exact_max_n": LOOP_EXACT_MAX_N}
    assert WISKI.loop_default_options(5)["exact_max_n"] == LOOP_EXACT_MAX_N
    assert "exact_max_n" not in WISKI.loop_default_options(5, {"exact_max_n": 0})
    assert WISKI.loop_default_options(8)["exact_max_n"] == LOOP_EXACT_MAX_N  # (its own kernel)
    X, Y = _data(10, 2, seed=9)
    for bad in (-1, 2.5, "many"):
        with pytest.raises(ValueError, match="exact_max_n"):
            WISKI(X, Y, exact_max_n=bad)
    assert not WISKI(X, Y).is_exact_gp_on_data()  # the class's default: SKI (the paper's)
    tanh = WISKI(torch.rand(10, 5, dtype=DT), Y, projection="tanh", exact_max_n=50)
    assert not tanh.is_exact_gp_on_data()  # a learned map is fitted on SKI's statistics


def _dense_exact_posterior(model: WISKI, Xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Mean and variance (user units, ``q``) at ``Xt`` (``q x d``) of the exact GP on
    ``model``'s held rows, by hand with its GPyTorch kernel (one grid, homoscedastic noise)."""
    with torch.no_grad():
        H, y = model.exact_X, model.exact_y
        sd, mu, c = model.outcome_std, model.outcome_mean, model.mean_module.constant
        r = (y - mu) / sd - c
        A = model.covar_module(H).to_dense() + model.likelihood.noise * torch.eye(len(H), dtype=DT)
        Ks = model.covar_module(H, Xt).to_dense()
        mean = c + Ks.T @ torch.linalg.solve(A, r)
        var = model.covar_module(Xt, diag=True) - (Ks * torch.linalg.solve(A, Ks)).sum(0)
        return mean * sd + mu, var * sd**2


def test_a_float32_state_loaded_into_a_float64_model_refactorises_in_float64():
    """A float32 model's state (its factor of float32 rounding) loaded into a float64 model: the
    float64 model predicts as the exact GP on the loaded rows to float64 round-off, as after
    ``.double()`` (before: it adopted the float32 factor, 1.5e-6 off in the mean)."""
    X, Y = _data(20, 2, seed=10)
    m32 = WISKI(X.float(), Y.float(), exact_max_n=40)
    m32.fit(max_iter=10)
    m64 = WISKI(X[:5], Y[:5], exact_max_n=40)
    m64.load_state_dict(m32.state_dict())
    assert m64.is_exact_gp_on_data() and m64.exact_X.dtype == DT
    Xt = torch.rand(6, 2, dtype=DT)
    mean, var = _dense_exact_posterior(m64, Xt)
    with torch.no_grad():
        post = m64.posterior(Xt)
    torch.testing.assert_close(post.mean.squeeze(-1), mean, rtol=0, atol=1e-10)
    torch.testing.assert_close(post.variance.squeeze(-1), var, rtol=0, atol=1e-10)


def test_a_partial_load_of_a_state_past_the_regime_drops_the_held_rows():
    """A complete state saved past ``exact_max_n`` (statistics, no rows) loaded with
    ``strict=False`` into a model that holds rows: the model is the saved one (SKI on its
    statistics), not the exact GP on its own earlier rows (before: 0.65 off in the mean)."""
    big = WISKI(*_data(60, 2, seed=11), exact_max_n=40)
    big.fit(max_iter=5)
    assert not big.is_exact_gp_on_data()
    small = WISKI(*_data(20, 2, seed=12), exact_max_n=40)
    assert small.is_exact_gp_on_data()
    small.load_state_dict(big.state_dict(), strict=False)
    assert not small.is_exact_gp_on_data() and small.num_data == 60
    Xt = torch.rand(6, 2, dtype=DT)
    with torch.no_grad():
        a, b = small.posterior(Xt), big.posterior(Xt)
    torch.testing.assert_close(a.mean, b.mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(a.variance, b.variance, rtol=0, atol=1e-12)


def test_saving_a_conditioned_model_past_exact_max_n_leaves_it_the_exact_gp():
    """A (non-batched) model conditioned past ``exact_max_n`` is the exact GP on all its rows;
    ``state_dict`` (which folds the pending rows in) must not change what it predicts, and the
    state loads as that model (before: the fold dropped the rows, and the saved model and the
    loaded one were SKI, 3e-4 off in the mean)."""
    X, Y = _data(20, 2, seed=13)
    model = WISKI(X, Y, exact_max_n=22)
    model.fit(max_iter=5)
    cond = model.condition_on_observations(*_data(5, 2, seed=14))
    Xt = torch.rand(6, 2, dtype=DT)
    with torch.no_grad():
        before = cond.posterior(Xt)
    saved = cond.state_dict()
    assert cond.is_exact_gp_on_data() and cond.exact_X.shape == (25, 2)
    mean, var = _dense_exact_posterior(cond, Xt)
    loaded = WISKI(X[:4], Y[:4], exact_max_n=22)
    loaded.load_state_dict(saved)
    with torch.no_grad():
        for post in (cond.posterior(Xt), loaded.posterior(Xt)):
            torch.testing.assert_close(post.mean, before.mean, rtol=0, atol=1e-12)
            torch.testing.assert_close(post.variance, before.variance, rtol=0, atol=1e-12)
            torch.testing.assert_close(post.mean.squeeze(-1), mean, rtol=0, atol=1e-10)
            torch.testing.assert_close(post.variance.squeeze(-1), var, rtol=0, atol=1e-10)
    # the next update takes it past exact_max_n, as an update of the model it was built on
    cond.update(*_data(1, 2, seed=15))
    assert not cond.is_exact_gp_on_data() and cond.num_data == 26
