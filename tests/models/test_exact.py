"""OnlineExactGP against BoTorch's SingleTaskGP and a dense GP computed by hand."""

import math

import pytest
import torch
from botorch.acquisition import (
    LogExpectedImprovement,
    qKnowledgeGradient,
    qLogExpectedImprovement,
    qUpperConfidenceBound,
)
from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood

from bo_online.models import OnlineExactGP

DT = torch.float64


def _data(n: int = 30, d: int = 3, seed: int = 0, noise_std: float = 0.1):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + noise_std * torch.randn(
        n, 1, generator=g, dtype=DT
    )
    return X, Y


def _set_hypers(model, lengthscale=(0.3, 0.5, 0.4), noise=0.05, constant=0.2):
    """Same hyperparameters on either model; inferred noise only where the model infers it."""
    model.covar_module.lengthscale = torch.tensor(lengthscale, dtype=DT)
    model.mean_module.constant = torch.tensor(constant, dtype=DT)
    if type(model.likelihood).__name__ == "GaussianLikelihood":
        model.likelihood.noise = torch.tensor([noise], dtype=DT)


def _pair(fixed_noise: bool = False, n: int = 30):
    X, Y = _data(n)
    Yvar = (
        (0.01 + 0.05 * torch.rand(n, 1, generator=torch.Generator().manual_seed(5), dtype=DT))
        if fixed_noise
        else None
    )
    ref = SingleTaskGP(X, Y, train_Yvar=Yvar)
    ours = OnlineExactGP(X, Y, train_Yvar=Yvar)
    _set_hypers(ref)
    _set_hypers(ours)
    return ref, ours, X, Y


def _close(a, b, tol=1e-8):
    a, b = torch.as_tensor(a).detach(), torch.as_tensor(b).detach()
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("fixed_noise", [False, True])
@pytest.mark.parametrize("observation_noise", [False, True])
def test_posterior_matches_single_task_gp(fixed_noise, observation_noise):
    ref, ours, _, _ = _pair(fixed_noise)
    Xt = torch.rand(4, 7, 3, generator=torch.Generator().manual_seed(1), dtype=DT)
    if fixed_noise and observation_noise:
        # BoTorch adds a given noise tensor (standardised units) for fixed-noise models.
        noise = torch.full((4, 7, 1), 0.03, dtype=DT)
        p_ref, p_ours = (
            ref.posterior(Xt, observation_noise=noise),
            ours.posterior(Xt, observation_noise=noise),
        )
    else:
        p_ref = ref.posterior(Xt, observation_noise=observation_noise)
        p_ours = ours.posterior(Xt, observation_noise=observation_noise)
    assert _close(p_ours.mean, p_ref.mean)
    assert _close(p_ours.covariance_matrix, p_ref.covariance_matrix)


def test_observation_noise_true_adds_likelihood_noise():
    _, ours, _, _ = _pair()
    Xt = torch.rand(5, 3, dtype=DT)
    latent = ours.posterior(Xt).covariance_matrix
    noisy = ours.posterior(Xt, observation_noise=True).covariance_matrix
    expected = ours.likelihood.noise * ours.outcome_std**2
    assert _close(noisy - latent, torch.eye(5, dtype=DT) * expected)


@pytest.mark.parametrize("fixed_noise", [False, True])
def test_300_single_point_updates_equal_model_built_once(fixed_noise):
    X, Y = _data(305, seed=3)
    Yvar = torch.full_like(Y, 0.02) + 0.01 * torch.rand_like(Y) if fixed_noise else None
    model = OnlineExactGP(X[:5], Y[:5], train_Yvar=None if Yvar is None else Yvar[:5])
    _set_hypers(model)
    for i in range(5, 305):
        model.update(X[i : i + 1], Y[i : i + 1], noise=None if Yvar is None else Yvar[i : i + 1])
    assert model.num_data == 305
    # Independent reference: SingleTaskGP on the same standardised data, no outcome transform.
    mu, sd = model.outcome_mean, model.outcome_std
    ref = SingleTaskGP(
        X, (Y - mu) / sd, train_Yvar=None if Yvar is None else Yvar / sd**2, outcome_transform=None
    )
    _set_hypers(ref)
    Xt = torch.rand(20, 3, generator=torch.Generator().manual_seed(9), dtype=DT)
    p, r = model.posterior(Xt), ref.posterior(Xt)
    assert _close(p.mean, r.mean * sd + mu)
    assert _close(p.covariance_matrix, r.covariance_matrix * sd**2)


