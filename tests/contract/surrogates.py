r"""The surrogates the contract suite (``tests/contract/``) checks, and their dense references.

To put a new surrogate under the contract of ``docs/contract.md``, append one
:class:`Surrogate` to :data:`SURROGATES`: a factory that builds the model on given data with fixed
hyperparameters, and a dense reference that computes the model's latent posterior from the data
by hand (no caches, statistics or update formulas of the model). Where the model legitimately
cannot satisfy a row, say so with a capability flag and its reason; the tests then check what the
model does promise instead (a row that cannot apply at all, such as fixed noise for labels, is
skipped with that reason; a known violation is a strict xfail with its reason).

Not listed, because they do not claim the contract: ``RefitSingleTaskGP`` (a BoTorch
``SingleTaskGP`` rebuilt and refit on every update: the baseline, not an ``OnlineModel``) and
``WISKIDirichletClassifier`` (a module holding one WISKI per class, not a BoTorch ``Model``).

Conventions of the dense references: ``dense(model, X, y, noise, Xt)`` takes transformed training
inputs ``X`` (``n x d``), standardised targets ``y`` (``n``) and standardised noise variances
``noise`` (``n``) under the model's current hyperparameters, and returns the latent posterior
mean (``N``) and covariance (``N x N``) at transformed test inputs ``Xt`` (``N x d``), in
standardised units. Everything is float64 and small (n <= ~40), so everything is formed densely.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from bo_online.models import QSGP, TSVGP, WISKI, DecoupledSVGP, OnlineExactGP, OnlineModel

# The fixed hyperparameters every factory sets (standardised units), so that two models built on
# different data (the parent and a rebuild on all data) are the same GP.
LENGTHSCALE = 0.3
CONSTANT = 0.1
NOISE = 0.05


def gp_posterior(
    Kxx: Tensor, Kxs: Tensor, Kss: Tensor, c: float | Tensor, y: Tensor, noise: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Dense GP posterior by hand: prior mean ``c``, covariance blocks ``Kxx`` (``n x n``),
    ``Kxs`` (``n x N``), ``Kss`` (``N x N``), per-point noise variances (``n``)."""
    L = torch.linalg.cholesky(Kxx + torch.diag(noise))
    A = torch.cholesky_solve(Kxs, L)  # (K + N)^-1 K_xs
    mean = c + A.T @ (y - c)
    return mean, Kss - Kxs.T @ A


def _kernel_dense(model: OnlineModel, X: Tensor, y: Tensor, noise: Tensor, Xt: Tensor):
    """Exact GP with the model's kernel and constant mean."""
    k = model.covar_module
    with torch.no_grad():
        c = model.mean_module.constant.reshape(())
        return gp_posterior(k(X).to_dense(), k(X, Xt).to_dense(), k(Xt).to_dense(), c, y, noise)


def _ski_dense(model: WISKI, X: Tensor, y: Tensor, noise: Tensor, Xt: Tensor):
    r"""SKI GP: kernel ``W K_UU W^T`` with the dense interpolation weights ``W`` of the grid and
    the model's jittered grid kernel (as ``tests/models/wiski/wiski_reference.py``)."""
    from models.wiski.wiski_reference import grid_kernel

    with torch.no_grad():
        W = model.grid.dense_weights(model._features(X))
        Ws = model.grid.dense_weights(model._features(Xt))
        K = grid_kernel(model)
        c = model.mean_module.constant.reshape(())
        mean, cov = gp_posterior(W @ K @ W.T, W @ K @ Ws.T, Ws @ K @ Ws.T, c, y, noise)
        if model.prior_variance == "exact":  # plus k(x, x) - w_x^T K w_x at the test points
            cov = cov + torch.diag(_ski_prior_variance(model, Xt) - ((Ws @ K) * Ws).sum(-1))
        return mean, cov


def _wiski_kernel_dense(model: WISKI, X: Tensor, y: Tensor, noise: Tensor, Xt: Tensor):
    r"""Exact GP with the kernel WISKI's grid interpolates, each component through GPyTorch's own
    kernel call (the model's exact regime writes the additive default out): ``covar_module``
    on the inputs, or the sum of the components' kernels on their groups of inputs."""

    def k(A: Tensor, B: Tensor) -> Tensor:
        if model.input_groups is None:
            return model.covar_module(A, B).to_dense()
        return sum(
            kernel(A[:, group], B[:, group]).to_dense()
            for kernel, group in zip(model.covar_module.kernels, model.input_groups)
        )

    with torch.no_grad():
        c = model.mean_module.constant.reshape(())
        return gp_posterior(k(X, X), k(X, Xt), k(Xt, Xt), c, y, noise)


