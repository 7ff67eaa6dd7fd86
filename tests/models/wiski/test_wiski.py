"""WISKI against dense SKI (W K W^T + sigma^2 D built explicitly), float64."""

from __future__ import annotations

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from wiski_reference import dense_mll, dense_posterior, dense_posterior_woodbury

from bo_online.models import WISKI

DT = torch.float64


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _data(n: int, d: int, seed: int, hetero: bool):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = (
        3
        + 2 * torch.sin(5 * X).sum(-1, keepdim=True)
        + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    )
    Yvar = (0.02 + 0.1 * torch.rand(n, 1, generator=g, dtype=DT)) if hetero else None
    return X, Y, Yvar


def _model(X, Y, Yvar, grid_size, kernel="matern"):
    d = X.shape[-1]
    if kernel == "matern":
        base = MaternKernel(nu=2.5, ard_num_dims=d)
    else:
        base = RBFKernel(ard_num_dims=d)
    covar = ScaleKernel(base)
    model = WISKI(X, Y, Yvar, grid_size=grid_size, covar_module=covar)
    covar.outputscale = 1.7
    base.lengthscale = torch.linspace(0.25, 0.4, d, dtype=DT)
    model.mean_module.constant = 0.3
    if Yvar is None:
        model.likelihood.noise = 0.07
    return model


CASES = [  # (d, grid size per dim incl. the unused outer ring, n): 10 x 10 x 10 and 30 x 30
    (3, 12, 40),  # grid points carrying weight (m = 1000, as in the issue)
    (3, 12, 700),
    (2, 32, 60),  # m = 900
    (2, 32, 1100),
    (3, 8, 300),  # m = 216 < n: the m x m form (Kronecker algebra on the whole grid for RBF)
]


@pytest.mark.parametrize("kernel", ["matern", "rbf"])  # dense algebra / Kronecker algebra
@pytest.mark.parametrize("hetero", [False, True])
@pytest.mark.parametrize("d,g,n", CASES)
def test_mll_and_gradient_match_dense_ski(d, g, n, hetero, kernel):
    X, Y, Yvar = _data(n, d, seed=n + d, hetero=hetero)
    model = _model(X, Y, Yvar, g, kernel=kernel)
    assert (model._kronecker_factors() is not None) == (kernel == "rbf")
    params = [p for _, p in model._trainable_parameters()[0].items()]
    ref = dense_mll(model, X, Y, Yvar)
    ref_grads = torch.autograd.grad(ref, params)
    ours = model.marginal_log_likelihood(include_priors=False)
    grads = torch.autograd.grad(ours, params)
    assert abs(float(ours.detach() - ref.detach())) / abs(float(ref.detach())) < 1e-8
    for p, a, b in zip(params, grads, ref_grads):
        assert _rel(a, b) < 1e-8, (p.shape, a, b)


@pytest.mark.parametrize("kernel", ["matern", "rbf"])
@pytest.mark.parametrize("hetero", [False, True])
@pytest.mark.parametrize("d,g,n", CASES)
def test_posterior_matches_dense_ski(d, g, n, hetero, kernel):
    X, Y, Yvar = _data(n, d, seed=10 * n + d, hetero=hetero)
    model = _model(X, Y, Yvar, g, kernel=kernel)
    torch.manual_seed(0)
    for N in (7, 150):  # dense covariance path and lazy operator path
        Xs = torch.rand(N, d, dtype=DT)
        post = model.posterior(Xs)
        mean_ref, cov_ref = dense_posterior(model, X, Y, Yvar, Xs)
        sd2 = model.outcome_std.reshape(()) ** 2
        assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-8
        cov = post.mvn.lazy_covariance_matrix.to_dense() / sd2
        assert _rel(cov, cov_ref) < 1e-8
        assert _rel(post.variance.squeeze(-1) / sd2, torch.diagonal(cov_ref)) < 1e-8
    if kernel == "rbf":
        # The large-n reference below serves the large-n tests, which use the Matern kernel.
        # With the RBF kernel's per-factor jitter (smallest eigenvalue of K_UU ~ jitter^d) its
        # cancellation reaches 1.7e-8 against the n x n reference on (2, 32, 1100, hetero),
        # which the model itself matches to 1e-8 above.
        return
    # the large-n reference (Woodbury on explicit W) agrees with the n x n computation
    mean_w, cov_w = dense_posterior_woodbury(model, X, Y, Yvar, Xs)
    assert _rel(mean_w, mean_ref) < 1e-8 and _rel(cov_w, cov_ref) < 1e-8