def test_condition_on_observations_returns_new_model_and_leaves_original():
    _, ours, _, _ = _pair()
    state = {k: v.clone() for k, v in ours.state_dict().items()}
    Xn, Yn = _data(3, seed=11)
    new = ours.condition_on_observations(Xn, Yn)
    assert new is not ours and new.num_data == ours.num_data + 3
    assert new.covar_module is ours.covar_module  # hyperparameter modules are shared
    after = ours.state_dict()
    assert all(torch.equal(state[k], after[k]) for k in state)
    # The new model equals one updated in place.
    ours.update(Xn, Yn)
    Xt = torch.rand(6, 3, dtype=DT)
    assert _close(new.posterior(Xt).mean, ours.posterior(Xt).mean)


@pytest.mark.parametrize("fixed_noise", [False, True])
def test_fantasize_matches_single_task_gp(fixed_noise):
    ref, ours, _, _ = _pair(fixed_noise)
    Xf = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(4), dtype=DT)
    f_ref = ref.fantasize(Xf, SobolQMCNormalSampler(torch.Size([8]), seed=7))
    f_ours = ours.fantasize(Xf, SobolQMCNormalSampler(torch.Size([8]), seed=7))
    assert f_ours.batch_shape == f_ref.batch_shape == torch.Size([8, 2])
    Xt = torch.rand(2, 5, 3, generator=torch.Generator().manual_seed(6), dtype=DT)
    a, b = f_ours.posterior(Xt), f_ref.posterior(Xt)
    assert _close(a.mean, b.mean)
    assert _close(a.covariance_matrix, b.covariance_matrix)
    # The parent's factor is shared, not copied; the new rows carry no fantasy-sample dim.
    assert f_ours.chol is ours.chol
    assert f_ours.tail_S.shape == (2, 3, 30) and f_ours.tail_L.shape == (2, 3, 3)


def test_hyperparameter_change_invalidates_caches():
    ref, ours, _, _ = _pair()
    Xt = torch.rand(5, 3, dtype=DT)
    ours.posterior(Xt)
    for m in (ref, ours):
        m.covar_module.lengthscale = torch.tensor([0.2, 0.25, 0.3], dtype=DT)
        m.likelihood.noise = torch.tensor([0.1], dtype=DT)
    assert _close(ours.posterior(Xt).mean, ref.posterior(Xt).mean)
    assert _close(ours.posterior(Xt).variance, ref.posterior(Xt).variance)


def test_marginal_likelihood_matches_gpytorch_and_fit_improves_it():
    ref, ours, _, _ = _pair()
    ref_mll = ExactMarginalLogLikelihood(ref.likelihood, ref)
    ref.train()
    target = ref_mll(ref(*ref.train_inputs), ref.train_targets)
    ref.eval()
    assert _close(ours.marginal_log_likelihood(), target, tol=1e-10)
    before = float(ours.marginal_log_likelihood())
    ours.fit(max_iter=100)
    after = float(ours.marginal_log_likelihood())
    assert after > before
    # fit_gpytorch_mll on the same starting point reaches the same optimum (custom_fit hook).
    fit_gpytorch_mll(ExactMarginalLogLikelihood(ref.likelihood, ref))
    ref.train()
    ref_opt = float(
        ExactMarginalLogLikelihood(ref.likelihood, ref)(ref(*ref.train_inputs), ref.train_targets)
    )
    ref.eval()
    assert after == pytest.approx(ref_opt, abs=1e-3)
    # After fit the caches are fresh: posterior equals a dense computation with fitted values.
    Xt = torch.rand(4, 3, dtype=DT)
    K = ours.covar_module
    Xtr, y = ours.train_X, ours.train_y
    Kxx = K(Xtr).to_dense() + ours.likelihood.noise * torch.eye(Xtr.shape[0], dtype=DT)
    mean = ours.mean_module.constant + K(Xt, Xtr).to_dense() @ torch.linalg.solve(
        Kxx, y - ours.mean_module.constant
    )
    assert _close(ours.posterior(Xt).mean.squeeze(-1), mean * ours.outcome_std + ours.outcome_mean)


def test_custom_fit_called_by_fit_gpytorch_mll():
    _, ours, _, _ = _pair()
    before = float(ours.marginal_log_likelihood())
    mll = fit_gpytorch_mll(ExactMarginalLogLikelihood(ours.likelihood, ours))
    assert not mll.training
    assert float(ours.marginal_log_likelihood()) > before


