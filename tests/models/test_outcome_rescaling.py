r"""Outcome re-standardisation and optimiser-bound projection, written once in
``bo_online.models.fitting`` / ``OnlineModel``: the helpers against direct computations (BoTorch's
``Standardize``, the GPyTorch constraints' bounds), and each family's re-standardisation against
the data it holds in the user's units."""

from __future__ import annotations

import copy
import warnings

import gpytorch
import pytest
import torch
from botorch.models.transforms.outcome import Standardize
from gpytorch.constraints import GreaterThan, Interval
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean

from bo_online.models.decoupled import DecoupledSVGP
from bo_online.models.exact import OnlineExactGP
from bo_online.models.fitting import (
    nonzero_std,
    project_to_bounds,
    remap_constant_mean,
    remap_standardized,
    trainable_parameters_and_bounds,
)
from bo_online.models.qsgp import QSGP
from bo_online.models.tsvgp import TSVGP
from bo_online.models.wiski import WISKI


def _data(seed: int, n: int, m: int = 1, scale: float = 1.0, shift: float = 0.0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64)
    Y = torch.stack([torch.sin(6 * X[:, 0] + k) + X[:, 1] ** 2 for k in range(m)], dim=-1)
    return X, Y * scale + shift + 0.05 * torch.randn(n, m, generator=g, dtype=torch.float64)


def _botorch_scaling(Y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""BoTorch's ``Standardize`` fitted on ``Y`` (``n x m``): its means and stds, ``(m,)``."""
    tf = Standardize(m=Y.shape[-1])
    tf(Y)
    return tf.means.reshape(-1), tf.stdvs.reshape(-1)


# ---------------------------------------------------------------------- pure helpers


def test_remap_standardized_equals_standardizing_the_user_values_again() -> None:
    g = torch.Generator().manual_seed(0)
    y = 3.0 * torch.randn(2, 9, generator=g, dtype=torch.float64) + 5.0  # m x n, user units
    old_mean, old_std = torch.tensor([1.0, -2.0]).double(), torch.tensor([0.5, 4.0]).double()
    new_mean, new_std = _botorch_scaling(y.T)
    v = (y - old_mean.unsqueeze(-1)) / old_std.unsqueeze(-1)
    got = remap_standardized(
        v,
        old_mean.unsqueeze(-1),
        old_std.unsqueeze(-1),
        new_mean.unsqueeze(-1),
        new_std.unsqueeze(-1),
    )
    expected = (y - new_mean.unsqueeze(-1)) / new_std.unsqueeze(-1)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.mean(-1), torch.zeros(2).double(), rtol=0, atol=1e-12)
    torch.testing.assert_close(got.std(-1), torch.ones(2).double(), rtol=1e-12, atol=0)


def test_remap_constant_mean_keeps_the_level_in_user_units_in_place() -> None:
    mean_module = ConstantMean().double()
    with torch.no_grad():
        mean_module.constant.fill_(0.3)
    param = mean_module.raw_constant
    old_mean, old_std = torch.tensor([2.0]).double(), torch.tensor([0.5]).double()
    new_mean, new_std = torch.tensor([-1.0]).double(), torch.tensor([4.0]).double()
    remap_constant_mean(mean_module, old_mean, old_std, new_mean, new_std)
    assert mean_module.raw_constant is param and param.shape == torch.Size([])
    level = mean_module.constant.detach() * new_std + new_mean  # user units: 0.3 * 0.5 + 2
    torch.testing.assert_close(
        level, torch.tensor([2.15], dtype=torch.float64), rtol=1e-14, atol=1e-14
    )


def test_nonzero_std_replaces_exactly_the_zero_deviations_as_botorch() -> None:
    Y = torch.tensor([[1.0, 2.0], [1.0, 5.0], [1.0, -3.0]], dtype=torch.float64)  # column 0 flat
    std = Y.std(0)
    got = nonzero_std(std)
    assert got[0].item() == 1.0 and got[1].item() == std[1].item()
    assert torch.equal(got, _botorch_scaling(Y)[1])


# ---------------------------------------------------------------------- bounds


class _Hypers(gpytorch.Module):
    r"""BoTorch-style untransformed constraints (enforced only by the optimiser) next to a
    transformed (softplus) one."""

    def __init__(self) -> None:
        super().__init__()
        self.covar_module = ScaleKernel(
            RBFKernel(ard_num_dims=3, lengthscale_constraint=GreaterThan(0.025, transform=None))
        )
        self.likelihood = GaussianLikelihood(
            noise_constraint=Interval(1e-4, 2.0, transform=None, initial_value=0.1)
        )


