r"""WISKI's exact regime with its own kernel (``regime_kernel="ard"``, the loops' default above 6
inputs): while it holds its rows it is BoTorch's ``SingleTaskGP`` (the same kernel, priors and
fit), in ``b x q x d`` batches and for fantasies; its SKI part (structure and learned map) is
derived and fitted when it leaves the regime, which the BO loop does by itself.

References: BoTorch's ``SingleTaskGP`` fitted with ``fit_gpytorch_mll``, or given WISKI's
hyperparameters, GPyTorch's ``ExactMarginalLogLikelihood`` and BoTorch's own
``condition_on_observations``; held out, a constant predictor's error."""

from __future__ import annotations

import pytest
import torch
from botorch.exceptions.warnings import InputDataWarning
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Standardize
from gpytorch.mlls import ExactMarginalLogLikelihood

from bo_online.models.wiski import WISKI
from bo_online.models.wiski.model import LOOP_EXACT_MAX_N

DT = torch.float64
D = 8


def _rosenbrock(X: torch.Tensor) -> torch.Tensor:
    r"""Rosenbrock on ``[-2, 2]^d`` from the unit cube, scaled to O(1) (``n x d`` -> ``n x 1``):
    consecutive inputs interact, which the pairs of WISKI's SKI structure only partly cover."""
    Z = 4 * X - 2
    f = (100 * (Z[:, 1:] - Z[:, :-1] ** 2) ** 2 + (1 - Z[:, :-1]) ** 2).sum(-1)
    return (f / 1e3).unsqueeze(-1)


def _data(n: int, seed: int, d: int = D) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    return X, _rosenbrock(X) + 0.01 * torch.randn(n, 1, generator=g, dtype=DT)


def _rosenbrock7_loop(n_init: int, exact_max_n: int, **options):
    r"""``BayesOptLoop(model="wiski")`` on Rosenbrock 7-D at its defaults but for a small
    ``exact_max_n`` (so that a few steps cross it) and ``options``."""
    from bo_online.loops import BayesOptLoop
    from bo_online.problems import synthetic_problem

    return BayesOptLoop(
        synthetic_problem("rosenbrock", dim=7),
        model="wiski",
        n_init=n_init,
        seed=0,
        model_options={"exact_max_n": exact_max_n},
        quiet=True,
        **options,
    )


def _twin(model: WISKI, X: torch.Tensor, Y: torch.Tensor) -> SingleTaskGP:
    r"""``SingleTaskGP`` with the regime's hyperparameters (its kernel is BoTorch's default)."""
    gp = SingleTaskGP(X, Y, outcome_transform=Standardize(m=1))
    gp.covar_module.load_state_dict(model.regime_covar_module.state_dict())
    gp.likelihood.noise = model.likelihood.noise.detach()
    gp.mean_module.constant.data.fill_(float(model.mean_module.constant.detach()))
    return gp.eval()


def test_loop_defaults_above_six_inputs_hold_botorchs_kernel():
    """Above 6 inputs the loops' WISKI is the exact GP of BoTorch's kernel up to
    ``LOOP_EXACT_MAX_N`` points; a user's ``exact_max_n`` or structure wins; a bad
    ``regime_kernel`` is refused before anything is built."""
    expected = {"projection": "pairs+tanh", "regime_kernel": "ard"}
    assert WISKI.loop_default_options(8) == {**expected, "exact_max_n": LOOP_EXACT_MAX_N}
    assert WISKI.loop_default_options(8, {"exact_max_n": 0}) == expected
    assert "regime_kernel" not in WISKI.loop_default_options(6)
    assert "regime_kernel" not in WISKI.loop_default_options(8, {"projection": "pairs"})
    X, Y = _data(20, seed=0)
    model = WISKI(X, Y, **WISKI.loop_default_options(D))
    assert model.is_exact_gp_on_data()
    assert model.projection.needs_data_init  # derived when the model leaves the regime
    with pytest.raises(ValueError, match="regime_kernel must be 'ski'"):
        WISKI(X, Y, projection="pairs+tanh", exact_max_n=50, regime_kernel="matern")
    # the SKI kernel's regime with a learned map stays refused (its map is fitted on SKI's
    # statistics); with regime_kernel="ard" the map is not used in the regime
    assert not WISKI(X, Y, projection="pairs+tanh", exact_max_n=50).is_exact_gp_on_data()
    assert WISKI(X[:, :2], Y, exact_max_n=50, regime_kernel=" ARD").is_exact_gp_on_data()


