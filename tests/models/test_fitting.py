r"""Shared fit helpers: log priors, fit settings, outcome standardisation, against direct
computations with GPyTorch's priors and BoTorch's ``Standardize``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from botorch.models.transforms.outcome import Standardize
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.priors import GammaPrior, LogNormalPrior

from bo_online.models.fitting import (
    OptimizerSettings,
    resolve_settings,
    standardization,
    sum_log_priors,
)


def _kernel_and_likelihood() -> tuple[ScaleKernel, GaussianLikelihood]:
    kernel = ScaleKernel(
        RBFKernel(ard_num_dims=3, lengthscale_prior=LogNormalPrior(0.5, 1.0)),
        outputscale_prior=GammaPrior(2.0, 0.15),
    ).double()
    kernel.base_kernel.lengthscale = torch.tensor([[0.3, 0.7, 1.9]], dtype=torch.float64)
    kernel.outputscale = torch.tensor(1.7, dtype=torch.float64)
    likelihood = GaussianLikelihood(noise_prior=GammaPrior(1.1, 0.05)).double()
    likelihood.noise = torch.tensor([0.02], dtype=torch.float64)
    return kernel, likelihood


def test_sum_log_priors_equals_the_prior_densities_written_out() -> None:
    kernel, likelihood = _kernel_and_likelihood()
    ls = kernel.base_kernel.lengthscale.detach()
    expected = (
        LogNormalPrior(0.5, 1.0).log_prob(ls).sum()
        + GammaPrior(2.0, 0.15).log_prob(kernel.outputscale.detach())
        + GammaPrior(1.1, 0.05).log_prob(likelihood.noise.detach()).sum()
    )
    ref = torch.zeros((), dtype=torch.float64)
    got = sum_log_priors([kernel, None, likelihood], ref)
    assert got.dtype == torch.float64
    assert torch.allclose(got, expected.double(), atol=1e-12)
    no_noise = sum_log_priors([kernel, likelihood], ref, skip=lambda name: "noise" in name)
    assert torch.allclose(
        no_noise,
        expected - GammaPrior(1.1, 0.05).log_prob(likelihood.noise.detach()).sum(),
        atol=1e-12,
    )


def test_sum_log_priors_is_differentiable_in_the_hyperparameters() -> None:
    kernel, likelihood = _kernel_and_likelihood()
    sum_log_priors([kernel, likelihood], torch.zeros((), dtype=torch.float64)).backward()
    assert kernel.base_kernel.raw_lengthscale.grad is not None
    assert float(kernel.base_kernel.raw_lengthscale.grad.abs().sum()) > 0


@dataclasses.dataclass(frozen=True)
class _Settings(OptimizerSettings):
    max_iter: int = 100
    rho: float = 1.0


def test_resolve_settings_applies_overrides_and_refuses_unknown_names() -> None:
    s = resolve_settings(_Settings, None, {"method": "adam", "rho": 0.5, "lr": None})
    assert (s.method, s.max_iter, s.rho, s.lr) == ("adam", 100, 0.5, 0.05)
    base = _Settings(max_iter=7)
    assert resolve_settings(_Settings, base, {}) is base
    assert resolve_settings(_Settings, base, {"rho": 2.0}).max_iter == 7
    with pytest.raises(ValueError, match="'num_iters'.*accepted: .*max_iter"):
        resolve_settings(_Settings, None, {"num_iters": 5})
    with pytest.raises(ValueError, match="'bogus'"):
        resolve_settings(_Settings, None, {"bogus": None})
    with pytest.raises(ValueError, match="must be a _Settings"):
        resolve_settings(_Settings, OptimizerSettings(), {})


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"max_iter": -5}, "max_iter must be an integer >= 0, got -5"),
        ({"max_iter": "10"}, "max_iter must be an integer >= 0, got '10'"),
        ({"max_iter": 2.5}, "max_iter must be an integer >= 0"),
        ({"max_iter": True}, "max_iter must be an integer >= 0"),
        ({"lr": -1.0}, "lr must be a positive number, got -1.0"),
        ({"lr": float("nan")}, "lr must be a positive number"),
        ({"lr": "0.1"}, "lr must be a positive number"),
        ({"timeout_sec": -1}, "timeout_sec must be a number of seconds >= 0 or None"),
    ],
)
def test_optimizer_settings_refuse_values_no_fit_can_run_with(bad, match) -> None:
    """A negative ``max_iter`` or ``timeout_sec`` was taken and the fit ran anyway, a string
    ``max_iter`` failed inside the optimiser with a TypeError: refused when the settings are
    made, through ``resolve_settings`` (what every ``fit`` and Ax's early check call) too."""
    with pytest.raises(ValueError, match=match):
        _Settings(**bad)
    with pytest.raises(ValueError, match=match):
        resolve_settings(_Settings, None, bad)
    # Values at the edge stay accepted: no iterations, no time, a whole float, None fields.
    s = resolve_settings(_Settings, None, {"max_iter": 0, "timeout_sec": 0.0})
    assert (s.max_iter, s.timeout_sec) == (0, 0.0)
    assert (
        _Settings(max_iter=50.0).max_iter == 50 and type(_Settings(max_iter=50.0).max_iter) is int
    )

    @dataclasses.dataclass(frozen=True)
    class _Optional(OptimizerSettings):
        max_iter: int | None = None
        lr: float | None = None

    assert (_Optional().max_iter, _Optional().lr) == (None, None)


def test_standardization_equals_botorch_standardize() -> None:
    y = torch.randn(2, 17, dtype=torch.float64) * 3 + 1
    mean, std = standardization(y)
    tf = Standardize(m=2)
    tf(y.T)
    assert torch.allclose(mean, tf.means.squeeze(0), atol=1e-12)
    assert torch.allclose(std, tf.stdvs.squeeze(0), atol=1e-12)
    mean1, std1 = standardization(torch.full((5,), 2.5, dtype=torch.float64))
    assert mean1.tolist() == [2.5] and std1.tolist() == [1.0]


def test_minimize_loss_with_max_iter_zero_moves_nothing():
    """``max_iter=0`` (a loop's ``fit_max_iter=0``, a ``fit(max_iter=0)``): SciPy's L-BFGS-B
    with ``maxiter=0`` still took a step; now nothing moves and the loss reported is the one at
    the start (by hand)."""
    from bo_online.models.fitting import minimize_loss

    for method in ("lbfgs", "adam"):
        x = torch.tensor([3.0, -1.0], dtype=torch.float64, requires_grad=True)
        result = minimize_loss(lambda: ((x - 1.0) ** 2).sum(), {"x": x}, method=method, max_iter=0)
        assert x.tolist() == [3.0, -1.0]
        assert result.step == 0 and result.fval == 8.0
