"""BoTorch's pathwise sampling (``draw_matheron_paths``, ``get_optimal_samples``,
``PathwiseThompsonSampling``) with bo_online's surrogates.

Checked against independent computations: the exact GP's paths against BoTorch's own paths of a
``SingleTaskGP`` with the same data and hyperparameters drawn with the same seed; every path
family's mean and covariance against the model's posterior and against the covariance of the
drawn random-feature prior updated by hand (dense linear algebra from the model's kernel), within
Monte-Carlo tolerances of ``Z_TOL`` standard errors for ``N_PATHS`` paths.
"""

import functools

import pytest
import torch
from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
from botorch.acquisition.utils import get_optimal_samples
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from botorch.sampling.pathwise import (
    draw_kernel_feature_paths,
    draw_matheron_paths,
    get_matheron_path_model,
)
from torch.quasirandom import SobolEngine

from bo_online.models import QSGP, TSVGP, WISKI, DecoupledSVGP, OnlineExactGP
from bo_online.models.singletask import RefitSingleTaskGP

DT = torch.float64
N_PATHS = 2000
#: random Fourier features of the prior: enough that the paths' covariance is close to the
#: model's (checked exactly against the features' own covariance, see _feature_covariance)
N_FEATURES = 4096
#: Monte-Carlo tolerance in standard errors: the sample mean's sqrt(C_ii / N) and the sample
#: covariance's sqrt((C_ii C_jj + C_ij^2) / (N - 1)) (normal theory)
Z_TOL = 4.0


def _data(n: int = 30, d: int = 2, seed: int = 0, dtype: torch.dtype = DT):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=dtype)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g, dtype=dtype)
    return X, Y


def _test_points(q: int = 5, d: int = 2, dtype: torch.dtype = DT):
    return torch.rand(q, d, generator=torch.Generator().manual_seed(7), dtype=dtype)


def _set_hypers(model, lengthscale=(0.3, 0.5), noise=0.05, constant=0.2):
    model.covar_module.lengthscale = torch.tensor(lengthscale, dtype=DT)
    model.mean_module.constant = torch.tensor(constant, dtype=DT)
    if type(model.likelihood).__name__ == "GaussianLikelihood":
        model.likelihood.noise = torch.tensor([noise], dtype=DT)


def _prior_sampler(num_features: int = N_FEATURES):
    r"""BoTorch's prior sampler with ``num_features`` features and i.i.d. normal weights (by
    default it takes them from a scrambled Sobol sequence, whose sample covariance in thousands
    of dimensions from fewer draws is not the i.i.d. one that the tolerances assume)."""
    return functools.partial(
        draw_kernel_feature_paths, num_features=num_features, weight_generator=torch.randn
    )


def _draw(model, n: int = N_PATHS, num_features: int = N_FEATURES):
    return draw_matheron_paths(model, torch.Size([n]), prior_sampler=_prior_sampler(num_features))


# ------------------------------------------------------------------ exact GP against BoTorch


def _exact_pair(case: str, dtype: torch.dtype = DT):
    r"""``(SingleTaskGP, OnlineExactGP, units)`` with the same data, hyperparameters and
    transforms; ``units`` maps the reference's paths to the user's units."""
    X, Y = _data(dtype=dtype)
    Yvar = 0.01 + 0.05 * torch.rand(30, 1, generator=torch.Generator().manual_seed(5), dtype=DT)
    Yvar = Yvar.to(dtype) if case == "fixed_noise" else None
    kw = {}
    if case == "input_transform":  # inputs on [0, 4] x [-1, 1], normalised by the model
        X = X * torch.tensor([4.0, 2.0], dtype=dtype) - torch.tensor([0.0, 1.0], dtype=dtype)
        bounds = torch.tensor([[0.0, -1.0], [4.0, 1.0]], dtype=dtype)
        kw = dict(input_transform=Normalize(d=2, bounds=bounds))
    if case == "conditioned":
        # the last 10 points added by condition_on_observations, against a SingleTaskGP on all
        # 30 with the parent's outcome scaling (targets scaled by hand, no outcome transform)
        ours = OnlineExactGP(X[:20], Y[:20])
        mean, std = ours.outcome_mean, ours.outcome_std
        ref = SingleTaskGP(X, (Y - mean) / std, outcome_transform=None)
        units = lambda values: values * std + mean  # noqa: E731
        for m in (ours, ref):
            _set_hypers(m)
        ours = ours.condition_on_observations(X[20:], Y[20:])
    else:
        ours = OnlineExactGP(X, Y, train_Yvar=Yvar, **kw)
        ref = SingleTaskGP(X, Y, train_Yvar=Yvar, **kw)
        units = lambda values: values  # noqa: E731
        for m in (ours, ref):
            _set_hypers(m)
    ours.to(dtype)
    ref.to(dtype)
    ref.eval()
    return ref, ours, units