def test_fit_and_posterior_are_botorchs_in_b_x_q_x_d_batches():
    """``fit`` in the regime reaches BoTorch's fit from the same defaults (its evidence, and the
    noise; the evidence is flat along some lengthscales, which the two L-BFGS runs leave up to
    20% apart); at WISKI's hyperparameters the posterior (latent and with noise) on ``4 x 3 x 8``
    test points and the posterior of a fantasy-conditioned model equal ``SingleTaskGP``'s."""
    X, Y = _data(30, seed=1)
    model = WISKI(X, Y, **WISKI.loop_default_options(D))
    ski_before = [p.detach().clone() for p in model.covar_module.parameters()]
    with torch.no_grad():
        at_defaults = float(model.marginal_log_likelihood())
    model.fit()
    gp = SingleTaskGP(X, Y, outcome_transform=Standardize(m=1))
    botorch_mll = ExactMarginalLogLikelihood(gp.likelihood, gp)
    fit_gpytorch_mll(botorch_mll)
    gp.train()  # the evidence, not the posterior at the training inputs
    with torch.no_grad():
        reached = float(botorch_mll(gp(X), gp.outcome_transform(Y)[0].squeeze(-1)))
        ours = float(model.marginal_log_likelihood())
    assert abs(ours - reached) < 1e-3 < reached - at_defaults, (ours, reached, at_defaults)
    torch.testing.assert_close(
        model.likelihood.noise.detach(), gp.likelihood.noise.detach(), rtol=1e-2, atol=0
    )
    # the SKI kernel is not what the regime fits
    for before, after in zip(ski_before, model.covar_module.parameters()):
        assert torch.equal(before, after.detach())

    twin = _twin(model, X, Y).train()
    mll = ExactMarginalLogLikelihood(twin.likelihood, twin)
    y_std = twin.outcome_transform(Y)[0].squeeze(-1)
    with torch.no_grad():
        ref_mll = mll(twin(X), y_std)
        torch.testing.assert_close(model.marginal_log_likelihood(), ref_mll, rtol=0, atol=1e-10)
    twin.eval()
    Xt = torch.rand(4, 3, D, generator=torch.Generator().manual_seed(2), dtype=DT)
    with torch.no_grad():
        for noise in (False, True):
            ours = model.posterior(Xt, observation_noise=noise)
            ref = twin.posterior(Xt, observation_noise=noise)
            assert ours.mean.shape == (4, 3, 1)
            torch.testing.assert_close(ours.mean, ref.mean, rtol=0, atol=1e-9)
            torch.testing.assert_close(
                ours.mvn.covariance_matrix, ref.mvn.covariance_matrix, rtol=0, atol=1e-9
            )
        Xf = torch.rand(2, 3, D, generator=torch.Generator().manual_seed(3), dtype=DT)
        Yf = torch.randn(2, 3, 1, generator=torch.Generator().manual_seed(4), dtype=DT)
        twin.posterior(X)  # BoTorch conditions a model whose caches exist
        ours = model.condition_on_observations(Xf, Yf).posterior(Xt[:2])
        ref = twin.condition_on_observations(Xf, Yf).posterior(Xt[:2])
        torch.testing.assert_close(ours.mean, ref.mean, rtol=0, atol=1e-9)
        torch.testing.assert_close(ours.variance, ref.variance, rtol=0, atol=1e-9)


def test_log_prior_in_the_regime_is_that_of_botorchs_kernel_and_noise():
    """In the regime ``log_prior()`` is the log prior of what ``fit`` moves, BoTorch's kernel and
    noise (summed over ``SingleTaskGP``'s registered priors by hand), and what the evidence
    adds; past the regime it is SKI's again (it returned SKI's priors in the regime too)."""
    X, Y = _data(30, seed=5)
    options = {**WISKI.loop_default_options(D), "exact_max_n": 30}
    model = WISKI(X, Y, **options).fit(max_iter=5)
    twin = _twin(model, X, Y)
    by_hand = sum(
        prior.log_prob(closure(module)).sum()
        for _, module, prior, closure, _ in twin.named_priors()
    )
    with torch.no_grad():
        torch.testing.assert_close(model.log_prior(), by_hand, rtol=0, atol=1e-10)
        added = (model.marginal_log_likelihood(True) - model.marginal_log_likelihood(False)) * 30
        torch.testing.assert_close(added, by_hand, rtol=0, atol=1e-9)
    model.update(*_data(2, seed=6))  # 32 points: SKI
    assert not model.is_exact_gp_on_data()
    with torch.no_grad():
        torch.testing.assert_close(model.log_prior(), model._ski_log_prior(), rtol=0, atol=0)
        assert abs(float(model.log_prior() - by_hand)) > 1e-3


