"""qLogNEI's baseline in long campaigns: above ``max_baseline`` observations it is cut, before
BoTorch's pruning, to the observed inputs of highest posterior mean, so an acquisition never
samples jointly at every observation (O(n^2) memory, O(n^3) time)."""

from __future__ import annotations

import pytest
import torch
from botorch.acquisition import qLogNoisyExpectedImprovement
from botorch.models import SingleTaskGP
from botorch.sampling import SobolQMCNormalSampler

from bo_online.acquisition import ACQ_OPTIONS, build_acquisition, likely_best_inputs
from bo_online.loops import BayesOptLoop
from bo_online.problems import CallableProblem

DTYPE = torch.float64


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 3, generator=g, dtype=DTYPE)
    f = -((X - torch.tensor([0.3, 0.6, 0.4], dtype=DTYPE)) ** 2).sum(-1) * 4
    Y = f + 0.1 * torch.randn(n, generator=g, dtype=DTYPE)
    return X, Y.unsqueeze(-1)


def _fixed_gp(X: torch.Tensor, Y: torch.Tensor) -> SingleTaskGP:
    """BoTorch's GP with set hyperparameters (no fit: the test does not depend on one)."""
    model = SingleTaskGP(X, Y)
    model.covar_module.lengthscale = torch.tensor([0.3, 0.3, 0.3], dtype=DTYPE)
    model.likelihood.noise = torch.tensor([0.01], dtype=DTYPE)
    model.mean_module.constant.data.fill_(float(Y.mean()))
    return model.eval()


def _mean_by_hand(model: SingleTaskGP, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """The posterior mean at the training inputs, from the kernel matrix (dense algebra)."""
    with torch.no_grad():
        K = model.covar_module(X).to_dense()
        noise = model.likelihood.noise.item()
        c = model.mean_module.constant.item()
        A = K + noise * torch.eye(X.shape[0], dtype=DTYPE)
        return c + K @ torch.linalg.solve(A, Y.squeeze(-1) - c)


def test_likely_best_inputs_are_the_top_k_by_a_dense_posterior_mean():
    X, Y = _data(120)
    model = _fixed_gp(X, Y)
    mean = _mean_by_hand(model, X, Y)
    kept = likely_best_inputs(model, X, 15)
    expected = X[torch.topk(mean, 15).indices.sort().values]  # in their order in X
    assert torch.equal(kept, expected)
    assert likely_best_inputs(model, X, 120) is X  # n <= k: the observations themselves


def _posterior_sizes(model) -> list[int]:
    """Wrap ``model.posterior`` to record the number of points each call samples jointly."""
    sizes: list[int] = []
    original = model.posterior

    def recording(X, *args, **kwargs):
        sizes.append(X.shape[-2])
        return original(X, *args, **kwargs)

    model.posterior = recording
    return sizes


def test_qlognei_never_samples_jointly_at_more_than_max_baseline_points():
    X, Y = _data(300)
    model = _fixed_gp(X, Y)
    sizes = _posterior_sizes(model)
    torch.manual_seed(0)
    acq = build_acquisition(
        "qlognei", model, q=1, step=1, dim=3, X_observed=X, options={"max_baseline": 40}
    )
    acq(torch.rand(4, 1, 3, dtype=DTYPE))
    assert max(sizes) <= 40 + 1  # the baseline plus the q candidate points
    assert acq.X_baseline.shape[0] <= 40


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_cut_keeps_every_point_botorchs_pruning_keeps(seed):
    """BoTorch's pruning over all 300 observations keeps only points among the 40 of highest
    posterior mean, so the cut drops no point the full pruning would keep."""
    X, Y = _data(300, seed=seed)
    model = _fixed_gp(X, Y)
    top = likely_best_inputs(model, X, 40)
    torch.manual_seed(0)
    full = qLogNoisyExpectedImprovement(
        model, X_baseline=X, sampler=SobolQMCNormalSampler(torch.Size([128])), cache_root=False
    ).X_baseline
    assert full.shape[0] >= 3  # pruning kept several points: the check is not trivial
    in_top = (full.unsqueeze(1) == top.unsqueeze(0)).all(-1).any(-1)
    assert in_top.all()


def test_below_max_baseline_the_acquisition_is_botorchs_unchanged():
    X, Y = _data(30)
    model = _fixed_gp(X, Y)
    Xt = torch.rand(5, 2, 3, dtype=DTYPE)
    torch.manual_seed(4)
    ours = build_acquisition("qlognei", model, q=2, step=1, dim=3, X_observed=X)
    torch.manual_seed(4)
    theirs = qLogNoisyExpectedImprovement(
        model, X_baseline=X, sampler=SobolQMCNormalSampler(torch.Size([128])), cache_root=False
    )
    assert torch.equal(ours.X_baseline, theirs.X_baseline)
    with torch.no_grad():
        assert torch.allclose(ours(Xt), theirs(Xt), rtol=0, atol=1e-12)


@pytest.mark.parametrize("bad", [0, 1.5, "many", True])
def test_a_bad_max_baseline_is_refused_by_name(bad):
    X, Y = _data(20)
    with pytest.raises(ValueError, match="max_baseline"):
        build_acquisition(
            "qlognei",
            _fixed_gp(X, Y),
            q=1,
            step=1,
            dim=3,
            X_observed=X,
            options={"max_baseline": bad},
        )
    assert "max_baseline" in ACQ_OPTIONS["qlognei"]


def test_the_loop_takes_max_baseline_and_builds_qlognei_on_the_cut_baseline(monkeypatch):
    import bo_online.acquisition as acquisition

    baselines: list[int] = []

    def recording(model, X_baseline, **kwargs):
        baselines.append(X_baseline.shape[0])
        return qLogNoisyExpectedImprovement(model, X_baseline=X_baseline, **kwargs)

    monkeypatch.setattr(acquisition, "qLogNoisyExpectedImprovement", recording)

    def quad(X: torch.Tensor) -> torch.Tensor:
        return ((X - 0.3) ** 2).sum(-1)

    problem = CallableProblem(quad, bounds=[[0.0, 0.0], [1.0, 1.0]], name="quad")
    loop = BayesOptLoop(
        problem,
        model="exact",
        acq="qlognei",
        acq_options={"max_baseline": 5},
        n_init=8,
        seed=0,
        quiet=True,
        optimizer_options={"num_restarts": 2, "raw_samples": 16, "maxiter": 20},
    )
    loop.run(2)
    assert baselines == [5, 5]  # 8 and 9 observations, cut to the 5 of highest mean