def _ard_regime_dense(model: WISKI, X: Tensor, y: Tensor, noise: Tensor, Xt: Tensor):
    r"""Exact GP with WISKI's own regime kernel (``regime_kernel="ard"``: BoTorch's RBF with one
    lengthscale per input) through GPyTorch's kernel call, on the inputs scaled to the unit cube
    by the model's input box."""
    lower, upper = model.input_bounds
    k = model.regime_covar_module
    U, Ut = (X - lower) / (upper - lower), (Xt - lower) / (upper - lower)
    with torch.no_grad():
        c = model.mean_module.constant.reshape(())
        Kxx, Kxs, Kss = (k(A, B).to_dense() for A, B in ((U, U), (U, Ut), (Ut, Ut)))
        return gp_posterior(Kxx, Kxs, Kss, c, y, noise)


def _ski_prior_variance(model: WISKI, Xt: Tensor) -> Tensor:
    r"""``k(x, x)`` of the model's kernel at each test point (plus the grid jitter per
    component), evaluated at the points themselves: per component for the additive model."""
    jitter = grid_kernel_jitter(model)
    if model.input_groups is None:
        return model.covar_module(model._features(Xt), diag=True) + jitter
    return sum(
        kernel(Xt[:, group], diag=True) + jitter
        for kernel, group in zip(model.covar_module.kernels, model.input_groups)
    )


def grid_kernel_jitter(model: WISKI) -> Tensor:
    from models.wiski.wiski_reference import grid_kernel

    K = grid_kernel(model)
    raw = model.covar_module(model.grid.points()).to_dense()
    return (K - raw)[0, 0]


def _sgpr_dense(model: TSVGP, X: Tensor, y: Tensor, noise: Tensor, Xt: Tensor):
    r"""Titsias' SGPR at the model's inducing inputs Z (as ``tests/models/tsvgp/test_tsvgp.py``):
    the optimal Gaussian q(u) of a Gaussian likelihood, computed densely."""
    k = model.covar_module
    with torch.no_grad():
        Z = model.inducing_points
        c = model.mean_module.constant.reshape(())
        Kuu, Kuf = k(Z).to_dense(), k(Z, X).to_dense()
        Ksu, Kss = k(Xt, Z).to_dense(), k(Xt).to_dense()
        Sig = torch.linalg.inv(Kuu + (Kuf / noise) @ Kuf.T)
        mean = c + Ksu @ Sig @ Kuf @ ((y - c) / noise)
        cov = Kss - Ksu @ torch.linalg.solve(Kuu, Ksu.T) + Ksu @ Sig @ Ksu.T
        return mean, cov


def _features_dense(model: QSGP, X: Tensor, y: Tensor, noise: Tensor, Xt: Tensor):
    r"""Bayesian linear regression on the model's features (prior ``w ~ N(0, I)`` for an RFF
    basis): the exact GP with kernel ``Phi Phi^T`` and zero mean."""
    with torch.no_grad():
        F, Fs = model.basis.features(X), model.basis.features(Xt)
        return gp_posterior(F @ F.T, F @ Fs.T, Fs @ Fs.T, 0.0, y, noise)


def _qsgp_kernel_dense(model: QSGP, X: Tensor, y: Tensor, noise: Tensor, Xt: Tensor):
    """Exact GP with the kernel QSGP's random features approximate and its constant mean."""
    k = model.basis.kernel
    with torch.no_grad():
        c = model.mean_constant.reshape(())
        return gp_posterior(k(X).to_dense(), k(X, Xt).to_dense(), k(Xt).to_dense(), c, y, noise)


def _features_family_dense(model: QSGP, X: Tensor, y: Tensor, noise: Tensor, Xt: Tensor):
    r"""QSGP's optimal Gaussian within a restricted family, by hand (arXiv paper's Prop. 1 and its
    chevron extension): with ``A = I + Phi^T N^-1 Phi`` (prior ``w ~ N(0, I)``), the mean is
    ``A^-1 Phi^T N^-1 y``; the factor ``C`` has, for each of the first ``k`` (dense) columns ``r``,
    ``A[r:, r:]^-1 e_1 / sqrt(e_1^T A[r:, r:]^-1 e_1)`` below the diagonal, and
    ``A_rr^-1/2`` on the diagonal of the others; the covariance is ``Phi C C^T Phi^T``."""
    with torch.no_grad():
        F, Fs = model.basis.features(X), model.basis.features(Xt)
        m, k = F.shape[-1], model.num_dense
        A = torch.eye(m, dtype=F.dtype) + F.T @ (F / noise.unsqueeze(-1))
        mu = torch.linalg.solve(A, F.T @ (y / noise))
        C = torch.diag(torch.diagonal(A).rsqrt())
        for r in range(k):
            v = torch.linalg.inv(A[r:, r:])[:, 0]
            C[r:, r] = v / v[0].sqrt()
        V = Fs @ C
        return Fs @ mu, V @ V.T


