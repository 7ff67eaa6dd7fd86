"""WISKI's cached root ``S`` and Gram ``M = R A^-1 R^T`` carried through in-place updates by
rank-q algebra (``bo_online.models.wiski.caches._updated_roots``), against caches rebuilt from
scratch and the dense SKI posterior."""

from __future__ import annotations

import copy

import torch
from gpytorch.kernels import MaternKernel, ScaleKernel
from wiski_reference import dense_posterior

from bo_online.models import WISKI

DT = torch.float64


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _f(X: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return (
        3
        + 2 * torch.sin(5 * X).sum(-1, keepdim=True)
        + 0.1 * torch.randn(X.shape[0], 1, generator=g, dtype=DT)
    )


def test_roots_updated_through_a_chain_of_updates_equal_a_rebuild_and_dense_ski():
    g = torch.Generator().manual_seed(21)
    X = torch.rand(20, 2, generator=g, dtype=DT)
    Y = _f(X, g)
    covar = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=2))
    model = WISKI(X, Y, grid_size=14, covar_module=covar)  # m = 144 > two column blocks
    covar.outputscale = 1.7
    covar.base_kernel.lengthscale = torch.tensor([0.25, 0.35], dtype=DT)
    model.likelihood.noise = 0.07
    model.eval()
    Xn = torch.rand(2, 3, 2, generator=g, dtype=DT)  # 2 candidate batches of q = 3
    Yn = torch.randn(2, 3, 1, generator=g, dtype=DT) + 3
    Xs = torch.rand(60, 2, generator=g, dtype=DT)
    Xall, Yall = X, Y
    for step in range(60):
        if step % 10 == 0:  # a fantasy on the current state: builds (first) or uses the caches
            model.condition_on_observations(Xn, Yn).posterior(Xs)
        Xq = torch.rand(3, 2, generator=g, dtype=DT)
        Yq = _f(Xq, g)
        model.update(Xq, Yq)
        Xall, Yall = torch.cat([Xall, Xq]), torch.cat([Yall, Yq])
        assert model._shared.get("S") is not None and model._shared.get("M") is not None
    S, M = model._shared["S"], model._shared["M"]
    rebuilt = copy.deepcopy(model)
    rebuilt.invalidate_caches()
    rebuilt.ensure_caches()
    assert rebuilt._shared == {}
    M_ref = rebuilt._factor_gram()
    assert _rel(M, M_ref) < 1e-9
    assert _rel(S @ S.mT, M_ref) < 1e-9
    # The conditioned posterior through the updated caches, against the rebuilt ones and dense SKI.
    p, p_ref = (
        model.condition_on_observations(Xn, Yn).posterior(Xs),
        rebuilt.condition_on_observations(Xn, Yn).posterior(Xs),
    )
    assert _rel(p.mean, p_ref.mean) < 1e-9
    assert (
        _rel(p.mvn.lazy_covariance_matrix.to_dense(), p_ref.mvn.lazy_covariance_matrix.to_dense())
        < 1e-9
    )
    sd2 = model.outcome_std.reshape(()) ** 2
    noise = model.likelihood.noise.reshape(()).expand(3)
    for b in range(2):
        mean_ref, cov_ref = dense_posterior(
            model, Xall, Yall, None, Xs, extra=(Xn[b], Yn[b], noise)
        )
        assert _rel(p.mean[b].squeeze(-1), mean_ref) < 1e-8
        assert _rel(p.mvn.lazy_covariance_matrix[b].to_dense() / sd2, cov_ref) < 1e-8


def test_update_without_cached_roots_leaves_them_to_be_built_lazily():
    g = torch.Generator().manual_seed(22)
    X = torch.rand(15, 2, generator=g, dtype=DT)
    model = WISKI(X, _f(X, g), grid_size=12)
    model.eval()
    model.posterior(X[:2])  # a small request: no root is cached
    assert model._shared.get("S") is None
    Xq = torch.rand(3, 2, generator=g, dtype=DT)
    model.update(Xq, _f(Xq, g))
    assert model._shared == {}


def test_in_place_root_updates_leave_conditioned_models_and_shallow_copies_unchanged():
    g = torch.Generator().manual_seed(23)
    X = torch.rand(25, 2, generator=g, dtype=DT)
    model = WISKI(X, _f(X, g), grid_size=14)
    model.eval()
    Xn = torch.rand(2, 3, 2, generator=g, dtype=DT)
    Yn = torch.randn(2, 3, 1, generator=g, dtype=DT)
    Xs = torch.rand(20, 2, generator=g, dtype=DT)
    model.condition_on_observations(Xn, Yn).posterior(Xs)  # builds S and M
    Xq = torch.rand(3, 2, generator=g, dtype=DT)
    model.update(Xq, _f(Xq, g))  # no other model reads the caches: updated in place
    cm = model.condition_on_observations(Xn, Yn)
    before = cm.posterior(Xs)
    mean0, cov0 = before.mean.clone(), before.mvn.covariance_matrix.clone()
    S_before = model._shared["S"]
    Xq = torch.rand(3, 2, generator=g, dtype=DT)
    model.update(Xq, _f(Xq, g))  # cm shares the old caches: they are replaced, not overwritten
    assert model._shared["S"] is not S_before
    after = cm.posterior(Xs)  # (a second request: the cached-rows path, same values to rounding)
    assert _rel(after.mean, mean0) < 1e-12
    assert _rel(after.mvn.covariance_matrix, cov0) < 1e-12
    # and the updated model's caches still equal a rebuild
    rebuilt = copy.deepcopy(model)
    rebuilt.invalidate_caches()
    rebuilt.ensure_caches()
    assert _rel(model._shared["M"], rebuilt._factor_gram()) < 1e-9
    S = model._shared["S"]
    assert _rel(S @ S.mT, rebuilt._factor_gram()) < 1e-9


