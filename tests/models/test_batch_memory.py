r"""A posterior for b points costs memory linear in b whatever the batch shape.

``b x 1 x d`` (what ``optimize_acqf`` and Ax ask for with q = 1) must cost about what the same b
points as one ``b x d`` request cost: no per-batch copies of an ``n x n`` factor, of the training
inputs or of the points conditioned on since the last fit. Peak memory is read from the torch
profiler's allocation events (CPU), and the two answers are compared elementwise.
"""

from __future__ import annotations

import pytest
import torch
from memory_profile import peak_allocated_bytes

from bo_online.models import QSGP, TSVGP, WISKI, DecoupledSVGP, OnlineExactGP

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
