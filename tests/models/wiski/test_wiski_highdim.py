"""WISKI above three inputs: the loops' default (every pair of inputs), the learned projection to 2
features, held-out accuracy and calibration against the data's spread, exact
conditioning for the projected model, and the projection shorthand strings."""

from __future__ import annotations

import pytest
import torch
from botorch.test_functions import Hartmann, StyblinskiTang
from wiski_reference import dense_posterior

from bo_online.models import WISKI
from bo_online.models.wiski.additive import input_groups
from bo_online.models.wiski.model import LOOP_EXACT_MAX_N
from bo_online.models.wiski.projection import TanhProjection, make_projection

DT = torch.float64


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a).detach(), torch.as_tensor(b).detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _split(f, dim: int, n: int, n_test: int = 300, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n + n_test, dim, generator=g, dtype=DT)
    Y = f(X).unsqueeze(-1)
    return X[:n], Y[:n], X[n:], Y[n:]


def _heldout(model, Xte, Yte):
    """RMSE and the fraction of held-out values inside the 95% predictive interval (noise
    included), both from the model's posterior in user units."""
    with torch.no_grad():
        post = model.posterior(Xte, observation_noise=True)
    mu, sd = post.mean.squeeze(-1), post.variance.squeeze(-1).sqrt()
    y = Yte.squeeze(-1)
    return float(((mu - y) ** 2).mean().sqrt()), float(
        ((y - mu).abs() <= 1.96 * sd).double().mean()
    )


@pytest.mark.parametrize("structure", ["default", "pairs+tanh", "tanh:2"])
@pytest.mark.parametrize(
    "name, f, dim",
    [
        ("hartmann6", Hartmann(dim=6), 6),
        ("styblinskitang4", lambda x: StyblinskiTang(dim=4)(10 * x - 5), 4),
    ],
)
def test_default_projection_beats_a_constant_and_is_calibrated(name, f, dim, structure):
    r"""200 seeded points in the unit cube, WISKI with the loops' default for 4-6 inputs
    (``projection="all-pairs"`` with ``prior_variance="exact"``, see ``loop_default_options``),
    with their default above 6 inputs (``"pairs+tanh"``) and with the learned projection
    ``projection="tanh:2"``, ``fit()``: held-out RMSE below the training data's standard
    deviation (a constant predictor's error) and the 95% predictive interval covering >= 80% of
    300 held-out values (not overconfident)."""
    Xtr, Ytr, Xte, Yte = _split(f, dim, 200)
    if structure == "default":
        model = WISKI(Xtr, Ytr, **{**WISKI.loop_default_options(dim), "exact_max_n": 0})
        assert model.input_groups == input_groups("all-pairs", dim)
        assert not hasattr(model, "projection") and model.prior_variance == "exact"
    elif structure == "pairs+tanh":
        model = WISKI(Xtr, Ytr, projection=structure)
        assert model.input_groups == [[i, i + 1] for i in range(0, dim, 2)]
        assert isinstance(model.projection, TanhProjection)
        assert len(model.grid.grids) == dim // 2 + 1
    else:
        model = WISKI(Xtr, Ytr, grid_size=20, projection=structure)
        assert isinstance(model.projection, TanhProjection) and model.num_features == 2
    model.fit(max_iter=60)
    rmse, coverage = _heldout(model, Xte, Yte)
    assert rmse < float(Ytr.std()), (name, rmse, float(Ytr.std()))
    assert coverage >= 0.8, (name, coverage)


def test_fit_projection_rederives_the_map_and_stays_calibrated():
    r"""The loop's refit path (``fit_projection`` on all raw data, default: map from data, kernel
    fitted on the rebuilt statistics) keeps the Hartmann6 guarantees and moves the map."""
    Xtr, Ytr, Xte, Yte = _split(Hartmann(dim=6), 6, 200)
    model = WISKI(Xtr[:40], Ytr[:40], grid_size=20, projection="tanh")
    W0 = model.projection.linear.weight.detach().clone()
    model.update(Xtr[40:], Ytr[40:])
    model.fit_projection(Xtr, Ytr, method="lbfgs", max_iter=60)
    assert not torch.allclose(model.projection.linear.weight, W0)
    rmse, coverage = _heldout(model, Xte, Yte)
    assert rmse < float(Ytr.std()) and coverage >= 0.8, (rmse, coverage)