def test_state_dict_round_trip_restores_exactly_without_refactorising():
    _, ours, _, _ = _pair()
    Xn, Yn = _data(4, seed=12)
    ours.update(Xn, Yn)
    state = ours.state_dict()
    assert "chol" in state and state["chol"].shape == (34, 34)
    fresh = OnlineExactGP(*_data(2, seed=13))
    fresh.load_state_dict(state)
    assert fresh._caches_valid()
    assert torch.equal(fresh.chol, ours.chol)
    Xt = torch.rand(5, 3, dtype=DT)
    assert torch.equal(fresh.posterior(Xt).mean, ours.posterior(Xt).mean)


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same_state(a, b):
    assert a.keys() == b.keys()
    assert all(a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "make_bad, match",
    [
        (lambda X, Y, V: (X, torch.tensor([[float("nan")]], dtype=DT), V), "NaN"),
        (lambda X, Y, V: (torch.rand(1, 4, dtype=DT), Y, V), "columns"),
        (lambda X, Y, V: (X, Y, torch.tensor([[-0.1]], dtype=DT)), "negative"),
        (lambda X, Y, V: (torch.full((1, 3), float("inf"), dtype=DT), Y, V), "NaN/inf"),
        (lambda X, Y, V: (X, torch.rand(2, 1, dtype=DT), V), "rows"),
    ],
)
def test_bad_input_raises_and_leaves_state(make_bad, match):
    X, Y = _data(10)
    Yvar = torch.full_like(Y, 0.01)
    model = OnlineExactGP(X, Y, train_Yvar=Yvar)
    before = _state(model)
    Xb, Yb, Vb = make_bad(X[:1], Y[:1], Yvar[:1])
    with pytest.raises(ValueError, match=match):
        model.update(Xb, Yb, noise=Vb)
    with pytest.raises(ValueError, match=match):
        model.condition_on_observations(Xb, Yb, noise=Vb)
    _assert_same_state(before, _state(model))


def test_out_of_bounds_and_missing_noise_raise():
    X, Y = _data(10)
    bounds = torch.tensor([[0.0] * 3, [1.0] * 3], dtype=DT)
    model = OnlineExactGP(X, Y, bounds=bounds)
    before = _state(model)
    with pytest.raises(ValueError, match="outside"):
        model.update(torch.tensor([[0.5, 1.5, 0.5]], dtype=DT), Y[:1])
    with pytest.raises(ValueError, match="outside"):
        model.posterior(torch.tensor([[0.5, -0.5, 0.5]], dtype=DT))
    _assert_same_state(before, _state(model))
    fixed = OnlineExactGP(X, Y, train_Yvar=torch.full_like(Y, 0.01))
    before = _state(fixed)
    with pytest.raises(ValueError, match="pass `noise`"):
        fixed.update(X[:1], Y[:1])
    _assert_same_state(before, _state(fixed))


def test_acquisition_functions_evaluate_and_optimize():
    _, model, X, Y = _pair(n=20)
    bounds = torch.tensor([[0.0] * 3, [1.0] * 3], dtype=DT)
    best = float(Y.max())
    sampler = SobolQMCNormalSampler(torch.Size([32]), seed=0)
    acqs = {
        "qUCB": qUpperConfidenceBound(model, beta=2.0, sampler=sampler),
        "qLogEI": qLogExpectedImprovement(model, best_f=best, sampler=sampler),
        "LogEI": LogExpectedImprovement(model, best_f=best),
        "qNIPV": qNegIntegratedPosteriorVariance(model, mc_points=torch.rand(64, 3, dtype=DT)),
        "qKG": qKnowledgeGradient(model, num_fantasies=4),
    }
    for name, acq in acqs.items():
        q = 1 if name == "LogEI" else 2
        Xq = torch.rand(
            3, q + (acq.num_fantasies if name == "qKG" else 0), 3, dtype=DT, requires_grad=True
        )
        val = acq(Xq)
        assert val.shape == (3,) and torch.isfinite(val).all(), name
        val.sum().backward()
        assert torch.isfinite(Xq.grad).all(), name
        cand, _ = optimize_acqf(
            acq, bounds=bounds, q=q, num_restarts=2, raw_samples=16, options={"maxiter": 20}
        )
        assert cand.shape == (q, 3) and bool(((cand >= 0) & (cand <= 1)).all()), name


