"""DecoupledSVGP's typed fit settings and its hyperparameter log prior (shared helpers)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from gpytorch.priors import LogNormalPrior

from bo_online.models import DecoupledFitSettings, DecoupledSVGP
from bo_online.models.fitting import OptimizerSettings


def _data(n: int = 40, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    Y = torch.sin(3 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(
        n, 1, generator=g, dtype=torch.float64
    )
    return X, Y


def _hyperparameters(model: DecoupledSVGP) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_settings_are_the_old_fit_keywords_with_their_defaults() -> None:
    expected = dict(
        method=None,
        max_iter=200,
        lr=None,
        lr_variational=None,
        batch_size=1024,
        num_kl_columns=None,
        grow=0,
        learn_inducing=None,
        train_hyperparameters=True,
        restandardize=True,
        compress=True,
        init_hyperparameters=0,
        refresh=False,
        timeout_sec=None,
    )
    got = {f.name: f.default for f in dataclasses.fields(DecoupledFitSettings)}
    assert got == expected
    assert issubclass(DecoupledFitSettings, OptimizerSettings)
    assert DecoupledSVGP.fit_settings_class is DecoupledFitSettings


@pytest.mark.parametrize(
    "options",
    [
        {"max_iter": 20},  # the default "auto" fit (exact marginal likelihood, small n)
        {"method": "adam", "max_iter": 15, "lr": 0.02, "grow": 2, "batch_size": 16},
        {"method": "lbfgs", "max_iter": 10, "train_hyperparameters": False},
    ],
)
def test_fit_with_a_settings_object_equals_fit_with_keywords(options: dict) -> None:
    X, Y = _data()
    by_keywords = DecoupledSVGP(X, Y, num_mean_bases=24, num_cov_bases=12)
    by_settings = DecoupledSVGP(X, Y, num_mean_bases=24, num_cov_bases=12)
    by_keywords.fit(**options)
    by_settings.fit(DecoupledFitSettings(**options))
    a, b = _hyperparameters(by_keywords), _hyperparameters(by_settings)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-12)
    torch.testing.assert_close(by_keywords.a_beta, by_settings.a_beta, rtol=0, atol=1e-12)
    torch.testing.assert_close(by_keywords.L, by_settings.L, rtol=0, atol=1e-12)


def test_keywords_override_a_settings_object() -> None:
    X, Y = _data()
    a = DecoupledSVGP(X, Y, num_mean_bases=24, num_cov_bases=12)
    b = DecoupledSVGP(X, Y, num_mean_bases=24, num_cov_bases=12)
    a.fit(method="adam", max_iter=5, lr=0.03)
    b.fit(DecoupledFitSettings(method="adam", max_iter=50, lr=0.03), max_iter=5)
    assert a.last_fit_steps == b.last_fit_steps == 5
    for k, v in _hyperparameters(a).items():
        torch.testing.assert_close(v, _hyperparameters(b)[k], rtol=0, atol=1e-12)


def test_unknown_fit_option_raises_before_anything_changes() -> None:
    X, Y = _data()
    model = DecoupledSVGP(X, Y, num_mean_bases=24, num_cov_bases=12)
    model.update(*_data(3, seed=1))  # grown bases, which a fit would compress
    before = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    with pytest.raises(ValueError, match="max_iters.*accepted:.*max_iter"):
        model.fit(max_iters=5)
    with pytest.raises(ValueError, match="DecoupledFitSettings"):
        model.fit(OptimizerSettings())  # a settings object of another model
    after = model.state_dict()
    assert before.keys() == {k for k, v in after.items() if torch.is_tensor(v)}
    for k, v in before.items():
        assert torch.equal(v, after[k]), k


def test_log_prior_equals_the_default_priors_written_out() -> None:
    d = 3
    X, Y = _data(d=d)
    model = DecoupledSVGP(X, Y, num_mean_bases=24, num_cov_bases=12)
    with torch.no_grad():  # away from the priors' modes, so a wrong term shows
        model.covar_module.lengthscale = torch.tensor([[0.3, 0.7, 1.9]], dtype=torch.float64)
        model.likelihood.noise = torch.tensor([0.05], dtype=torch.float64)
    # BoTorch's defaults: lengthscale ~ LogNormal(sqrt(2) + log(d) / 2, sqrt(3)),
    # noise ~ LogNormal(-4, 1); the constant mean has no prior.
    expected = LogNormalPrior(math.sqrt(2) + 0.5 * math.log(d), math.sqrt(3)).log_prob(
        torch.tensor([0.3, 0.7, 1.9], dtype=torch.float64)
    ).sum() + LogNormalPrior(-4.0, 1.0).log_prob(torch.tensor(0.05, dtype=torch.float64))
    got = model._log_prior()
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    # The exact-fit objective adds it once per point (the old hand-written loop did the same).
    mll = model.marginal_log_likelihood(include_priors=True)
    torch.testing.assert_close(
        mll - model.marginal_log_likelihood(include_priors=False), expected / X.shape[0]
    )
