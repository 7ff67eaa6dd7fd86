r"""TSVGP's typed fit settings and log prior: a settings object fits as the same keywords, bad
options fail before anything moves, and the log prior is the GPyTorch priors written out."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.priors import GammaPrior, LogNormalPrior

from bo_online.likelihoods import Bernoulli
from bo_online.models import TSVGP, TSVGPFitSettings
from bo_online.models.fitting import OptimizerSettings

DT = torch.float64


def _data(n=25, d=3, m=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, m, generator=g, dtype=DT)
    return X, Y


def _models():
    """Fresh (model, fit options) pairs covering the fit's branches: the exact objective (n <= m),
    learned inducing inputs (n > m, Adam) and variational EM with minibatch E-steps."""
    X, Y = _data()
    labels = (Y > Y.median()).to(DT)
    return {
        "exact regime": (lambda: TSVGP(X, Y), {"max_iter": 15}),
        "inducing learned": (
            lambda: TSVGP(X, Y, inducing_points=8),
            {"method": "adam", "max_iter": 10, "lr": 0.02, "include_priors": False},
        ),
        "bernoulli EM": (
            lambda: TSVGP(X, labels, likelihood=Bernoulli(), inducing_points=8),
            {"max_iter": 5, "num_em_iters": 2, "num_e_steps": 2, "rho": 0.7, "batch_size": 10},
        ),
    }


def _state(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


@pytest.mark.parametrize("case", list(_models()))
def test_fit_with_a_settings_object_equals_fit_with_the_same_keywords(case):
    make, options = _models()[case]
    by_keywords = make()
    torch.manual_seed(1)  # minibatch E-steps draw from the global generator
    by_keywords.fit(**options)
    by_settings = make()
    torch.manual_seed(1)
    by_settings.fit(TSVGPFitSettings(**options))
    mixed = make()  # a settings object with keyword overrides on top
    first, *rest = options
    torch.manual_seed(1)
    mixed.fit(TSVGPFitSettings(**{first: options[first]}), **{k: options[k] for k in rest})
    want = _state(by_keywords)
    for other in (by_settings, mixed):
        got = _state(other)
        assert want.keys() == got.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-12)
    # the fit moved something (otherwise the comparison above could not fail)
    assert any(not torch.equal(want[k], v) for k, v in _state(make()).items())


def test_settings_have_the_fit_keywords_and_their_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(TSVGPFitSettings)}
    assert issubclass(TSVGPFitSettings, OptimizerSettings)
    assert fields == {
        "method": "lbfgs",
        "max_iter": 100,
        "lr": 0.05,
        "timeout_sec": None,
        "num_em_iters": 3,
        "num_e_steps": 5,
        "rho": 1.0,
        "batch_size": None,
        "learn_inducing_points": None,
        "reinit_inducing": None,
        "restandardize": True,
        "include_priors": True,
    }
    assert TSVGP.fit_settings_class is TSVGPFitSettings


@pytest.mark.parametrize(
    "bad", [{"max_iters": 5}, {"num_em_iter": 2, "lr": 0.1}, {"method": "bfgs"}]
)
def test_a_bad_fit_option_raises_before_anything_moves(bad):
    X, Y = _data(n=30)
    model = TSVGP(X, Y * 3 + 1, inducing_points=8)  # a fit would restandardise and move Z
    X2, Y2 = _data(n=6, seed=1)
    model.update(X2, Y2)  # the scaling of the initial data no longer fits all data held
    params = _state(model)
    buffers = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    scaling = (model.outcome_mean.clone(), model.outcome_std.clone())
    with pytest.raises(ValueError) as err:
        model.fit(**bad)
    if "method" not in bad:
        assert "accepted:" in str(err.value) and "num_em_iters" in str(err.value)
    for name, value in _state(model).items():
        assert torch.equal(value, params[name]), name
    for name, value in model.state_dict().items():
        if torch.is_tensor(value):
            assert torch.equal(value, buffers[name]), name
    assert torch.equal(model.outcome_mean, scaling[0])
    assert torch.equal(model.outcome_std, scaling[1])


def test_fit_gpytorch_mll_passes_settings_fields_on():
    X, Y = _data()
    model, ref = TSVGP(X, Y, inducing_points=8), TSVGP(X, Y, inducing_points=8)
    # (TSVGP's own likelihood wraps GPyTorch's; BoTorch's dispatcher only needs a Gaussian one)
    mll = ExactMarginalLogLikelihood(model.likelihood.gaussian, model)
    fit_gpytorch_mll(mll, max_iter=7, num_em_iters=1, optimizer_kwargs={"unused": 1})
    ref.fit(max_iter=7)
    for name, value in _state(ref).items():
        torch.testing.assert_close(_state(model)[name], value, rtol=0, atol=1e-12)


def _lognormal(value, loc, scale):
    """log density of LogNormal(loc, scale) at value, written out in float64."""
    z = (torch.log(value) - loc) / scale
    return -torch.log(value) - math.log(scale) - 0.5 * math.log(2 * math.pi) - 0.5 * z**2


@pytest.mark.parametrize("outputs", [1, 2])
def test_log_prior_is_the_default_priors_written_out(outputs):
    d = 3
    X, Y = _data(d=d, m=outputs)
    model = TSVGP(X, Y, inducing_points=8)
    with torch.no_grad():  # away from the initial values, so each term matters
        model.covar_module.lengthscale = torch.rand(model.covar_module.lengthscale.shape) + 0.1
        model.likelihood.gaussian.noise = torch.rand(model.likelihood.gaussian.noise.shape) / 10
    # BoTorch's defaults: LogNormal(sqrt(2) + log(d) / 2, sqrt(3)) on every lengthscale,
    # LogNormal(-4, 1) on the noise, none on the constant mean.
    ls = model.covar_module.lengthscale
    noise = model.likelihood.gaussian.noise
    by_hand = _lognormal(ls, math.sqrt(2) + 0.5 * math.log(d), math.sqrt(3)).sum()
    by_hand = by_hand + _lognormal(noise, -4.0, 1.0).sum()
    gpytorch_priors = (
        LogNormalPrior(math.sqrt(2) + 0.5 * math.log(d), math.sqrt(3)).log_prob(ls).sum()
        + LogNormalPrior(-4.0, 1.0).log_prob(noise).sum()
    )
    torch.testing.assert_close(model.log_prior(), gpytorch_priors, rtol=1e-12, atol=1e-12)
    # BoTorch's priors hold float32 constants (log(scale) is taken in float32 by torch's Normal)
    torch.testing.assert_close(model.log_prior(), by_hand, rtol=1e-6, atol=0)
    # the fit's objective adds it to the bound
    want = (model.elbo() + gpytorch_priors) / model.num_data
    torch.testing.assert_close(model.marginal_log_likelihood(), want, rtol=1e-12, atol=1e-12)
    no_priors = model.marginal_log_likelihood(include_priors=False)
    torch.testing.assert_close(no_priors, model.elbo() / model.num_data, rtol=1e-12, atol=1e-12)


def _gamma(value, concentration, rate):
    """log density of Gamma(concentration, rate) at value, written out in float64."""
    return (
        concentration * math.log(rate)
        - math.lgamma(concentration)
        + (concentration - 1) * torch.log(value)
        - rate * value
    )


def test_log_prior_of_a_bernoulli_model_is_the_kernel_prior_alone():
    r"""The lengthscales' dimension-scaled LogNormal prior and, since labels are not
    standardised, the default kernel's outputscale prior, Gamma(2, 0.5)."""
    X, Y = _data()
    model = TSVGP(X, (Y > 0).to(DT), likelihood=Bernoulli(), inducing_points=8)
    with torch.no_grad():
        model.covar_module.outputscale = 2.7
    ls = model.covar_module.base_kernel.lengthscale
    scale = model.covar_module.outputscale
    prior = LogNormalPrior(math.sqrt(2) + 0.5 * math.log(3), math.sqrt(3)).log_prob(ls).sum()
    two, half = torch.tensor(2.0, dtype=DT), torch.tensor(0.5, dtype=DT)
    prior = prior + GammaPrior(two, half).log_prob(scale).sum()
    torch.testing.assert_close(model.log_prior(), prior, rtol=1e-12, atol=1e-12)
    by_hand = _lognormal(ls, math.sqrt(2) + 0.5 * math.log(3), math.sqrt(3)).sum()
    by_hand = by_hand + _gamma(scale, 2.0, 0.5)
    torch.testing.assert_close(model.log_prior(), by_hand, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "option, value",
    [
        ("batch_size", -3),  # sliced "all but 3 points" as a minibatch
        ("batch_size", 0),  # divided by zero
        ("num_em_iters", -1),  # ran no M-step, silently
        ("num_e_steps", -1),  # ran no E-step, silently
    ],
)
def test_fit_and_e_step_refuse_counts_below_their_minimum_and_leave_the_model_as_it_was(
    option, value
):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(30, 2, generator=g, dtype=DT)
    y = (X[:, :1] + 0.3 * torch.randn(30, 1, generator=g, dtype=DT) > 0.5).to(DT)
    model = TSVGP(X, y, likelihood=Bernoulli(), inducing_points=8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"{option} must be an integer >= "):
        model.fit(max_iter=3, **{option: value})
    if option == "batch_size":
        with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1"):
            model.e_step(batch_size=value)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