def test_update_of_a_projected_model_equals_the_dense_rebuild():
    r"""After ``fit_projection`` and then ``update`` with new points, the statistics equal those of
    a WISKI built from scratch on all data with the same (fixed) projection and hyperparameters,
    and the posterior equals the dense SKI posterior on the projected features, to 1e-9."""
    X, Y, Xt, _ = _split(Hartmann(dim=6), 6, 90, n_test=7, seed=3)
    model = WISKI(X[:50], Y[:50], grid_size=12, projection="tanh")
    model.fit_projection(X[:50], Y[:50], method="lbfgs", max_iter=15)
    model.update(X[50:70], Y[50:70])
    model.update(X[70:], Y[70:])
    scratch = WISKI(
        X,
        Y,
        projection=model.projection,
        grid_size=12,
        covar_module=model.covar_module,
        likelihood=model.likelihood,
    )
    ours, ref = model.statistics(), scratch.statistics()
    for name in ours:
        assert _rel(ours[name], ref[name]) < 1e-9, name
    mean_ref, cov_ref = dense_posterior(model, X, Y, None, Xt)
    post = model.posterior(Xt)
    assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-9
    assert _rel(post.mvn.covariance_matrix / model.outcome_std**2, cov_ref) < 1e-9


def test_projection_shorthand_strings_and_error_hint():
    X, Y, _, _ = _split(Hartmann(dim=6), 6, 30, n_test=1)
    assert WISKI(X, Y, projection="tanh:1", grid_size=16).num_features == 1
    assert WISKI(X, Y, projection="tanh", grid_size=10).num_features == 2
    assert make_projection(None, 6) is None and make_projection("none", 6) is None
    with pytest.raises(ValueError, match="must be 1, 2 or 3"):
        WISKI(X, Y, projection="tanh:4")
    with pytest.raises(ValueError, match="projection must be"):
        WISKI(X, Y, projection="pca")
    for spec in (None, "none"):
        with pytest.raises(ValueError, match="projection='tanh'") as err:
            WISKI(X, Y, projection=spec)
        assert "k=2" not in str(err.value) and "out_dim=2" in str(err.value)
    all_pairs = {"projection": "all-pairs", "prior_variance": "exact", "grid_size": 12}
    all_pairs["exact_max_n"] = LOOP_EXACT_MAX_N  # the exact regime at small n, every structure
    assert WISKI.loop_default_options(4) == WISKI.loop_default_options(6) == all_pairs
    assert WISKI.loop_default_options(7) == {
        "projection": "pairs+tanh",
        "regime_kernel": "ard",
        "exact_max_n": LOOP_EXACT_MAX_N,
    }
    assert WISKI.loop_default_options(3) == {"exact_max_n": LOOP_EXACT_MAX_N}
    # the hint's suggestions work
    assert WISKI(X, Y, projection=TanhProjection(6, out_dim=2), grid_size=10).num_features == 2


def test_loop_gives_wiski_a_projection_above_three_inputs_by_default():
    r"""``BayesOptLoop(model="wiski")`` on a 6-D problem needs no options: the loop adds
    ``loop_default_options`` (the additive model over every pair of inputs, fully online); a
    user's own ``projection`` wins, and with a learned projection the initial fit is the
    ``fit_projection`` path on the loop's data."""
    from bo_online.loops import BayesOptLoop
    from bo_online.problems import synthetic_problem

    def initialized(**options):
        loop = BayesOptLoop(
            synthetic_problem("hartmann6"),
            model="wiski",
            n_init=12,
            seed=0,
            model_options={"grid_size": 10, **options},
            fit_max_iter=5,
            init_fit_max_iter=5,
        )
        loop.initialize()
        return loop

    loop = initialized()
    assert loop.model.input_groups == input_groups("all-pairs", 6)
    assert not hasattr(loop.model, "projection") and loop.model.prior_variance == "exact"
    assert loop.config["model_options"] == {"grid_size": 10}  # the default is not stored
    loop = initialized(projection="pairs+tanh")
    assert loop.model.input_groups == [[0, 1], [2, 3], [4, 5]]
    assert isinstance(loop.model.projection, TanhProjection)
    assert loop.model.projection.out_dim == 2 and not loop.model.projection.needs_data_init
    loop = initialized(projection="tanh")
    assert isinstance(loop.model.projection, TanhProjection)
    assert loop.model.projection.out_dim == 2 and not loop.model.projection.needs_data_init
    loop = initialized(projection="tanh:1")
    assert loop.model.num_features == 1


