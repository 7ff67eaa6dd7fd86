r"""The WISKI package's own pieces: typed fit settings (equal to the keyword form, unknown names
refused before anything moves), the log prior against GPyTorch's priors written out, optimiser
bounds against BoTorch's per-module ones, the projection's deprecated spellings, and the old module
paths (shims and saved run configurations) resolving to the same objects."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
import warnings

import pytest
import torch
from botorch.optim.utils import get_parameters_and_bounds
from gpytorch.priors import GammaPrior, LogNormalPrior

from bo_online.models import WISKI, WISKIFitSettings, WISKIProjectionFitSettings
from bo_online.models.wiski.projection import TanhProjection

DT = torch.float64


def _data(n: int = 30, d: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    return X, Y


def _hypers(model: WISKI) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _state(model: WISKI) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "options",
    [
        {"max_iter": 20},
        {"method": "adam", "max_iter": 5, "lr": 0.02, "restandardize": False},
        {"max_iter": 10, "include_priors": False},
    ],
)
def test_fit_with_a_settings_object_equals_fit_with_the_same_keywords(options) -> None:
    X, Y = _data()
    a, b = WISKI(X, Y, grid_size=12), WISKI(X, Y, grid_size=12)
    a.fit(**options)
    b.fit(WISKIFitSettings(**options))
    ha, hb = _hypers(a), _hypers(b)
    assert ha.keys() == hb.keys()
    for name in ha:
        assert torch.allclose(ha[name], hb[name], rtol=0, atol=1e-12), name
    assert not torch.equal(
        ha["covar_module.raw_lengthscale"],
        _hypers(WISKI(X, Y, grid_size=12))["covar_module.raw_lengthscale"],
    )
    # keywords override the settings object's fields
    c = WISKI(X, Y, grid_size=12)
    c.fit(WISKIFitSettings(max_iter=3), **options)
    for name, value in _hypers(c).items():
        assert torch.allclose(value, ha[name], rtol=0, atol=1e-12), name


def test_fit_settings_keep_the_keyword_defaults() -> None:
    s = WISKIFitSettings()
    assert (s.method, s.max_iter, s.lr, s.timeout_sec) == ("lbfgs", 200, 0.05, None)
    assert s.restandardize and s.include_priors
    p = WISKIProjectionFitSettings()
    assert (p.method, p.max_iter, p.lr, p.include_priors, p.joint) == (
        "adam",
        100,
        0.01,
        True,
        False,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.max_iter = 3  # type: ignore[misc]
    assert WISKI.fit_settings_class is WISKIFitSettings


def test_an_unknown_fit_option_raises_before_any_parameter_moves() -> None:
    X, Y = _data()
    model = WISKI(X, Y, grid_size=12)
    model.update(X[:3] * 0.5, Y[:3])
    before = _state(model)
    with pytest.raises(ValueError, match="'max_iters'.*accepted: .*max_iter"):
        model.fit(max_iters=5)
    with pytest.raises(ValueError, match="must be a WISKIFitSettings"):
        model.fit(WISKIProjectionFitSettings())
    after = _state(model)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    # fit_projection: the same, with its own settings
    X4, Y4 = _data(d=4)
    proj = WISKI(X4, Y4, projection="tanh:2", grid_size=10)
    before = _state(proj)
    with pytest.raises(ValueError, match="'restandardize'.*accepted: .*joint"):
        proj.fit_projection(X4, Y4, restandardize=False)
    after = _state(proj)
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "options",
    [{"max_iter": 4}, {"method": "adam", "max_iter": 4, "lr": 0.02, "joint": True}],
)
def test_fit_projection_with_settings_equals_fit_projection_with_keywords(options) -> None:
    X, Y = _data(n=24, d=4)
    a = WISKI(X[:12], Y[:12], projection=TanhProjection(4, 2, seed=0), grid_size=10)
    b = copy.deepcopy(a)
    a.fit_projection(X, Y, **options)
    b.fit_projection(X, Y, settings=WISKIProjectionFitSettings(**options))
    ha, hb = _hypers(a), _hypers(b)
    for name in ha:
        assert torch.allclose(ha[name], hb[name], rtol=0, atol=1e-12), name
    assert torch.equal(a.G, b.G) and float(a.n) == 24


def _lengthscale_prior(k: int) -> LogNormalPrior:
    # BoTorch's dimension-scaled lengthscale prior (get_covar_module_with_dim_scaled_prior).
    return LogNormalPrior(loc=math.sqrt(2) + 0.5 * math.log(k), scale=math.sqrt(3))


def test_log_prior_equals_the_prior_densities_written_out() -> None:
    X, Y = _data()
    model = WISKI(X, Y, grid_size=12)
    model.fit(max_iter=5)  # away from the initial values
    ls = model.covar_module.lengthscale.detach()
    noise = model.likelihood.noise.detach()
    expected = (
        _lengthscale_prior(2).log_prob(ls).sum() + LogNormalPrior(-4.0, 1.0).log_prob(noise).sum()
    )
    assert torch.allclose(model.log_prior(), expected, rtol=0, atol=1e-12)
    assert torch.equal(model._log_prior(), model.log_prior())
    # fixed noise: the likelihood is unused and its prior left out
    fixed = WISKI(X, Y, train_Yvar=torch.full_like(Y, 0.01), grid_size=12)
    ls = fixed.covar_module.lengthscale.detach()
    assert torch.allclose(
        fixed.log_prior(), _lengthscale_prior(2).log_prob(ls).sum(), rtol=0, atol=1e-12
    )
    # additive default: one scaled kernel per component grid, outputscale prior Gamma(2, J)
    X5, Y5 = _data(d=5)
    additive = WISKI(X5, Y5, projection="pairs")
    parts = additive.covar_module.kernels
    J = len(parts)
    expected = LogNormalPrior(-4.0, 1.0).log_prob(additive.likelihood.noise.detach()).sum()
    # (these components' lengthscale priors keep BoTorch's float32 parameters: the same here)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).item()  # noqa: E731
    ls_prior = LogNormalPrior(f32(math.sqrt(2) + 0.5 * math.log(2)), f32(math.sqrt(3)))
    os_prior = GammaPrior(torch.tensor(2.0, dtype=DT), torch.tensor(float(J), dtype=DT))
    for part in parts:
        expected = expected + ls_prior.log_prob(part.base_kernel.lengthscale.detach()).sum()
        expected = expected + os_prior.log_prob(part.outputscale.detach())
    assert torch.allclose(additive.log_prior(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("spec", ["plain", "fixed", "projection"])
def test_trainable_parameters_and_bounds_equal_botorchs_per_module(spec) -> None:
    r"""The shared helper gives the parameters (same order) and bounds that BoTorch's
    ``get_parameters_and_bounds`` gives module by module (the former implementation)."""
    d = 4 if spec == "projection" else 2
    X, Y = _data(d=d)
    kw = {"grid_size": 10}
    if spec == "fixed":
        kw["train_Yvar"] = torch.full_like(Y, 0.01)
    if spec == "projection":
        kw["projection"] = "tanh:2"
    model = WISKI(X, Y, **kw)
    for include_projection in (False, True):
        prefixes = ["covar_module", "mean_module"] + ([] if spec == "fixed" else ["likelihood"])
        if include_projection and spec == "projection":
            prefixes.append("projection")
        ref_p, ref_b = {}, {}
        for prefix in prefixes:
            p, b = get_parameters_and_bounds(getattr(model, prefix), requires_grad=True)
            ref_p.update({f"{prefix}.{k}": v for k, v in p.items()})
            ref_b.update({f"{prefix}.{k}": v for k, v in b.items()})
        params, bounds = model._trainable_parameters(include_projection=include_projection)
        assert list(params) == list(ref_p)
        assert all(params[k] is ref_p[k] for k in params)
        assert bounds == ref_b
    assert "covar_module.raw_lengthscale" in bounds  # the lengthscale floor is a bound


def test_update_noise_units_through_the_shared_per_point_noise() -> None:
    X, Y = _data()
    model = WISKI(X, Y, grid_size=12)
    assert torch.equal(model._to_D(X[:3], None), torch.ones(3, dtype=DT))
    sigma2 = float(model.likelihood.noise.detach())
    D = model._to_D(X[:2], torch.tensor([2 * sigma2, 0.5 * sigma2], dtype=DT))
    assert torch.allclose(D, torch.tensor([2.0, 0.5], dtype=DT), rtol=1e-14)
    fixed = WISKI(X, Y, train_Yvar=torch.full_like(Y, 0.01), grid_size=12)
    before = _state(fixed)
    with pytest.raises(ValueError, match="fixed per-point noise: pass `noise`"):
        fixed.update(X[:2], Y[:2])
    assert all(torch.equal(v, fixed.state_dict()[k]) for k, v in before.items())


def test_projection_deprecated_spellings_warn_and_agree() -> None:
    X = torch.rand(20, 5, dtype=DT)
    a = TanhProjection(5, 2, seed=1, init="random").double()
    b = copy.deepcopy(a)
    assert a.normalized is False
    a.set_normalization(X)
    with pytest.warns(DeprecationWarning, match="set_normalization"):
        b.set_normalisation(X)
    with pytest.warns(DeprecationWarning, match="normalized"):
        assert b.normalised is True
    assert a.normalized and b.normalized
    assert torch.equal(a(X), b(X))
    # nothing renamed in the state dict (the flag is a plain attribute, not state)
    assert list(a.state_dict()) == [
        "linear.weight",
        "linear.bias",
        "norm.running_mean",
        "norm.running_var",
        "norm.num_batches_tracked",
    ]
    # a projection pickled before the rename (flag stored as "normalised") loads
    old = copy.deepcopy(a)
    old.__dict__["normalised"] = old.__dict__.pop("normalized")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = pickle.loads(pickle.dumps(old))
        assert restored.normalized is True


def test_a_users_projection_with_the_old_spelling_is_still_normalized() -> None:
    class OldStyle(torch.nn.Module):
        out_dim = 2

        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 2).double()
            self.normalised, self.calls = False, 0

        def set_normalisation(self, X: torch.Tensor) -> None:
            self.normalised, self.calls = True, self.calls + 1

        def forward(self, X: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.linear(X))

    X, Y = _data(d=4)
    model = WISKI(X, Y, projection=OldStyle(), grid_size=10)
    assert model.projection.calls == 1 and model.projection.normalised


def test_old_module_paths_name_the_same_objects() -> None:
    import bo_online.grid as old_grid
    import bo_online.models.additive_grid as old_additive
    import bo_online.models.projection as old_projection
    import bo_online.models.wiski_classification as old_classification
    import bo_online.models.wiski_covariance as old_covariance
    from bo_online.models.wiski import additive, classification, covariance, grid, projection

    for old, new in [
        (old_grid, grid),
        (old_additive, additive),
        (old_projection, projection),
        (old_classification, classification),
        (old_covariance, covariance),
    ]:
        assert old.__all__ == new.__all__
        for name in new.__all__:
            assert getattr(old, name) is getattr(new, name), (old.__name__, name)
    # module constants that were public under the old paths
    assert old_grid.PADDING_CELLS == grid.PADDING_CELLS
    assert old_additive.ADDITIVE_GRID_BUDGET == additive.ADDITIVE_GRID_BUDGET


def test_the_old_inducing_point_module_path_still_imports() -> None:
    import bo_online.models.inducing as old_inducing
    from bo_online.models.tsvgp import inducing

    assert old_inducing.select_inducing_points is inducing.select_inducing_points


@pytest.mark.parametrize(
    "path", ["bo_online.models.projection", "bo_online.models.wiski.projection"]
)
def test_a_run_config_naming_either_projection_path_builds_the_same_class(path) -> None:
    from bo_online.loops.options import instantiate

    spec = {"__class__": f"{path}.TanhProjection", "args": [6], "kwargs": {"out_dim": 2, "seed": 0}}
    built = instantiate(spec)
    assert type(built) is TanhProjection
    ref = TanhProjection(6, out_dim=2, seed=0)
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in built.state_dict().items())


def test_the_loop_passes_its_fit_options_to_fit_projection(fit_projection_calls) -> None:
    r"""``fit_projection(X, Y, Yvar, settings, **overrides)``: the loop's refit still passes the
    settings' fields it has (its L-BFGS default, ``max_iter`` and ``fit_options``)."""
    from bo_online.loops.bayesopt import BayesOptLoop
    from bo_online.problems import synthetic_problem

    calls = fit_projection_calls
    loop = BayesOptLoop(
        synthetic_problem("hartmann6"),
        model="wiski",
        seed=0,
        n_init=10,
        refit_every=1,
        model_options={"grid_size": 8, "projection": "tanh:2"},
        fit_options={"joint": True, "lr": 0.03},
        init_fit_max_iter=3,
        fit_max_iter=3,
        acq="ts",
        acq_options={"num_candidates": 16},
    )
    loop.initialize()
    loop._fit(2)
    assert calls and calls[-1] == {"max_iter": 2, "method": "lbfgs", "joint": True, "lr": 0.03}
