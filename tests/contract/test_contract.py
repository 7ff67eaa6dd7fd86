r"""Every row of ``docs/contract.md``, checked for every surrogate in ``surrogates.SURROGATES``
against a dense reference computed by hand (float64, CPU, seeded, small n).

A new surrogate is covered by adding it to that one list.
"""

from __future__ import annotations

import copy
import gc
import pickle
import warnings
import weakref
from unittest import mock

import pytest
import torch
from botorch.acquisition.objective import ScalarizedPosteriorTransform
from botorch.exceptions.warnings import BotorchWarning
from botorch.fit import fit_gpytorch_mll
from botorch.models.transforms.input import FilterFeatures, InteractionFeatures, Normalize, Warp
from botorch.models.transforms.outcome import Log, Standardize
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood, MarginalLogLikelihood
from linear_operator.operators import DenseLinearOperator
from memory_profile import peak_allocated_bytes
from surrogates import (
    SURROGATES,
    assert_close,
    ids,
    latent,
    reference,
    reference_conditioned,
    same_state,
    tensor_state,
)

DT = torch.float64
D = 2  # input dimension of most rows (every surrogate takes it without extra options)
N0, Q = 12, 3  # initial points, points per conditioning

surrogates = pytest.mark.parametrize("s", SURROGATES, ids=ids())
dims = pytest.mark.parametrize("d", [D, 4], ids=["d2", "d4"])
noise_kinds = pytest.mark.parametrize("fixed", [False, True], ids=["inferred", "fixed"])


def _skip_unsupported(s, fixed: bool) -> None:
    if fixed and not s.fixed_noise:
        pytest.skip(f"{s.name} has no fixed-noise variant: {s.reasons.get('fixed_noise', '')}")


def _test_points(n: int = 5, d: int = D, seed: int = 99, batch: tuple[int, ...] = ()):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*batch, n, d, generator=g, dtype=DT)


def _block(t: torch.Tensor, b: int, q: int) -> torch.Tensor:
    """Batch ``b`` of a stacked reference (``(B q)`` mean or ``(B q) x (B q)`` covariance)."""
    sl = slice(b * q, (b + 1) * q)
    return t[sl] if t.dim() == 1 else t[sl, sl]


# ------------------------------------------------------------------ posterior


@surrogates
@noise_kinds
@dims
def test_posterior_shapes_and_units_match_dense_reference(s, fixed, d):
    """posterior(): ``q x d`` and ``b x q x d`` inputs, latent and with observation noise (True:
    the likelihood's noise, or the mean training noise for fixed noise, as BoTorch; a tensor:
    standardised units), in the user's outcome units."""
    _skip_unsupported(s, fixed)
    X, Y, Yvar = s.data(N0, d, seed=0, fixed=fixed)
    model = s.make(X, Y, Yvar)
    B, q = 3, 4
    Xt = _test_points(q, d=d, batch=(B,))
    mean_ref, cov_ref = reference(s, model, X, Y, Yvar, Xt.reshape(-1, d))
    std2 = model.outcome_std.reshape(()) ** 2
    if s.observation_noise_at is not None:  # depends on the latent mean (standardised)
        f = (mean_ref - model.outcome_mean) / model.outcome_std
        noise_std = s.observation_noise_at(model, f)
    elif fixed:
        noise_std = (Yvar / std2).mean().expand(B * q)
    else:
        noise_std = s.noise_of(model).expand(B * q)
    given = torch.linspace(0.01, 0.05, B * q, dtype=DT).reshape(B, q, 1)  # standardised
    for obs in (False, True, given):
        for Xq, batch in ((Xt[1], ()), (Xt, (B,))):
            o = obs if not isinstance(obs, torch.Tensor) else (obs if batch else obs[1])
            post = model.posterior(Xq, observation_noise=o)
            assert post.mean.shape == torch.Size([*batch, q, 1])
            assert post.variance.shape == torch.Size([*batch, q, 1])
            cov = post.covariance_matrix
            assert cov.shape == torch.Size([*batch, q, q])
            for b in range(B) if batch else [1]:
                m_b = post.mean[b] if batch else post.mean
                c_b = cov[b] if batch else cov
                add = torch.zeros(q, dtype=DT)
                if obs is True:
                    add = _block(noise_std, b, q)
                elif isinstance(obs, torch.Tensor):
                    add = given[b].squeeze(-1)
                expect = _block(cov_ref, b, q) + torch.diag(add * std2)
                assert_close(m_b.squeeze(-1), _block(mean_ref, b, q), s.tol, f"mean obs={obs!r:.5}")
                assert_close(c_b, expect, s.tol, f"covariance obs={obs!r:.5}")
    # output_indices=[0] is the whole posterior; anything else is refused
    post = model.posterior(Xt, output_indices=[0])
    assert_close(post.mean.squeeze(-1), mean_ref.reshape(B, q), s.tol, "output_indices=[0]")
    for bad in ([1], [], [0, 1]):
        with pytest.raises(ValueError):
            model.posterior(Xt, output_indices=bad)
    # a posterior transform is applied last, in the user's units
    post = model.posterior(
        Xt, posterior_transform=ScalarizedPosteriorTransform(torch.tensor([-2.0], dtype=DT))
    )
    assert_close(post.mean.squeeze(-1), -2 * mean_ref.reshape(B, q), s.tol, "scalarised mean")
    var_ref = 4 * cov_ref.diagonal().reshape(B, q)
    assert_close(post.variance.squeeze(-1), var_ref, s.tol, "scalarised variance")


@surrogates
def test_posterior_at_an_empty_batch_is_empty(s):
    """``posterior`` at ``0 x q x d`` points (and at an empty batch of a fantasy model), as a
    ``SingleTaskGP`` answers: an empty mean and covariance of the broadcast batch shape, with or
    without observation noise, differentiable in ``X`` (a zero gradient). Asked after the model's
    per-point caches are warm (WISKI serves repeated requests from a cached Gram matrix)."""
    X, Y, _ = s.data(N0, 4, seed=0)
    model = s.make(X, Y)
    for _ in range(12):  # past any "build the cache after k calls" threshold
        x = _test_points(3, d=4, batch=(2,)).requires_grad_(True)
        model.posterior(x).variance.sum().backward()
    fantasy = model.fantasize(
        _test_points(Q, d=4, batch=(2,)), SobolQMCNormalSampler(torch.Size([2]))
    )
    for m, batch in ((model, (0,)), (model, (3, 0)), (fantasy, (0, 2, 2)), (fantasy, (0, 1, 1))):
        for obs in (False, True):
            x = _test_points(3, d=4, batch=batch).requires_grad_(True)
            post = m.posterior(x, observation_noise=obs)
            shape = torch.broadcast_shapes(torch.Size(batch), m.batch_shape)
            assert post.mean.shape == (*shape, 3, 1) and post.variance.shape == (*shape, 3, 1)
            assert post.mean.dtype == DT
            (post.mean.sum() + post.variance.sum()).backward()
            assert x.grad is not None and x.grad.shape == x.shape


@surrogates
def test_variance_at_many_points_is_lazy(s, request):
    """.variance at many points (one batch of q = 1000) equals the dense diagonal, and the
    covariance is a lazy operator: no q x q matrix is formed to get it, which the allocations
    show (WISKI's exact regime wrapped a dense prior k(X, X) in a lazy sum: 2 q x q matrices
    at 2 inputs, 75 at 6, so 10,000 points at 6 inputs needed 60 GB)."""
    if not s.lazy_covariance:
        request.applymarker(pytest.mark.xfail(strict=True, reason=s.reasons["lazy_covariance"]))
    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    Xm = _test_points(1000, seed=5)
    post = model.posterior(Xm)
    _, cov_m = reference(s, model, X, Y, None, Xm)
    assert_close(post.variance.squeeze(-1).detach(), cov_m.diagonal(), s.tol, "variance")
    covar = post.distribution.lazy_covariance_matrix
    assert not isinstance(covar, DenseLinearOperator), type(covar).__name__
    with torch.no_grad():
        peak = peak_allocated_bytes(lambda: model.posterior(Xm).variance)
    assert peak < 0.5 * Xm.shape[0] ** 2 * 8, f"{peak / 1e6:.1f} MB: a q x q matrix was formed"


# ------------------------------------------------------------------ conditioning


def _rebuild(s, parent, X, Y, Yvar):
    r"""A model built on all data with the parent's hyperparameters and outcome scaling: the
    data standardised by the parent's scaling, the model's own standardisation off."""
    mu, sd = parent.outcome_mean, parent.outcome_std
    Yvar_s = None if Yvar is None else Yvar / sd**2
    return s.make(X, (Y - mu) / sd, Yvar_s, template=parent, standardize=False), mu, sd


@surrogates
@noise_kinds
@dims
def test_condition_equals_update_equals_rebuild_equals_dense(s, fixed, d):
    """condition_on_observations (standardised noise) == update (user-unit noise) == a model built
    on all data with the same hyperparameters and scaling == the dense reference on all data;
    conditioning a conditioned model == conditioning once on both batches."""
    _skip_unsupported(s, fixed)
    X, Y, Yvar = s.data(N0, d, seed=0, fixed=fixed)
    Xn, Yn, Nn = s.data(Q, d, seed=1, fixed=fixed)
    Xm, Ym, Nm = s.data(2, d, seed=2, fixed=fixed)
    Xt = _test_points(d=d)
    parent = s.make(X, Y, Yvar)
    std2 = parent.outcome_std**2
    cond = parent.condition_on_observations(Xn, Yn, noise=None if Nn is None else Nn / std2)
    assert type(cond) is type(parent)
    upd = s.make(X, Y, Yvar)
    assert upd.update(Xn, Yn, Nn) is upd
    mean_ref, cov_ref = reference_conditioned(s, parent, X, Y, Yvar, [(Xn, Yn, Nn)], Xt)
    m_c, C_c = latent(cond, Xt)
    m_u, C_u = latent(upd, Xt)
    results = {"condition": (m_c, C_c), "update": (m_u, C_u)}
    if s.conditioning == "rebuild":
        Xa, Ya = torch.cat([X, Xn]), torch.cat([Y, Yn])
        Va = None if Yvar is None else torch.cat([Yvar, Nn])
        reb, mu, sd = _rebuild(s, parent, Xa, Ya, Va)
        m_r, C_r = latent(reb, Xt)
        results["rebuild"] = (m_r * sd + mu, C_r * sd**2)
    for name, (m, C) in results.items():
        assert_close(m, mean_ref, s.tol, f"{name} mean vs dense")
        assert_close(C, cov_ref, s.tol, f"{name} covariance vs dense")
    assert_close(m_c, m_u, s.tol, "condition vs update")
    assert_close(C_c, C_u, s.tol, "condition vs update")
    # a batch of candidate sets (b x q x d, Y b x q x 1): each equals its own conditioning
    Xs = torch.stack([Xn, Xn.flip(0) * 0.9])
    Ys = torch.stack([Yn, Yn.flip(0)])
    Ns = None if Nn is None else torch.stack([Nn, Nn.flip(0)]) / std2
    batched = parent.condition_on_observations(Xs, Ys, noise=Ns)
    assert batched.batch_shape == torch.Size([2])
    m_b, C_b = latent(batched, Xt.expand(2, *Xt.shape))
    for j in range(2):
        Nj = None if Nn is None else Ns[j] * std2
        mean_j, cov_j = reference_conditioned(s, parent, X, Y, Yvar, [(Xs[j], Ys[j], Nj)], Xt)
        assert_close(m_b[j], mean_j, s.tol, f"batched conditioning {j} mean")
        assert_close(C_b[j], cov_j, s.tol, f"batched conditioning {j} covariance")
    # chained conditioning == once on both batches == dense on everything
    chained = cond.condition_on_observations(Xm, Ym, noise=None if Nm is None else Nm / std2)
    both = parent.condition_on_observations(
        torch.cat([Xn, Xm]),
        torch.cat([Yn, Ym]),
        noise=None if Nn is None else torch.cat([Nn, Nm]) / std2,
    )
    mean_ref2, cov_ref2 = reference_conditioned(
        s, parent, X, Y, Yvar, [(Xn, Yn, Nn), (Xm, Ym, Nm)], Xt
    )
    refs = {"chained": (mean_ref2, cov_ref2), "both": (mean_ref2, cov_ref2)}
    if not s.chain_equals_batch:  # each against its own reference (see the surrogate's reason)
        N_both = None if Nn is None else torch.cat([Nn, Nm])
        batch = (torch.cat([Xn, Xm]), torch.cat([Yn, Ym]), N_both)
        refs["both"] = reference_conditioned(s, parent, X, Y, Yvar, [batch], Xt)
    for name, mdl in {"chained": chained, "both": both}.items():
        m, C = latent(mdl, Xt)
        assert_close(m, refs[name][0], s.tol, f"{name} mean vs dense")
        assert_close(C, refs[name][1], s.tol, f"{name} covariance vs dense")
    # a second in-place update continues from the first
    upd.update(Xm, Ym, Nm)
    m, C = latent(upd, Xt)
    assert_close(m, mean_ref2, s.tol, "second update mean")
    assert_close(C, cov_ref2, s.tol, "second update covariance")