def test_project_to_bounds_clamps_into_the_constraints_bounds() -> None:
    module = _Hypers().double()
    kernel, lik = module.covar_module, module.likelihood
    raw_ls = torch.tensor([[-1.0, 0.01, 0.7]], dtype=torch.float64)
    with torch.no_grad():
        kernel.base_kernel.raw_lengthscale.copy_(raw_ls)
        lik.noise_covar.raw_noise.fill_(3.0)
        kernel.raw_outputscale.fill_(-40.0)  # softplus-transformed: any raw value is allowed
    params, bounds = trainable_parameters_and_bounds(module)
    project_to_bounds(params, bounds)  # the leaves require grad: done without autograd
    lower = kernel.base_kernel.raw_lengthscale_constraint.lower_bound
    expected_ls = torch.where(raw_ls < lower, lower, raw_ls)
    assert torch.equal(kernel.base_kernel.raw_lengthscale.detach(), expected_ls)
    assert expected_ls[0, 2].item() == 0.7 and expected_ls[0, 0].item() == lower.item()
    upper = lik.noise_covar.raw_noise_constraint.upper_bound
    assert torch.equal(lik.noise_covar.raw_noise.detach(), upper.reshape(1))
    assert kernel.raw_outputscale.item() == -40.0
    assert kernel.base_kernel.raw_lengthscale.grad_fn is None


def test_project_to_bounds_leaves_parameters_without_bounds_alone() -> None:
    p = torch.tensor([-5.0, 5.0], dtype=torch.float64, requires_grad=True)
    q = torch.tensor([-5.0, 5.0], dtype=torch.float64, requires_grad=True)
    project_to_bounds({"p": p, "q": q}, {"p": (None, 1.0)})
    assert torch.equal(p.detach(), torch.tensor([-5.0, 1.0]).double())
    assert torch.equal(q.detach(), torch.tensor([-5.0, 5.0]).double())


def test_decoupled_adam_bounds_are_the_constraints_of_its_trained_hyperparameters() -> None:
    r"""The bounds the decoupled model's Adam projects into: for every trained hyperparameter with
    an untransformed constraint, the constraint's own bounds (BoTorch's defaults)."""
    X, Y = _data(0, 30)
    for kwargs in ({}, {"train_Yvar": torch.full_like(Y, 0.01)}):
        model = DecoupledSVGP(X, Y, num_mean_bases=16, num_cov_bases=8, **kwargs)
        params, bounds = model._hyperparameters_and_bounds()
        expected = {}
        for name, p, c in model.named_parameters_and_constraints():
            if name in params and c is not None and not c.enforced:
                expected[name] = (c.lower_bound.item(), c.upper_bound.item())
        got = {k: tuple(float(b) for b in v) for k, v in bounds.items() if k in expected}
        assert got == expected and expected


# ---------------------------------------------------------------------- families


def _updated(model, m: int = 1, noise: bool = False):
    X2, Y2 = _data(2, 10, m=m, scale=8.0, shift=3.0)
    model.update(X2, Y2, torch.full_like(Y2, 0.04) if noise else None)
    return model