@pytest.mark.parametrize(
    "case", ["inferred_noise", "fixed_noise", "input_transform", "conditioned"]
)
def test_exact_paths_equal_singletaskgp_paths(case):
    r"""With the same seed, OnlineExactGP's paths are BoTorch's paths of a SingleTaskGP with the
    same data, hyperparameters, noise, input transform and outcome standardisation, at ``q x d``
    inputs and at batches that broadcast against the sample shape (``4 x q x d``, ``3 x 1 x q x
    d``) as BoTorch's do."""
    ref, ours, units = _exact_pair(case)
    X = _test_points() * (4.0 if case == "input_transform" else 1.0)
    inputs = [X, torch.rand(4, 6, 2, dtype=DT), torch.rand(3, 1, 6, 2, dtype=DT)]
    values = {}
    for name, model in (("ref", ref), ("ours", ours)):
        torch.manual_seed(1)
        paths = draw_matheron_paths(model, torch.Size([4]))
        with torch.no_grad():
            values[name] = [paths(x) for x in inputs]
    values["ref"] = [units(v) for v in values["ref"]]
    for a, b in zip(values["ours"], values["ref"]):
        assert a.shape == b.shape
        assert torch.allclose(a, b, rtol=1e-7, atol=1e-7)
    assert values["ours"][2].shape == (3, 4, 6)