@surrogates
def test_observation_noise_of_a_conditioned_fixed_noise_model_counts_the_new_points(s):
    """With fixed noise, ``observation_noise=True`` adds the mean noise of every point the model
    holds (BoTorch's convention): after conditioning (one batch of points, or ``b`` candidate
    sets at once) that mean includes the conditioned points, as after ``update`` with them. So
    the noisy posterior is the dense latent posterior on all data plus that mean, computed from
    the data by hand."""
    _skip_unsupported(s, True)
    X, Y, Yvar = s.data(N0, D, seed=0, fixed=True)
    Xn, Yn, _ = s.data(Q, D, seed=1, fixed=True)
    Nn = torch.full((Q, 1), 0.3, dtype=DT)  # user units, well above the training noise
    Xt = _test_points()
    parent = s.make(X, Y, Yvar)
    std2 = parent.outcome_std**2
    mean_ref, cov_ref = reference_conditioned(s, parent, X, Y, Yvar, [(Xn, Yn, Nn)], Xt)
    noisy_ref = cov_ref + torch.diag(torch.cat([Yvar, Nn]).mean().expand(Xt.shape[0]))
    cond = parent.condition_on_observations(Xn, Yn, noise=Nn / std2)
    batched = parent.condition_on_observations(
        Xn.expand(2, *Xn.shape), Yn.expand(2, *Yn.shape), noise=(Nn / std2).expand(2, Q, 1)
    )
    upd = s.make(X, Y, Yvar)
    upd.update(Xn, Yn, Nn)
    for name, mdl, Xq in (
        ("update", upd, Xt),
        ("condition", cond, Xt),
        ("batched condition", batched, Xt.expand(2, *Xt.shape)),
    ):
        m, C = latent(mdl, Xq, observation_noise=True)
        for j in range(2) if m.dim() > 1 else [None]:
            mj, Cj = (m, C) if j is None else (m[j], C[j])
            assert_close(mj, mean_ref, s.tol, f"{name} {j} mean")
            assert_close(Cj, noisy_ref, s.tol, f"{name} {j} covariance with observation noise")


@surrogates
def test_fixed_noise_fantasies_of_a_batched_model_take_x_without_its_batch(s):
    """BoTorch's ``fantasize`` takes ``X`` whose batch only broadcasts with the model's (one
    ``q x d`` set for every batch of a model conditioned on ``b`` candidate sets; before, a
    fixed-noise model's default noise, now per batch, was refused by ``posterior`` or failed in
    conditioning). The fantasy model adds, with ``observation_noise=True``, the mean noise of
    every point it holds: the data's and the conditioned points' (the fantasised points carry
    that mean)."""
    _skip_unsupported(s, True)
    X, Y, Yvar = s.data(N0, D, seed=0, fixed=True)
    Xn, Yn, _ = s.data(Q, D, seed=1, fixed=True)
    parent = s.make(X, Y, Yvar)
    std2 = parent.outcome_std**2
    Nn = torch.full((2, Q, 1), 0.3, dtype=DT)  # user units, well above the training noise
    cond = parent.condition_on_observations(
        torch.stack([Xn, Xn.flip(0)]), Yn.expand(2, *Yn.shape), noise=Nn / std2
    )
    fant = cond.fantasize(_test_points(2, seed=5), SobolQMCNormalSampler(torch.Size([3]), seed=0))
    assert fant.batch_shape == torch.Size([3, 2])
    Xt = _test_points()
    _, C = latent(fant, Xt)
    _, C_noisy = latent(fant, Xt, observation_noise=True)
    mean_noise = (Yvar.sum() + Nn[:, :, 0].sum(-1)) / (N0 + Q)  # per batch
    added = (C_noisy - C).diagonal(dim1=-2, dim2=-1)
    assert_close(added, mean_noise.reshape(1, 2, 1).expand(3, 2, Xt.shape[0]), s.tol, "noise")


@surrogates
def test_fixed_noise_fantasies_of_a_batched_model_take_each_batch_mean_noise(s):
    """A fixed-noise model conditioned on candidate sets with a different noise each fantasises,
    as BoTorch, with each batch's own mean noise (``batch x 1 x 1``): the fantasised points
    carry it, so the fantasy covariance of batch ``j`` is the dense one of the parent
    conditioned on its candidate set and then on the fantasy points with that noise, and
    ``observation_noise=True`` still adds that batch's mean. (Before, the exact GP and the
    decoupled SVGP fantasised every batch with the mean over all batches.)"""
    _skip_unsupported(s, True)
    if not s.fantasy_covariance_independent_of_Y:
        pytest.skip(s.reasons["fantasy_covariance_independent_of_Y"])
    X, Y, Yvar = s.data(N0, D, seed=0, fixed=True)
    Xn, Yn, _ = s.data(Q, D, seed=1, fixed=True)
    parent = s.make(X, Y, Yvar)
    std2 = parent.outcome_std**2
    Nn = torch.stack([torch.full((Q, 1), 0.05, dtype=DT), torch.full((Q, 1), 0.8, dtype=DT)])
    Xs = torch.stack([Xn, Xn.flip(0) * 0.9])
    cond = parent.condition_on_observations(Xs, Yn.expand(2, *Yn.shape), noise=Nn / std2)
    Xf = _test_points(2, seed=5)
    fant = cond.fantasize(Xf, SobolQMCNormalSampler(torch.Size([3]), seed=0))
    assert fant.batch_shape == torch.Size([3, 2])
    Xt = _test_points()
    _, C = latent(fant, Xt)
    _, C_noisy = latent(fant, Xt, observation_noise=True)
    mean_noise = (Yvar.sum() + Nn[:, :, 0].sum(-1)) / (N0 + Q)  # per batch, user units
    added = (C_noisy - C).diagonal(dim1=-2, dim2=-1)
    assert_close(added, mean_noise.reshape(1, 2, 1).expand(3, 2, Xt.shape[0]), s.tol, "noise")
    for j in range(2):  # the covariance does not depend on the fantasised values
        Nf = mean_noise[j].expand(2, 1)
        batches = [(Xs[j], Yn, Nn[j]), (Xf, torch.zeros(2, 1, dtype=DT), Nf)]
        _, cov_j = reference_conditioned(s, parent, X, Y, Yvar, batches, Xt)
        for i in range(3):
            assert_close(C[i, j], cov_j, s.tol, f"fantasy {i}, batch {j} covariance")


@surrogates
def test_noise_varying_along_dims_x_lacks_conditions_each_element_on_its_own(s):
    """``condition_on_observations`` with noise that differs along leading dims of ``Y`` that
    ``X`` lacks -- fantasy sample dims (``X``: ``q x d``, ``Y`` and noise ``2 x q x 1``), or the
    batch of a model conditioned on candidate sets (``X``: ``q x d`` for both) -- conditions each
    element on its own noise: each equals the dense reference of the parent conditioned on its
    own data. (Before, every element silently took the noise of the first.)"""
    _skip_unsupported(s, True)
    X, Y, Yvar = s.data(N0, D, seed=0, fixed=True)
    Xn, Yn, _ = s.data(Q, D, seed=1, fixed=True)
    Xm, Ym, _ = s.data(2, D, seed=2, fixed=True)
    Xt = _test_points()
    parent = s.make(X, Y, Yvar)
    std2 = parent.outcome_std**2
    Nn = torch.stack([torch.full((Q, 1), 0.02, dtype=DT), torch.full((Q, 1), 0.5, dtype=DT)])
    Ys = torch.stack([Yn, Yn.flip(0)])
    samples = parent.condition_on_observations(Xn, Ys, noise=Nn / std2)
    assert samples.batch_shape == torch.Size([2])
    m, C = latent(samples, Xt)
    for j in range(2):
        mean_j, cov_j = reference_conditioned(s, parent, X, Y, Yvar, [(Xn, Ys[j], Nn[j])], Xt)
        assert_close(m[j], mean_j, s.tol, f"sample {j} mean")
        assert_close(C[j], cov_j, s.tol, f"sample {j} covariance")
    # a model conditioned on 2 candidate sets, then on Xm for both, with noise per batch
    Xs = torch.stack([Xn, Xn.flip(0) * 0.9])
    cond = parent.condition_on_observations(Xs, Ys, noise=Nn / std2)
    Nm = torch.stack([torch.full((2, 1), 0.5, dtype=DT), torch.full((2, 1), 0.02, dtype=DT)])
    chained = cond.condition_on_observations(Xm, Ym.expand(2, 2, 1), noise=Nm / std2)
    m, C = latent(chained, Xt)
    for j in range(2):
        batches = [(Xs[j], Ys[j], Nn[j]), (Xm, Ym, Nm[j])]
        mean_j, cov_j = reference_conditioned(s, parent, X, Y, Yvar, batches, Xt)
        assert_close(m[j], mean_j, s.tol, f"chained batch {j} mean")
        assert_close(C[j], cov_j, s.tol, f"chained batch {j} covariance")


@surrogates
def test_noise_per_batch_with_x_of_batch_one_conditions_each_batch_on_its_own(s):
    """``X`` of batch size 1 (``1 x q x d``) broadcasts against ``Y`` and noise of batch ``b``
    (``b x q x 1``) with a different noise per batch: each batch equals the dense reference of
    the parent conditioned on its own data. (Before, the exact GP, WISKI and the decoupled SVGP
    failed with torch's RuntimeError, and t-SVGP used the first batch's noise for all.)"""
    _skip_unsupported(s, True)
    X, Y, Yvar = s.data(N0, D, seed=0, fixed=True)
    Xn, Yn, _ = s.data(Q, D, seed=1, fixed=True)
    Xt = _test_points()
    parent = s.make(X, Y, Yvar)
    Nn = torch.tensor([0.02, 0.5, 0.1], dtype=DT).reshape(3, 1, 1).expand(3, Q, 1)
    Ys = torch.stack([Yn, Yn.flip(0), Yn + 0.3])
    cond = parent.condition_on_observations(Xn.unsqueeze(0), Ys, noise=Nn / parent.outcome_std**2)
    assert cond.batch_shape == torch.Size([3])
    m, C = latent(cond, Xt)
    for j in range(3):
        mean_j, cov_j = reference_conditioned(s, parent, X, Y, Yvar, [(Xn, Ys[j], Nn[j])], Xt)
        assert_close(m[j], mean_j, s.tol, f"batch {j} mean")
        assert_close(C[j], cov_j, s.tol, f"batch {j} covariance")