def test_float32_updates_refactorise_on_a_fixed_schedule_of_n():
    """Below float64 the rank-one chain drifts from the factor of the same statistics (the
    statistics are exact sums), so ``update`` refactorises whenever n passes a multiple of
    ``REFACTOR_EVERY``: there the streamed model is the model rebuilt from its statistics, bit for
    bit, and close to a float64 model of the same data. Float64 chains never refactorise."""
    g = torch.Generator().manual_seed(5)
    X = torch.rand(2 * WISKI.REFACTOR_EVERY, 2, generator=g, dtype=DT)
    Y = _f(X, g)
    models = {}
    for dtype in (torch.float32, DT):
        covar = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=2))
        model = WISKI(X[:20].to(dtype), Y[:20].to(dtype), grid_size=14, covar_module=covar)
        covar.outputscale = 1.7
        covar.base_kernel.lengthscale = torch.tensor([0.25, 0.35])
        model.likelihood.noise = 0.07
        model.eval()
        model.ensure_caches()  # for these hyperparameters, before the stream
        models[dtype] = model
    factorised = []
    for dtype, model in models.items():
        original = type(model)._rebuild_caches

        def counting(self, original=original, dtype=dtype):
            factorised.append(dtype)
            return original(self)

        model._rebuild_caches = counting.__get__(model)
        for i in range(20, X.shape[0]):
            model.update(X[i : i + 1].to(dtype), Y[i : i + 1].to(dtype))
    # n went 20 -> 2K: past K and 2K once each (float32); float64: no refactorisation.
    assert factorised.count(torch.float32) == 2
    assert torch.float64 not in factorised
    streamed = models[torch.float32]
    assert streamed.num_data % WISKI.REFACTOR_EVERY == 0
    fresh = copy.deepcopy(streamed)
    fresh.invalidate_caches()
    fresh.ensure_caches()
    assert torch.equal(streamed.chol_A, fresh.chol_A)
    Xt = torch.rand(50, 2, generator=g, dtype=DT)
    with torch.no_grad():
        mean32 = streamed.posterior(Xt.float()).mean.double()
        mean64 = models[DT].posterior(Xt).mean
    assert _rel(mean32, mean64) < 1e-4


def test_a_float32_model_loaded_from_its_state_posts_what_it_posts():
    r"""A loop's resumed run loads the model's saved state, which holds ``L_A`` but not the lazy
    ``S`` and ``M = R A^-1 R^T``. A float32 model carried them through its updates by rank-q
    algebra, so its candidate covariances (and their gradients) differed from those of its
    loaded copy, which builds them from ``L_A`` (here by 3e-7 and 1e-5 on one 2-D grid, 3e-6
    and 5e-5 for the 4-D all-pairs model: ``bo-online resume`` of a float32 WISKI run proposed
    other points from its first step on, Branin and Ackley 5-D alike). Below float64
    ``update`` now drops ``S`` and ``M``, so both build them from the same ``L_A``: equal bit
    for bit, for one grid and for the additive model."""
    g = torch.Generator().manual_seed(3)
    for d, options in (
        (2, {"grid_size": 14}),
        (4, {**WISKI.loop_default_options(4), "exact_max_n": 0}),
    ):
        X = torch.rand(15, d, generator=g, dtype=DT)
        Y = _f(X, g)
        model = WISKI(X.float(), Y.float(), **options)
        model.likelihood.noise = 0.01
        Xs = torch.rand(4, 3, d, generator=g, dtype=torch.float32)

        def covariance_and_grad(m):
            Xg = Xs.clone().requires_grad_(True)
            cov = m.posterior(Xg).mvn.covariance_matrix
            return cov.detach(), torch.autograd.grad(cov.sum(), Xg)[0]

        for _ in range(3):  # as a loop: candidates (M is built), then the chosen points
            covariance_and_grad(model)
            Xn = torch.rand(3, d, generator=g, dtype=DT)
            model.update(Xn.float(), _f(Xn, g).float())
        loaded = WISKI(X.float(), Y.float(), **options)
        loaded.load_state_dict(model.state_dict())
        cov, grad = covariance_and_grad(model)
        cov_loaded, grad_loaded = covariance_and_grad(loaded)
        assert torch.equal(cov, cov_loaded)
        assert torch.equal(grad, grad_loaded)