def test_batched_posterior_and_observation_noise():
    X, Y, Yvar = _data(30, 2, seed=3, hetero=False)
    model = _model(X, Y, Yvar, 12)
    Xs = torch.rand(4, 3, 2, dtype=DT)
    post = model.posterior(Xs, observation_noise=True)
    assert post.mean.shape == (4, 3, 1)
    _, cov_ref = dense_posterior(model, X, Y, Yvar, Xs[1])
    sd2 = model.outcome_std.reshape(()) ** 2
    cov = post.mvn.covariance_matrix[1] / sd2
    expected = cov_ref + model.likelihood.noise * torch.eye(3, dtype=DT)
    assert _rel(cov, expected) < 1e-8


def test_rbf_default_kernel_and_d_gt_3_error():
    X, Y, _ = _data(10, 2, seed=4, hetero=False)
    model = WISKI(X, Y)
    assert model.grid.sizes == (30, 30) and model.num_grid_points == 28 * 28
    X3, Y3, _ = _data(10, 3, seed=4, hetero=False)
    assert WISKI(X3, Y3).grid.sizes == (10, 10, 10)
    X5, Y5, _ = _data(10, 5, seed=4, hetero=False)
    with pytest.raises(ValueError, match="projection"):
        WISKI(X5, Y5)


# ---------------------------------------------------------------------- updates and conditioning


def _stats_close(a: dict, b: dict, tol: float) -> None:
    for name in a:
        assert _rel(a[name], b[name]) < tol, name


def test_chained_updates_match_scratch_and_dense_ski():
    """2,000 chained updates (batch sizes 1-6) vs statistics from scratch and dense SKI."""
    g = torch.Generator().manual_seed(7)
    X0, Y0, _ = _data(5, 2, seed=11, hetero=False)
    model = _model(X0, Y0, None, 10)
    Xs, Ys = [X0], [Y0]
    for _ in range(2000):
        q = int(torch.randint(1, 7, (1,), generator=g))
        Xn = torch.rand(q, 2, generator=g, dtype=DT)
        Yn = 3 + 2 * torch.sin(5 * Xn).sum(-1, keepdim=True)
        model.update(Xn, Yn)
        Xs.append(Xn)
        Ys.append(Yn)
    X, Y = torch.cat(Xs), torch.cat(Ys)
    scratch = WISKI(
        X, Y, grid_size=10, covar_module=model.covar_module, likelihood=model.likelihood
    )
    _stats_close(model.statistics(), scratch.statistics(), 1e-9)
    Xt = torch.rand(9, 2, generator=g, dtype=DT)
    post = model.posterior(Xt)
    # n ~ 7000: the n x n Cholesky takes ~15 s here, so the dense SKI reference applies
    # (W K W^T + N)^-1 by Woodbury on the explicit W (the literal n x n check of this chain runs
    # in benchmarks/bench_wiski.py --check-chain).
    mean_ref, cov_ref = dense_posterior_woodbury(model, X, Y, None, Xt)
    assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-7
    sd2 = model.outcome_std.reshape(()) ** 2
    assert _rel(post.mvn.covariance_matrix / sd2, cov_ref) < 1e-7


@pytest.mark.parametrize("hetero", [False, True])
def test_update_in_place_matches_dense_and_large_batches_refactor(hetero):
    X, Y, Yvar = _data(40, 3, seed=5, hetero=hetero)
    model = _model(X, Y, Yvar, 8)  # m = 216
    X2, Y2, Yvar2 = _data(100, 3, seed=6, hetero=hetero)  # 3 q >= m: refactorisation branch
    X3, Y3, Yvar3 = _data(4, 3, seed=8, hetero=hetero)  # rank-4 Cholesky update branch
    model.update(X2, Y2, Yvar2)
    model.update(X3, Y3, Yvar3)
    Xa, Ya = torch.cat([X, X2, X3]), torch.cat([Y, Y2, Y3])
    Va = None if Yvar is None else torch.cat([Yvar, Yvar2, Yvar3])
    Xt = torch.rand(6, 3, dtype=DT)
    post = model.posterior(Xt)
    mean_ref, cov_ref = dense_posterior(model, Xa, Ya, Va, Xt)
    assert _rel(post.mean.squeeze(-1), mean_ref) < 1e-9
    assert _rel(post.mvn.covariance_matrix / model.outcome_std**2, cov_ref) < 1e-9
    ref = dense_mll(model, Xa, Ya, Va)
    assert _rel(model.marginal_log_likelihood(include_priors=False), ref) < 1e-9