def test_a_box_other_than_the_unit_cube_is_scaled_as_botorch_normalizes():
    """Inputs in a box: the regime's kernel sees them scaled to the unit cube, so the posterior
    equals ``SingleTaskGP``'s on the scaled inputs; and in float32 it stays within float32's
    accuracy of float64's."""
    X, Y = _data(25, seed=5)
    bounds = torch.stack([torch.full((D,), -3.0, dtype=DT), torch.full((D,), 5.0, dtype=DT)])
    Xbox = bounds[0] + X * (bounds[1] - bounds[0])
    options = {**WISKI.loop_default_options(D), "bounds": bounds}
    with pytest.warns(InputDataWarning, match="unit cube"):  # (the SKI kernel's prior)
        model = WISKI(Xbox, Y, **options).fit(max_iter=30)
    twin = _twin(model, X, Y)
    Xt = torch.rand(5, D, generator=torch.Generator().manual_seed(6), dtype=DT)
    with torch.no_grad():
        ours = model.posterior(bounds[0] + Xt * (bounds[1] - bounds[0]))
        ref = twin.posterior(Xt)
    torch.testing.assert_close(ours.mean, ref.mean, rtol=0, atol=1e-9)
    torch.testing.assert_close(ours.variance, ref.variance, rtol=0, atol=1e-9)
    with pytest.warns(InputDataWarning, match="unit cube"):
        single = WISKI(Xbox.float(), Y.float(), **{**options, "bounds": bounds.float()})
    single.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    with torch.no_grad():
        low = single.posterior((bounds[0] + Xt * (bounds[1] - bounds[0])).float())
    assert low.mean.dtype == torch.float32
    torch.testing.assert_close(low.mean.double(), ours.mean, rtol=0, atol=1e-3)
    torch.testing.assert_close(low.variance.double(), ours.variance, rtol=0, atol=1e-3)


def test_saved_state_predicts_bit_for_bit():
    X, Y = _data(20, seed=7)
    model = WISKI(X, Y, **WISKI.loop_default_options(D)).fit(max_iter=20)
    loaded = WISKI(X[:3], Y[:3], **WISKI.loop_default_options(D))
    loaded.load_state_dict(model.state_dict())
    Xt = torch.rand(2, 4, D, generator=torch.Generator().manual_seed(8), dtype=DT)
    with torch.no_grad():
        a, b = model.posterior(Xt), loaded.posterior(Xt)
    assert loaded.is_exact_gp_on_data()
    assert torch.equal(a.mean, b.mean)
    assert torch.equal(a.mvn.covariance_matrix, b.mvn.covariance_matrix)


def test_leaving_the_regime_then_fit_projection_gives_a_fitted_ski_model():
    """Past ``exact_max_n`` the rows are dropped; ``fit_projection`` on all data (what the loops
    call) derives the map and fits SKI, which then predicts 250 held-out points of Rosenbrock
    8-D better than a constant and covers >= 80% of them with its 95% interval."""
    X, Y = _data(450, seed=9)
    Xtr, Ytr, Xte, Yte = X[:200], Y[:200], X[200:], Y[200:]
    model = WISKI(Xtr[:30], Ytr[:30], **{**WISKI.loop_default_options(D), "exact_max_n": 40})
    model.fit(max_iter=30)
    model.update(Xtr[30:40], Ytr[30:40])
    assert model.is_exact_gp_on_data() and model.projection.needs_data_init
    model.update(Xtr[40:], Ytr[40:])
    assert not model.is_exact_gp_on_data() and model.num_data == 200
    model.fit_projection(Xtr, Ytr, method="lbfgs", max_iter=60)
    assert not model.projection.needs_data_init and not model.is_exact_gp_on_data()
    with torch.no_grad():
        post = model.posterior(Xte, observation_noise=True)
    mu, sd, y = post.mean.squeeze(-1), post.variance.squeeze(-1).sqrt(), Yte.squeeze(-1)
    rmse = float(((mu - y) ** 2).mean().sqrt())
    assert rmse < 0.8 * float(Ytr.std()), (rmse, float(Ytr.std()))
    assert float(((y - mu).abs() <= 1.96 * sd).double().mean()) >= 0.8