@surrogates
@noise_kinds
def test_fantasies_at_no_points_leave_the_posterior_as_it_was(s, fixed):
    """``fantasize`` at ``b x 0 x d`` (BoTorch conditions on empty ``sample x b x 0 x 1``
    observations) gives a ``sample x b`` batch of models each equal to the parent, as does
    fantasising a batched model at no points. (Before, every surrogate but WISKI with inferred
    noise failed with torch's RuntimeError from a reshape of the empty noise or of the empty
    right-hand sides of a solve; the Bernoulli t-SVGP's sampler refused 0 dimensions.)"""
    _skip_unsupported(s, fixed)
    X, Y, Yvar = s.data(N0, D, seed=0, fixed=fixed)
    parent = s.make(X, Y, Yvar)
    Xt = _test_points()
    m0, C0 = latent(parent, Xt)
    fant = parent.fantasize(torch.empty(3, 0, D, dtype=DT), SobolQMCNormalSampler(torch.Size([2])))
    assert fant.batch_shape == torch.Size([2, 3])
    m, C = latent(fant, Xt)
    assert_close(m, m0.expand(2, 3, -1), s.tol, "mean")
    assert_close(C, C0.expand(2, 3, -1, -1), s.tol, "covariance")
    again = fant.fantasize(torch.empty(0, D, dtype=DT), SobolQMCNormalSampler(torch.Size([2])))
    assert again.batch_shape == torch.Size([2, 2, 3])
    m, C = latent(again, Xt)
    assert_close(m, m0.expand(2, 2, 3, -1), s.tol, "mean of the fantasy's fantasy")
    assert_close(C, C0.expand(2, 2, 3, -1, -1), s.tol, "covariance of the fantasy's fantasy")