@pytest.mark.parametrize("hetero", [False, True])
def test_condition_on_observations_matches_dense_and_leaves_original(hetero):
    X, Y, Yvar = _data(30, 2, seed=12, hetero=hetero)
    model = _model(X, Y, Yvar, 12)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    Xn = torch.rand(3, 2, 2, dtype=DT)  # batch of 3, q = 2
    Yn = torch.randn(4, 3, 2, 1, dtype=DT) + 3  # 4 samples
    noise = None if Yvar is None else torch.full((3, 2, 1), 0.05, dtype=DT) / model.outcome_std**2
    cm = model.condition_on_observations(Xn, Yn, noise=noise)
    assert cm.batch_shape == torch.Size([4, 3])
    # chained conditioning on the conditioned model
    Xm = torch.rand(3, 1, 2, dtype=DT)
    Ym = torch.randn(4, 3, 1, 1, dtype=DT) + 3
    noise_m = None if noise is None else noise[:, :1]
    cm2 = cm.condition_on_observations(Xm, Ym, noise=noise_m)
    Xt = torch.rand(70, 2, dtype=DT)  # lazy covariance path
    p1, p2 = cm.posterior(Xt), cm2.posterior(Xt)
    sd2 = model.outcome_std.reshape(()) ** 2
    N_new = model.likelihood.noise.reshape(()).expand(2) if noise is None else noise[0].reshape(-1)
    N_m = model.likelihood.noise.reshape(()).expand(1) if noise is None else noise_m[0].reshape(-1)
    for s in (0, 3):
        for b in (0, 2):
            mean_ref, cov_ref = dense_posterior(
                model, X, Y, Yvar, Xt, extra=(Xn[b], Yn[s, b], N_new)
            )
            assert _rel(p1.mean[s, b].squeeze(-1), mean_ref) < 1e-8
            assert _rel(p1.mvn.lazy_covariance_matrix[s, b].to_dense() / sd2, cov_ref) < 1e-8
            assert _rel(p1.variance[s, b].squeeze(-1) / sd2, torch.diagonal(cov_ref)) < 1e-8
            X2 = torch.cat([Xn[b], Xm[b]])
            Y2 = torch.cat([Yn[s, b], Ym[s, b]])
            mean2, cov2 = dense_posterior(
                model, X, Y, Yvar, Xt, extra=(X2, Y2, torch.cat([N_new, N_m]))
            )
            assert _rel(p2.mean[s, b].squeeze(-1), mean2) < 1e-8
            assert _rel(p2.variance[s, b].squeeze(-1) / sd2, torch.diagonal(cov2)) < 1e-8
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k


def test_fantasize_matches_dense_and_shares_covariance():
    from botorch.sampling import SobolQMCNormalSampler

    X, Y, _ = _data(25, 2, seed=13, hetero=False)
    model = _model(X, Y, None, 12)
    Xf = torch.rand(5, 3, 2, dtype=DT)
    fm = model.fantasize(Xf, SobolQMCNormalSampler(torch.Size([6]), seed=0))
    assert fm.batch_shape == torch.Size([6, 5])
    # one factor correction per candidate batch, shared by the 6 fantasy samples
    assert fm.d_F.shape == (5, model.num_grid_points, 3) and fm.d_mean_coef.shape[:2] == (6, 5)
    Xt = torch.rand(1, 100, 2, dtype=DT)
    post = fm.posterior(Xt)
    noise = model.likelihood.noise.reshape(()).expand(3)
    sd2 = model.outcome_std.reshape(()) ** 2
    for s, b in ((0, 0), (5, 4), (2, 3)):
        Yf = fm.d_y[s, b, -3:]
        mean_ref, cov_ref = dense_posterior(model, X, Y, None, Xt[0], extra=(Xf[b], Yf, noise))
        assert _rel(post.mean[s, b].squeeze(-1), mean_ref) < 1e-8
        assert _rel(post.variance[s, b].squeeze(-1) / sd2, torch.diagonal(cov_ref)) < 1e-8
    # variances do not depend on the fantasy sample
    torch.testing.assert_close(post.variance[0], post.variance[5], rtol=1e-12, atol=0)