def _sgpr_sites(model: TSVGP, X: Tensor, g1: Tensor, beta: Tensor, Xt: Tensor):
    r"""t-SVGP's q(f) at ``Xt`` from Gaussian sites ``exp(g1 h - beta h^2 / 2)`` (``h = f - c``) on
    ``X``: SGPR with pseudo-targets ``c + g1 / beta`` and noise ``1 / beta``, densely."""
    k = model.covar_module
    Z = model.inducing_points.detach()
    c = model.mean_module.constant.detach().reshape(())
    Kuu, Kuf = k(Z).to_dense(), k(Z, X).to_dense()
    Ksu, Kss = k(Xt, Z).to_dense(), k(Xt).to_dense()
    Sig = torch.linalg.inv(Kuu + (Kuf * beta) @ Kuf.T)
    mean = c + Ksu @ Sig @ Kuf @ g1
    return mean, Kss - Ksu @ torch.linalg.solve(Kuu, Ksu.T) + Ksu @ Sig @ Ksu.T


def _probit_site(y: Tensor, mean: Tensor, var: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    r"""The t-SVGP site of a probit-Bernoulli label ``y`` at the marginal ``N(mean, var)``, by
    hand: ``alpha = E[d log Phi(s f) / df]``, ``beta = -E[d^2 log Phi(s f) / df^2]``
    (``s = 2y - 1``;
    with ``r = phi(s f) / Phi(s f)`` the derivatives are ``s r`` and ``-r (s f + r)``), integrated
    by the trapezoid rule on 4001 points over +-12 sd (exponentially accurate for these smooth
    integrands; the model uses Gauss-Hermite quadrature), and ``g1 = beta (mean - c) + alpha``."""
    sgn = 2 * y - 1
    t = torch.linspace(-12.0, 12.0, 4001, dtype=mean.dtype)
    f = mean.unsqueeze(-1) + var.clamp_min(0).sqrt().unsqueeze(-1) * t  # n x 4001
    w = torch.exp(-0.5 * t**2) / math.sqrt(2 * math.pi)
    z = sgn.unsqueeze(-1) * f
    r = torch.exp(-0.5 * z**2 - 0.5 * math.log(2 * math.pi) - torch.special.log_ndtr(z))
    alpha = torch.trapezoid(sgn.unsqueeze(-1) * r * w, t, dim=-1)
    beta = torch.trapezoid(r * (z + r) * w, t, dim=-1)
    return beta * (mean - c) + alpha, beta


def _bernoulli_sites(model: TSVGP, X: Tensor, y: Tensor, batches=()):
    r"""Sites of the initial data after ``BERNOULLI_E_STEPS`` full E-steps (rho = 1) from the
    prior, then one site step per conditioning batch at the marginal of everything before it."""
    c = model.mean_module.constant.detach().reshape(())
    g1, beta = torch.zeros_like(y), torch.zeros_like(y)
    for _ in range(BERNOULLI_E_STEPS):
        mean, cov = _sgpr_sites(model, X, g1, beta, X)
        g1, beta = _probit_site(y, mean, cov.diagonal(), c)
    for Xb, yb in batches:
        mean, cov = _sgpr_sites(model, X, g1, beta, Xb)
        g1b, betab = _probit_site(yb, mean, cov.diagonal(), c)
        X, g1, beta = torch.cat([X, Xb]), torch.cat([g1, g1b]), torch.cat([beta, betab])
    return X, g1, beta


def _bernoulli_dense(model: TSVGP, X: Tensor, y: Tensor, noise: Tensor, Xt: Tensor):
    """Probit t-SVGP on labels ``y``: E-steps by hand, then the posterior from the sites."""
    with torch.no_grad():
        X, g1, beta = _bernoulli_sites(model, X, y)
        return _sgpr_sites(model, X, g1, beta, Xt)


def _bernoulli_conditioned(model: TSVGP, X, y, noise, batches, Xt):
    r"""Online t-SVGP conditioning: each batch adds its sites at the current marginal (one step,
    ``condition_steps = 0``), the earlier sites unchanged."""
    with torch.no_grad():
        X, g1, beta = _bernoulli_sites(model, X, y, [(Xb, yb) for Xb, yb, _ in batches])
        return _sgpr_sites(model, X, g1, beta, Xt)


def _probit_label_variance(model: TSVGP, f: Tensor) -> Tensor:
    r"""``Var[y | f] = p (1 - p)``, ``p = Phi(f)``: what ``observation_noise=True`` adds for labels
    (at the latent mean ``f``)."""
    p = torch.distributions.Normal(0.0, 1.0).cdf(f)
    return p * (1 - p)


def _bernoulli_fantasy_Y(model: TSVGP, X: Tensor, sampler) -> Tensor:
    r"""The labels ``fantasize`` draws: latent samples ``f`` from the sampler, then ``y = 1[u <
    Phi(f)]`` with uniforms from a generator seeded by the sampler's seed."""
    with torch.no_grad():
        F = sampler(model.posterior(X))
    gen = torch.Generator().manual_seed(int(sampler.seed))
    U = torch.rand(F.shape, generator=gen, dtype=F.dtype)
    return (U < torch.distributions.Normal(0.0, 1.0).cdf(F)).to(F)


def _decoupled_state_dense(model: DecoupledSVGP, X: Tensor, y: Tensor, noise: Tensor, Xt: Tensor):
    r"""The decoupled predictive of the model's variational state, by hand (the data enter only
    through that state): mean ``c + K_{x,beta} a_beta + K_{x,alpha} a_alpha``, covariance
    ``K_xx - K_{x,beta} (B^-1 + K_beta)^-1 K_{beta,x}`` with ``B = L L^T``, inverted densely."""
    k = model.covar_module
    with torch.no_grad():
        beta, L = model.beta_points, model.L
        mean = model.mean_module.constant.reshape(()) + k(Xt, beta).to_dense() @ model.a_beta
        if model.alpha_points.shape[-2] > 0:
            mean = mean + k(Xt, model.alpha_points).to_dense() @ model.a_alpha
        K_sb = k(Xt, beta).to_dense()
        inner = torch.linalg.inv(torch.linalg.inv(L @ L.T) + k(beta).to_dense())
        return mean, k(Xt).to_dense() - K_sb @ inner @ K_sb.T


def _likelihood_noise(model: OnlineModel) -> Tensor:
    """The homoscedastic noise variance (standardised units) as a scalar tensor."""
    lik = getattr(model.likelihood, "gaussian", model.likelihood)
    if not hasattr(lik, "noise"):  # a likelihood without a noise variance (Bernoulli)
        return torch.tensor(float("nan"), dtype=model.outcome_mean.dtype)
    return lik.noise.detach().reshape(())


def _set_common(model: OnlineModel) -> None:
    """Lengthscale, constant mean and (inferred) noise of the kernel/mean/likelihood modules."""
    with torch.no_grad():
        kernel = model.covar_module if hasattr(model, "covar_module") else model.basis.kernel
        for part in getattr(kernel, "kernels", [kernel]):  # WISKI d > 3: one kernel per grid
            base = getattr(part, "base_kernel", part)
            base.lengthscale = torch.full_like(base.lengthscale, LENGTHSCALE)
        if hasattr(model, "mean_module"):
            model.mean_module.constant.fill_(CONSTANT)
        lik = getattr(model.likelihood, "gaussian", model.likelihood)
        if not model.fixed_noise and hasattr(lik, "noise"):
            lik.noise = torch.full_like(lik.noise, NOISE)


def _make_exact(X, Y, Yvar=None, *, template=None, **kw) -> OnlineExactGP:
    model = OnlineExactGP(X, Y, Yvar, **kw)
    _set_common(model)
    return model


def _make_wiski(X, Y, Yvar=None, *, template=None, **kw) -> WISKI:
    # 9 points per dimension (about 4 carry weight inside the unit cube): small m keeps the
    # dense reference and every O(m^3) rebuild cheap; the grid's accuracy is not under test.
    # d > 3: the loops' default (every pair of inputs, exact prior variance); a rebuild reuses
    # the parent's structure (its groups, any learned map, its prior variance).
    if template is not None and hasattr(template, "projection"):
        kw.setdefault("projection", copy.deepcopy(template.projection))
    if template is not None:
        kw.setdefault("prior_variance", template.prior_variance)
    if template is not None and getattr(template, "input_groups", None) is not None:
        kw.setdefault("additive", template.input_groups)  # the parent's additive structure
    elif "input_transform" not in kw:
        kw = {**WISKI.loop_default_options(X.shape[-1]), **kw}
    kw["exact_max_n"] = 0  # SKI from the first point (the exact regime has its own row)
    model = WISKI(X, Y, Yvar, **{**kw, "grid_size": 9})
    _set_common(model)
    return model


def _make_wiski_exact_regime(X, Y, Yvar=None, *, template=None, **kw) -> WISKI:
    # exact_max_n above every size the suite uses: the exact GP of WISKI's kernel throughout;
    # d > 3: the loops' all-pairs additive model (a rebuild reuses the parent's groups)
    if template is not None and getattr(template, "input_groups", None) is not None:
        kw.setdefault("additive", template.input_groups)
        kw.setdefault("prior_variance", template.prior_variance)
    elif "input_transform" not in kw:
        kw = {**WISKI.loop_default_options(X.shape[-1]), **kw}
    model = WISKI(X, Y, Yvar, **{**kw, "grid_size": 9, "exact_max_n": 100_000})
    _set_common(model)
    return model


def _make_wiski_ard_regime(X, Y, Yvar=None, *, template=None, **kw) -> WISKI:
    # the exact regime throughout, with its own kernel (BoTorch's ARD RBF; the loops' default
    # above 6 inputs) over the SKI structure of the loops' defaults
    model = _make_wiski_exact_regime(X, Y, Yvar, template=template, regime_kernel="ard", **kw)
    with torch.no_grad():
        ard = model.regime_covar_module
        ard.lengthscale = torch.full_like(ard.lengthscale, LENGTHSCALE)
    return model


def _make_tsvgp(X, Y, Yvar=None, *, template=None, **kw) -> TSVGP:
    # The inducing inputs are part of the model: a rebuild on all data reuses the parent's.
    Z = 8 if template is None else template.inducing_points.detach().clone()
    model = TSVGP(X, Y, Yvar, inducing_points=Z, **kw)
    _set_common(model)
    return model


#: full E-steps (rho = 1) run by the probit-Bernoulli TSVGP factory (and its dense reference)
BERNOULLI_E_STEPS = 5


def _make_tsvgp_bernoulli(X, Y, Yvar=None, *, template=None, **kw) -> TSVGP:
    from bo_online.likelihoods import Bernoulli

    Z = 8 if template is None else template.inducing_points.detach().clone()
    model = TSVGP(X, Y, Yvar, inducing_points=Z, likelihood=Bernoulli("probit"), **kw)
    _set_common(model)
    # The constructor's E-steps ran under the default hyperparameters: start again from the
    # prior under the fixed ones.
    zeros = torch.zeros_like(model.train_y)
    model.set_sites(zeros, zeros)
    for _ in range(BERNOULLI_E_STEPS):
        model.e_step(rho=1.0)
    return model


def _make_decoupled(X, Y, Yvar=None, *, template=None, **kw) -> DecoupledSVGP:
    # n <= num_cov_bases: the bases are the data and the state is the exact GP's (set again after
    # the hyperparameters change, as the variational state is not a cache).
    model = DecoupledSVGP(X, Y, Yvar, num_mean_bases=64, num_cov_bases=48, **kw)
    _set_common(model)
    with torch.no_grad():
        model._set_exact_state(model.train_X)
    return model


def _make_decoupled_sparse(X, Y, Yvar=None, *, template=None, **kw) -> DecoupledSVGP:
    # n > num_cov_bases: bases seeded from random data points with the closed-form warm start
    # (the state of every model on more than num_cov_bases points); hyperparameters set after.
    model = DecoupledSVGP(X, Y, Yvar, num_mean_bases=7, num_cov_bases=4, seed=1, **kw)
    _set_common(model)
    return model


def _make_qsgp_kernel_regime(X, Y, Yvar=None, *, template=None, **kw) -> QSGP:
    # exact_max_n above every size the suite uses: the exact GP of the kernel throughout
    model = QSGP(X, Y, Yvar, num_features=40, seed=3, exact_max_n=100_000, **kw)
    _set_common(model)
    with torch.no_grad():
        model.mean_constant.fill_(CONSTANT)
    return model


def _qsgp_factory(family: str) -> Callable[..., QSGP]:
    """QSGP on 40 random Fourier features, in the given variational family, at its optimum, in
    weight space (``exact_max_n=0``: not the exact GP of its kernel at any n)."""

    def make(X, Y, Yvar=None, *, template=None, **kw) -> QSGP:
        kw.setdefault("exact_max_n", 0)
        model = QSGP(X, Y, Yvar, num_features=40, family=family, num_dense_columns=3, seed=3, **kw)
        _set_common(model)
        with torch.no_grad():
            model.set_optimal_variational()
        return model

    return make


@dataclass(frozen=True)
class Surrogate:
    r"""One surrogate under the contract.

    Attributes:
        name: test id.
        make: ``make(X, Y, Yvar=None, *, template=None, **constructor_options)``: the model on
            ``X`` (``n x d``), ``Y`` (``n x 1``), optional fixed noise ``Yvar`` (``n x 1``), with
            the fixed hyperparameters above; deterministic. ``template``: a model whose
            structural choices (inducing inputs, ...) the new one must share (a rebuild on all
            data).
        dense: the dense reference (module docstring).
        max_dim: largest input dimension the model takes without extra options (WISKI's grid).
        fixed_noise: the model accepts ``train_Yvar`` (fixed heteroscedastic noise).
        exact_in_hyperparameters: the posterior after a hyperparameter change equals the dense
            reference with the new values (the state is statistics plus caches). False where the
            model holds a variational state that a hyperparameter change does not re-optimise
            (a refit does); the row then checks that caches are rebuilt (the posterior equals
            the one after ``invalidate_caches``).
        exact_mll: ``ExactMarginalLogLikelihood(model.likelihood, model)`` can be built (the
            likelihood is a GPyTorch ``GaussianLikelihood``); otherwise another GPyTorch
            marginal likelihood around the model dispatches ``fit_gpytorch_mll`` to ``fit``.
        lazy_covariance: the posterior covariance at many points (q = 1000) is a lazy operator,
            so ``.variance`` forms no ``q x q`` matrix (the contract's promise). False is a known
            violation: the row is an ``xfail(strict=True)`` with the reason.
        conditioning: what conditioning (and ``update``) equals. ``"rebuild"``: the model built
            on all data with the same hyperparameters and scaling, and the dense reference on all
            data. ``"posterior_as_prior"``: exact Gaussian conditioning of the model's own
            posterior (the dense reference's joint at the new and the test points, conditioned
            on the new observations by hand); a rebuild differs (the reason says why).
            Or a callable ``(model, X, y, noise, batches, Xt) -> (mean, cov)`` (standardised
            units; ``batches``: ``[(Xb, yb, noise_b), ...]`` conditioned on in turn): the
            surrogate's own dense reference for conditioning.
        explicit_noise_when_inferred: ``update(X, Y, noise)`` takes per-point noise on a model
            that infers its noise (False: it refuses with a ValueError, state unchanged).
        chain_equals_batch: conditioning on two batches in turn equals conditioning once on
            both (False: each is checked against its own reference).
        fantasy_covariance_independent_of_Y: as the contract says for Gaussian likelihoods.
        outcomes: maps the suite's real-valued data to the model's outcomes (labels, counts).
        observation_noise_at: ``(model, f) -> variance`` (standardised) that
            ``observation_noise=True`` adds at the latent mean ``f``; None: the likelihood's noise
            (or the mean training noise of a fixed-noise model).
        fantasy_Y: ``(model, X, sampler) -> Y`` (user units), the observations ``fantasize``
            draws; None: BoTorch's Gaussian samples of the posterior with observation noise.
        reasons: why a capability is False (shown in the tests' skip/xfail messages).
        tol: tolerance of the comparisons with the dense reference (float64).
    """

    name: str
    make: Callable[..., OnlineModel]
    dense: Callable[[Any, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
    max_dim: int = 8
    fixed_noise: bool = True
    exact_in_hyperparameters: bool = True
    exact_mll: bool = True
    lazy_covariance: bool = True
    conditioning: str | Callable[..., tuple[Tensor, Tensor]] = "rebuild"
    explicit_noise_when_inferred: bool = True
    chain_equals_batch: bool = True
    fantasy_covariance_independent_of_Y: bool = True
    outcomes: Callable[[Tensor], Tensor] | None = None
    observation_noise_at: Callable[[Any, Tensor], Tensor] | None = None
    fantasy_Y: Callable[[Any, Tensor, Any], Tensor] | None = None
    reasons: dict[str, str] = field(default_factory=dict)
    tol: float = 1e-8

    def data(self, n: int, d: int, seed: int, dtype: torch.dtype = torch.float64, fixed=False):
        """The suite's data (see :func:`data`) with outcomes the model takes."""
        X, Y, Yvar = data(n, d, seed, dtype, fixed)
        return X, (Y if self.outcomes is None else self.outcomes(Y)), Yvar

    def noise_of(self, model: OnlineModel) -> Tensor:
        """The model's homoscedastic noise (standardised units, scalar)."""
        return _likelihood_noise(model)


#: Every surrogate the suite checks. Add a new one here (and nowhere else).
SURROGATES: list[Surrogate] = [
    Surrogate("exact", _make_exact, _kernel_dense),
    Surrogate("wiski", _make_wiski, _ski_dense, max_dim=3),
    Surrogate("wiski-exact-regime", _make_wiski_exact_regime, _wiski_kernel_dense),
    Surrogate("wiski-ard-regime", _make_wiski_ard_regime, _ard_regime_dense),
    Surrogate(
        "tsvgp",
        _make_tsvgp,
        _sgpr_dense,
        exact_mll=False,
        explicit_noise_when_inferred=False,
        reasons={
            "explicit_noise_when_inferred": "per-point noise is stored only for a fixed-noise "
            "TSVGP (train_Yvar); update() refuses it otherwise",
            "exact_mll": "its likelihood is a site likelihood (Gaussian, Bernoulli, Poisson, "
            "Student-t), which GPyTorch's ExactMarginalLogLikelihood refuses",
        },
    ),
    Surrogate(
        "tsvgp-bernoulli",  # the streaming loop's classifier (models.classifiers.TSVGPClassifier)
        _make_tsvgp_bernoulli,
        _bernoulli_dense,
        fixed_noise=False,
        exact_in_hyperparameters=False,
        exact_mll=False,
        explicit_noise_when_inferred=False,
        conditioning=_bernoulli_conditioned,
        chain_equals_batch=False,
        fantasy_covariance_independent_of_Y=False,
        outcomes=lambda Y: (Y > 2.5).to(Y),
        observation_noise_at=_probit_label_variance,
        fantasy_Y=_bernoulli_fantasy_Y,
        tol=1e-7,
        reasons={
            "fixed_noise": "labels have no noise variance",
            "explicit_noise_when_inferred": "labels have no noise variance",
            "exact_in_hyperparameters": "the sites are variational parameters that a "
            "hyperparameter change keeps (the E-steps of fit move them)",
            "exact_mll": "a site likelihood, which ExactMarginalLogLikelihood refuses",
            "conditioning": "online t-SVGP: the new sites are taken at the current marginal "
            "(one step), the old ones kept; a rebuild on all data runs E-steps from the prior",
            "chain_equals_batch": "the second batch's sites are taken at the marginal that "
            "already includes the first batch's, not at the parent's",
            "fantasy_covariance_independent_of_Y": "a site precision depends on its label for a "
            "non-Gaussian likelihood, so each fantasy has its own covariance",
        },
    ),
    Surrogate(
        "decoupled",
        _make_decoupled,
        _kernel_dense,
        exact_in_hyperparameters=False,
        reasons={
            "exact_in_hyperparameters": "the variational state (a, L) is a parameter of the "
            "model, not a cache: a hyperparameter change keeps it (fit re-optimises it)",
        },
    ),
    Surrogate(
        "decoupled-sparse",
        _make_decoupled_sparse,
        _decoupled_state_dense,
        exact_in_hyperparameters=False,
        conditioning="posterior_as_prior",
        reasons={
            "conditioning": "with fewer bases than data the state is a variational "
            "approximation: conditioning is exact Gaussian conditioning of it (new bases at the "
            "new points), while a rebuild on all data seeds and warm-starts other bases",
            "exact_in_hyperparameters": "the variational state (a, L) is a parameter of the "
            "model, not a cache: a hyperparameter change keeps it (fit re-optimises it)",
        },
    ),
    Surrogate(
        "qsgp",
        _qsgp_factory("full"),
        _features_dense,
        exact_in_hyperparameters=False,
        reasons={
            "exact_in_hyperparameters": "the weight-space variational state (mean, factor) is "
            "kept when the kernel changes; only fit / set_optimal_variational re-optimise it",
        },
    ),
    Surrogate("qsgp-kernel-regime", _make_qsgp_kernel_regime, _qsgp_kernel_dense),
    *[
        Surrogate(
            f"qsgp-{family}",
            _qsgp_factory(family),
            _features_family_dense,
            exact_in_hyperparameters=False,
            conditioning="posterior_as_prior",
            reasons={
                "conditioning": f"conditioning is exact Gaussian conditioning of the fitted "
                f"{family} posterior, kept in weight space; a rebuild on all data re-optimises "
                f"the {family} family instead, which is a different Gaussian",
                "exact_in_hyperparameters": "the weight-space variational state is kept when the "
                "kernel changes; only fit / set_optimal_variational re-optimise it",
            },
        )
        for family in ("mean_field", "chevron")
    ],
]


def ids(surrogates: list[Surrogate] = SURROGATES) -> list[str]:
    return [s.name for s in surrogates]


def data(n: int, d: int, seed: int, dtype: torch.dtype = torch.float64, fixed: bool = False):
    r"""``(X, Y, Yvar)``: inputs in the unit cube, a smooth function plus noise, optional fixed
    noise variances (user units); seeded."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    Y = (
        2.0
        + 1.5 * torch.sin(5 * X).sum(-1, keepdim=True)
        + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    )
    Yvar = (0.01 + 0.04 * torch.rand(n, 1, generator=g, dtype=torch.float64)) if fixed else None
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return cast(X), cast(Y), cast(Yvar)


def standardised(model: OnlineModel, Y: Tensor, Yvar: Tensor | None) -> tuple[Tensor, Tensor]:
    r"""Targets (``n``) and noise variances (``n``) of user-unit data in the model's
    standardised units; the homoscedastic noise where ``Yvar`` is None."""
    std = model.outcome_std.reshape(())
    y = ((Y - model.outcome_mean) / std).reshape(-1)
    if Yvar is None:
        noise = _likelihood_noise(model).expand(y.shape)
    else:
        noise = Yvar.reshape(-1) / std**2
    return y, noise


def reference(s: Surrogate, model: OnlineModel, X, Y, Yvar, Xt) -> tuple[Tensor, Tensor]:
    r"""The dense latent posterior at ``Xt`` (``N x d``, untransformed) in the user's units:
    mean (``N``) and covariance (``N x N``), for data ``X, Y, Yvar`` (user units,
    untransformed) under the model's hyperparameters and scaling."""
    with torch.no_grad():
        tX, tXt = model.transform_inputs(X), model.transform_inputs(Xt)
    y, noise = standardised(model, Y, Yvar)
    mean, cov = s.dense(model, tX, y, noise, tXt)
    std = model.outcome_std.reshape(())
    return mean * std + model.outcome_mean.reshape(()), cov * std**2


def reference_conditioned(
    s: Surrogate, model: OnlineModel, X, Y, Yvar, batches, Xt
) -> tuple[Tensor, Tensor]:
    r"""The dense latent posterior at ``Xt`` (user units) of ``model`` (built on ``X, Y, Yvar``)
    after conditioning on ``batches`` in turn: ``[(Xb, Yb, Nb), ...]`` with ``Xb`` (``p x d``),
    ``Yb`` (``p x 1``) and user-unit noise ``Nb`` (``p x 1``; None: the likelihood's), as the
    surrogate's ``conditioning`` says."""
    std = model.outcome_std.reshape(())
    if callable(s.conditioning):
        with torch.no_grad():
            tX, tXt = model.transform_inputs(X), model.transform_inputs(Xt)
            y, noise = standardised(model, Y, Yvar)
            std_batches = []
            for Xb, Yb, Nb in batches:
                yb, nb = standardised(model, Yb, Nb)
                std_batches.append((model.transform_inputs(Xb), yb, nb))
        mean, cov = s.conditioning(model, tX, y, noise, std_batches, tXt)
        return mean * std + model.outcome_mean.reshape(()), cov * std**2
    Xn = torch.cat([b[0] for b in batches])
    Yn = torch.cat([b[1] for b in batches])
    Nn = None if batches[0][2] is None else torch.cat([b[2] for b in batches])
    if s.conditioning == "rebuild":
        if Yvar is None and Nn is not None:  # explicit noise on an inferred-noise model
            Yvar = _likelihood_noise(model) * std**2 * torch.ones_like(Y)
        Va = None if Yvar is None else torch.cat([Yvar, Nn])
        return reference(s, model, torch.cat([X, Xn]), torch.cat([Y, Yn]), Va, Xt)
    assert s.conditioning == "posterior_as_prior", s.conditioning
    p = Xn.shape[-2]
    mean, cov = reference(s, model, X, Y, Yvar, torch.cat([Xn, Xt]))
    if Nn is None:
        noise = _likelihood_noise(model) * std**2 * torch.ones(p, dtype=X.dtype)
    else:
        noise = Nn.reshape(-1)
    G = cov[:p, :p] + torch.diag(noise)
    gain = torch.linalg.solve(G, cov[:p, p:]).T  # N x p
    return mean[p:] + gain @ (Yn.reshape(-1) - mean[:p]), cov[p:, p:] - gain @ cov[:p, p:]


def latent(model: OnlineModel, Xt: Tensor, **kwargs) -> tuple[Tensor, Tensor]:
    """Posterior mean (``batch x N``) and covariance (``batch x N x N``), user units, detached."""
    with torch.no_grad():
        post = model.posterior(Xt, **kwargs)
        return post.mean.squeeze(-1), post.covariance_matrix


def assert_close(a: Tensor, b: Tensor, tol: float, what: str = "") -> None:
    """``|a - b| <= tol * max(1, max |b|)`` elementwise, with the worst error in the message."""
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    assert a.shape == b.shape, f"{what}: shapes {tuple(a.shape)} != {tuple(b.shape)}"
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    err = float((a - b).abs().max()) if a.numel() else 0.0
    bound = tol * scale
    assert err <= bound and not math.isnan(err), f"{what}: max error {err:.3g} > {bound:.3g}"


def tensor_state(model: torch.nn.Module) -> dict[str, Tensor]:
    r"""Every buffer and parameter of the model (not through ``state_dict``, which may refresh
    caches), cloned; plus the model's own tensor attributes that are not modules' buffers."""
    out = {f"buffer:{k}": v.detach().clone() for k, v in model.named_buffers() if v is not None}
    out.update({f"param:{k}": v.detach().clone() for k, v in model.named_parameters()})
    return out


def same_state(before: dict[str, Tensor], after: dict[str, Tensor]) -> list[str]:
    """Names whose tensors differ (shape or any value) or that appeared/disappeared."""
    diff = sorted(set(before) ^ set(after))
    for k in set(before) & set(after):
        a, b = before[k], after[k]
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
            diff.append(k)
    return diff