def test_a_structure_named_by_the_user_gets_its_own_constructor_defaults():
    r"""The all-pairs defaults (``grid_size=12``, ``prior_variance="exact"``) belong to the
    default structure: a loop given ``additive`` groups or a ``projection`` builds the model a
    direct ``WISKI(X, Y, <that option>)`` gives -- the same grid and the same posterior -- and
    ``additive`` is not refused for clashing with the default ``projection``."""
    from bo_online.loops import BayesOptLoop
    from bo_online.problems import synthetic_problem

    regime = {"exact_max_n": LOOP_EXACT_MAX_N}  # not the structure's: it stays
    assert WISKI.loop_default_options(5, {"projection": "tanh:2"}) == regime
    assert WISKI.loop_default_options(5, {"additive": [[0, 1], [2, 3]]}) == regime
    assert WISKI.loop_default_options(5, {"grid_size": 8})["projection"] == "all-pairs"
    for options in ({"additive": [[0, 2], [1, 3]]}, {"projection": "tanh:2"}):
        loop = BayesOptLoop(
            synthetic_problem("styblinskitang", dim=4),
            model="wiski",
            n_init=10,
            seed=0,
            model_options=options,
            refit_every=0,
        )
        X = torch.rand(10, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        Y = (X - 0.3).pow(2).sum(-1, keepdim=True)
        built = loop._build_model(X, Y)
        direct = WISKI(X, Y, **options, **WISKI.loop_default_options(4, options))
        assert built.num_grid_points == direct.num_grid_points
        assert built.prior_variance == direct.prior_variance
        Xte = torch.rand(7, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        a, b = built.posterior(Xte), direct.posterior(Xte)
        assert _rel(a.mean, b.mean) < 1e-10 and _rel(a.variance, b.variance) < 1e-10


def test_posterior_of_a_projected_model_carries_no_gradient_of_the_projection():
    """Above 6 inputs (learned projection): a posterior is not differentiated with respect to
    the fixed map's parameters, so a plain ``posterior`` builds no autograd graph (before, it
    recorded the interpolation of every point); gradients with respect to X still flow through
    the map (acquisition optimisation), and equal those of the map called directly."""
    d = 8
    g = torch.Generator().manual_seed(0)
    X = torch.rand(60, d, generator=g, dtype=torch.float64)
    Y = (6 * X).sin().sum(-1, keepdim=True)
    model = WISKI(X, Y, **{**WISKI.loop_default_options(d), "exact_max_n": 0})
    assert any(p.requires_grad for p in model.projection.parameters())
    Xt = torch.rand(50, d, generator=g, dtype=torch.float64)
    post = model.posterior(Xt)
    assert not post.mean.requires_grad and not post.variance.requires_grad
    Xg = Xt[:3].clone().requires_grad_(True)
    model.posterior(Xg).mean.sum().backward()
    assert all(p.grad is None for p in model.projection.parameters())
    assert Xg.grad is not None and Xg.grad.abs().sum() > 0
    # the X-gradient is the posterior mean's own (central differences, one coordinate each)
    h = 1e-6
    for i, j in ((0, 0), (1, 5), (2, 7)):
        E = torch.zeros_like(Xt[:3])
        E[i, j] = h
        with torch.no_grad():
            up = model.posterior(Xt[:3] + E).mean.sum()
            down = model.posterior(Xt[:3] - E).mean.sum()
        assert abs(float((up - down) / (2 * h)) - float(Xg.grad[i, j])) < 1e-5