@pytest.mark.parametrize("refit_every", ["auto", 0])
def test_bo_loop_refits_from_defaults_in_the_regime_and_derives_the_map_on_leaving(refit_every):
    """``BayesOptLoop(model="wiski")`` on a 7-D problem at its defaults (with a small
    ``exact_max_n`` so the run crosses it): in the regime every refit rebuilds the exact GP from
    the defaults without deriving the map; the step that leaves the regime refits through
    ``fit_projection``, after which the map is derived and the model is SKI on every point.
    With ``refit_every=0`` (no refits after the initial fit) the model stays the one fitted on
    the initial design until it leaves the regime, and still gets its SKI part's first fit."""
    loop = _rosenbrock7_loop(
        14,
        15,
        optimizer_options={"num_restarts": 2, "raw_samples": 32},
        refit_every=refit_every,
    )
    loop.initialize()
    first = loop.model
    assert first.is_exact_gp_on_data() and first.projection.needs_data_init
    assert loop.model.regime_kernel == "ard"
    loop.step()  # 15 points: still in the regime, rebuilt from the defaults under "auto"
    assert (loop.model is first) == (refit_every == 0) and loop.model.is_exact_gp_on_data()
    assert loop.model.projection.needs_data_init
    loop.step()  # 16 points: left the regime, refit through fit_projection
    assert not loop.model.is_exact_gp_on_data() and loop.model.num_data == 16
    assert not loop.model.projection.needs_data_init
    assert loop.records[-1]["refit"]


def test_a_loop_without_any_fit_budget_still_derives_the_map_on_leaving():
    """``init_fit_max_iter=0, fit_max_iter=0, refit_every=0``: nothing is ever fitted, but the
    map is still derived when the model leaves the regime (the loop missed the leaving, since
    it only noted the regime at a fit, and past 256 points predicted with the random map). The
    model is then the one built by hand on the same data outside the regime, whose constructor
    derives the map, with the default hyperparameters: the same posterior to round-off."""
    loop = _rosenbrock7_loop(
        14,
        15,
        optimizer_options={"num_restarts": 2, "raw_samples": 32},
        refit_every=0,
        init_fit_max_iter=0,
        fit_max_iter=0,
    )
    loop.run(2)  # 16 points: left the regime
    model = loop.model
    assert not model.is_exact_gp_on_data() and not model.projection.needs_data_init
    X, Y = loop._training_data()
    by_hand = WISKI(X, Y, **{**WISKI.loop_default_options(7), "exact_max_n": 15})
    assert not by_hand.projection.needs_data_init
    Xt = torch.rand(5, 3, 7, generator=torch.Generator().manual_seed(3), dtype=DT)
    with torch.no_grad():
        ours, theirs = model.posterior(Xt), by_hand.posterior(Xt)
    torch.testing.assert_close(ours.mean, theirs.mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ours.variance, theirs.variance, rtol=1e-9, atol=1e-9)


def test_a_loaded_state_in_the_regime_leaves_the_map_to_derive():
    """A state saved in the regime holds a map that was never derived (it is derived when the
    model leaves the regime): the model it is loaded into (a resumed loop's, built on the
    initial design) still says so, so leaving the regime through the joint ``fit_projection``
    (a loop's ``refit_from="current"``) derives it first, as for the model that was saved: both
    then predict bit for bit alike. (The loaded copy was marked derived, and its joint fit
    started from the random map.)"""
    X, Y = _data(60, seed=10)
    options = {**WISKI.loop_default_options(D), "exact_max_n": 40}
    model = WISKI(X[:30], Y[:30], **options).fit(max_iter=10)
    loaded = WISKI(X[:12], Y[:12], **options)
    loaded.load_state_dict(model.state_dict())
    assert loaded.is_exact_gp_on_data() and loaded.projection.needs_data_init
    Xt = torch.rand(6, D, generator=torch.Generator().manual_seed(11), dtype=DT)
    posteriors = []
    for m in (model, loaded):
        m.update(X[30:], Y[30:])
        assert not m.is_exact_gp_on_data()
        m.fit_projection(X, Y, joint=True, method="lbfgs", max_iter=5)
        with torch.no_grad():
            posteriors.append(m.posterior(Xt))
    assert torch.equal(posteriors[0].mean, posteriors[1].mean)
    assert torch.equal(posteriors[0].variance, posteriors[1].variance)
    # past the regime the saved map is the derived one, and a loaded copy keeps it
    again = WISKI(X[:12], Y[:12], **options)
    again.load_state_dict(loaded.state_dict())
    assert not again.is_exact_gp_on_data() and not again.projection.needs_data_init


