r"""A posterior for b points costs memory linear in b whatever the batch shape.

``b x 1 x d`` (what ``optimize_acqf`` and Ax ask for with q = 1) must cost about what the same b
points as one ``b x d`` request cost: no per-batch copies of an ``n x n`` factor, of the training
inputs or of the points conditioned on since the last fit. Peak memory is read from the torch
profiler's allocation events (CPU), and the two answers are compared elementwise.
"""

from __future__ import annotations

import pytest
import torch
from botorch.sampling import SobolQMCNormalSampler
from memory_profile import peak_allocated_bytes

from bo_online.models import QSGP, TSVGP, WISKI, DecoupledSVGP, OnlineExactGP
from bo_online.models.wiski.grid import interp_matmul

DT = torch.float64
N, B = 1000, 512


def _peak_bytes(fn) -> tuple[int, object]:
    """Peak of the running sum of CPU allocations made while ``fn()`` runs, and its result."""
    out = []
    with torch.no_grad():
        peak = peak_allocated_bytes(lambda: out.append(fn()))
    assert peak > 0, "the profiler recorded no allocation: the measurement is broken"
    return peak, out[0]


def _data(d: int, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(5 * X).sum(-1, keepdim=True) + 0.05 * torch.randn(n, 1, generator=g, dtype=DT)
    return X, Y


def _model(name: str):
    if name == "exact":
        return OnlineExactGP(*_data(4, N))
    if name == "wiski":
        return WISKI(*_data(2, N), grid_size=32)
    if name == "tsvgp":  # enough inducing inputs that b copies of them would show
        return TSVGP(*_data(6, N), inducing_points=256)
    if name == "decoupled":
        return DecoupledSVGP(*_data(6, N), num_mean_bases=512, num_cov_bases=256)
    if name == "qsgp":
        X, Y = _data(4, 200)
        model = QSGP(X, Y)
        Xs, Ys = _data(4, N - 200, seed=1)
        for i in range(0, Xs.shape[0], 50):  # k = 800 points conditioned on since the fit
            model.update(Xs[i : i + 50], Ys[i : i + 50])
        return model
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["exact", "wiski", "tsvgp", "decoupled", "qsgp"])
def test_batched_posterior_memory_is_linear_in_b(name: str) -> None:
    torch.manual_seed(0)
    model = _model(name)
    model.eval()
    d = model.dim
    Xt = torch.rand(B, d, generator=torch.Generator().manual_seed(3), dtype=DT)
    model.posterior(Xt[:2]).variance  # caches built outside the measurement

    def flat():
        p = model.posterior(Xt)
        return p.mean.reshape(-1), p.variance.reshape(-1)

    def batched():
        p = model.posterior(Xt.unsqueeze(-2))
        return p.mean.reshape(-1), p.variance.reshape(-1)

    peak_flat, (mean_f, var_f) = _peak_bytes(flat)
    peak_batched, (mean_b, var_b) = _peak_bytes(batched)
    torch.testing.assert_close(mean_b, mean_f, atol=1e-10, rtol=0)
    torch.testing.assert_close(var_b, var_f, atol=1e-10, rtol=0)
    # Floor of 1 MB: tiny requests are dominated by fixed overheads.
    assert peak_batched <= 2 * max(peak_flat, 2**20), (name, peak_batched, peak_flat)


def test_wiski_six_inputs_joint_posterior_gradient_memory_is_linear_in_the_points() -> None:
    """qLogNEI asks WISKI (6 inputs, the loops' all-pairs grids: m = 1,500, 240 weights per
    point) for the joint posterior of its baseline plus a candidate in every restart, with a
    gradient. The backward pass used to keep the gathered ``K x m`` rows of the factor for every
    point (1.7 GB of peak RSS for 4 restarts x 81 points, 8.9 GB for 20); it must stay within a
    small multiple of the no-gradient request for the same points."""
    g = torch.Generator().manual_seed(5)
    X = torch.rand(80, 6, generator=g, dtype=DT)
    Y = torch.sin(3 * X).sum(-1, keepdim=True)
    model = WISKI(X, Y, **{**WISKI.loop_default_options(6), "exact_max_n": 0})
    model.eval()
    Xt = torch.cat([X.expand(4, 80, 6), torch.rand(4, 1, 6, generator=g, dtype=DT)], -2)
    model.posterior(Xt[:1, :2]).variance  # caches built outside the measurement
    base = torch.randn(16, 4, 81, generator=g, dtype=DT)

    def with_gradient():
        Xg = Xt.clone().requires_grad_(True)
        post = model.posterior(Xg)
        post.rsample_from_base_samples(torch.Size([16]), base).sum().backward()
        return Xg.grad

    def without_gradient():
        return model.posterior(Xt).rsample_from_base_samples(torch.Size([16]), base)

    peak_grad = peak_allocated_bytes(with_gradient)
    with torch.no_grad():
        peak_plain = peak_allocated_bytes(without_gradient)
    assert peak_grad <= 4 * max(peak_plain, 2**20), (peak_grad, peak_plain)