def test_qnipv_value_and_gradient_match_dense():
    from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance

    X, Y, _ = _data(20, 2, seed=14, hetero=False)
    model = _model(X, Y, None, 12)
    mc = torch.rand(300, 2, dtype=DT)
    acq = qNegIntegratedPosteriorVariance(model, mc_points=mc)
    Xc = torch.rand(4, 3, 2, dtype=DT, requires_grad=True)
    val = acq(Xc)
    val.sum().backward()
    sd2 = model.outcome_std.reshape(()) ** 2
    noise = model.likelihood.noise.reshape(()).expand(3)
    for b in range(4):
        _, cov_ref = dense_posterior(
            model, X, Y, None, mc, extra=(Xc[b].detach(), torch.zeros(3, 1, dtype=DT), noise)
        )
        ref = -(torch.diagonal(cov_ref) * sd2).mean()
        assert abs(float(val[b].detach()) - float(ref)) < 1e-9 * abs(float(ref))
    # gradient in the candidates against central finite differences
    eps = 1e-6
    Xd = Xc.detach().clone()
    for b, i, k in ((0, 0, 0), (2, 1, 1)):
        Xp, Xm_ = Xd.clone(), Xd.clone()
        Xp[b, i, k] += eps
        Xm_[b, i, k] -= eps
        with torch.no_grad():
            fd = (acq(Xp)[b] - acq(Xm_)[b]) / (2 * eps)
        assert abs(float(Xc.grad[b, i, k]) - float(fd)) < 1e-5 * max(1.0, abs(float(fd)))


def test_fantasize_fixed_noise_uses_mean_training_noise():
    from botorch.sampling import SobolQMCNormalSampler

    X, Y, Yvar = _data(30, 2, seed=15, hetero=True)
    model = _model(X, Y, Yvar, 12)
    Xf = torch.rand(2, 2, 2, dtype=DT)
    fm = model.fantasize(Xf, SobolQMCNormalSampler(torch.Size([3]), seed=1))
    Xt = torch.rand(1, 80, 2, dtype=DT)
    post = fm.posterior(Xt)
    sd2 = model.outcome_std.reshape(()) ** 2
    noise = (Yvar.mean() / sd2).expand(2)  # BoTorch's default: the mean training noise
    for s, b in ((0, 0), (2, 1)):
        mean_ref, cov_ref = dense_posterior(
            model, X, Y, Yvar, Xt[0], extra=(Xf[b], fm.d_y[s, b], noise)
        )
        assert _rel(post.mean[s, b].squeeze(-1), mean_ref) < 1e-8
        assert _rel(post.variance[s, b].squeeze(-1) / sd2, torch.diagonal(cov_ref)) < 1e-8


def test_add_observations_equals_updates_and_validates_first():
    X, Y, Yvar = _data(300, 2, seed=16, hetero=True)
    a = _model(X[:10], Y[:10], Yvar[:10], 12)
    b = _model(X[:10], Y[:10], Yvar[:10], 12)
    a.add_observations(X[10:], Y[10:], Yvar[10:], chunk_size=100)
    for i in range(10, 300, 29):
        b.update(X[i : i + 29], Y[i : i + 29], Yvar[i : i + 29])
    _stats_close(a.statistics(), b.statistics(), 1e-12)
    Xt = torch.rand(5, 2, dtype=DT)
    assert _rel(a.posterior(Xt).mean, b.posterior(Xt).mean) < 1e-10
    before = {k: v.clone() for k, v in a.state_dict().items()}
    bad = X[:50].clone()
    bad[37, 1] = 1.5  # one bad row deep inside the batch
    import pytest

    with pytest.raises(ValueError, match="outside"):
        a.add_observations(bad, Y[:50], Yvar[:50], chunk_size=10)
    after = a.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_condition_on_zero_points_is_the_model_itself():
    # As every other surrogate (and update() with no points): conditioning on q = 0 points,
    # batched or not, gives the same posterior instead of failing inside the grid interpolation.
    X, Y, _ = _data(30, 2, 5, False)
    model = _model(X, Y, None, 16)
    Xt = torch.rand(9, 2, generator=torch.Generator().manual_seed(1), dtype=DT)
    before = model.posterior(Xt)
    for batch in [(), (4,)]:
        child = model.condition_on_observations(
            torch.zeros(*batch, 0, 2, dtype=DT), torch.zeros(*batch, 0, 1, dtype=DT)
        )
        assert child.batch_shape == torch.Size(batch)
        post = child.posterior(Xt)
        assert torch.allclose(post.mean, before.mean.expand(post.mean.shape), atol=1e-12)
        assert torch.allclose(post.variance, before.variance.expand(post.mean.shape), atol=1e-12)