def test_qnipv_variance_reduction_matches_dense_conditioning():
    """qNIPV on the fantasy model equals the variance of a GP conditioned densely."""
    _, model, X, Y = _pair(n=15)
    mc = torch.rand(10, 3, dtype=DT)
    Xq = torch.rand(1, 2, 3, dtype=DT)
    acq = qNegIntegratedPosteriorVariance(model, mc_points=mc)
    val = acq(Xq)
    sd2 = model.outcome_std**2
    K = model.covar_module
    Xall = torch.cat([model.train_X, Xq[0]])
    noise = model.likelihood.noise * torch.eye(Xall.shape[0], dtype=DT)
    Kinv = torch.linalg.inv(K(Xall).to_dense() + noise)
    Kmx = K(mc, Xall).to_dense()
    var = K(mc).to_dense().diagonal() - (Kmx @ Kinv @ Kmx.T).diagonal()
    assert float(val) == pytest.approx(-float(var.mean() * sd2), rel=1e-8)
    assert math.isfinite(float(val))


def test_conditioning_a_conditioned_model_and_updating_it_match_in_place_updates():
    _, ours, _, _ = _pair()
    X1, Y1 = _data(2, seed=21)
    X2, Y2 = _data(3, seed=22)
    X3, Y3 = _data(1, seed=23)
    chained = ours.condition_on_observations(X1, Y1).condition_on_observations(X2, Y2)
    chained.update(X3, Y3)
    for X, Y in ((X1, Y1), (X2, Y2), (X3, Y3)):
        ours.update(X, Y)
    Xt = torch.rand(6, 3, dtype=DT)
    a, b = chained.posterior(Xt), ours.posterior(Xt)
    assert _close(a.mean, b.mean) and _close(a.covariance_matrix, b.covariance_matrix)
    assert chained.tail_S is None and chained.chol.shape == (36, 36)


def test_update_keeps_no_autograd_graph_in_caches():
    """In-place updates must not chain an autograd graph through the cached factor (it would
    keep every previous factor alive); caches built by a rebuild carry none either."""
    _, ours, _, _ = _pair()
    for seed in (31, 32):
        Xn, Yn = _data(1, seed=seed)
        ours.update(Xn, Yn)
    assert not ours.chol.requires_grad and not ours.alpha.requires_grad
    assert not ours.train_y.requires_grad and not ours.train_X.requires_grad


def test_load_state_dict_leaves_conditioned_models_intact():
    """A conditioned model shares its parent's buffers; loading a state into the parent must not
    change it."""
    _, ours, _, _ = _pair()
    Xn, Yn = _data(2, seed=41)
    child = ours.condition_on_observations(Xn, Yn)
    Xt = torch.rand(5, 3, dtype=DT)
    before = child.posterior(Xt)
    other = OnlineExactGP(*_data(30, seed=42))
    _set_hypers(other)
    ours.load_state_dict(other.state_dict())
    after = child.posterior(Xt)
    assert torch.equal(after.mean, before.mean)
    assert torch.equal(after.covariance_matrix, before.covariance_matrix)


@pytest.mark.parametrize("x_batch", [(), (2,)])
def test_fixed_noise_fantasy_posterior_with_observation_noise(x_batch):
    """observation_noise=True on a fixed-noise fantasy model (batch 8 x 2) at X with or without
    the model's batch dims: BoTorch's mean training noise per batch, as SingleTaskGP."""
    ref, ours, _, _ = _pair(fixed_noise=True)
    Xf = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(4), dtype=DT)
    f_ref = ref.fantasize(Xf, SobolQMCNormalSampler(torch.Size([8]), seed=7))
    f_ours = ours.fantasize(Xf, SobolQMCNormalSampler(torch.Size([8]), seed=7))
    Xt = torch.rand(*x_batch, 5, 3, generator=torch.Generator().manual_seed(6), dtype=DT)
    a, b = f_ours.posterior(Xt, observation_noise=True), f_ref.posterior(Xt, observation_noise=True)
    assert _close(a.mean, b.mean)
    assert _close(a.covariance_matrix, b.covariance_matrix)


def test_fixed_noise_marginal_likelihood_matches_gpytorch():
    """With fixed noise the (unused) likelihood's noise prior must not enter the MLL."""
    ref, ours, _, _ = _pair(fixed_noise=True)
    ref_mll = ExactMarginalLogLikelihood(ref.likelihood, ref)
    ref.train()
    target = ref_mll(ref(*ref.train_inputs), ref.train_targets)
    ref.eval()
    assert _close(ours.marginal_log_likelihood(), target, tol=1e-10)