def test_wiski_fantasy_gradient_keeps_no_gathered_grid_rows() -> None:
    r"""Fantasies of ``b x q`` candidates that need a gradient in X (qKG, qNIPV in
    ``optimize_acqf``) cost memory of the fantasy models' ``b x q x m`` corrections, not of the
    ``b q K x m`` rows of the grid factors gathered for them (K = 96 weights per point for the
    4-input all-pairs model): the peak with the backward stays within a few times the peak
    without a gradient (before: 143 MB against 5 MB), and the gradient in X equals the one of a
    dense ``W`` (the interpolation weights as an ``N x m`` matrix) through the same factors."""
    g = torch.Generator().manual_seed(0)
    d, b = 4, 64
    X = torch.rand(200, d, generator=g, dtype=DT)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    model = WISKI(X, Y, **{**WISKI.loop_default_options(d), "exact_max_n": 0})
    model.posterior(X[:3]).variance  # caches built outside the measurement
    Xc = torch.rand(b, 2, d, generator=g, dtype=DT)
    Xt = torch.rand(b, 1, d, generator=g, dtype=DT)
    grads = []

    def run(grad: bool) -> None:
        x = Xc.clone().requires_grad_(grad)
        fant = model.fantasize(x, SobolQMCNormalSampler(torch.Size([4]), seed=0))
        out = fant.posterior(Xt).mean.sum()
        if grad:
            out.backward()
            grads.append(x.grad)

    with torch.no_grad():
        peak_plain = peak_allocated_bytes(lambda: run(False))
    peak_grad = peak_allocated_bytes(lambda: run(True))
    assert peak_grad <= 4 * max(peak_plain, 2**20), (peak_grad, peak_plain)

    # The gradient of the fantasy correction F = L_A^-1 U (one of the gathered products) against
    # the dense weights: dF/dX through W S (S = the model's cached factor root).
    S = model._factor_root()
    x = Xc[:4].clone().requires_grad_(True)
    idx, val = model._interp(x)
    (interp_matmul(idx, val, S) ** 2).sum().backward()
    xd = Xc[:4].clone().requires_grad_(True)
    idx_d, val_d = model._interp(xd)
    W = torch.zeros(*idx_d.shape[:-1], S.shape[0], dtype=DT).scatter_add(-1, idx_d, val_d)
    ((W @ S) ** 2).sum().backward()
    torch.testing.assert_close(x.grad, xd.grad, rtol=1e-10, atol=1e-12)


def test_wiski_fantasy_samples_do_not_copy_the_shared_correction() -> None:
    r"""qKG fantasizes S samples at each of b candidate sets: the rank-q correction ``S F``
    (``b x m x q``) is the same for every sample, only the mean coefficients (``S x b x m``)
    differ. ``torch.matmul`` broadcasting copied it once per sample (``S x b x m x q``: 1.1 GB
    for qKG's default 64 fantasies at b = 512 on the 6-input all-pairs grids); the peak must
    stay below one such copy, and each sample's posterior equals conditioning on its own
    observations alone."""
    g = torch.Generator().manual_seed(1)
    d, b, q, S = 4, 64, 6, 32
    X = torch.rand(200, d, generator=g, dtype=DT)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    model = WISKI(X, Y, **{**WISKI.loop_default_options(d), "exact_max_n": 0})
    m = model.num_grid_points
    Xc = torch.rand(b, q, d, generator=g, dtype=DT)
    Xt = torch.rand(b, 2, d, generator=g, dtype=DT)
    sampler = SobolQMCNormalSampler(torch.Size([S]), seed=0)
    model.posterior(Xc[:1]).variance  # caches built outside the measurement
    out = []
    peak = peak_allocated_bytes(lambda: out.append(model.fantasize(Xc, sampler)))
    assert peak < S * b * m * q * 8, (peak, S * b * m * q * 8)
    fantasy = out[0]
    with torch.no_grad():
        Yf = SobolQMCNormalSampler(torch.Size([S]), seed=0)(
            model.posterior(Xc, observation_noise=True)
        )
        post = fantasy.posterior(Xt)
        for s in (0, S - 1):
            ref = model.condition_on_observations(Xc, Yf[s]).posterior(Xt)
            torch.testing.assert_close(post.mean[s], ref.mean, atol=1e-10, rtol=0)
            torch.testing.assert_close(
                post.covariance_matrix[s], ref.covariance_matrix, atol=1e-10, rtol=0
            )
