r"""DecoupledSVGP on streams: the default fit against an exact GP, capped bases under long chains
of updates against a dense computation, and posterior memory linear in the batch size
(float64, CPU, seeded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch
from botorch.acquisition import UpperConfidenceBound
from botorch.test_functions import Branin, Hartmann

from bo_online.models import DecoupledSVGP, OnlineExactGP
from bo_online.models.decoupled.bases import pivoted_cholesky_select

DT = torch.float64


def _function_data(f, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, f.dim, generator=g, dtype=DT)
    lb, ub = f.bounds.to(X)
    Y = f(lb + (ub - lb) * X).unsqueeze(-1)
    return X, Y + 0.01 * Y.std() * torch.randn(n, 1, generator=g, dtype=DT)


def _stream(n: int, d: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(4 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    return X, Y


# ---------------------------------------------------------------------- the default fit


def test_default_fit_reaches_the_exact_gp_hyperparameters():
    # Branin (2-D, 60 points) and Hartmann (4-D, 80 points): n > num_cov_bases, so the bases are
    # not the data, yet the hyperparameters are those of an exact GP fitted on the same data.
    for f, n in ((Branin(), 60), (Hartmann(dim=4), 80)):
        X, Y = _function_data(f, n)
        m = DecoupledSVGP(X, Y, num_mean_bases=48, num_cov_bases=16)
        m.fit(max_iter=200)
        e = OnlineExactGP(X, Y)
        e.fit()
        ls_m, ls_e = m.covar_module.lengthscale.detach(), e.covar_module.lengthscale.detach()
        assert torch.allclose(ls_m, ls_e, rtol=0.05), (ls_m, ls_e)
        noise_m, noise_e = float(m.likelihood.noise), float(e.likelihood.noise)
        assert abs(noise_m / noise_e - 1) < 0.2, (noise_m, noise_e)
        # The exact marginal likelihood at the decoupled model's hyperparameters.
        at_m = OnlineExactGP(X, Y, covar_module=m.covar_module, likelihood=m.likelihood)
        at_m.mean_module = m.mean_module
        mll_m = float(at_m.marginal_log_likelihood())
        assert mll_m > float(e.marginal_log_likelihood()) - 1e-3
        # And the fitted model ends at the closed-form optimum: bases capped, fold mode on.
        assert m.num_beta == 16 and m.num_alpha == 48 and m.site_Q is not None


def test_default_fit_with_bases_equal_to_data_is_the_exact_gp():
    X, Y = _function_data(Branin(), 30, seed=3)
    m = DecoupledSVGP(X, Y)  # 30 <= 128 covariance bases: the bases are the data
    m.fit(max_iter=200)
    e = OnlineExactGP(X, Y)
    e.fit()
    Xt = torch.rand(7, 2, generator=torch.Generator().manual_seed(4), dtype=DT)
    pm, pe = m.posterior(Xt), e.posterior(Xt)
    assert torch.allclose(pm.mean, pe.mean, atol=1e-4 * float(Y.std()))
    assert torch.allclose(pm.variance, pe.variance, rtol=1e-3, atol=1e-8 * float(Y.var()))


# ---------------------------------------------------------------------- capped bases


def _dense_site_optimum(m: DecoupledSVGP, Xt: torch.Tensor):
    r"""Independent dense computation, by explicit inverses, of the model that a chain of folds
    must equal: for fixed bases ``Z = [beta; alpha]`` and hyperparameters, the ELBO optimum
    over ``(a, B)`` on ALL held data (standardised units):
    ``mean(x) = c + k_xZ (K_Z + K_ZX N^-1 K_XZ)^-1 K_ZX N^-1 (y - c)`` and
    ``cov = k_xx - k_xb (B^-1 + K_j)^-1 k_bx``, ``B = K_j^-1 (P + 1e-6 I) K_j^-1``,
    ``P = K_bX N^-1 K_Xb``, ``K_j = K_b + 1e-8 I`` (the model's stated jitters: fold mode's
    ``H`` holds ``K_j``, so its covariance is ``K_j^-1 - (K_j + P + 1e-6 I)^-1`` between bases)."""
    k = lambda A, B: m.covar_module(A, B).to_dense()  # noqa: E731
    beta, Z, X = m.beta_points, torch.cat([m.beta_points, m.alpha_points]), m.train_X
    Ninv = torch.diag(1.0 / m.likelihood.noise.detach().expand(X.shape[0]))
    c = m.mean_module.constant.detach()
    KZX = k(Z, X)
    a = torch.linalg.inv(k(Z, Z) + KZX @ Ninv @ KZX.T) @ KZX @ Ninv @ (m.train_y - c)
    mean = c + k(Xt, Z) @ a  # the explicit inverses are the independent route
    Kb = k(beta, beta)
    eye = torch.eye(Kb.shape[0], dtype=DT)
    P = k(beta, X) @ Ninv @ k(X, beta)
    Kj_inv = torch.linalg.inv(Kb + 1e-8 * eye)
    B = Kj_inv @ (P + 1e-6 * eye) @ Kj_inv
    cov = k(Xt, Xt) - k(Xt, beta) @ torch.linalg.inv(torch.linalg.inv(B) + Kb + 1e-8 * eye) @ k(
        beta, Xt
    )
    return mean, cov


def test_long_chain_of_updates_keeps_bases_capped_and_equals_the_batch_site_optimum():
    X, Y = _stream(40)
    m = DecoupledSVGP(X, Y, num_mean_bases=20, num_cov_bases=8)
    with torch.no_grad():
        # Short lengthscales keep K_Z well conditioned, so that 1e-9 tests the algebra.
        m.covar_module.lengthscale = torch.tensor([[0.15, 0.2]], dtype=DT)
        m.likelihood.noise = torch.tensor([0.05], dtype=DT)
    m.fit(max_iter=0)  # restandardise and compress only (no optimiser steps)
    m._set_sites(m.beta_points, m.alpha_points)  # the site optimum for these hyperparameters
    Xs, Ys = _stream(400, seed=1)
    sizes = [1] * 300 + [3] * 20 + [2] * 20  # 400 points in 340 updates
    start = 0
    for q in sizes:
        m.update(Xs[start : start + q], Ys[start : start + q])
        start += q
    assert m.num_beta == 8 and m.num_alpha == 20 and m.num_data == 440
    Xt = torch.rand(6, 2, generator=torch.Generator().manual_seed(5), dtype=DT)
    p = m.posterior(Xt)
    mean_ref, cov_ref = _dense_site_optimum(m, Xt)
    std, var = m.outcome_std, m.outcome_std**2
    assert torch.allclose(p.mean.squeeze(-1), mean_ref * std + m.outcome_mean, atol=1e-9, rtol=0)
    assert torch.allclose(p.covariance_matrix, cov_ref * var, atol=1e-9, rtol=0)
    # The same statistics summed in one batch over all held data give the same model.
    b = DecoupledSVGP(X, Y, num_mean_bases=20, num_cov_bases=8)
    b.load_state_dict(m.state_dict())
    b._set_sites(m.beta_points, m.alpha_points)
    assert torch.allclose(b.site_Q, m.site_Q, atol=1e-9 * float(m.site_Q.abs().max()), rtol=0)
    pb = b.posterior(Xt)
    assert torch.allclose(pb.mean, p.mean, atol=1e-9, rtol=0)
    assert torch.allclose(pb.covariance_matrix, p.covariance_matrix, atol=1e-9, rtol=0)


def test_exact_growth_stops_at_the_budget_and_then_folds():
    X, Y = _stream(5)  # 5 <= 8 covariance bases: bases = data, exact conditioning grows them
    m = DecoupledSVGP(X, Y, num_mean_bases=16, num_cov_bases=8, max_basis_growth=10)
    with torch.no_grad():
        m.covar_module.lengthscale = torch.tensor([[0.15, 0.2]], dtype=DT)
    m.fit(max_iter=0)  # the exact-GP state for the new lengthscales (bases = data)
    Xs, Ys = _stream(40, seed=2)
    for i in range(13):  # 18 points: still within 8 + 10
        m.update(Xs[i : i + 1], Ys[i : i + 1])
    assert m.num_beta == 18 and m.site_Q is None
    Ystd = (torch.cat([Y, Ys[:13]]) - m.outcome_mean) / m.outcome_std  # the model's scaling
    e = OnlineExactGP(
        torch.cat([X, Xs[:13]]),
        Ystd,
        covar_module=m.covar_module,
        likelihood=m.likelihood,
        standardize=False,
    )
    e.mean_module = m.mean_module
    Xt = torch.rand(4, 2, generator=torch.Generator().manual_seed(6), dtype=DT)
    assert torch.allclose(
        m.posterior(Xt).mean, e.posterior(Xt).mean * m.outcome_std + m.outcome_mean, atol=1e-9
    )
    for i in range(13, 40):  # past the budget: compressed to the caps, then folded
        m.update(Xs[i : i + 1], Ys[i : i + 1])
    assert m.num_beta == 8 and m.num_alpha == 16 and m.site_Q is not None
    mean_ref, cov_ref = _dense_site_optimum(m, Xt)
    p = m.posterior(Xt)
    assert torch.allclose(
        p.mean.squeeze(-1), mean_ref * m.outcome_std + m.outcome_mean, atol=1e-9, rtol=0
    )
    assert torch.allclose(p.covariance_matrix, cov_ref * m.outcome_std**2, atol=1e-9, rtol=0)


def _folded_model(updates: int = 60):
    r"""A model in fold mode (8 covariance / 20 mean bases) after ``updates`` single-point folds."""
    X, Y = _stream(40)
    m = DecoupledSVGP(X, Y, num_mean_bases=20, num_cov_bases=8)
    with torch.no_grad():
        m.covar_module.lengthscale = torch.tensor([[0.15, 0.2]], dtype=DT)
        m.likelihood.noise = torch.tensor([0.05], dtype=DT)
    m.fit(max_iter=0)
    with torch.no_grad():  # as fit does
        m._set_sites(m.beta_points, m.alpha_points)
    Xs, Ys = _stream(updates, seed=8)
    for i in range(updates):
        m.update(Xs[i : i + 1], Ys[i : i + 1])
    return m


def test_factors_formed_after_folds_equal_the_dense_optimum_and_predict_the_same():
    # Folds keep only the factors the prediction needs; L and chol_H, formed on first read,
    # must be the closed-form optimum B = K_j^-1 P~ K_j^-1 and H = I + L^T K_j L (dense, by
    # explicit inverses), and predicting through them must give the fold-mode posterior.
    m = _folded_model()
    Xt = torch.rand(5, 2, generator=torch.Generator().manual_seed(9), dtype=DT)
    p_fold = m.posterior(Xt)
    k = lambda A, B: m.covar_module(A, B).to_dense()  # noqa: E731
    beta, X = m.beta_points, m.train_X
    eye = torch.eye(8, dtype=DT)
    P = k(beta, X) @ k(X, beta) / m.likelihood.noise.detach()
    Kj_inv = torch.linalg.inv(k(beta, beta) + 1e-8 * eye)
    B_ref = Kj_inv @ (P + 1e-6 * eye) @ Kj_inv
    B = m.L @ m.L.T
    assert torch.allclose(B, B_ref, atol=1e-9 * float(B_ref.abs().max()), rtol=0)
    H_ref = eye + m.L.T @ (k(beta, beta) + 1e-8 * eye) @ m.L
    assert torch.allclose(m.chol_H @ m.chol_H.T, H_ref, atol=1e-9 * float(H_ref.abs().max()))
    V = torch.linalg.solve_triangular(m.chol_H, m.L.T @ k(beta, Xt), upper=False)
    cov_L = (k(Xt, Xt) - V.T @ V) * m.outcome_std**2
    assert torch.allclose(cov_L, p_fold.covariance_matrix, atol=1e-10, rtol=0)


def test_state_dict_after_folds_round_trips_and_folding_goes_on_equal():
    m = _folded_model()
    state = m.state_dict()
    assert state["L"] is not None and state["chol_H"] is not None
    X, Y = _stream(40)
    r = DecoupledSVGP(X, Y, num_mean_bases=20, num_cov_bases=8)
    r.load_state_dict(state)
    Xs, Ys = _stream(30, seed=10)
    for i in range(30):  # both fold on: the restored one from refactorised sites
        m.update(Xs[i : i + 1], Ys[i : i + 1])
        r.update(Xs[i : i + 1], Ys[i : i + 1])
    Xt = torch.rand(5, 2, generator=torch.Generator().manual_seed(11), dtype=DT)
    pm, pr = m.posterior(Xt), r.posterior(Xt)
    assert torch.allclose(pm.mean, pr.mean, atol=1e-10, rtol=0)
    assert torch.allclose(pm.covariance_matrix, pr.covariance_matrix, atol=1e-10, rtol=0)
    mean_ref, cov_ref = _dense_site_optimum(m, Xt)
    assert torch.allclose(pm.covariance_matrix, cov_ref * m.outcome_std**2, atol=1e-9, rtol=0)


def test_a_failed_load_leaves_a_folded_model_as_it_was():
    m = _folded_model(20)
    Xt = torch.rand(4, 2, generator=torch.Generator().manual_seed(14), dtype=DT)
    before = m.posterior(Xt)
    state = {k: v for k, v in m.state_dict().items() if not k.startswith("site_")}
    state["not_a_buffer"] = torch.zeros(1, dtype=DT)  # strict: unexpected key, the load fails
    try:
        m.load_state_dict(state)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the load should have failed")
    after = m.posterior(Xt)
    assert m.site_Q is not None  # still in fold mode
    assert torch.equal(after.mean, before.mean)
    assert torch.equal(after.covariance_matrix, before.covariance_matrix)


def test_factors_formed_or_refactorised_on_demand_carry_no_graph():
    # L, chol_H and the refactorised fold factors are caches: formed inside a differentiable
    # posterior, a fantasy or a state_dict they must not tie the buffers to the hyperparameters
    # (a second backward would fail, deepcopy would refuse the buffers).
    import copy

    for route in ("state_dict", "load", "fantasy"):
        m = _folded_model(20)
        if route == "state_dict":
            m.state_dict()
        elif route == "load":
            r = DecoupledSVGP(*_stream(40), num_mean_bases=20, num_cov_bases=8)
            r.load_state_dict(m.state_dict())
            m = r  # its fold factors are refactorised from the loaded sites
        Xt = torch.rand(4, 2, generator=torch.Generator().manual_seed(13), dtype=DT)
        for _ in range(2):
            model = m.condition_on_observations(Xt[:1], torch.zeros(1, 1, dtype=DT))
            model = model if route == "fantasy" else m
            model.posterior(Xt).variance.sum().backward()
        assert not m.chol_H.requires_grad and not m.L.requires_grad, route
        copy.deepcopy(m)


def test_conditioning_a_folded_model_equals_conditioning_its_posterior():
    # Fantasies from fold mode grow the bases from L and chol_H formed on demand; the result
    # must be the fold-mode posterior conditioned densely (posterior as prior, docs/math.md §5).
    m = _folded_model()
    g = torch.Generator().manual_seed(12)
    Xn, Yn = torch.rand(3, 2, generator=g, dtype=DT), torch.randn(3, 1, generator=g, dtype=DT)
    Xt = torch.rand(5, 2, generator=g, dtype=DT)
    post = m.posterior(torch.cat([Xn, Xt]))
    mu, S = post.mean.squeeze(-1), post.covariance_matrix
    noise = m.likelihood.noise.detach() * m.outcome_std**2  # user units
    gain = S[3:, :3] @ torch.linalg.inv(S[:3, :3] + noise * torch.eye(3, dtype=DT))
    mean_ref = mu[3:] + gain @ (Yn.squeeze(-1) - mu[:3])
    cov_ref = S[3:, 3:] - gain @ S[:3, 3:]
    c = m.condition_on_observations(Xn, Yn)
    pc = c.posterior(Xt)
    assert c.num_beta == 11 and m.site_Q is not None  # the model itself stays in fold mode
    assert torch.allclose(pc.mean.squeeze(-1), mean_ref, atol=1e-9, rtol=0)
    assert torch.allclose(pc.covariance_matrix, cov_ref, atol=1e-9, rtol=0)


def test_changed_hyperparameters_drop_the_sites_and_fantasies_do_not_share_them():
    X, Y = _stream(30)
    m = DecoupledSVGP(X, Y, num_mean_bases=16, num_cov_bases=8)
    assert m.site_Q is not None
    c = m.condition_on_observations(X[:2], Y[:2])
    assert c.site_Q is None and c.num_beta == 10 and m.site_Q is not None
    with torch.no_grad():
        m.covar_module.lengthscale = m.covar_module.lengthscale * 1.3
    m.update(X[:1], Y[:1])  # sites summed under the old kernel are stale: exact growth instead
    assert m.site_Q is None and m.num_beta == 9


# ---------------------------------------------------------------------- memory


def test_batched_posterior_equals_flat_one():
    X, Y = _stream(60)
    m = DecoupledSVGP(X, Y, num_mean_bases=24, num_cov_bases=8, max_basis_growth=500)
    m.set_variational_parameters(m.beta_points, m.L, m.a_beta, m.alpha_points, m.a_alpha)
    Xs, Ys = _stream(50, seed=3)
    for i in range(50):  # exact growth: 58 covariance bases
        m.update(Xs[i : i + 1], Ys[i : i + 1])
    Xt = torch.rand(37, 2, generator=torch.Generator().manual_seed(7), dtype=DT)
    flat, batched = m.posterior(Xt), m.posterior(Xt.unsqueeze(-2))
    assert torch.allclose(batched.mean.reshape(-1), flat.mean.reshape(-1), atol=1e-10, rtol=0)
    assert torch.allclose(
        batched.variance.reshape(-1), flat.variance.reshape(-1), atol=1e-10, rtol=0
    )
    Xq = Xt[:36].reshape(12, 3, 2)  # b x q x d with q = 3: the joint q x q blocks
    pq = m.posterior(Xq)
    for i in range(12):
        pi = m.posterior(Xq[i])
        assert torch.allclose(pq.covariance_matrix[i], pi.covariance_matrix, atol=1e-10, rtol=0)


_MEMORY_SCRIPT = textwrap.dedent(
    r"""
    import json, resource, sys
    import torch
    from bo_online.models import DecoupledSVGP
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(100, 3, generator=g, dtype=torch.float64)
    Y = torch.sin(3 * X).sum(-1, keepdim=True)
    m = DecoupledSVGP(X, Y, num_mean_bases=64, num_cov_bases=32, max_basis_growth=10**6)
    m.set_variational_parameters(m.beta_points, m.L, m.a_beta, m.alpha_points, m.a_alpha)
    with torch.no_grad():
        m.likelihood.noise = torch.tensor([0.01], dtype=torch.float64)
    Xs = torch.rand(400, 3, generator=g, dtype=torch.float64)
    for i in range(400):  # k = 400 exact updates since the refit: 432 covariance bases
        m.update(Xs[i : i + 1], torch.sin(3 * Xs[i : i + 1]).sum(-1, keepdim=True))
    b = 512
    Xt = torch.rand(b, 3, generator=g, dtype=torch.float64)

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    p = m.posterior(Xt[:4].unsqueeze(-2)); p.mean; p.variance  # warm-up of every code path
    p = m.posterior(Xt[:4]); p.mean; p.variance
    base = peak_mb()
    p = m.posterior(Xt); p.mean; p.variance
    flat = peak_mb() - base
    del p
    p = m.posterior(Xt.unsqueeze(-2)); p.mean; p.variance
    both = peak_mb() - base
    print(json.dumps({"flat_mb": flat, "batched_mb": both, "num_beta": m.num_beta}))
    """
)


def test_posterior_peak_memory_for_b_x_1_x_d_within_2x_of_b_x_d():
    # Measured in a fresh process: ru_maxrss (peak RSS, KiB on Linux) sees torch's CPU
    # allocations, which tracemalloc does not. The b x 1 x d posterior runs after the b x d one,
    # so ``batched_mb`` is the peak over both; it must stay within 2x of the b x d peak (plus
    # 32 MB of allocator slack). Per-batch copies of the 432 x 432 factor would cost ~760 MB.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["num_beta"] == 432
    assert r["batched_mb"] <= 2 * r["flat_mb"] + 32, r


def test_a_model_loaded_from_state_dict_goes_on_bit_for_bit():
    # A resumed stream must repeat the uninterrupted one: the loaded model carries the folds'
    # factors (not refactorised afresh) and the generator its refits draw subsets from.
    X, Y = _stream(700)
    m = DecoupledSVGP(X[:600], Y[:600], num_mean_bases=40, num_cov_bases=16, exact_fit_points=64)
    m.fit(max_iter=5)  # draws from the generator (subset of 64 of the 600 points)
    for i in range(600, 630):
        m.update(X[i : i + 1], Y[i : i + 1])
    r = DecoupledSVGP(X[:630], Y[:630], num_mean_bases=40, num_cov_bases=16, exact_fit_points=64)
    r.load_state_dict(m.state_dict())
    for model in (m, r):
        for i in range(630, 660):
            model.update(X[i : i + 1], Y[i : i + 1])
        model.fit(max_iter=5)  # a refit drawing new subsets
        for i in range(660, 700):
            model.update(X[i : i + 1], Y[i : i + 1])
    Xt = torch.rand(5, 2, generator=torch.Generator().manual_seed(15), dtype=DT)
    pm, pr = m.posterior(Xt), r.posterior(Xt)
    assert torch.equal(pm.mean, pr.mean)
    assert torch.equal(pm.covariance_matrix, pr.covariance_matrix)


def test_saved_only_state_is_not_held_and_loads_through_a_parent_module():
    X, Y = _stream(700)
    m = DecoupledSVGP(X[:600], Y[:600], num_mean_bases=40, num_cov_bases=16, exact_fit_points=64)
    m.fit(max_iter=5)
    for i in range(600, 620):
        m.update(X[i : i + 1], Y[i : i + 1])
    state = m.state_dict()
    assert state["generator_state"].dtype == torch.uint8 and "fold_chol_A" in state
    held = ("generator_state", "fold_chol_K", "fold_chol_A", "fold_chol_C")
    assert all(m._buffers[name] is None for name in held)  # only while saving
    # A generic parent module saves and loads the child through torch's recursion; a state
    # cast to float64 on the way (as a user might) still restores the generator.
    parent = torch.nn.Module()
    parent.gp = DecoupledSVGP(X[:620], Y[:620], num_mean_bases=40, num_cov_bases=16)
    parent.load_state_dict(
        {f"gp.{k}": v.double() if k == "generator_state" else v for k, v in state.items()}
    )
    r = parent.gp
    assert all(r._buffers[name] is None for name in held)
    for model in (m, r):
        model.fit(max_iter=5)
        for i in range(620, 640):
            model.update(X[i : i + 1], Y[i : i + 1])
    Xt = torch.rand(5, 2, generator=torch.Generator().manual_seed(16), dtype=DT)
    assert torch.equal(m.posterior(Xt).mean, r.posterior(Xt).mean)
    assert torch.equal(m.posterior(Xt).variance, r.posterior(Xt).variance)


# ---------------------------------------------------------------------- float32


def test_float32_long_stream_in_six_dimensions_matches_float64():
    # A smooth function at long lengthscales and small noise: K_beta (128 bases, 6 inputs) has
    # condition ~1e10 and K_Z + Q ~1e11, far beyond float32's ~1e-7. The site statistics and
    # their factors are held in float64 for a float32 model (statistics.site_dtype); before, the
    # fit beyond num_cov_bases points raised NotPositiveDefiniteError (chol of H = I + L^T K_j L)
    # and folded means were off by a good fraction of the outcome's standard deviation.
    d, n0, n = 6, 150, 450  # 300 points streamed one at a time, defaults (128 / 256 bases)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = X.sum(-1, keepdim=True)
    Xt = torch.rand(50, d, generator=g, dtype=DT)

    def build(dtype: torch.dtype) -> DecoupledSVGP:
        m = DecoupledSVGP(X[:n0].to(dtype), Y[:n0].to(dtype))
        with torch.no_grad():
            m.covar_module.lengthscale = torch.full((1, d), 2.0, dtype=dtype)
            m.likelihood.noise = torch.tensor([1e-4], dtype=dtype)
        return m

    m64, m32 = build(DT), build(torch.float32)
    m64.fit(train_hyperparameters=False)  # bases by pivoted Cholesky, then the sites
    m32.fit(train_hyperparameters=False)  # raised NotPositiveDefiniteError
    assert m32._in_fold_mode()
    # The same bases for both: the selection runs in float64 for a float32 model too (before,
    # their coordinates were up to 0.81 apart); set again so the comparison rests on the folds.
    assert torch.allclose(m32.beta_points.double(), m64.beta_points, atol=1e-6, rtol=0)
    with torch.no_grad():
        m32._set_sites(m64.beta_points.float(), m64.alpha_points.float())
    ucb = UpperConfidenceBound(m32, beta=2.0)
    for i in range(n0, n):
        m64.update(X[i : i + 1], Y[i : i + 1])
        m32.update(X[i : i + 1].float(), Y[i : i + 1].float())
        if i % 50 == 0:  # an analytic acquisition calls m32.to(X) on each evaluation, and
            ucb(Xt[:4].float().unsqueeze(-2))  # a user may: neither may round the sites
            m32.to(torch.float32)
    assert m32.site_Q.dtype == m32.site_s.dtype == torch.float64
    assert m32._in_fold_mode() and m32.num_beta == 128 and m32.num_data == n
    std, var = float(Y.std()), float(Y.var())

    def assert_close(a: DecoupledSVGP, b: DecoupledSVGP, mean_tol: float = 1e-3) -> None:
        with torch.no_grad():
            p32, p64 = a.posterior(Xt.float()), b.posterior(Xt)
        mean32, var32 = p32.mean.double(), p32.variance.double()
        assert torch.allclose(mean32, p64.mean, atol=mean_tol * std, rtol=0)
        assert torch.allclose(var32, p64.variance, atol=1e-5 * var, rtol=1e-3)

    assert_close(m32, m64)
    # Exact conditioning of the folded model (its L and chol_H formed from the sites). Its
    # L = K_j^{-1} chol(P~), rounded to float32, carries entries ~cond(K_j) times chol(P~)'s and
    # the conditioning multiplies it in float32: measured 1.1e-3 std off, so 3e-3 here.
    Xq, Yq = X[:3] + 0.01, Y[:3]
    f32 = m32.condition_on_observations(Xq.float(), Yq.float())
    assert_close(f32, m64.condition_on_observations(Xq, Yq), mean_tol=3e-3)
    m32.fit(train_hyperparameters=False)  # a refit on all 450 points
    assert m32._in_fold_mode()
    # a state cast to float32 by hand (or saved before the sites were held in float64) loads
    # with its sites in float64 again, so later folds do not go on in float32
    state = {k: v.float() if v.is_floating_point() else v for k, v in m32.state_dict().items()}
    assert state["site_Q"].dtype == torch.float32
    m32.load_state_dict(state)
    assert m32.site_Q.dtype == m32.site_s.dtype == torch.float64
    assert m32._fold_factors()[0].dtype == torch.float64


def test_a_float32_model_loaded_into_a_fresh_one_keeps_its_float64_sites_bit_for_bit():
    # A resumed float32 stream rebuilds the model on the initial design (no sites yet) and loads
    # the state of a folded one: its float64 sites and fold factors must load as float64, not be
    # rounded through the model's float32 on the way.
    X, Y = _stream(700)
    X, Y = X.float(), Y.float()
    m = DecoupledSVGP(X[:600], Y[:600], num_mean_bases=40, num_cov_bases=16, exact_fit_points=64)
    m.fit(max_iter=5)
    for i in range(600, 630):
        m.update(X[i : i + 1], Y[i : i + 1])
    r = DecoupledSVGP(X[:10], Y[:10], num_mean_bases=40, num_cov_bases=16, exact_fit_points=64)
    assert r.site_Q is None  # not in fold mode: nothing to load the sites into
    r.load_state_dict(m.state_dict())
    assert r.site_Q.dtype == torch.float64 and torch.equal(r.site_Q, m.site_Q)
    assert torch.equal(r.site_s, m.site_s)
    for model in (m, r):
        for i in range(630, 660):
            model.update(X[i : i + 1], Y[i : i + 1])
    Xt = torch.rand(5, 2, generator=torch.Generator().manual_seed(15)).float()
    pm, pr = m.posterior(Xt), r.posterior(Xt)
    assert pm.mean.dtype == torch.float32
    assert torch.equal(pm.mean, pr.mean)
    assert torch.equal(pm.variance, pr.variance)


def test_pivoted_cholesky_of_a_float32_kernel_picks_the_farthest_point_as_float64():
    # Residual variance after picking x_0 is k(x, x) - k(x, x_0)^2 = 1 - exp(-|x - x_0|^2 / l^2):
    # the greedy rule picks the point farthest from x_0. At l = 0.3 in five inputs most points
    # have k(x, x_0)^2 < 6e-8, so float32 rounded 1 - k^2 to 1 and the argmax took the first
    # index of that tie (pivoted_cholesky_select now runs in float64).
    g = torch.Generator().manual_seed(0)
    X = torch.rand(200, 5, generator=g, dtype=DT)
    K = torch.exp(-0.5 * torch.cdist(X, X).pow(2) / 0.3**2)  # by hand, float64
    picks64 = pivoted_cholesky_select(K, 10)
    assert int(picks64[0]) == 0  # a tie of the constant diagonal: the first index
    assert int(picks64[1]) == int(torch.cdist(X[:1], X).argmax())
    assert torch.equal(pivoted_cholesky_select(K.float(), 10), picks64)
    # and with only the diagonal and the rows given (the default fit's selection)
    rows = pivoted_cholesky_select(None, 10, diag=K.diagonal().float(), row=lambda i: K[i].float())
    assert torch.equal(rows, picks64)


def test_float32_stream_compressed_to_a_tiny_basis_keeps_the_float64_bases():
    # 7 mean / 4 covariance bases, l = 0.3 in five inputs: exact growth until 4 + 40 covariance
    # bases, then compressed back by pivoted Cholesky and folded. The float32 model chose other
    # mean bases there (coordinates up to 0.96 apart; posterior means 1.4 outcome sd apart after
    # 300 points), because its residual variances rounded to 1 (see the test above).
    d, n0, n = 5, 20, 80
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(3 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    Xt = torch.rand(50, d, generator=g, dtype=DT)

    def build(dtype: torch.dtype) -> DecoupledSVGP:
        kw = dict(num_mean_bases=7, num_cov_bases=4, max_basis_growth=40, seed=1)
        m = DecoupledSVGP(X[:n0].to(dtype), Y[:n0].to(dtype), **kw)
        with torch.no_grad():
            m.covar_module.lengthscale = torch.full((1, d), 0.3, dtype=dtype)
            m.likelihood.noise = torch.tensor([0.05], dtype=dtype)
        return m

    m64, m32 = build(DT), build(torch.float32)
    for i in range(n0, n):
        m64.update(X[i : i + 1], Y[i : i + 1])
        m32.update(X[i : i + 1].float(), Y[i : i + 1].float())
    assert m32._in_fold_mode() and m64._in_fold_mode() and m32.num_alpha == 7
    for name in ("beta_points", "alpha_points"):
        torch.testing.assert_close(
            getattr(m32, name).double(), getattr(m64, name), atol=1e-6, rtol=0
        )
    with torch.no_grad():
        p32, p64 = m32.posterior(Xt.float()), m64.posterior(Xt)
    std = float(Y.std())
    torch.testing.assert_close(p32.mean.double(), p64.mean, atol=1e-4 * std, rtol=0)