@surrogates
def test_long_stream_of_updates_matches_dense_reference(s):
    """40 single-point updates in place (as a loop makes them) stay on the dense reference: no
    drift of the incrementally updated factors."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xs, Ys, _ = s.data(40, D, seed=11)
    Xt = _test_points()
    model = s.make(X, Y)
    twin = s.make(X, Y)  # untouched, for the reference's hyperparameters and scaling
    for i in range(40):
        model.update(Xs[i : i + 1], Ys[i : i + 1])
    mean_ref, cov_ref = reference_conditioned(
        s, twin, X, Y, None, [(Xs[i : i + 1], Ys[i : i + 1], None) for i in range(40)], Xt
    )
    m, C = latent(model, Xt)
    assert_close(m, mean_ref, 10 * s.tol, "mean after 40 updates")
    assert_close(C, cov_ref, 10 * s.tol, "covariance after 40 updates")


@surrogates
def test_data_botorch_reads_follow_updates(s):
    """``num_data`` and, where the model holds its data, ``train_inputs`` and ``train_targets``
    (what ``get_X_baseline``, proximal acquisition and ``sample_around_best`` read) hold every
    point added by ``update``, in order, before any refit."""
    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    batches = [s.data(k, D, seed=20 + k) for k in (1, 3, 2)]
    for Xb, Yb, _ in batches:
        model.update(Xb, Yb)
    X_all = torch.cat([X] + [b[0] for b in batches])
    Y_all = torch.cat([Y] + [b[1] for b in batches]).reshape(-1)
    assert model.num_data == X_all.shape[0], s.name
    if hasattr(model, "train_inputs"):  # not WISKI: it keeps statistics, not the points
        torch.testing.assert_close(model.train_inputs[0], X_all, rtol=0, atol=1e-12)
        torch.testing.assert_close(model.train_targets, Y_all, rtol=0, atol=1e-9)


@surrogates
def test_subset_to_the_only_output_is_an_independent_copy_as_for_singletaskgp(s):
    """``subset_output([0])`` of a single-output model raised ``NotImplementedError`` (BoTorch's
    default), where ``SingleTaskGP`` returns a copy; it now returns an independent copy with the
    same posterior, and a subset it cannot give is refused saying what to do."""
    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    Xt = _test_points()
    before = model.posterior(Xt)
    for idcs in ([0], [-1]):
        sub = model.subset_output(idcs)
        assert sub is not model and sub.num_outputs == 1, s.name
        torch.testing.assert_close(sub.posterior(Xt).mean, before.mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(sub.posterior(Xt).variance, before.variance, rtol=0, atol=1e-12)
    sub.update(*s.data(3, D, seed=7)[:2])  # the copy moves on alone
    torch.testing.assert_close(model.posterior(Xt).mean, before.mean, rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="cannot be subset to outputs"):
        model.subset_output([1])


@surrogates
def test_calling_the_model_says_to_use_posterior_and_fit(s):
    """``model(X)`` (GPyTorch's training call) raised a bare ``NotImplementedError``."""
    X, Y, _ = s.data(N0, D, seed=0)
    with pytest.raises(NotImplementedError, match=r"use model.posterior\(X\) for predictions"):
        s.make(X, Y)(_test_points())


@surrogates
def test_explicit_noise_on_an_inferred_noise_model(s):
    """update(X, Y, noise) on a model that infers its noise: the same as conditioning with that
    noise (standardised), the dense reference with those per-point noises, and kept by the
    model's statistics (a cache rebuild with the same hyperparameters changes nothing)."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xn, Yn, _ = s.data(Q, D, seed=1)
    Nn = torch.linspace(0.05, 0.3, Q, dtype=DT).unsqueeze(-1)  # user units
    Xt = _test_points()
    model = s.make(X, Y)
    if not s.explicit_noise_when_inferred:
        latent(model, Xt)  # (caches built: a lazy first build is not a change of state)
        before = tensor_state(model)
        with pytest.raises(ValueError):
            model.update(Xn, Yn, Nn)
        assert same_state(before, tensor_state(model)) == []
        return
    std2 = model.outcome_std**2
    cond = model.condition_on_observations(Xn, Yn, noise=Nn / std2)
    mean_ref, cov_ref = reference_conditioned(s, model, X, Y, None, [(Xn, Yn, Nn)], Xt)
    model.update(Xn, Yn, Nn)
    for name, mdl in {"condition": cond, "update": model}.items():
        for rebuilt in (False, True):
            if rebuilt:
                mdl.invalidate_caches()
            m, C = latent(mdl, Xt)
            assert_close(m, mean_ref, s.tol, f"{name} mean (caches rebuilt: {rebuilt})")
            assert_close(C, cov_ref, s.tol, f"{name} covariance (caches rebuilt: {rebuilt})")


@surrogates
def test_conditioning_leaves_parent_untouched_and_child_independent(s):
    """The original is untouched by conditioning, shares its hyperparameter modules with the
    child, and the child does not change when the parent is later updated in place."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xn, Yn, _ = s.data(Q, D, seed=1)
    Xt = _test_points()
    parent = s.make(X, Y)
    parent0 = s.make(X, Y)  # an untouched twin, for the dense reference
    m0, C0 = latent(parent, Xt)  # caches built
    before = tensor_state(parent)
    child = parent.condition_on_observations(Xn, Yn)
    assert same_state(before, tensor_state(parent)) == []
    m1, C1 = latent(parent, Xt)
    # (equal up to rounding: a model may cache a factor root on the first conditioning and
    # predict through it afterwards)
    assert_close(m1, m0, 1e-12, "parent mean after conditioning")
    assert_close(C1, C0, 1e-12, "parent covariance after conditioning")
    for name, module in parent.named_children():
        if any(True for _ in module.parameters()):  # hyperparameter modules are shared
            assert getattr(child, name) is module, name
    mc, Cc = latent(child, Xt)
    child_state = tensor_state(child)
    for seed in (3, 4):  # later in-place updates of the parent
        Xu, Yu, _ = s.data(2, D, seed=seed)
        parent.update(Xu, Yu)
    # loading another state (the same hyperparameters, other data) into the parent does not
    # reach the child through shared buffers
    parent.load_state_dict(s.make(X[:4], Y[:4], template=parent).state_dict())
    assert same_state(child_state, tensor_state(child)) == []
    mc2, Cc2 = latent(child, Xt)
    assert_close(mc2, mc, 1e-12, "child mean after parent updates")
    assert_close(Cc2, Cc, 1e-12, "child covariance after parent updates")
    mean_ref, cov_ref = reference_conditioned(s, parent0, X, Y, None, [(Xn, Yn, None)], Xt)
    assert_close(mc2, mean_ref, s.tol, "child mean vs dense after parent updates")
    assert_close(Cc2, cov_ref, s.tol, "child covariance vs dense after parent updates")
    if s.exact_in_hyperparameters:
        # A refit of the parent moves the shared hyperparameters: the child follows them from
        # its own data and scaling (the parent's restandardisation does not reach it).
        parent.fit(max_iter=5)
        mc3, Cc3 = latent(child, Xt)
        mean_ref, cov_ref = reference_conditioned(s, child, X, Y, None, [(Xn, Yn, None)], Xt)
        assert_close(mc3, mean_ref, 10 * s.tol, "child mean after a parent refit")
        assert_close(Cc3, cov_ref, 10 * s.tol, "child covariance after a parent refit")


@surrogates
def test_a_conditioned_model_does_not_keep_its_parent_alive(s):
    """A conditioned child shares the parent's tensors and hyperparameter modules, not the
    parent: the shallow copy shared GPyTorch's load_state_dict pre-hook, a method bound to the
    parent, so a child (Ax's model of every trial, a fantasy model) kept its parent and all its
    caches alive, and loading a state into the child ran the parent's hook."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xn, Yn, _ = s.data(Q, D, seed=1)
    parent = s.make(X, Y)
    child = parent.condition_on_observations(Xn, Yn)
    mean, _ = latent(child, _test_points())
    gone = weakref.ref(parent)
    del parent
    gc.collect()
    assert gone() is None
    assert_close(latent(child, _test_points())[0], mean, 1e-12, "child mean without its parent")


@surrogates
def test_a_dropped_model_is_freed_by_reference_counting(s):
    """A model, fitted, predicted from and conditioned, is freed with its caches as soon as the
    last reference goes: GPyTorch's load_state_dict pre-hook, a method bound to the module,
    made every model a reference cycle that waited for Python's cyclic garbage collection,
    which counts objects, not bytes; through Ax (a new model every trial) WISKI at 6 inputs
    grew by 100-200 MB of dead models a trial (Hartmann6: 1.9 GB at the 8th BO trial)."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xn, Yn, _ = s.data(Q, D, seed=1)
    gc.collect()
    gc.disable()
    try:
        model = s.make(X, Y)
        model.fit(max_iter=2)
        latent(model, _test_points())
        child = model.condition_on_observations(Xn, Yn)
        latent(child, _test_points())
        model.load_state_dict(model.state_dict())
        refs = [weakref.ref(model), weakref.ref(child)]
        del model, child
        assert [ref() is None for ref in refs] == [True, True]
    finally:
        gc.enable()


@surrogates
def test_batched_points_with_one_shared_Y_condition_like_each_batch_alone(s):
    """``condition_on_observations`` with ``X``: ``b x q x d`` and ``Y``: ``q x 1`` (batch dims
    broadcast) gives, for every batch element, the model conditioned on that element alone."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xn, Yn, _ = s.data(4 * Q, D, seed=1)
    Xb = Xn.reshape(4, Q, D)
    parent = s.make(X, Y)
    Xt = _test_points()
    with torch.no_grad():
        batched = parent.condition_on_observations(Xb, Yn[:Q]).posterior(Xt)
        assert batched.mean.shape == (4, Xt.shape[0], 1)
        for b in range(4):
            alone = parent.condition_on_observations(Xb[b], Yn[:Q]).posterior(Xt)
            assert_close(batched.mean[b], alone.mean, s.tol, f"mean of batch {b}")
            assert_close(batched.variance[b], alone.variance, s.tol, f"variance of batch {b}")


@surrogates
@noise_kinds
def test_fantasize_shapes_and_covariance_independent_of_Y(s, fixed):
    """fantasize: ``sample x batch`` fantasy models; every fantasy equals the dense posterior on
    the data plus that fantasy's Y; the covariance does not depend on Y; fixed-noise models
    default to the mean training noise, as BoTorch."""
    _skip_unsupported(s, fixed)
    X, Y, Yvar = s.data(N0, D, seed=0, fixed=fixed)
    model = s.make(X, Y, Yvar)
    std2 = model.outcome_std**2
    S, B, q = 4, 3, 2
    Xf = _test_points(q, seed=7, batch=(B,))
    sampler = SobolQMCNormalSampler(torch.Size([S]), seed=0)
    latent(model, Xf[0])  # caches built
    before = tensor_state(model)
    fm = model.fantasize(Xf, sampler)
    assert same_state(before, tensor_state(model)) == [], "fantasize changed the model"
    assert fm.batch_shape == torch.Size([S, B])
    Xt = _test_points(5, seed=8, batch=(B,))
    post = fm.posterior(Xt)
    assert post.mean.shape == torch.Size([S, B, 5, 1])
    cov = post.covariance_matrix.detach()
    assert cov.shape == torch.Size([S, B, 5, 5])
    # a q x d input broadcasts over the fantasy batch; observation noise keeps the shapes
    shared = fm.posterior(Xt[1])
    assert shared.mean.shape == torch.Size([S, B, 5, 1])
    assert_close(shared.mean[:, 1], post.mean[:, 1], 1e-10, "q x d input to a fantasy model")
    noisy = fm.posterior(Xt, observation_noise=True)
    assert noisy.variance.shape == torch.Size([S, B, 5, 1])
    assert bool((noisy.variance > post.variance).all())
    # The fantasy Y: the same sampler (fixed base samples) on the same posterior.
    noise_s = None if not fixed else (Yvar / std2).mean().reshape(1, 1).expand(B, q, 1)
    if s.fantasy_Y is not None:
        Yf = s.fantasy_Y(model, Xf, sampler)
    else:
        obs = True if noise_s is None else noise_s
        with torch.no_grad():
            Yf = sampler(model.posterior(Xf, observation_noise=obs))
    assert Yf.shape == torch.Size([S, B, q, 1])
    noise_user = None if not fixed else (noise_s * std2)
    for b in range(B):
        Nb = None if not fixed else noise_user[b]
        for j in range(S):
            mean_ref, cov_ref = reference_conditioned(
                s, model, X, Y, Yvar, [(Xf[b], Yf[j, b], Nb)], Xt[b]
            )
            assert_close(post.mean[j, b].squeeze(-1), mean_ref, 10 * s.tol, f"fantasy {j},{b} mean")
            assert_close(cov[j, b], cov_ref, 10 * s.tol, f"fantasy {j},{b} covariance")
            if s.fantasy_covariance_independent_of_Y:
                assert_close(cov[j, b], cov[0, b], 1e-12, "covariance differs between fantasies")
    if s.fantasy_covariance_independent_of_Y:
        # Conditioning on any other Y (zeros) gives the same covariance.
        other = model.condition_on_observations(Xf, torch.zeros(B, q, 1, dtype=DT), noise=noise_s)
        _, C0 = latent(other, Xt)
        assert_close(C0, cov[0], 10 * s.tol, "covariance with Y = 0")


@surrogates
def test_fantasy_factorisations_are_shared_by_the_samples(s):
    """condition_on_observations with leading fantasy-sample dims does the Y-independent work
    once: no Cholesky factorisation during fantasize (and the fantasy posterior) carries the
    sample dimension, for a batch of 3 candidate sets and 5 samples."""
    if not s.fantasy_covariance_independent_of_Y:
        pytest.skip(s.reasons["fantasy_covariance_independent_of_Y"])
    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    latent(model, _test_points())  # the parent's caches exist before fantasising
    S, B = 5, 3
    Xf = _test_points(2, seed=7, batch=(B,))
    shapes: list[torch.Size] = []
    chol, chol_ex = torch.linalg.cholesky, torch.linalg.cholesky_ex

    def record(fn):
        def wrapped(A, *args, **kwargs):
            shapes.append(A.shape)
            return fn(A, *args, **kwargs)

        return wrapped

    with (
        mock.patch("torch.linalg.cholesky", record(chol)),
        mock.patch("torch.linalg.cholesky_ex", record(chol_ex)),
    ):
        fm = model.fantasize(Xf, SobolQMCNormalSampler(torch.Size([S]), seed=0))
        post = fm.posterior(_test_points(4, seed=8, batch=(B,)))
        post.mean, post.covariance_matrix
    assert fm.batch_shape == torch.Size([S, B])
    per_sample = [tuple(sh) for sh in shapes if S in sh[:-2]]
    assert per_sample == [], f"factorisations repeated per fantasy sample: {per_sample}"


# ------------------------------------------------------------------ state


class _Counter:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@surrogates
@noise_kinds
def test_state_dict_round_trip_restores_caches_without_refactorisation(s, fixed):
    """state_dict carries the caches; load_state_dict into a fresh (smaller) model resizes the
    grown buffers and gives the same posterior bit for bit, without rebuilding any cache."""
    _skip_unsupported(s, fixed)
    X, Y, Yvar = s.data(N0, D, seed=0, fixed=fixed)
    model = s.make(X, Y, Yvar)
    for seed in (1, 2):
        Xn, Yn, Nn = s.data(Q, D, seed=seed, fixed=fixed)
        model.update(Xn, Yn, Nn)
    Xt = _test_points()
    m0, C0 = latent(model, Xt)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fresh = s.make(X[:5], Y[:5], None if Yvar is None else Yvar[:5])
    counter = _Counter(fresh._rebuild_caches)
    fresh._rebuild_caches = counter  # instance attribute: every rebuild goes through it
    fresh.load_state_dict(state)
    loaded = fresh.state_dict()
    assert loaded.keys() == state.keys()
    for k, v in state.items():
        assert loaded[k].shape == v.shape and torch.equal(loaded[k], v), k
    m1, C1 = latent(fresh, Xt)
    assert counter.calls == 0, "load_state_dict / posterior refactorised the caches"
    assert torch.equal(m0, m1) and torch.equal(C0, C1)
    # and the loaded model goes on like the original
    Xn, Yn, Nn = s.data(Q, D, seed=3, fixed=fixed)
    model.update(Xn, Yn, Nn)
    fresh.update(Xn, Yn, Nn)
    assert counter.calls == 0
    m2, C2 = latent(model, Xt)
    m3, C3 = latent(fresh, Xt)
    # bit for bit: a resumed run must repeat the uninterrupted one's records
    assert torch.equal(m3, m2) and torch.equal(C3, C2), "after a further update"
    # an earlier state (before any update: fewer and absent caches) loads into the grown model
    first = s.make(X, Y, Yvar)
    m4, C4 = latent(first, Xt)
    model.load_state_dict(first.state_dict())
    m5, C5 = latent(model, Xt)
    assert torch.equal(m4, m5) and torch.equal(C4, C5)


@surrogates
def test_a_conditioned_model_updates_and_round_trips_like_an_updated_one(s):
    """A child of ``condition_on_observations`` then updated in place equals the model updated
    twice, and its ``state_dict`` loaded into a fresh model gives its posterior (QSGP's child
    kept its parent's factor in the saved state and extended that one in ``update``)."""
    X, Y, _ = s.data(N0, D, seed=0)
    (X1, Y1, _), (X2, Y2, _) = s.data(Q, D, seed=1), s.data(2, D, seed=2)
    Xt = _test_points()
    child = s.make(X, Y).condition_on_observations(X1, Y1)
    m_child, C_child = latent(child, Xt)
    fresh = s.make(X, Y)
    fresh.load_state_dict({k: v.clone() for k, v in child.state_dict().items()})
    m_loaded, C_loaded = latent(fresh, Xt)
    assert_close(m_loaded, m_child, s.tol, "mean of the loaded conditioned model")
    assert_close(C_loaded, C_child, s.tol, "covariance of the loaded conditioned model")
    # loaded into another conditioned model (which holds a pending term of its own)
    other = s.make(X, Y).condition_on_observations(*s.data(2, D, seed=5)[:2])
    other.load_state_dict({k: v.clone() for k, v in child.state_dict().items()})
    m_other, C_other = latent(other, Xt)
    assert_close(m_other, m_child, s.tol, "mean loaded into a conditioned model")
    assert_close(C_other, C_child, s.tol, "covariance loaded into a conditioned model")
    twice = s.make(X, Y)
    twice.update(X1, Y1)
    twice.update(X2, Y2)
    child.update(X2, Y2)
    m_ref, C_ref = latent(twice, Xt)
    m, C = latent(child, Xt)
    assert_close(m, m_ref, s.tol, "mean: condition, then update")
    assert_close(C, C_ref, s.tol, "covariance: condition, then update")


@surrogates
def test_load_state_dict_failure_leaves_state_unchanged(s):
    """A state that does not fit (a key missing, or another surrogate's) raises and leaves every
    buffer and parameter of the model as it was."""
    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    model.update(*s.data(Q, D, seed=1))
    Xt = _test_points()
    m0, C0 = latent(model, Xt)
    before = tensor_state(model)
    good = s.make(X[:6], Y[:6], template=model).state_dict()
    param = next(k for k, _ in model.named_parameters())
    other = next(o for o in SURROGATES if type(o.make(*o.data(3, D, 0)[:2])) is not type(model))
    for bad in (
        {k: v for k, v in good.items() if k != param},
        other.make(*other.data(N0, D, seed=0)[:2]).state_dict(),
    ):
        with pytest.raises(RuntimeError):
            model.load_state_dict(bad)
        assert same_state(before, tensor_state(model)) == []
    m1, C1 = latent(model, Xt)
    assert torch.equal(m0, m1) and torch.equal(C0, C1)


def kernel_in_use(model):
    """The kernel the model predicts with: WISKI's exact-regime kernel of its own
    (``regime_kernel="ard"``) where it has one, else ``covar_module`` (or the bases' kernel)."""
    if getattr(model, "regime_kernel", "ski") == "ard":
        return model.regime_covar_module
    return model.covar_module if hasattr(model, "covar_module") else model.basis.kernel


def _change_hyperparameters(model) -> None:
    """Lengthscale x 1.3 and (inferred) noise x 2, in place."""
    kernel = kernel_in_use(model)
    lik = getattr(model.likelihood, "gaussian", model.likelihood)
    with torch.no_grad():
        for part in getattr(kernel, "kernels", [kernel]):
            base = getattr(part, "base_kernel", part)
            base.lengthscale = base.lengthscale * 1.3
        if not model.fixed_noise and hasattr(lik, "noise"):
            lik.noise = lik.noise * 2


@surrogates
def test_a_partial_state_loaded_with_strict_false_rebuilds_the_caches(s):
    """``load_state_dict(state, strict=False)`` with only some keys (changed hyperparameters, no
    caches) rebuilds the caches: the posterior equals that of the same model with those
    hyperparameters set directly (before, the caches of the old hyperparameters were kept, and
    WISKI took the partial state for one saved before its per-factor jitter)."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xn, Yn, _ = s.data(Q, D, seed=1)
    Xt = _test_points()
    model, ref = s.make(X, Y), s.make(X, Y)
    for m in (model, ref):
        m.update(Xn, Yn)
    latent(model, Xt)  # caches built under the old hyperparameters
    _change_hyperparameters(ref)
    ref.invalidate_caches()
    m_ref, C_ref = latent(ref, Xt)
    names = {k for k, _ in ref.named_parameters()}
    old = model.state_dict()
    partial = {
        k: v.clone()
        for k, v in ref.state_dict().items()
        if k in names and not torch.equal(v, old[k])
    }
    assert partial, "no hyperparameter changed"
    result = model.load_state_dict(partial, strict=False)
    assert result.missing_keys
    m, C = latent(model, Xt)
    assert_close(m, m_ref, 1e-12, "mean after a partial load")
    assert_close(C, C_ref, 1e-12, "covariance after a partial load")


def _bad_inputs(fixed: bool):
    r"""(name, X, Y, noise) triples every entry point must refuse (``q x d`` shapes)."""
    x = torch.full((2, D), 0.5, dtype=DT)
    y = torch.ones(2, 1, dtype=DT)
    n = torch.full((2, 1), 0.02, dtype=DT) if fixed else None
    nan_x = x.clone()
    nan_x[0, 1] = float("nan")
    inf_y = y.clone()
    inf_y[1, 0] = float("inf")
    return [
        ("nan X", nan_x, y, n),
        ("inf X", x.clone().fill_(float("inf")), y, n),
        ("inf Y", x, inf_y, n),
        ("nan Y", x, torch.full_like(y, float("nan")), n),
        ("X width", torch.full((2, D + 1), 0.5, dtype=DT), y, n),
        ("rows of Y", x, torch.ones(3, 1, dtype=DT), n),
        ("Y columns", x, torch.ones(2, 2, dtype=DT), n),
        ("negative noise", x, y, torch.tensor([[0.02], [-0.01]], dtype=DT)),
        ("nan noise", x, y, torch.tensor([[0.02], [float("nan")]], dtype=DT)),
        ("noise shape", x, y, torch.full((3, 1), 0.02, dtype=DT)),
        ("1-D X", torch.full((D,), 0.5, dtype=DT), y[:1], None if n is None else n[:1]),
        ("outside the bounds", torch.tensor([[0.5, 1.2], [0.5, 0.5]], dtype=DT), y, n),
    ]


@surrogates
@noise_kinds
def test_bad_input_raises_value_error_and_leaves_state_unchanged(s, fixed):
    """update / condition_on_observations / posterior refuse NaN/inf, wrong shapes and negative
    noise with a ValueError, and every buffer and parameter is unchanged afterwards."""
    _skip_unsupported(s, fixed)
    X, Y, Yvar = s.data(N0, D, seed=0, fixed=fixed)
    unit_cube = torch.stack([torch.zeros(D, dtype=DT), torch.ones(D, dtype=DT)])
    model = s.make(X, Y, Yvar, bounds=unit_cube)
    model.update(*s.data(2, D, seed=1, fixed=fixed))
    Xt = _test_points()
    m0, C0 = latent(model, Xt)
    before = tensor_state(model)
    for name, Xb, Yb, nb in _bad_inputs(fixed):
        with pytest.raises(ValueError):
            model.update(Xb, Yb, nb)
        assert same_state(before, tensor_state(model)) == [], f"update({name}) changed the state"
        with pytest.raises(ValueError):
            model.condition_on_observations(Xb, Yb, nb)
        assert same_state(before, tensor_state(model)) == [], f"condition({name}) changed the state"
    if fixed:  # a fixed-noise model needs the noise of new points
        with pytest.raises(ValueError, match="noise"):
            model.update(torch.full((1, D), 0.5, dtype=DT), torch.ones(1, 1, dtype=DT))
    with pytest.raises(ValueError):  # update is for q x d, not batches
        model.update(torch.full((2, 1, D), 0.5, dtype=DT), torch.ones(2, 1, 1, dtype=DT))
    for bad_X in (
        torch.full((3, D), float("nan"), dtype=DT),
        torch.rand(3, D + 1, dtype=DT),
        torch.rand(D, dtype=DT),
        torch.full((3, D), -0.5, dtype=DT),
    ):
        with pytest.raises(ValueError):
            model.posterior(bad_X)
    with pytest.raises(ValueError):  # a negative observation-noise tensor
        model.posterior(Xt, observation_noise=-torch.ones(5, 1, dtype=DT))
    with pytest.raises(ValueError):  # one of the wrong shape
        model.posterior(Xt, observation_noise=torch.full((7, 1), 0.01, dtype=DT))
    assert same_state(before, tensor_state(model)) == []
    m1, C1 = latent(model, Xt)
    assert torch.equal(m0, m1) and torch.equal(C0, C1)


@surrogates
def test_batches_that_do_not_broadcast_with_a_batched_model_are_refused(s):
    """A batched model (here a ``2 x 3`` fantasy model) refuses, with a ValueError naming both
    batch shapes, points whose batch does not broadcast with its own, at ``posterior`` and
    ``condition_on_observations`` (before: torch's RuntimeError from inside each model's
    algebra); batches that broadcast are taken."""
    X, Y, _ = s.data(N0, D, seed=0)
    parent = s.make(X, Y)
    fant = parent.fantasize(_test_points(2, batch=(3,)), SobolQMCNormalSampler(torch.Size([2])))
    assert fant.batch_shape == torch.Size([2, 3])
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        fant.posterior(_test_points(batch=(4,)))
    Xn, Yn, _ = s.data(1, D, seed=1)
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        fant.condition_on_observations(Xn.expand(4, 1, D), Yn.expand(4, 1, 1))
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        fant.condition_on_observations(Xn, Yn.expand(4, 1, 1))
    assert fant.posterior(_test_points(batch=(1, 3))).mean.shape == torch.Size([2, 3, 5, 1])
    both = fant.condition_on_observations(Xn.expand(3, 1, D), Yn.expand(2, 3, 1, 1))
    assert both.batch_shape == torch.Size([2, 3])


@surrogates
def test_constructor_refuses_bad_data(s):
    """The constructor validates its data like every other entry point."""
    X, Y, Yvar = s.data(N0, D, seed=0, fixed=s.fixed_noise)
    nan_X = X.clone()
    nan_X[3, 0] = float("nan")
    inf_Y = Y.clone()
    inf_Y[2, 0] = float("inf")
    cases = [(nan_X, Y, None), (X, inf_Y, None), (X, Y[:-1], None), (X[:, 0], Y, None)]
    cases += [((X * 4).long(), Y, None)]  # integer inputs: a ValueError, as for every model
    if s.fixed_noise:
        cases += [(X, Y, -Yvar), (X, Y, Yvar[:-1])]
    for Xb, Yb, Vb in cases:
        with pytest.raises(ValueError):
            s.make(Xb, Yb, Vb)


@surrogates
def test_update_with_no_points_changes_nothing(s):
    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    Xt = _test_points()
    m0, C0 = latent(model, Xt)
    before = tensor_state(model)
    assert model.update(X[:0], Y[:0]) is model
    assert same_state(before, tensor_state(model)) == []
    m1, C1 = latent(model, Xt)
    assert torch.equal(m0, m1) and torch.equal(C0, C1)


@surrogates
def test_one_shared_noise_variance_equals_it_given_per_point(s):
    _skip_unsupported(s, True)
    X, Y, _ = s.data(N0, D, seed=0)
    shared = s.make(X, Y, torch.full((1, 1), 0.02, dtype=DT))
    per_point = s.make(X, Y, torch.full((N0, 1), 0.02, dtype=DT))
    Xt = _test_points()
    for a, b in zip(latent(shared, Xt), latent(per_point, Xt)):
        assert torch.equal(a, b)


@surrogates
def test_noise_that_would_enlarge_Y_is_refused_with_the_shape_to_use(s):
    """``n`` variances against ``n x 1`` observations broadcast to ``n x n``: a ValueError that
    says to give ``n x 1`` (the expand that gives a shared variance to every point raised a
    RuntimeError on it), at construction and in update(); in posterior() against the
    posterior's shape."""
    _skip_unsupported(s, True)
    X, Y, _ = s.data(N0, D, seed=0)
    with pytest.raises(ValueError, match=r"does not broadcast to Y's shape .*unsqueeze"):
        s.make(X, Y, torch.full((N0,), 0.02, dtype=DT))
    model = s.make(X, Y, torch.full((N0, 1), 0.02, dtype=DT))
    Xn, Yn, _ = s.data(3, D, seed=1)
    with pytest.raises(ValueError, match="does not broadcast to Y's shape"):
        model.update(Xn, Yn, torch.full((1, 3), 0.02, dtype=DT))  # 3 x 1 against 1 x 3
    # a posterior's observation_noise is said against the posterior's shape (it named Y's)
    bad = torch.full((4,), 0.02, dtype=DT)
    with pytest.raises(ValueError, match=r"observation_noise .* the posterior's shape \(3, 1\)"):
        model.posterior(Xn, observation_noise=bad)


@surrogates
def test_constructor_refuses_bad_bounds(s):
    """A ``bounds`` box must be ``2 x d``, finite, lower < upper: said at construction, not later
    as points "outside [2, -2]" or a shape error deep inside a model."""
    X, Y, _ = s.data(N0, D, seed=0)
    box = torch.tensor([[0.0] * D, [1.0] * D], dtype=DT)
    s.make(X, Y, bounds=box)  # a good box is taken
    nan_box = box.clone()
    nan_box[1, 0] = float("nan")
    for bad, message in (
        (box.flip(0), "lower < upper"),
        (torch.zeros(2, D, dtype=DT), "lower < upper"),
        (nan_box, "finite"),
        (torch.tensor([[0.0] * (D + 1), [1.0] * (D + 1)], dtype=DT), f"2 x {D}"),
    ):
        with pytest.raises(ValueError, match=message):
            s.make(X, Y, bounds=bad)


def _tensors_with_graph(obj, seen=None, path="model") -> list[str]:
    """Paths of tensors reachable from a module's buffers and plain attributes (dicts, lists,
    tuples) that carry an autograd graph (``grad_fn``)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    out = []
    if isinstance(obj, torch.Tensor):
        return [path] if obj.grad_fn is not None else []
    if isinstance(obj, torch.nn.Module):
        for k, v in obj._buffers.items():
            out += _tensors_with_graph(v, seen, f"{path}.{k}")
        for k, v in obj._modules.items():
            out += _tensors_with_graph(v, seen, f"{path}.{k}")
        for k, v in vars(obj).items():
            if not k.startswith("_modules") and not k.startswith("_parameters"):
                out += _tensors_with_graph(v, seen, f"{path}.{k}")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out += _tensors_with_graph(v, seen, f"{path}[{k!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += _tensors_with_graph(v, seen, f"{path}[{i}]")
    return out


@surrogates
def test_no_autograd_graph_kept_in_caches(s):
    """Posteriors are differentiable in X, but no cached tensor keeps a graph: not after a
    posterior at inputs that require grad, a conditioning on them, or in-place updates."""
    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    model.update(*s.data(2, D, seed=1))
    for seed in (5, 6):  # twice: a second request may hit per-point caches
        Xg = _test_points(4, seed=5, batch=(2,)).requires_grad_(True)
        post = model.posterior(Xg, observation_noise=True)
        (post.mean.sum() + post.variance.sum()).backward()
        assert Xg.grad is not None and bool(torch.isfinite(Xg.grad).all())
        assert Xg.grad.abs().sum() > 0
    assert _tensors_with_graph(model) == []
    Xc = _test_points(2, seed=6).requires_grad_(True)
    child = model.condition_on_observations(Xc, torch.ones(2, 1, dtype=DT))
    child.posterior(_test_points(3, seed=7)).mean.sum().backward()
    assert Xc.grad is not None  # fantasies stay differentiable in their X (qKG)
    assert _tensors_with_graph(model) == []
    model.update(*s.data(2, D, seed=2))
    model.posterior(_test_points(3, seed=7).requires_grad_(True)).mean.sum().backward()
    assert _tensors_with_graph(model) == []


@surrogates
def test_update_holds_its_own_copy_of_the_new_points(s):
    """``update`` keeps what it is given, not the caller's tensors: changing them in place
    afterwards (a buffer the caller reuses) leaves the model as it was, and inputs that require
    grad leave no graph in it (it deep-copies)."""
    import copy

    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    Xn, Yn, _ = s.data(2, D, seed=1)
    Xn.requires_grad_(True)
    Yn.requires_grad_(True)
    model.update(Xn, Yn)
    before = tensor_state(model)
    assert _tensors_with_graph(model) == []
    copy.deepcopy(model)
    with torch.no_grad():
        Xn.fill_(0.5)
        Yn.fill_(0.0)
    assert same_state(before, tensor_state(model)) == []


@surrogates
def test_gradient_does_not_depend_on_a_no_grad_evaluation_of_the_same_points(s):
    """A user who looks at a value under ``torch.no_grad()`` and then differentiates at the same
    X tensor (``requires_grad_()`` does not change X's version) gets the gradient a fresh tensor
    gets: a cache filled without a graph must not be served to the differentiable call."""
    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    model.update(*s.data(2, D, seed=1))
    model.eval()
    for batch in ((), (3,)):
        x = _test_points(2, seed=8, batch=batch)
        fresh = x.clone().requires_grad_(True)
        post = model.posterior(fresh)
        (post.mean.sum() + post.variance.sum()).backward()
        with torch.no_grad():
            model.posterior(x).variance
        x.requires_grad_(True)
        post = model.posterior(x)
        (post.mean.sum() + post.variance.sum()).backward()
        assert x.grad is not None, s.name
        torch.testing.assert_close(x.grad, fresh.grad, rtol=1e-10, atol=1e-12)


@surrogates
def test_a_model_conditioned_on_plain_data_keeps_no_graph(s):
    """Conditioned on data that need no gradient (an Ax trial, a user's new points), the child
    holds no autograd graph to the hyperparameters: it can be differentiated in its inputs
    twice and deep-copied, as a ``SingleTaskGP`` can."""
    import copy

    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    child = model.condition_on_observations(*s.data(Q, D, seed=1)[:2])
    assert _tensors_with_graph(child) == []
    for _ in range(2):
        x = _test_points(3, seed=4, batch=(2,)).requires_grad_(True)
        child.posterior(x).mean.sum().backward()
        assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    twin = copy.deepcopy(child)
    m0, _ = latent(child, _test_points())
    m1, _ = latent(twin, _test_points())
    assert torch.equal(m0, m1)


@surrogates
def test_fantasies_and_believed_means_at_points_without_gradient_keep_no_graph(s):
    """Observations drawn from the model's own posterior (``fantasize`` at points that need no
    gradient, a Kriging believer's ``posterior(X).mean``) carry a graph to the hyperparameters
    that is not data to differentiate: as BoTorch (GPyTorch detaches its test caches unless
    ``propagate_grads`` is on), the child keeps none. It can be differentiated in its inputs twice
    (an acquisition optimised on it), and equals the child conditioned on the detached values.
    Under ``propagate_grads`` the gradient to ``Y`` flows, as in BoTorch."""
    from botorch import settings

    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    Xf = _test_points(Q, seed=3, batch=(2,))
    children = {"fantasize": model.fantasize(Xf, SobolQMCNormalSampler(torch.Size([2]), seed=0))}
    if s.outcomes is None:  # real-valued observations: believe the posterior mean
        believed = model.posterior(Xf).mean  # a graph to the hyperparameters (most models)
        children["believer"] = model.condition_on_observations(Xf, believed)
        plain = model.condition_on_observations(Xf, believed.detach())
        m0, c0 = latent(children["believer"], _test_points())
        m1, c1 = latent(plain, _test_points())
        assert_close(m0, m1, s.tol, "believer mean")
        assert_close(c0, c1, s.tol, "believer covariance")
    for name, child in children.items():
        assert _tensors_with_graph(child) == [], name
        for _ in range(2):
            x = _test_points(3, seed=4, batch=(2,)).requires_grad_(True)
            post = child.posterior(x)
            (post.mean.sum() + post.variance.sum()).backward()
            assert x.grad is not None and bool(torch.isfinite(x.grad).all()), name
    Yn = torch.ones(Q, 1, dtype=DT, requires_grad=True)
    with settings.propagate_grads(True):
        child = model.condition_on_observations(_test_points(Q, seed=6), Yn)
        child.posterior(_test_points(3, seed=7)).mean.sum().backward()
    assert Yn.grad is not None and Yn.grad.abs().sum() > 0


@surrogates
def test_float32_matches_float64(s):
    """A float32 model (float32 data) gives the float64 posterior within float32 accuracy, also
    after conditioning and updates; float64 inputs to it are cast, not rejected."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xn, Yn, _ = s.data(Q, D, seed=1)
    Xt = _test_points()
    m64 = s.make(X, Y)
    m32 = s.make(X.float(), Y.float())
    assert m32.outcome_mean.dtype == torch.float32
    tol = 2e-3  # relative to the outcome scale: float32 solves of well-conditioned n ~ 15 systems
    for stage in ("initial", "conditioned", "updated"):
        if stage == "conditioned":
            a = m64.condition_on_observations(Xn, Yn)
            b = m32.condition_on_observations(Xn.float(), Yn.float())
        else:
            if stage == "updated":
                m64.update(Xn, Yn)
                m32.update(Xn.float(), Yn.float())
            a, b = m64, m32
        mean64, cov64 = latent(a, Xt)
        mean32, cov32 = latent(b, Xt.float())
        assert mean32.dtype == torch.float32
        scale = float(a.outcome_std)
        assert_close(mean32, mean64, tol * scale, f"{stage} mean")
        assert_close(cov32, cov64, tol * scale**2, f"{stage} covariance")
    mean, _ = latent(m32, Xt)  # float64 inputs to a float32 model are cast
    assert mean.dtype == torch.float32
    mean, _ = latent(m64, Xt.float())  # and float32 inputs to a float64 model
    assert mean.dtype == torch.float64
    assert_close(mean, latent(m64, Xt)[0], 1e-6 * float(m64.outcome_std), "float32 inputs")


@surrogates
def test_float64_state_loads_into_a_float32_model_as_float32(s):
    """As torch's load_state_dict keeps a module's own dtype: a float64 state (a float64 run's
    checkpoint) loaded into a float32 model leaves every floating tensor float32, also the
    caches that model had not built yet, and it predicts as the float64 model within float32
    accuracy (the buffers took the state's float64 and broke or mixed the dtypes before)."""
    X, Y, _ = s.data(N0, D, seed=0)
    m64 = s.make(X, Y)
    m64.update(*s.data(Q, D, seed=1))
    Xt = _test_points()
    mean64, cov64 = latent(m64, Xt)
    m32 = s.make(X.float(), Y.float())  # its caches not built yet
    m32.load_state_dict(m64.state_dict())
    site = getattr(m32, "_site_dtype", lambda: torch.float32)()  # the decoupled model's sites
    dtypes = {v.dtype for v in m32.state_dict().values() if v.is_floating_point()}
    assert dtypes <= {torch.float32, site}
    mean32, cov32 = latent(m32, Xt.float())
    assert mean32.dtype == torch.float32
    scale = float(m64.outcome_std)
    assert_close(mean32, mean64, 2e-3 * scale, "mean")
    assert_close(cov32, cov64, 2e-3 * scale**2, "covariance")


@surrogates
def test_a_float32_state_loaded_into_a_float64_model_rebuilds_its_caches(s):
    """As ``.double()``: a float32 model's state (its checkpoint) loaded into a float64 model
    brought float32 caches, trusted as fresh, so the float64 model predicted with float32
    rounding (1.4e-6 off what its state gives in float64 for WISKI) for good. They are now
    rebuilt from the loaded state in float64; a float64 state still loads with its caches."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xt = _test_points()
    m32 = s.make(X.float(), Y.float())
    latent(m32, Xt.float())
    for seed in range(20):
        Xn, Yn, _ = s.data(1, D, seed=100 + seed)
        m32.update(Xn.float(), Yn.float())
    model = s.make(X, Y)
    model.load_state_dict(m32.state_dict())
    floating = [t for t in model.state_dict().values() if t.is_floating_point()]
    assert all(t.dtype == DT for t in floating)
    mean, cov = latent(model, Xt)
    rebuilt = copy.deepcopy(model)
    rebuilt.invalidate_caches()
    mean_ref, cov_ref = latent(rebuilt, Xt)
    scale = float(model.outcome_std)
    assert_close(mean, mean_ref, 1e-10 * scale, "mean")
    assert_close(cov, cov_ref, 1e-10 * scale**2, "covariance")
    again = s.make(X, Y)
    with mock.patch.object(type(again), "_rebuild_caches", side_effect=AssertionError("rebuilt")):
        again.load_state_dict(model.state_dict())
        assert_close(latent(again, Xt)[0], mean, 1e-12, "float64 state")


@surrogates
def test_float32_targets_whose_offset_hides_their_signal_are_reported(s):
    """Targets 1e8 + O(1) cast to float32 (spacing 8 there) reach the model as a coarse copy or a
    constant: the model learned nothing, without a word. It now warns where the rounding at the
    targets' level is a sizeable part of their spread; float64, and float32 targets of ordinary
    scale, are not reported."""
    if s.name == "tsvgp-bernoulli":
        pytest.skip("class labels reach the likelihood as given: no outcome scaling")
    X, Y, _ = s.data(N0, D, seed=0)
    with pytest.warns(UserWarning, match=r"where float32 resolves steps of 11\.9"):
        s.make(X.float(), (10 * Y + 1e8).float())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        s.make(X.float(), (100 + 3 * Y).float())
        s.make(X, Y + 1e8)
        s.make(X.float(), torch.full_like(Y, 5.0).float())  # constant as given: nothing lost
    # new targets at such a level, given to a model built on O(1) targets, as they arrive
    model = s.make(X.float(), Y.float())
    Xn, Yn, _ = s.data(Q, D, seed=1)
    with pytest.warns(UserWarning, match="new targets reach 1e\\+08"):
        model.condition_on_observations(Xn.float(), (Yn + 1e8).float())
    with pytest.warns(UserWarning, match="new targets reach 1e\\+08"):
        model.update(Xn.float(), (Yn + 1e8).float())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        s.make(X.float(), Y.float()).update(Xn.float(), Yn.float())


@surrogates
def test_to_is_skipped_when_nothing_moves_and_converts_otherwise(s):
    """``model.to(its own dtype)`` (which BoTorch's analytic acquisition functions call on every
    evaluation) leaves every tensor as it is without walking the submodules; ``model.to`` another
    dtype converts every parameter and buffer, and the posterior follows (float32 accuracy)."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xt = _test_points()
    model = s.make(X, Y)
    mean64, _ = latent(model, Xt)
    before = list(model.parameters()) + list(model.buffers())
    with mock.patch.object(torch.nn.Module, "_apply", side_effect=AssertionError("walked")):
        assert model.to(DT) is model and model.to(Xt) is model
    after = list(model.parameters()) + list(model.buffers())
    assert len(before) == len(after) and all(a is b for a, b in zip(after, before))
    model.to(torch.float32)
    floating = [
        t for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()
    ]
    assert floating and all(t.dtype == torch.float32 for t in floating)
    mean32, _ = latent(model, Xt.float())
    assert mean32.dtype == torch.float32
    assert_close(mean32, mean64, 2e-3 * float(model.outcome_std), "mean after .to(float32)")
    for p in model.parameters():  # an in-place conversion reaches gradients too
        p.grad = torch.zeros_like(p)
    model.share_memory()
    assert all(p.is_shared() and p.grad.is_shared() for p in model.parameters())


@surrogates
@pytest.mark.parametrize("convert", ["child", "parent"])
def test_converting_a_model_converts_no_model_sharing_its_modules(s, convert):
    """A model and the models conditioned on it share hyperparameter modules, and torch's
    ``Module._apply`` converts parameters in place: ``child.float()`` (a fantasy model's
    ``.to``) made the parent's hyperparameters float32, so the parent (a float64 model with
    float32 hyperparameters) failed with torch's dtype error (t-SVGP) or predicted with rounded
    values; ``parent.float()`` likewise reached its children. The converted model now takes
    copies of the shared modules first: every other model keeps every tensor bit for bit and
    its posterior, and the converted one predicts as before within float32 accuracy."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xn, Yn, _ = s.data(Q, D, seed=1)
    Xt = _test_points()
    parent = s.make(X, Y)
    child = parent.condition_on_observations(Xn, Yn)
    fantasy = parent.fantasize(Xn, SobolQMCNormalSampler(torch.Size([2])))
    models = {"parent": parent, "child": child, "fantasy": fantasy}
    posts = {k: latent(m, Xt) for k, m in models.items()}
    states = {k: tensor_state(m) for k, m in models.items()}
    converted = models[convert]
    assert converted.float() is converted
    floating = [t for t in converted.parameters() if t.is_floating_point()]
    assert all(t.dtype == torch.float32 for t in floating)
    scale = float(parent.outcome_std)
    mean32, cov32 = latent(converted, Xt.float())
    assert_close(mean32, posts[convert][0], 2e-3 * scale, f"{convert} mean after float()")
    assert_close(cov32, posts[convert][1], 2e-3 * scale**2, f"{convert} covariance")
    for name, model in models.items():
        if name == convert:
            continue
        assert same_state(states[name], tensor_state(model)) == [], name
        mean, cov = latent(model, Xt)
        assert_close(mean, posts[name][0], 1e-12, f"{name} mean")
        assert_close(cov, posts[name][1], 1e-12, f"{name} covariance")
    # the others still share their modules with each other (a refit of the parent reaches
    # the children it was not converted with)
    others = [m for k, m in models.items() if k != convert]
    for name, module in others[0].named_children():
        if any(True for _ in module.parameters()):
            assert getattr(others[1], name) is module, name


@surrogates
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_models_copied_together_still_convert_no_model_sharing_their_modules(s, how):
    """A parent and its child copied together (``copy.deepcopy((parent, child))``, one pickle
    holding both: ``torch.save`` of a dict of models) share their hyperparameter modules in the
    copy as in the original, but the copies forgot that they share them (the set of sharers
    became ``None``), so ``child.float()`` made the copied parent's hyperparameters float32
    again (t-SVGP then failed with torch's dtype error, the others predicted with rounded
    values). The copies now know each other; a model copied alone shares with no one."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xn, Yn, _ = s.data(Q, D, seed=1)
    Xt = _test_points()
    original = s.make(X, Y)
    pair = (original, original.condition_on_observations(Xn, Yn))
    if how == "deepcopy":
        parent, child = copy.deepcopy(pair)
    else:
        parent, child = pickle.loads(pickle.dumps(pair))
    assert parent.likelihood is child.likelihood  # still shared within the copy
    post = latent(parent, Xt)
    state = tensor_state(parent)
    child.float()
    assert all(t.dtype == torch.float32 for t in child.parameters() if t.is_floating_point())
    assert same_state(state, tensor_state(parent)) == []
    mean, cov = latent(parent, Xt)
    assert_close(mean, post[0], 1e-12, "parent mean")
    assert_close(cov, post[1], 1e-12, "parent covariance")
    # copied alone, a model shares with no one: converting it copies no module
    alone = copy.deepcopy(parent)
    with mock.patch.object(copy, "deepcopy", side_effect=AssertionError("copied")):
        alone.float()


@surrogates
def test_a_float32_model_made_float64_rebuilds_its_caches_in_float64(s):
    """``.double()`` of a float32 model converted its caches (Cholesky factors updated point by
    point in float32) and kept them, as valid for the unchanged hyperparameters: the float64
    model predicted with float32 rounding (2e-6 off what its state gives in float64 for the
    exact GP and WISKI), and kept it through later updates (float64 never refactors). The
    caches are now rebuilt in float64 from the state; the exact GP, whose state is its data,
    then equals the dense float64 posterior on the same data."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xt = _test_points()
    model = s.make(X.float(), Y.float())
    latent(model, Xt.float())  # caches built in float32
    for seed in range(20):
        Xn, Yn, _ = s.data(1, D, seed=100 + seed)
        model.update(Xn.float(), Yn.float())
    model.double()
    assert model.outcome_mean.dtype == DT
    rebuilt = copy.deepcopy(model)
    rebuilt.invalidate_caches()
    scale = float(model.outcome_std)
    for stage in ("converted", "updated"):
        if stage == "updated":
            Xn, Yn, _ = s.data(Q, D, seed=7)
            model.update(Xn, Yn)
            rebuilt.update(Xn, Yn)
        mean, cov = latent(model, Xt)
        assert mean.dtype == DT
        mean_ref, cov_ref = latent(rebuilt, Xt)
        assert_close(mean, mean_ref, 1e-10 * scale, f"{stage} mean")
        assert_close(cov, cov_ref, 1e-10 * scale**2, f"{stage} covariance")
    if s.name == "exact":
        Ya = model.train_targets.reshape(-1, 1)  # its data, float32 numbers and the new ones
        mean_ref, cov_ref = reference(s, model, model.train_X, Ya, None, Xt)
        assert_close(mean, mean_ref, 1e-9 * scale, "exact mean vs dense")
        assert_close(cov, cov_ref, 1e-9 * scale**2, "exact covariance vs dense")


# ------------------------------------------------------------------ input transforms


def _transform_cases():
    lo = torch.tensor([-1.0, 2.0], dtype=DT)
    hi = torch.tensor([3.0, 2.5], dtype=DT)
    return {
        # same dimension: raw inputs in a box, mapped to the unit cube by the transform
        "normalize": (
            lambda: Normalize(d=D, bounds=torch.stack([lo, hi])),
            lambda U: lo + (hi - lo) * U,  # raw inputs whose transform is U
            lambda U: U,  # what the model sees
        ),
        # drops a column: d + 1 raw inputs, the last one ignored
        "filter": (
            lambda: FilterFeatures(feature_indices=torch.arange(D)),
            lambda U: torch.cat([U, torch.full_like(U[..., :1], 0.7)], dim=-1),
            lambda U: U,
        ),
        # appends a column: the product x1 * x2 (in the unit cube)
        "interaction": (
            lambda: InteractionFeatures(),
            lambda U: U,
            lambda U: torch.cat([U, U[..., :1] * U[..., 1:2]], dim=-1),
        ),
    }


@surrogates
@pytest.mark.parametrize("case", list(_transform_cases()))
def test_input_transform_equals_model_on_transformed_inputs(s, case):
    """A model with an input transform (including one that adds or drops columns) equals the
    same model built on the transformed inputs: posterior, conditioning, update and state."""
    make_tf, raw, seen = _transform_cases()[case]
    U, Y, _ = s.data(N0, D, seed=0)
    Un, Yn, _ = s.data(Q, D, seed=1)
    Ut = _test_points()
    plain = s.make(seen(U), Y)
    model = s.make(raw(U), Y, input_transform=make_tf())
    assert model.dim == seen(U).shape[-1]
    m_ref, C_ref = latent(plain, seen(Ut))
    m, C = latent(model, raw(Ut))
    assert_close(m, m_ref, s.tol, "posterior mean")
    assert_close(C, C_ref, s.tol, "posterior covariance")
    cond_ref = plain.condition_on_observations(seen(Un), Yn)
    cond = model.condition_on_observations(raw(Un), Yn)
    assert_close(latent(cond, raw(Ut))[0], latent(cond_ref, seen(Ut))[0], s.tol, "conditioned mean")
    fm = model.fantasize(raw(Un).unsqueeze(0), SobolQMCNormalSampler(torch.Size([2]), seed=0))
    assert fm.posterior(raw(Ut)).mean.shape == torch.Size([2, 1, 5, 1])
    plain.update(seen(Un), Yn)
    model.update(raw(Un), Yn)
    assert_close(latent(model, raw(Ut))[0], latent(plain, seen(Ut))[0], s.tol, "updated mean")
    assert_close(latent(model, raw(Ut))[1], latent(plain, seen(Ut))[1], s.tol, "updated covariance")


@surrogates
@pytest.mark.parametrize("case", list(_transform_cases()))
def test_botorch_reads_the_training_inputs_in_the_users_space(s, case):
    """BoTorch's ``get_X_baseline`` (the training points that ``optimize_acqf`` perturbs with
    ``sample_around_best`` and ``optimize_acqf_mixed_alternating`` sprays around) reads
    ``_original_train_inputs`` of a model whose ``train_inputs`` are transformed, as
    ``SingleTaskGP``'s are in eval mode. The models hold them transformed but said they did not,
    so it took the transformed inputs for raw ones: with ``Normalize`` from [10, 20]^5 every
    point sampled around the best lay on the box's corner. They are now the raw inputs (after an
    update and in a conditioned model too), as ``SingleTaskGP``'s; for a transform that cannot be
    undone, none (BoTorch's warning) rather than wrong ones."""
    from botorch.acquisition import PosteriorMean
    from botorch.models import SingleTaskGP
    from botorch.optim.utils import get_X_baseline

    make_tf, raw, _ = _transform_cases()[case]
    U, Y, _ = s.data(N0, D, seed=0)
    Un, Yn, _ = s.data(Q, D, seed=1)
    model = s.make(raw(U), Y, input_transform=make_tf())
    if not hasattr(model, "train_inputs"):  # WISKI keeps statistics, not the points
        pytest.skip(f"{s.name} holds no training inputs")
    X_ref = get_X_baseline(PosteriorMean(SingleTaskGP(raw(U), Y, input_transform=make_tf())))
    torch.testing.assert_close(X_ref, raw(U), rtol=0, atol=0)  # BoTorch's answer: the raw inputs
    model.update(raw(Un), Yn)
    child = model.condition_on_observations(raw(U[:Q]), Yn)
    # the child: its held inputs (t-SVGP's hold the base data only) mapped back by hand
    for m, X_raw in ((model, torch.cat([raw(U), raw(Un)])), (child, None)):
        if case != "normalize":  # FilterFeatures, InteractionFeatures: no untransform
            with pytest.warns(BotorchWarning, match="Failed to extract X_baseline"):
                assert get_X_baseline(PosteriorMean(m)) is None
            continue
        X_raw = raw(m.train_inputs[0]) if X_raw is None else X_raw
        torch.testing.assert_close(get_X_baseline(PosteriorMean(m)), X_raw, rtol=0, atol=1e-12)
    plain = s.make(U, Y)
    assert plain._original_train_inputs is None  # no transform: train_inputs are the originals
    torch.testing.assert_close(get_X_baseline(PosteriorMean(plain)), U, rtol=0, atol=0)


@surrogates
def test_learned_input_bounds_are_not_learned_again_from_new_observations(s):
    """A ``Normalize`` that learns its bounds learns them from the training data at construction
    and keeps them: ``condition_on_observations`` and ``update`` on a model still in training
    mode (as built, or after ``train()``) leave the bounds as they were and give the same
    posterior as on a model put in eval mode first (BoTorch's ``preprocess_transform``)."""
    lo = torch.tensor([-1.0, 2.0], dtype=DT)
    hi = torch.tensor([3.0, 2.5], dtype=DT)
    U, Y, _ = s.data(N0, D, seed=0)
    _, Yn, _ = s.data(Q, D, seed=1)
    Un = 0.5 * (U[:Q] + U[Q : 2 * Q])  # inside the learned box, so WISKI's grid takes them
    raw, Ut = (lambda V: lo + (hi - lo) * V), 0.5 * (U[-5:] + U[:5])
    model = s.make(raw(U), Y, input_transform=Normalize(d=D)).train()
    ref = s.make(raw(U), Y, input_transform=Normalize(d=D)).eval()
    learned = model.input_transform.bounds.clone()
    cond = model.condition_on_observations(raw(Un), Yn)
    assert torch.equal(model.input_transform.bounds, learned), "conditioning re-learned bounds"
    cond_ref = ref.condition_on_observations(raw(Un), Yn)
    assert_close(latent(cond, raw(Ut))[0], latent(cond_ref, raw(Ut))[0], s.tol, "conditioned mean")
    model.train().update(raw(Un), Yn)
    assert torch.equal(model.input_transform.bounds, learned), "update re-learned bounds"
    ref.update(raw(Un), Yn)
    assert_close(latent(model, raw(Ut))[0], latent(ref, raw(Ut))[0], s.tol, "updated mean")
    assert_close(latent(model, raw(Ut))[1], latent(ref, raw(Ut))[1], s.tol, "updated covariance")


@surrogates
def test_a_conditioned_model_put_in_training_mode_leaves_its_parents_learned_bounds(s):
    """A conditioned model shares its parent's input transform; ``child.train()`` (any call
    of it, a hand-written training loop's) put that transform in training mode while the parent
    stayed in eval mode, so the parent's next posterior re-learned a learned ``Normalize``'s bounds
    from the query points: the exact GP's mean moved by 1.3 and every later prediction and
    conditioning used the new box. Queries now go through the transform in eval mode."""
    lo = torch.tensor([-1.0, 2.0], dtype=DT)
    hi = torch.tensor([3.0, 2.5], dtype=DT)
    U, Y, _ = s.data(N0, D, seed=0)
    _, Yn, _ = s.data(Q, D, seed=1)
    Un = 0.5 * (U[:Q] + U[Q : 2 * Q])  # inside the learned box, so WISKI's grid takes them
    raw, Ut = (lambda V: lo + (hi - lo) * V), 0.5 * (U[-5:] + U[:5])
    parent = s.make(raw(U), Y, input_transform=Normalize(d=D)).eval()
    learned = parent.input_transform.bounds.clone()
    mean, cov = latent(parent, raw(Ut))
    child = parent.condition_on_observations(raw(Un), Yn)
    child.train()
    latent(parent, raw(Ut[:2]))  # queries on a narrower box than the training data's
    assert torch.equal(parent.input_transform.bounds, learned), "the parent re-learned bounds"
    mean2, cov2 = latent(parent, raw(Ut))
    assert_close(mean2, mean, 1e-12, "parent mean")
    assert_close(cov2, cov, 1e-12, "parent covariance")


def _warp() -> Warp:
    """BoTorch's learned input warping (Kumaraswamy CDFs) on every input of the unit cube (fixed
    bounds: none would be learned from the first data), away from the identity."""
    unit = torch.stack([torch.zeros(D, dtype=DT), torch.ones(D, dtype=DT)])
    warp = Warp(d=D, indices=list(range(D)), bounds=unit).to(DT)
    with torch.no_grad():
        warp.concentration0.copy_(torch.tensor([0.7, 1.5], dtype=DT))
        warp.concentration1.copy_(torch.tensor([1.3, 0.8], dtype=DT))
    return warp


@surrogates
def test_an_input_transform_with_trainable_parameters_is_refused(s):
    """An input transform with trainable parameters (``Warp``, whose concentrations are meant to
    be learned) is refused at construction with a ``ValueError`` saying to freeze it or to use
    ``SingleTaskGP``: the models hold their inputs transformed once (or statistics of them), so
    a transform that changes would leave them stale. The same transform frozen is taken, and the
    model equals the one built on the warped inputs."""
    U, Y, _ = s.data(N0, D, seed=0)
    Un, Yn, _ = s.data(Q, D, seed=1)
    Ut = _test_points()
    with pytest.raises(
        ValueError, match=r"(?s)concentration0.*requires_grad_\(False\).*SingleTaskGP"
    ):
        s.make(U, Y, input_transform=_warp())
    model = s.make(U, Y, input_transform=_warp().requires_grad_(False))
    seen = _warp().requires_grad_(False).eval()  # the warped inputs the model sees
    plain = s.make(seen(U), Y)
    m_ref, C_ref = latent(plain, seen(Ut))
    m, C = latent(model, Ut)
    assert_close(m, m_ref, s.tol, "posterior mean with a frozen Warp")
    assert_close(C, C_ref, s.tol, "posterior covariance with a frozen Warp")
    plain.update(seen(Un), Yn)
    model.update(Un, Yn)
    assert_close(latent(model, Ut)[0], latent(plain, seen(Ut))[0], s.tol, "updated mean")


@surrogates
def test_outcome_transform_standardize_is_accepted_and_others_are_refused(s):
    """``outcome_transform=Standardize(m=1)``, which a BoTorch user passes out of habit, is taken
    and changes nothing (outcomes are standardised internally); any other outcome transform is
    refused at construction with a ``ValueError`` that says what to do instead."""
    U, Y, _ = s.data(N0, D, seed=0)
    Ut = _test_points()
    model = s.make(U, Y, outcome_transform=Standardize(m=1))
    plain = s.make(U, Y)
    m, C = latent(model, Ut)
    m_ref, C_ref = latent(plain, Ut)
    assert_close(m, m_ref, s.tol, "posterior mean with Standardize(m=1)")
    assert_close(C, C_ref, s.tol, "posterior covariance with Standardize(m=1)")
    for other in (Log(), Standardize(m=2)):
        with pytest.raises(
            ValueError, match=r"(?s)not supported.*Transform Y before.*SingleTaskGP"
        ):
            s.make(U, Y, outcome_transform=other)


# ------------------------------------------------------------------ caches and fit


@surrogates
def test_caches_follow_hyperparameter_changes(s):
    """ensure_caches: changing any hyperparameter in place rebuilds the caches at the next use
    (the posterior equals the one after invalidate_caches), and for models whose state is
    statistics plus caches it equals the dense reference with the new values."""
    X, Y, _ = s.data(N0, D, seed=0)
    Xn, Yn, _ = s.data(Q, D, seed=1)
    Xt = _test_points()
    model = s.make(X, Y)
    model.update(Xn, Yn)
    latent(model, Xt)
    kernel = kernel_in_use(model)
    base = getattr(kernel, "base_kernel", kernel)
    with torch.no_grad():
        base.lengthscale = base.lengthscale * 1.3
    m1, C1 = latent(model, Xt)
    model.invalidate_caches()
    m2, C2 = latent(model, Xt)
    assert_close(m1, m2, 1e-12, "mean after a lengthscale change")
    assert_close(C1, C2, 1e-12, "covariance after a lengthscale change")
    if s.exact_in_hyperparameters:  # (implies a state of statistics: conditioning = rebuild)
        mean_ref, cov_ref = reference(s, model, torch.cat([X, Xn]), torch.cat([Y, Yn]), None, Xt)
        assert_close(m1, mean_ref, s.tol, "mean vs dense with the new lengthscale")
        assert_close(C1, cov_ref, s.tol, "covariance vs dense with the new lengthscale")


class _AnyMLL(MarginalLogLikelihood):
    """A marginal likelihood object around the model; never evaluated (custom_fit takes over)."""

    def forward(self, *args, **kwargs):
        raise AssertionError("fit_gpytorch_mll evaluated the mll instead of calling custom_fit")


@surrogates
def test_fit_gpytorch_mll_dispatches_to_fit_from_own_statistics(s):
    """fit_gpytorch_mll dispatches to the model's fit (custom_fit); fit works from the model's
    own statistics after updates (no data passed) and leaves a consistent model: for models whose
    state is statistics plus caches, the dense reference under the fitted hyperparameters."""

    X, Y, _ = s.data(N0, D, seed=0)
    Xn, Yn, _ = s.data(Q, D, seed=1)
    model = s.make(X, Y)
    model.update(Xn, Yn)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    if s.exact_mll:
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
    else:  # any GPyTorch marginal likelihood around the model dispatches the same way
        with pytest.raises(RuntimeError):
            ExactMarginalLogLikelihood(model.likelihood, model)
        mll = _AnyMLL(model.likelihood, model)
    with mock.patch.object(type(model), "fit", autospec=True, side_effect=type(model).fit) as fit:
        fit_gpytorch_mll(mll, max_iter=5)
    assert fit.call_count == 1 and fit.call_args.kwargs.get("max_iter") == 5
    assert not mll.training
    changed = [k for k, v in model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert changed, "fit left every hyperparameter unchanged"
    # fit(restandardize=True), the default, rescales outcomes from all the data held
    Y_all = torch.cat([Y, Yn])
    if s.outcomes is None:
        assert_close(model.outcome_mean.reshape(()), Y_all.mean(), 1e-12, "outcome_mean after fit")
        assert_close(model.outcome_std.reshape(()), Y_all.std(), 1e-12, "outcome_std after fit")
    else:  # labels are never standardised
        assert float(model.outcome_mean) == 0.0 and float(model.outcome_std) == 1.0
    Xt = _test_points()
    m1, C1 = latent(model, Xt)
    assert bool(torch.isfinite(m1).all() and torch.isfinite(C1).all())
    if s.exact_in_hyperparameters:
        mean_ref, cov_ref = reference(s, model, torch.cat([X, Xn]), torch.cat([Y, Yn]), None, Xt)
        assert_close(m1, mean_ref, 1e-7, "mean vs dense after fit")
        assert_close(C1, cov_ref, 1e-7, "covariance vs dense after fit")


@surrogates
def test_fit_respects_the_bounds_of_gpytorch_constraints(s):
    """fit keeps a constrained hyperparameter inside its GPyTorch constraint when the constraint
    has no transform (so only the optimiser's bounds hold it): the lengthscale in [0.2, 0.25],
    below what the data would pick."""
    from gpytorch.constraints import Interval

    X, Y, _ = s.data(N0, D, seed=0)
    model = s.make(X, Y)
    model.update(*s.data(Q, D, seed=1))
    kernel = kernel_in_use(model)
    base = getattr(kernel, "base_kernel", kernel)
    base.register_constraint("raw_lengthscale", Interval(0.2, 0.25, transform=None))
    with torch.no_grad():
        base.raw_lengthscale.fill_(0.22)
    model.fit(max_iter=10)
    ls = base.lengthscale.detach()
    assert bool(((ls >= 0.2 - 1e-9) & (ls <= 0.25 + 1e-9)).all()), ls
    assert not torch.equal(ls, torch.full_like(ls, 0.22)), "fit did not move the lengthscale"