@pytest.mark.parametrize("fixed", [False, True])
def test_held_data_restandardization_keeps_targets_and_noise_in_user_units(fixed: bool) -> None:
    X, Y = _data(1, 12)
    Yvar = torch.full_like(Y, 0.01) if fixed else None
    models = [
        OnlineExactGP(X, Y, Yvar),
        DecoupledSVGP(X, Y, Yvar, num_mean_bases=16, num_cov_bases=8),
        QSGP(X, Y, Yvar, num_features=32),
    ]
    for model in models:
        _updated(model, noise=fixed)
        if isinstance(model, QSGP):
            model._absorb(restandardize=False)  # the conditioning data join the held data
        targets = model.train_targets.clone()
        noise_user = None if not fixed else model.train_noise * model.outcome_std**2
        const = (
            model.mean_constant if isinstance(model, QSGP) else model.mean_module.constant
        ).detach()
        level = const * model.outcome_std + model.outcome_mean  # the constant in user units
        model._restandardize()
        mean, std = _botorch_scaling(targets.unsqueeze(-1))
        torch.testing.assert_close(model.outcome_mean, mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(model.outcome_std, std, rtol=1e-12, atol=0)
        torch.testing.assert_close(model.train_targets, targets, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(model.train_y, (targets - mean) / std, rtol=1e-12, atol=1e-12)
        if fixed:
            torch.testing.assert_close(model.train_noise * std**2, noise_user, rtol=1e-12, atol=0)
        if not isinstance(model, OnlineExactGP):  # decoupled and QSGP keep the constant's level
            const = (
                model.mean_constant if isinstance(model, QSGP) else model.mean_module.constant
            ).detach()
            new_level = const * model.outcome_std + model.outcome_mean
            torch.testing.assert_close(new_level, level, rtol=1e-12, atol=1e-12)


def test_tsvgp_restandardization_is_per_output() -> None:
    X, Y = _data(1, 12, m=2)
    model = _updated(TSVGP(X, Y, inducing_points=8), m=2)
    targets = model.train_targets.clone()  # m x n
    model._restandardize()
    mean, std = _botorch_scaling(targets.T)
    torch.testing.assert_close(model.outcome_mean, mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.outcome_std, std, rtol=1e-12, atol=0)
    torch.testing.assert_close(model.train_targets, targets, rtol=1e-12, atol=1e-12)
    expected = (targets - mean.unsqueeze(-1)) / std.unsqueeze(-1)
    torch.testing.assert_close(model.train_y, expected, rtol=1e-12, atol=1e-12)


def test_wiski_restandardization_leaves_its_posterior_unchanged() -> None:
    r"""With a ScaleKernel, WISKI maps the constant mean, the noise and the outputscale, so its
    posterior in the user's units is that of before (and its caches are rebuilt)."""
    X, Y = _data(1, 12)
    kernel = ScaleKernel(RBFKernel(ard_num_dims=2))
    model = _updated(WISKI(X, Y, grid_size=12, covar_module=kernel))
    Xt = torch.rand(5, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    before = model.posterior(Xt, observation_noise=True)
    all_Y = torch.cat([Y, _data(2, 10, scale=8.0, shift=3.0)[1]])
    model.restandardize()
    mean, std = _botorch_scaling(all_Y)
    torch.testing.assert_close(model.outcome_mean, mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(model.outcome_std, std, rtol=1e-10, atol=0)
    after = model.posterior(Xt, observation_noise=True)
    torch.testing.assert_close(after.mean, before.mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(after.variance, before.variance, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("cls", [OnlineExactGP, WISKI, TSVGP, DecoupledSVGP, QSGP])
def test_a_model_on_one_point_is_centred_on_it_as_botorch_standardize(cls):
    """One training point: the outcome scaling is BoTorch's ``Standardize`` on one value (mean
    the value, deviation 1), so before any fit the model predicts the value everywhere, as
    ``SingleTaskGP`` does (it kept mean 0: an exact GP on y = 102 predicted 20-50)."""
    from botorch.models import SingleTaskGP

    X = torch.tensor([[0.3, 0.6]], dtype=torch.float64)
    Y = torch.tensor([[102.0]], dtype=torch.float64)
    Xt = torch.tensor([[0.3, 0.6], [0.9, 0.1], [0.5, 0.5]], dtype=torch.float64)
    reference = SingleTaskGP(X, Y, outcome_transform=Standardize(m=1)).posterior(Xt).mean
    model = cls(X, Y)
    assert torch.equal(model.outcome_mean, torch.tensor([102.0], dtype=torch.float64))
    assert torch.equal(model.outcome_std, torch.ones(1, dtype=torch.float64))
    assert torch.allclose(model.posterior(Xt).mean, reference, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("cls", [OnlineExactGP, WISKI, TSVGP, DecoupledSVGP, QSGP])
def test_posterior_variance_on_a_small_outcome_scale_is_not_floored_in_user_units(cls, dtype):
    """Targets of sd about 1e-6: the posterior variances (about 1e-13) scale with the targets'
    variance. GPyTorch floors ``MultivariateNormal.variance`` at 1e-10 (float64) / 1e-6
    (float32) in whatever units it is in, so every model reported that constant at every point
    (10^3 / 10^7 times too large, with a 'negative variance' warning) and qNIPV was flat; the
    floor now applies in standardised units. Checked against the same model on the unscaled
    targets and the diagonal of the posterior covariance, and for the exact GP against a dense
    GP computed by hand in float64."""
    d, s = 6, 1e-6
    X, Y = _data(0, 20)
    X = torch.cat([X, X.flip(-1), X[:, :2]], dim=-1)  # d = 6
    Xt = torch.rand(7, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    Xt[0] = X[0]  # at a training point: the smallest variance
    opts = {"projection": "all-pairs", "grid_size": 8} if cls is WISKI else {}
    if cls is QSGP:
        opts = {"num_features": 64, "seed": 0}
    big = cls(X.to(dtype), Y.to(dtype), **opts)
    small = cls(X.to(dtype), (s * Y).to(dtype), **opts)
    with gpytorch.settings.fast_pred_var(False), torch.no_grad():
        v_big = big.posterior(Xt.to(dtype)).variance.squeeze(-1).double()
        with warnings.catch_warnings():
            warnings.simplefilter("error", gpytorch.utils.warnings.NumericalWarning)
            post = small.posterior(Xt.to(dtype))
            v_small = post.variance.squeeze(-1).double()
            diag = post.covariance_matrix.diagonal().double()
    assert bool((v_small > 0).all())
    rtol = 1e-8 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(v_small / s**2, v_big, rtol=rtol, atol=0)
    torch.testing.assert_close(v_small, diag, rtol=rtol, atol=0)
    if cls is OnlineExactGP:  # a dense GP by hand (standardised units), in float64
        k = copy.deepcopy(small.covar_module).double()
        noise = small.likelihood.noise.detach().double().reshape(())
        K = k(X).to_dense() + noise * torch.eye(X.shape[0], dtype=torch.float64)
        Ks = k(Xt, X).to_dense()
        var = k(Xt).to_dense().diagonal() - (Ks * torch.linalg.solve(K, Ks.T).T).sum(-1)
        expect = var * small.outcome_std.double().reshape(()) ** 2
        torch.testing.assert_close(v_small, expect, rtol=10 * rtol, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_multi_output_posterior_variance_is_floored_per_output_in_standardised_units(dtype):
    """A two-output t-SVGP whose first output has sd about 1e-6 and second about 1e3: every
    output's variances scale with its own targets' variance (the first was GPyTorch's 1e-10 /
    1e-6 at every point, also when asked for with ``output_indices=[0]``)."""
    X, Y = _data(1, 20, m=2)
    scales = torch.tensor([1e-6, 1e3], dtype=torch.float64)
    Xt = torch.rand(5, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    big = TSVGP(X.to(dtype), Y.to(dtype))
    small = TSVGP(X.to(dtype), (Y * scales).to(dtype))
    rtol = 1e-8 if dtype == torch.float64 else 1e-4
    with torch.no_grad():
        v_big = big.posterior(Xt.to(dtype)).variance.double()  # 5 x 2
        with warnings.catch_warnings():
            warnings.simplefilter("error", gpytorch.utils.warnings.NumericalWarning)
            post = small.posterior(Xt.to(dtype))
            v_small = post.variance.double()
            diag = post.covariance_matrix.diagonal().double().reshape(5, 2)  # interleaved
            v_first = small.posterior(Xt.to(dtype), output_indices=[0]).variance.double()
    torch.testing.assert_close(v_small / scales**2, v_big, rtol=rtol, atol=0)
    torch.testing.assert_close(v_small, diag, rtol=rtol, atol=0)
    torch.testing.assert_close(v_first.squeeze(-1), v_small[:, 0], rtol=rtol, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_scalarized_posterior_variance_is_floored_in_standardised_units(dtype):
    """BoTorch's ``ScalarizedPosteriorTransform`` (``LogEI(..., posterior_transform=...)``, and
    what qNIPV needs on a multi-output model) builds a plain ``MultivariateNormal``, so the
    variance it reported was again GPyTorch's user-unit floor: 1e-10 (float64) / 1e-6 (float32)
    at every point for targets of sd 1e-6, 10^4 / 10^8 times the covariance's diagonal. The
    scalarized variance is floored as the untransformed one: checked against the diagonal and,
    single-output, against the untransformed variance; two outputs (sds 1e-6, 1e3) weighted
    (-1, 0) against the first output's variance."""
    from botorch.acquisition.objective import ScalarizedPosteriorTransform

    X, Y = _data(0, 20)
    Xt = torch.rand(2, 5, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    Xt[0, 0] = X[0]  # at a training point: the smallest variance
    rtol = 1e-8 if dtype == torch.float64 else 1e-4
    X2, Y2 = _data(1, 20, m=2)
    cases = [
        (OnlineExactGP(X.to(dtype), (1e-6 * Y).to(dtype)), [-1.0], None),
        (TSVGP(X2.to(dtype), (Y2 * torch.tensor([1e-6, 1e3])).to(dtype)), [-1.0, 0.0], 0),
    ]
    for model, weights, first in cases:
        transform = ScalarizedPosteriorTransform(torch.tensor(weights, dtype=dtype))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error", gpytorch.utils.warnings.NumericalWarning)
            post = model.posterior(Xt.to(dtype), posterior_transform=transform)
            var = post.variance.squeeze(-1).double()
            diag = post.distribution.covariance_matrix.diagonal(dim1=-2, dim2=-1).double()
            plain = model.posterior(Xt.to(dtype)).variance.double()
        torch.testing.assert_close(var, diag, rtol=rtol, atol=0)
        expect = plain.squeeze(-1) if first is None else plain[..., first]
        torch.testing.assert_close(var, expect, rtol=rtol, atol=0)