def test_exact_paths_float32_equal_singletaskgp_paths():
    r"""A float32 model's paths are float32 and BoTorch's float32 SingleTaskGP paths (same seed)
    within float32 accuracy."""
    ref, ours, _ = _exact_pair("inferred_noise", dtype=torch.float32)
    values = []
    for model in (ref, ours):
        torch.manual_seed(1)
        with torch.no_grad():
            paths = draw_matheron_paths(model, torch.Size([4]))
            values.append(paths(_test_points(dtype=torch.float32)))
    assert values[1].dtype == torch.float32
    assert torch.allclose(values[1], values[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["exact", "tsvgp", "decoupled"])
def test_prior_paths_in_user_units(name):
    r"""``draw_kernel_feature_paths(model)`` alone: prior draws in the user's units, mean
    ``outcome_mean + outcome_std c`` and covariance ``outcome_std^2 k`` within the Monte-Carlo
    tolerance and the features' kernel (exactly ``Phi Phi^T`` of the drawn features)."""
    X, Y = _data()
    # inputs on [1, 2]^2, normalised by the model; outcomes scaled
    bounds = torch.tensor([[1.0, 1.0], [2.0, 2.0]], dtype=DT)
    model = _MODELS[name](X + 1.0, 3.0 * Y + 5.0, input_transform=Normalize(d=2, bounds=bounds))
    Xq = _test_points() + 1.0
    paths = _prior_sampler()(model, torch.Size([N_PATHS]))
    with torch.no_grad():
        values = paths(Xq)  # N x q
        std, c = model.outcome_std, model.mean_module.constant
        Phi = paths.feature_map(model.transform_inputs(Xq))
        C = std.pow(2) * (Phi @ Phi.mT)
        K = std.pow(2) * model.covar_module(model.transform_inputs(Xq)).to_dense()
    # sin^2 + cos^2 = 1: the features' variance is the kernel's exactly
    assert torch.allclose(C.diagonal(), K.diagonal(), rtol=1e-10)
    d = C.diagonal()
    se_mean = (d / N_PATHS).sqrt()
    assert ((values.mean(0) - (model.outcome_mean + std * c)).abs() <= Z_TOL * se_mean).all()
    se_cov = ((d.unsqueeze(-1) * d.unsqueeze(-2) + C.pow(2)) / (N_PATHS - 1)).sqrt()
    assert ((torch.cov(values.T) - C).abs() <= Z_TOL * se_cov).all()


# ------------------------------------------------------------------ moments by hand


def _feature_covariance(Phi_x, Phi_P, K_xP, K_xx, K_PP, M, R):
    r"""Covariance at ``x`` of paths ``f(x) + k(x, P) (M (t - f(P)) + r)``, ``r ~ N(0, R)``,
    with the prior ``f`` of kernel ``kF = Phi Phi^T`` (``Phi=None``: the exact kernel, giving the
    model's posterior), in standardised units."""
    if Phi_x is None:
        kF_xx, kF_xP, kF_PP = K_xx, K_xP, K_PP
    else:
        kF_xx, kF_xP = Phi_x @ Phi_x.mT, Phi_x @ Phi_P.mT
        kF_PP = Phi_P @ Phi_P.mT
    G = K_xP @ M
    return kF_xx - kF_xP @ G.mT - G @ kF_xP.mT + G @ kF_PP @ G.mT + K_xP @ R @ K_xP.mT


def _update_by_hand(model, jittered_bases=0):
    r"""``(P, M, R)`` of the model's pathwise update, from its kernel and state by hand.
    ``jittered_bases``: the decoupled SVGP's first bases whose ``K_beta`` carries its fold mode's
    1e-8 jitter in ``H``."""
    k = lambda A, B: model.covar_module(A, B).to_dense()  # noqa: E731
    if isinstance(model, OnlineExactGP):
        P = model.train_X
        if model.fixed_noise:
            noise = model.train_noise
        else:
            noise = model.likelihood.noise.squeeze(-1).expand(P.shape[:-1])
        M = torch.linalg.inv(k(P, P) + torch.diag_embed(noise))  # (K + N)^-1
        return P, M, M @ torch.diag_embed(noise) @ M
    if isinstance(model, TSVGP):
        P = model.inducing_points.detach()
        _, S_u = model.q_u()
        M = torch.linalg.inv(k(P, P))  # K_ZZ^-1
        return P, M, M @ S_u @ M
    # H = I + L^T (K_beta + J) L with J the fold mode's 1e-8 jitter (L there is K_j^-1
    # chol(P~), ~cond(K_beta) times larger than chol(P~): the jitter counts); the paths'
    # pseudo-observations L^T (f(beta) + d) + e, d ~ N(0, J), e ~ N(0, I), have covariance H
    P, L = model.beta_points, model.L
    J = torch.zeros(P.shape[-2], dtype=P.dtype)
    J[:jittered_bases] = 1e-8
    eye = torch.eye(L.shape[-1], dtype=L.dtype)
    H = eye + L.mT @ (k(P, P) + torch.diag(J)) @ L
    LHinv = L @ torch.linalg.inv(H)
    return P, LHinv @ L.mT, LHinv @ (L.mT @ torch.diag(J) @ L + eye) @ LHinv.mT


def _check_moments(model, paths, X, n_paths=N_PATHS, jittered_bases=0):
    r"""Sample mean and covariance of the paths at ``X`` (``q x d``) against the posterior's mean
    and the drawn features' covariance, within ``Z_TOL`` standard errors; the covariance formula
    itself against the posterior with the exact kernel (to rounding). ``m > 1`` outputs are a
    batch dim (``m x q``), as the paths and the kernel hold them."""
    m = model.num_outputs
    with torch.no_grad():
        Xt = model.transform_inputs(X)
        if m > 1:  # per output, as BoTorch's paths of a batched multi-output model
            X, Xt = X.unsqueeze(-3), Xt.unsqueeze(-3)
        values = paths(X)  # N x batch x (m x) q
        post_mean = torch.stack(
            [model.posterior(X, output_indices=[j]).mean.squeeze(-1) for j in range(m)], dim=-2
        )
        C_post = torch.stack(
            [model.posterior(X, output_indices=[j]).covariance_matrix for j in range(m)], dim=-3
        )
        if m == 1:
            post_mean, C_post = post_mean.squeeze(-2), C_post.squeeze(-3)
        P, M, R = _update_by_hand(model, jittered_bases)
        K = lambda A, B: model.covar_module(A, B).to_dense()  # noqa: E731
        feature_map = paths["prior_paths"].feature_map
        var = model.outcome_std.pow(2).reshape(-1, 1, 1).squeeze(0)
        exact = var * _feature_covariance(None, None, K(Xt, P), K(Xt, Xt), K(P, P), M, R)
        assert torch.allclose(exact, C_post, rtol=1e-8, atol=1e-10)
        C = var * _feature_covariance(
            feature_map(Xt), feature_map(P), K(Xt, P), K(Xt, Xt), K(P, P), M, R
        )
    mean = values.mean(0)
    centred = values - mean
    cov = centred.unsqueeze(-1).mul(centred.unsqueeze(-2)).sum(0) / (n_paths - 1)
    d = C.diagonal(dim1=-2, dim2=-1)
    se_mean = (d / n_paths).sqrt()
    se_cov = ((d.unsqueeze(-1) * d.unsqueeze(-2) + C.pow(2)) / (n_paths - 1)).sqrt()
    assert ((mean - post_mean).abs() <= Z_TOL * se_mean).all()
    assert ((cov - C).abs() <= Z_TOL * se_cov).all()


def _exact(case):
    X, Y = _data()
    if case == "fixed_noise":
        return OnlineExactGP(X, Y, train_Yvar=torch.full_like(Y, 0.02))
    if case == "conditioned":
        return OnlineExactGP(X[:20], Y[:20]).condition_on_observations(X[20:], Y[20:])
    return OnlineExactGP(X, Y)


def _tsvgp(case):
    X, Y = _data()
    model = TSVGP(X, Y, inducing_points=10)
    if case == "conditioned":  # pending low-rank sites on the parent's factor
        model = TSVGP(X[:20], Y[:20], inducing_points=10)
        model = model.condition_on_observations(X[20:], Y[20:])
    return model


def _decoupled(case):
    X, Y = _data()
    if case == "bases_are_data":
        return DecoupledSVGP(X, Y)
    model = DecoupledSVGP(X, Y, num_cov_bases=8, num_mean_bases=16)
    assert model._in_fold_mode()
    if case == "conditioned":  # a bordered state on the capped bases
        model = model.condition_on_observations(*_data(n=3, seed=3))
    return model


@pytest.mark.parametrize(
    "make, case",
    [
        (_exact, "inferred_noise"),
        (_exact, "fixed_noise"),
        (_exact, "conditioned"),
        (_tsvgp, "sparse"),
        (_tsvgp, "conditioned"),
        (_decoupled, "bases_are_data"),
        (_decoupled, "fold_mode"),
        (_decoupled, "conditioned"),
    ],
)
def test_path_moments_match_posterior(make, case):
    r"""Paths of the exact GP, t-SVGP (``u ~ q(u)`` on the inducing inputs) and the decoupled
    SVGP (its mean and covariance bases) have the posterior's mean and the covariance of the
    drawn prior updated by hand, which with the exact kernel is the posterior's."""
    model = make(case)
    # the decoupled SVGP's capped bases: 8, jittered in fold mode (and in the parent block of a
    # model conditioned on it)
    jittered = 8 if case in ("fold_mode", "conditioned") and make is _decoupled else 0
    _check_moments(model, _draw(model), _test_points(), jittered_bases=jittered)


def test_exact_fantasy_model_paths():
    r"""A fantasy model's paths have its batch shape (``sample x fantasies x q``), each fantasy's
    mean and covariance as its posterior's (the update by hand per fantasy)."""
    X, Y = _data()
    model = OnlineExactGP(X, Y)
    fantasy = model.fantasize(_data(n=2, seed=2)[0], SobolQMCNormalSampler(torch.Size([3])))
    paths = _draw(fantasy)
    with torch.no_grad():
        assert paths(_test_points()).shape == (N_PATHS, 3, 5)
    _check_moments(fantasy, paths, _test_points())


def test_multi_output_tsvgp_paths():
    r"""A two-output t-SVGP: ``get_matheron_path_model`` gives ``sample x q x 2`` values; per
    output the paths have the posterior's mean and the covariance by hand, each output in its
    own units."""
    X, Y = _data()
    Y2 = torch.cat([Y, 3.0 * torch.cos(4 * X).sum(-1, keepdim=True) + 2.0], dim=-1)
    model = TSVGP(X, Y2, inducing_points=12)
    with torch.no_grad():
        assert get_matheron_path_model(model, torch.Size([4]))(_test_points()).shape == (4, 5, 2)
    _check_moments(model, _draw(model, n=1000), _test_points(), n_paths=1000)


# ------------------------------------------------------------------ QSGP


def test_qsgp_paths_are_its_sample_paths():
    r"""QSGP's paths are its own ``sample_paths`` draws (same seed), evaluated with BoTorch's
    broadcasting: path ``i`` at ``X[i]`` for ``num_paths x k x d`` inputs."""
    X, Y = _data()
    for model in (QSGP(X, Y, num_features=64), QSGP(X, Y, num_features=64, exact_max_n=10)):
        torch.manual_seed(3)
        own = model.sample_paths(4)
        torch.manual_seed(3)
        paths = draw_matheron_paths(model, torch.Size([4]))
        Xb = torch.rand(4, 6, 2, dtype=DT)
        with torch.no_grad():
            assert torch.allclose(paths(_test_points()), own(_test_points()), atol=1e-10)
            every = own(Xb)  # 4 paths x 4 batches x 6
            assert torch.allclose(paths(Xb), every[range(4), range(4)], atol=1e-10)


def test_qsgp_weight_space_path_moments():
    r"""Beyond its kernel regime QSGP's paths are exact draws of its weight posterior: their mean
    and covariance are the posterior's within the Monte-Carlo tolerance."""
    X, Y = _data()
    model = QSGP(X, Y, num_features=64, exact_max_n=10)
    assert not model.is_exact_gp_on_data()
    with torch.no_grad():
        values = draw_matheron_paths(model, torch.Size([N_PATHS]))(_test_points())
        post = model.posterior(_test_points())
    C = post.distribution.covariance_matrix
    d = C.diagonal()
    mean, cov = values.mean(0), torch.cov(values.T)
    assert ((mean - post.mean.squeeze(-1)).abs() <= Z_TOL * (d / N_PATHS).sqrt()).all()
    se_cov = ((d.unsqueeze(-1) * d.unsqueeze(-2) + C.pow(2)) / (N_PATHS - 1)).sqrt()
    assert ((cov - C).abs() <= Z_TOL * se_cov).all()


# ------------------------------------------------------------------ shapes and dtypes


_MODELS = {
    "exact": lambda X, Y, **kw: OnlineExactGP(X, Y, **kw),
    "tsvgp": lambda X, Y, **kw: TSVGP(X, Y, inducing_points=10, **kw),
    "decoupled": lambda X, Y, **kw: DecoupledSVGP(X, Y, num_cov_bases=8, num_mean_bases=16, **kw),
    "qsgp": lambda X, Y, **kw: QSGP(X, Y, num_features=64, exact_max_n=10, **kw),
}


@pytest.mark.parametrize("name", list(_MODELS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batch_inputs_and_dtype(name, dtype):
    r"""``b x 1 x q x d`` inputs give ``b x sample x q`` values, each batch the paths at its own
    points; the paths are in the model's dtype and their mean over 1,000 paths is the posterior
    mean within the Monte-Carlo tolerance."""
    X, Y = _data(dtype=dtype)
    model = _MODELS[name](X, Y)
    if name == "qsgp":  # its own features: no prior sampler to choose
        paths = draw_matheron_paths(model, torch.Size([1000]))
    else:
        paths = _draw(model, n=1000, num_features=1024)
    Xq = _test_points(dtype=dtype)
    Xb = torch.stack([Xq, Xq.flip(0), Xq * 0.5]).unsqueeze(-3)  # 3 x 1 x 5 x 2
    with torch.no_grad():
        out = paths(Xb)
        assert out.shape == (3, 1000, 5) and out.dtype == dtype
        for i in range(3):
            assert torch.allclose(out[i], paths(Xb[i, 0]), atol=1e-5 if dtype == DT else 1e-3)
        post = model.posterior(Xq)
    se = (out[0].var(0) / 1000).sqrt()
    assert ((out[0].mean(0) - post.mean.squeeze(-1)).abs() <= Z_TOL * se + 1e-4).all()


def test_refit_singletaskgp_paths_are_its_models():
    r"""The refit-every-step baseline's paths are those of the SingleTaskGP it wraps (same seed);
    ``get_optimal_samples`` takes it."""
    X, Y = _data()
    model = RefitSingleTaskGP(X, Y)
    values = []
    for m in (model, model.model):
        torch.manual_seed(1)
        with torch.no_grad():
            values.append(draw_matheron_paths(m, torch.Size([4]))(_test_points()))
    assert torch.equal(values[0], values[1])
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    X_opt, _ = get_optimal_samples(model, bounds=bounds, num_optima=2, raw_samples=64)
    assert X_opt.shape == (2, 2)


def test_wiski_refused_with_what_to_use():
    X, Y = _data()
    model = WISKI(X, Y)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    for call in (
        lambda: draw_matheron_paths(model, torch.Size([2])),
        lambda: get_optimal_samples(model, bounds=bounds, num_optima=2),
        lambda: draw_kernel_feature_paths(model, torch.Size([2])),
    ):
        with pytest.raises(NotImplementedError, match="MaxPosteriorSampling"):
            call()


# ------------------------------------------------------------------ acquisitions


def _quadratic(n: int = 25):
    r"""``-|x - x*|^2`` on Sobol points of the unit square, ``x* = (0.3, 0.7)``."""
    X = SobolEngine(2, scramble=True, seed=0).draw(n).to(DT)
    x_star = torch.tensor([0.3, 0.7], dtype=DT)
    return X, -(X - x_star).pow(2).sum(-1, keepdim=True), x_star


@pytest.mark.parametrize("cls", [OnlineExactGP, TSVGP, DecoupledSVGP, QSGP])
def test_get_optimal_samples_near_the_optimum(cls):
    r"""After a fit on a quadratic, every sampled optimum is near its maximiser and value. The
    models at their defaults, as a BO loop has them after a 25-point Sobol design (t-SVGP's 128
    inducing inputs: the data points and Sobol fill points, 25 of which repeat the design's
    points, as with a loop's seed-0 design: K_ZZ singular up to its jitter)."""
    X, Y, x_star = _quadratic()
    model = cls(X, Y)
    model.fit()
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    X_opt, f_opt = get_optimal_samples(model, bounds=bounds, num_optima=8, raw_samples=256)
    assert X_opt.shape == (8, 2) and f_opt.shape == (8, 1)
    assert ((X_opt - x_star).norm(dim=-1) < 0.1).all()
    assert (f_opt.abs() < 0.05).all()  # the maximum, 0, within 5% of f's range on the square


def test_pathwise_thompson_sampling_with_optimize_acqf():
    r"""``PathwiseThompsonSampling`` through ``optimize_acqf`` with ``q = 2``: each candidate
    maximises its own path at least as well as the best of 1,024 Sobol points."""
    X, Y, _ = _quadratic()
    model = OnlineExactGP(X, Y).fit()
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    acqf = PathwiseThompsonSampling(model)
    cand, value = optimize_acqf(acqf, bounds=bounds, q=2, num_restarts=8, raw_samples=128)
    assert cand.shape == (2, 2)
    grid = SobolEngine(2, scramble=True, seed=1).draw(1024).to(DT)
    with torch.no_grad():
        per_path = acqf.samples(cand.unsqueeze(-2)).squeeze(-1).squeeze(-1)  # 2 paths, own cand
        grid_best = acqf.samples(grid).squeeze(-1).max(-1).values  # 2
    assert torch.allclose(per_path.sum(), value)
    assert (per_path >= grid_best - 1e-6).all()