def test_fantasy_posterior_at_shared_points_reads_the_parent_factor_once():
    r"""qNIPV's posterior of a fantasy model (b candidate points, s fantasies each) at integration
    points shared by every batch element reads the parent's n x n factor once: it forms no
    ``b x n x q`` block (before: 3.5 GB and 74 s per evaluation at n = 1,000, b = 512, 128
    points), and equals the posterior at the same points given to each element."""
    from memory_profile import peak_allocated_bytes

    n, b, q = 600, 64, 32
    model = OnlineExactGP(*_data(n=n))
    _set_hypers(model)
    g = torch.Generator().manual_seed(5)
    sampler = SobolQMCNormalSampler(torch.Size([4]), seed=0)
    fantasy = model.fantasize(torch.rand(b, 1, 3, generator=g, dtype=DT), sampler)
    Xs = torch.rand(q, 3, generator=g, dtype=DT)
    fantasy.posterior(Xs[:2]).variance  # caches built outside the measurement
    out = []

    def shared():
        with torch.no_grad():
            p = fantasy.posterior(Xs)
            out.append((p.mean, p.variance))

    peak = peak_allocated_bytes(shared)
    mean, var = out[0]
    each = fantasy.posterior(Xs.expand(b, q, 3))  # every element's own points
    torch.testing.assert_close(mean, each.mean, atol=1e-10, rtol=0)
    torch.testing.assert_close(var, each.variance, atol=1e-10, rtol=0)
    block = b * n * q * 8  # one b x n x q float64 block (9.8 MB)
    assert peak < block / 4, (peak, block)


def test_fantasy_posterior_at_points_of_each_fantasy_reads_the_parent_points_once():
    r"""qKG's posterior of a fantasy model (``s x b`` batch) at points of every fantasy's own
    (``s x b x 1 x d``): the kernel against the training inputs was evaluated against each
    batch element's copy of them, broadcast over the samples (``s x b x n x d`` differences and
    ``s x b x n x (d + 2)`` augmented inputs: 1.3 GB peak at n = 2,000, b = 512, 8 fantasies,
    d = 6). It is now one folded kernel against the parent's points plus the new rows; the
    values equal a dense GP on the data and each fantasy's observations."""
    from memory_profile import peak_allocated_bytes

    n, b, s, q, d = 400, 32, 8, 2, 3
    model = OnlineExactGP(*_data(n=n))
    _set_hypers(model)
    g = torch.Generator().manual_seed(6)
    Xc = torch.rand(b, q, d, generator=g, dtype=DT)
    sampler = SobolQMCNormalSampler(torch.Size([s]), seed=0)
    with torch.no_grad():
        Yf = SobolQMCNormalSampler(torch.Size([s]), seed=0)(
            model.posterior(Xc, observation_noise=True)
        )
        fantasy = model.fantasize(Xc, sampler)
    Xa = torch.rand(s, b, 1, d, generator=g, dtype=DT)
    fantasy.posterior(Xa[:1, :1]).variance  # caches built outside the measurement
    out = []

    def each():
        with torch.no_grad():
            p = fantasy.posterior(Xa)
            out.append((p.mean, p.variance))

    peak = peak_allocated_bytes(each)
    mean, var = out[0]
    assert mean.shape == var.shape == (s, b, 1, 1)
    block = s * b * n * d * 8  # the training inputs broadcast over s x b (2.5 MB)
    assert peak < block, (peak, block)
    # dense reference: the GP on the data plus each fantasy's points, standardised units
    K, X = model.covar_module, model.train_X
    c, noise = model.mean_module.constant.detach(), model.likelihood.noise.detach()
    y = (_data(n=n)[1].squeeze(-1) - model.outcome_mean) / model.outcome_std
    with torch.no_grad():
        for i, j in ((0, 0), (s - 1, b - 1), (3, 17)):
            Xall = torch.cat([X[:n], Xc[j]])
            yall = torch.cat([y, (Yf[i, j].squeeze(-1) - model.outcome_mean) / model.outcome_std])
            Kall = K(Xall).to_dense() + noise * torch.eye(n + q, dtype=DT)
            Kx = K(Xa[i, j], Xall).to_dense()
            m_ref = c + Kx @ torch.linalg.solve(Kall, yall - c)
            v_ref = (
                K(Xa[i, j]).to_dense().diagonal() - (Kx @ torch.linalg.solve(Kall, Kx.T)).diagonal()
            )
            std = model.outcome_std.reshape(())
            assert _close(mean[i, j].squeeze(-1), m_ref * std + model.outcome_mean, tol=1e-9)
            assert _close(var[i, j].squeeze(-1), v_ref * std**2, tol=1e-9)