def test_float32_stream_with_offset_outcomes_matches_dense_ski():
    """Outcomes around 1e4 (spread ~1.5) streamed into a float32 model one by one: the marginal
    likelihood and the posterior mean agree with the dense SKI GP in float64 on the same
    (float32-rounded) data. The statistics held raw outcomes, so the residual ``z - beta h``
    cancelled four of float32's seven digits: the likelihood per point was -25 against 0.46 and
    the mean drifted 1.4e-2 of a standard deviation at n = 600."""
    import copy

    X, Y, _ = _data(600, 2, seed=3, hetero=False)
    X, Y = X.float(), (Y + 1e4).float()
    model = _model(X[:20], Y[:20], None, 10)
    for i in range(20, 600):
        model.update(X[i : i + 1], Y[i : i + 1])
    ref = copy.deepcopy(model).double()  # the same hyperparameters and outcome scaling
    X64, Y64 = X.double(), Y.double()
    with torch.no_grad():
        mll = float(model.marginal_log_likelihood(include_priors=False))
        assert abs(mll - float(dense_mll(ref, X64, Y64))) < 1e-3
    Xt = torch.rand(50, 2, generator=torch.Generator().manual_seed(1), dtype=DT)
    mean_ref, cov_ref = dense_posterior(ref, X64, Y64, None, Xt)
    post = model.posterior(Xt.float())
    # two float32 ulps at 1e4 (the returned mean's own resolution)
    assert float((post.mean.squeeze(-1).double() - mean_ref).abs().max()) < 2e-3
    var = post.variance.squeeze(-1).double() / float(ref.outcome_std) ** 2
    assert _rel(var, cov_ref.diagonal()) < 1e-3


def test_grid_size_given_wrongly_says_what_to_pass():
    """A string grid_size was read character by character ('big': "invalid literal for int()
    with base 10: 'b'"; '30': sizes 3 and 0), a NumPy integer or a whole float was refused with
    "object is not iterable": a string or non-whole value gets a message that says what to pass,
    and any whole number (NumPy, 0-d tensor, whole float) is taken as the int it is."""
    import numpy as np

    X = torch.rand(8, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    Y = X.sum(-1, keepdim=True)
    for bad in ("big", "30", 12.5, float("nan"), [12, "x"], [12.5, 12], object(), True):
        with pytest.raises(ValueError, match="grid_size must be a whole number or a sequence"):
            WISKI(X, Y, grid_size=bad)
    for good in (np.int64(12), 12.0, torch.tensor(12), (12, 12), [np.int32(12), 12.0]):
        model = WISKI(X, Y, grid_size=good)
        assert model.grid.sizes == (12, 12) and all(type(g) is int for g in model.grid.sizes)
        reference = WISKI(X, Y, grid_size=12)
        torch.testing.assert_close(model.posterior(X).mean, reference.posterior(X).mean)
    with pytest.raises(ValueError, match="Grid sizes must be >= 6"):  # the bound's own message
        WISKI(X, Y, grid_size=[-4, -4])


def test_grid_size_as_a_numpy_array_is_taken():
    """A NumPy array of sizes (``np.full(2, 12)``) was taken before grid sizes were checked
    (each element read as an int) and is then refused as not a sequence; a 0-d array was
    refused too, where a NumPy integer is taken. Both are taken as the sizes they hold."""
    import numpy as np

    X = torch.rand(8, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    Y = X.sum(-1, keepdim=True)
    reference = WISKI(X, Y, grid_size=12)
    for good in (np.full(2, 12), np.array(12), np.array([12.0, 12.0])):
        model = WISKI(X, Y, grid_size=good)
        assert model.grid.sizes == (12, 12) and all(type(g) is int for g in model.grid.sizes)
        torch.testing.assert_close(model.posterior(X).mean, reference.posterior(X).mean)
    bad_arrays = (np.array([12.5, 12]), np.array(["12", "12"]), np.full((2, 2), 12))
    for bad in (*bad_arrays, torch.full((2, 2), 12)):  # a 2-d tensor: a RuntimeError of .item()
        with pytest.raises(ValueError, match="grid_size must be a whole number or a sequence"):
            WISKI(X, Y, grid_size=bad)


def test_a_grid_jitter_no_factorisation_can_use_is_refused_at_construction():
    """``grid_jitter=-1.0`` was taken and failed only at the first fit with "not positive
    definite" (in Ax: after the Sobol trials); ``"x"`` failed inside ``float()``. Both are
    refused when the model is built, with what is accepted; 0 and the default pass."""
    X = torch.rand(10, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    Y = X.sum(-1, keepdim=True)
    for bad in (-1.0, float("nan"), float("inf"), "x", True):
        with pytest.raises(ValueError, match="grid_jitter must be a finite number >= 0"):
            WISKI(X, Y, grid_size=10, grid_jitter=bad)
    assert WISKI(X, Y, grid_size=10, grid_jitter=0).grid_jitter == 0.0
    assert WISKI(X, Y, grid_size=10).grid_jitter == 1e-6