def test_a_state_without_a_regime_kernel_loads_as_the_model_that_saved_it():
    """A saved model's state without ``regime_covar_module`` (a model with
    ``regime_kernel="ski"``: above 6 inputs every state saved before ``"ard"`` became the loops'
    default, which a resumed run loads into a model built with today's defaults) loads, and the
    model goes on as the saved one: no regime with its learned map, the same posterior, and
    after an update and ``fit_projection`` the same model bit for bit. (The load failed: the
    regime kernel's keys were missing.) A load that fails leaves the model's kernel as it
    was."""
    X, Y = _data(40, seed=12)
    saved = WISKI(X[:20], Y[:20], projection="pairs+tanh").fit(max_iter=10)  # as saved before
    loaded = WISKI(X[:12], Y[:12], **WISKI.loop_default_options(D))
    state = saved.state_dict()
    broken = {k: v for k, v in state.items() if k != "mean_module.raw_constant"}
    with pytest.raises(RuntimeError, match="raw_constant"):
        loaded.load_state_dict(broken)
    assert loaded.regime_kernel == "ard" and hasattr(loaded, "regime_covar_module")
    assert loaded.is_exact_gp_on_data()
    loaded.load_state_dict(state)
    assert loaded.regime_kernel == "ski" and not hasattr(loaded, "regime_covar_module")
    assert not loaded.is_exact_gp_on_data() and loaded.state_dict().keys() == state.keys()
    Xt = torch.rand(6, D, generator=torch.Generator().manual_seed(13), dtype=DT)
    for step in ("loaded", "updated and refitted"):
        if step != "loaded":
            for m in (saved, loaded):
                m.update(X[20:], Y[20:])
                m.fit_projection(X, Y, method="lbfgs", max_iter=5)
        assert not loaded.is_exact_gp_on_data()
        with torch.no_grad():
            a, b = saved.posterior(Xt), loaded.posterior(Xt)
        assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance), step


def test_bo_loop_passes_fit_and_fit_projection_each_the_fit_options_it_takes(
    fit_projection_calls,
):
    """A loop's ``fit_options`` may name ``fit_projection``'s settings (``joint``) as well as
    ones both take (``lr``): in the regime of its own kernel WISKI is fitted with ``fit``, which
    gets the latter only (the run failed at its initial fit: "Unknown fit option 'joint'"), so
    the loop's model is the one ``fit`` gives by hand; the step that leaves the regime passes
    ``fit_projection`` its own."""
    calls = fit_projection_calls
    loop = _rosenbrock7_loop(
        10,
        10,
        fit_options={"joint": True, "method": "adam", "lr": 0.03},
        init_fit_max_iter=3,
        fit_max_iter=3,
        acq="ts",
        acq_options={"num_candidates": 16},
    )
    loop.initialize()
    X, Y = loop._training_data()
    by_hand = WISKI(X, Y, **WISKI.loop_default_options(7, {"exact_max_n": 10}), exact_max_n=10)
    by_hand.fit(max_iter=3, method="adam", lr=0.03)
    assert loop.model.is_exact_gp_on_data() and not calls
    Xt = torch.rand(5, 7, generator=torch.Generator().manual_seed(14), dtype=DT)
    with torch.no_grad():
        ours, ref = loop.model.posterior(Xt), by_hand.posterior(Xt)
    assert torch.equal(ours.mean, ref.mean) and torch.equal(ours.variance, ref.variance)
    loop.step()  # 11 points: leaves the regime
    assert not loop.model.is_exact_gp_on_data()
    assert calls == [{"max_iter": 3, "method": "adam", "joint": True, "lr": 0.03}]
