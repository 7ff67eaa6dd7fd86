"""New points' noise is floored the same way by every WISKI entry point that adds data.

``update``, ``add_observations`` and ``projection_step`` all scale a new point's noise into
standardised units through :meth:`OnlineModel._standardized_noise`, which raises variances below
the noise floor to it. Checked against the same noise floored by hand.
"""

from __future__ import annotations

import pytest
import torch
from gpytorch.utils.warnings import NumericalWarning

from bo_online.models import WISKI
from bo_online.models.validation import NOISE_FLOOR

DT = torch.float64


def _data(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = 3 + 2 * torch.sin(5 * X).sum(-1, keepdim=True)
    return X, Y + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)


def _floored_by_hand(model: WISKI, noise: torch.Tensor) -> torch.Tensor:
    r"""User-unit noise ``q x 1`` -> standardised ``q``, values in (0, floor) raised to it."""
    s = noise.squeeze(-1) / model.outcome_std.pow(2)
    return torch.where((s > 0) & (s < NOISE_FLOOR), torch.full_like(s, NOISE_FLOOR), s)


def test_standardized_noise_matches_hand_computation() -> None:
    X, Y = _data(20, 2, seed=0)
    model = WISKI(X, Y, grid_size=10)
    std2 = model.outcome_std.pow(2)
    noise = torch.tensor([[0.0], [1e-3 * NOISE_FLOOR], [0.5 * NOISE_FLOOR], [0.3]], dtype=DT)
    noise = noise * std2  # user units
    with pytest.warns(NumericalWarning, match="below the floor"):
        got = model._standardized_noise(noise, X, torch.Size([4, 1]))
    assert torch.equal(got, _floored_by_hand(model, noise))
    assert got[0] == 0 and got[1] == NOISE_FLOOR and got[2] == NOISE_FLOOR
    assert model._standardized_noise(None, X, torch.Size([4, 1])) is None


@pytest.mark.parametrize("fixed", [False, True])
def test_add_observations_floors_tiny_noise_as_update(fixed: bool) -> None:
    X, Y = _data(60, 2, seed=1)
    Yvar = torch.full_like(Y, 0.01) if fixed else None
    tiny = torch.full_like(Y[20:], 1e-14)  # far below the floor (std^2 is ~ 1)
    a = WISKI(X[:20], Y[:20], Yvar if Yvar is None else Yvar[:20], grid_size=10)
    b = WISKI(X[:20], Y[:20], Yvar if Yvar is None else Yvar[:20], grid_size=10)
    b.load_state_dict(a.state_dict())
    with pytest.warns(NumericalWarning, match="below the floor"):
        a.update(X[20:], Y[20:], tiny)
    with pytest.warns(NumericalWarning, match="below the floor"):
        b.add_observations(X[20:], Y[20:], tiny, chunk_size=16)
    sa, sb = a.statistics(), b.statistics()
    for k in sa:
        assert torch.allclose(sa[k], sb[k], rtol=1e-10, atol=1e-12), k
    Xt = torch.rand(7, 2, dtype=DT)
    pa, pb = a.posterior(Xt), b.posterior(Xt)
    assert torch.allclose(pa.mean, pb.mean, rtol=1e-9, atol=1e-12)
    assert torch.allclose(pa.variance, pb.variance, rtol=1e-9, atol=1e-12)


def test_projection_step_floors_tiny_noise() -> None:
    X, Y = _data(50, 5, seed=2)
    a = WISKI(X[:45], Y[:45], projection="tanh:2", grid_size=10)
    b = WISKI(X[:45], Y[:45], projection="tanh:2", grid_size=10)
    b.load_state_dict(a.state_dict())
    Xn, Yn = X[45:], Y[45:]
    tiny = torch.full_like(Yn, 1e-14)
    at_floor = NOISE_FLOOR * a.outcome_std.pow(2).expand_as(Yn)  # the floor in user units
    with pytest.warns(NumericalWarning, match="below the floor"):
        obj_tiny = a.projection_step(Xn, Yn, tiny, lr=1e-3)
    obj_floor = b.projection_step(Xn, Yn, at_floor, lr=1e-3)
    assert torch.allclose(obj_tiny, obj_floor, rtol=1e-10)
    for p, q in zip(a.projection.parameters(), b.projection.parameters()):
        assert torch.allclose(p, q, rtol=1e-10, atol=1e-14)
