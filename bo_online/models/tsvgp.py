r"""t-SVGP: a sparse variational GP in dual (site) parameters, with additive online conditioning.

``TSVGP`` is the sparse variational GP of Adam, Chang, Khan & Solin (NeurIPS 2021,
arXiv:2111.03412) written in the notation and sign convention of
docs/math.md §2. Every observation ``i`` owns a Gaussian site ``exp(g1_i f_i - beta_i f_i^2 / 2)`` on the
latent ``h = f - c`` (``c`` the constant prior mean), with a POSITIVE site precision ``beta_i``.
The sites enter the posterior only through two m-dimensional summaries::

    lam = sum_i k_u(x_i) g1_i          Lam = sum_i k_u(x_i) beta_i k_u(x_i)^T
    q(u) = N(K (K + Lam)^-1 lam, K (K + Lam)^-1 K)
    mean(x) = c + k_xu (K + Lam)^-1 lam
    cov(x, x') = k(x, x') - k_xu K^-1 k_ux' + k_xu (K + Lam)^-1 k_ux'

so a new observation is folded in by ADDING its site: a rank-q update of a Cholesky factor, O(m^2 q),
independent of n. For a Gaussian likelihood ``g1_i = (y_i - c)/sigma^2``, ``beta_i = 1/sigma^2``
and the model is exactly SGPR (Titsias 2009); for other likelihoods (Bernoulli probit/logit,
Poisson, Student-t: ``bo_online.likelihoods``) the sites come from natural-gradient E-steps
(``alpha_i = E_q[d log p/df]``, ``beta_i = -E_q[d^2 log p/df^2]``, ``g1_i = beta_i m_i + alpha_i``).

Factorisation used (a stable form of "the Cholesky of K + Lam"): with ``L_K L_K^T = K`` and the
whitened ``B = I + L_K^-1 Lam L_K^-T = L_B L_B^T`` (eigenvalues >= 1), ``chol(K + Lam) = L_K L_B``.
The caches are ``L_K``, ``L_B``, ``lam_w = L_K^-1 lam`` and ``v = B^-1 lam_w``; then
``mean(x) = c + a_x^T v`` and ``var(x) = k_xx - |a_x|^2 + |L_B^-1 a_x|^2`` with ``a_x = L_K^-1 k_ux``,
and ``KL[q(u) || p(u)] = 1/2 (logdet B + tr B^-1 - m + |v|^2)`` (docs/math.md §2's KL, whitened).

Learning is variational EM (paper Sec. 3-4): E-steps move the sites by natural gradients
(full batch or minibatch with the N/|B| scaling of Eqs. 22-23); M-steps maximise the TIGHTER bound
of Eq. 15 -- sites frozen per point, q rebuilt from them with the new hyperparameters and inducing
points -- with Adam or L-BFGS. The per-point sites (O(n)) are kept so any refit re-projects them
exactly. For a Gaussian likelihood the E-step is exact in closed form and the M-step objective is
the collapsed SGPR bound.

Use it for BO / active learning when n will grow large (thousands and beyond), when the likelihood is
not Gaussian (binary success/failure, counts, outliers), or when fantasies must be cheap: ``fantasize``
for q points costs O(m^2 q + S m^2) for S samples with a Gaussian likelihood (rank-one updates for
the conditioned model keeps its parent's factor ``L_B`` and the q new whitened site columns, and
solves with ``B + U U^T`` in Woodbury form (``bo_online.linalg.LowRankUpdatedCholesky``); ``update``
(in place) folds them into the factor itself).

Several outputs (``train_Y`` ``n x m``, Gaussian likelihoods): the outputs are an internal batch
dimension -- per-point tensors ``m x n``, caches ``batch x m x ...`` -- exactly m independent
single-output models computed together (``kl_divergence`` returns the m KLs, ``elbo`` their sum).

``posterior(X, observation_noise=True)``: Gaussian likelihoods add the noise variance. For the
others the returned distribution is still Gaussian: the latent posterior plus ``Var[y | f]``
evaluated at the posterior mean of f (Bernoulli ``p (1 - p)``, Poisson ``exp(m)``, Student-t
``scale^2 nu / (nu - 2)``), i.e. a moment-style approximation of the predictive spread of y, never
the exact (non-Gaussian) predictive distribution.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import gpytorch
import torch
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from botorch.optim.closures import ForwardBackwardClosure
from botorch.optim.core import scipy_minimize, torch_minimize
from botorch.optim.utils import get_parameters_and_bounds
from botorch.sampling.base import MCSampler
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.means import ConstantMean
from linear_operator.operators import DenseLinearOperator, MatmulLinearOperator
from torch import Tensor
from typing_extensions import Self

from bo_online.likelihoods import FixedNoiseGaussian, Gaussian, SiteLikelihood
from bo_online.linalg import (
    LowRankUpdatedCholesky,
    broadcast_shapes,
    cholesky_logdet,
    cholesky_solve,
    psd_cholesky,
    solve_lower,
)
from bo_online.models.base import OnlineModel
from bo_online.models.inducing import select_inducing_points
from bo_online.models.validation import check_finite, check_observations

__all__ = ["TSVGP"]

DEFAULT_NUM_INDUCING = 128


class TSVGP(OnlineModel):
    r"""Sparse variational GP in dual (site) parameters with O(m^2 q) online conditioning.

    Args:
        train_X: ``n x d`` initial inputs (n >= 1).
        train_Y: ``n x m`` initial observations (labels in {0, 1} for Bernoulli, counts for
            Poisson). ``m > 1`` (Gaussian likelihoods only): ``m`` independent outputs sharing the
            inputs and the inducing inputs, each with its own sites, kernel, constant mean, noise
            and outcome scaling (batch shape ``[m]``, as BoTorch's batched multi-output models);
            ``posterior`` then returns a ``MultitaskMultivariateNormal`` (``batch x q x m``) and
            ``update`` / ``condition_on_observations`` take ``Y`` of shape ``... x q x m``.
        train_Yvar: optional ``n x m`` known noise variances (user units): a fixed-noise Gaussian
            model; every later ``update`` must then pass ``noise``.
        inducing_points: ``m x d`` tensor, or an int m, or None for
            ``DEFAULT_NUM_INDUCING`` (128). An int/None selects them by greedy variance reduction
            (pivoted Cholesky) on ``train_X`` and fills the remaining slots with Sobol points over
            ``bounds`` (default the unit cube), so m may exceed n.
        likelihood: a :class:`~bo_online.likelihoods.SiteLikelihood`; default :class:`Gaussian`
            (or :class:`FixedNoiseGaussian` when ``train_Yvar`` is given).
        covar_module: GPyTorch kernel; default BoTorch's RBF with dimension-scaled priors (batch
            shape ``[m]`` for ``m > 1`` outputs; a user kernel must then have that batch shape).
        bounds: optional ``2 x d`` input box; inputs outside it are rejected.
        standardize: standardise outcomes (only for likelihoods on real-valued targets).
        input_transform: optional BoTorch input transform.
        num_init_e_steps: E-steps (rho = 1) run at construction for non-Gaussian likelihoods
            (the first from the prior marginals).
        condition_steps: further fixed-point steps on the new sites when conditioning with a
            non-Gaussian likelihood (0 = one step at the current marginal, docs/math.md §2).

    Example:
        >>> model = TSVGP(train_X, train_Y)               # Gaussian, 128 inducing points
        >>> model.fit()                                    # M-step on the collapsed bound
        >>> model.update(new_X, new_Y)                     # O(m^2 q), in place
        >>> clf = TSVGP(X, labels, likelihood=Bernoulli())
        >>> clf.fit(num_em_iters=3)                        # variational EM
    """

    #: a BO loop's refit at small n also fits a model rebuilt from its defaults and keeps the
    #: one with the higher ``marginal_log_likelihood`` (see ``OnlineLoop._restart_due``)
    restart_fit_from_defaults = True

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        inducing_points: Tensor | int | None = None,
        likelihood: SiteLikelihood | None = None,
        covar_module: Kernel | None = None,
        bounds: Tensor | None = None,
        standardize: bool = True,
        input_transform: Any | None = None,
        num_init_e_steps: int = 5,
        condition_steps: int = 0,
    ) -> None:
        dtype, device = train_X.dtype, train_X.device
        if not isinstance(train_X, Tensor) or train_X.dim() != 2:
            raise ValueError(f"train_X must be an n x d tensor, got {getattr(train_X, 'shape', train_X)}.")
        dim = OnlineModel.transformed_dim(train_X, input_transform)  # after the transform
        super().__init__(
            dim=dim, bounds=bounds, input_transform=input_transform, dtype=dtype, device=device
        )
        X = self._transform_and_check(train_X)
        if isinstance(train_Y, Tensor) and train_Y.dim() < 2:
            raise ValueError(
                f"train_Y must be n x m (one column per output; n x 1 for one output), got shape "
                f"{tuple(train_Y.shape)}; use train_Y.unsqueeze(-1)."
            )
        check_observations(
            X, train_Y, train_Yvar, dim=dim, bounds=self.input_bounds,
            num_outputs=train_Y.shape[-1] if isinstance(train_Y, Tensor) and train_Y.dim() else 1,
        )
        if train_Y.dim() != 2 or train_X.shape[0] < 1:
            raise ValueError("train_Y must be n x m with n >= 1.")
        num_out = train_Y.shape[-1]
        self._num_outputs = num_out
        #: the output batch dims of every per-output tensor: [] for one output, [m] for m > 1
        self._out = torch.Size([num_out]) if num_out > 1 else torch.Size()
        if num_out > 1 and likelihood is not None and not likelihood.conjugate:
            raise ValueError(
                "Several outputs are supported for Gaussian likelihoods only; use one TSVGP per "
                "output for other likelihoods."
            )
        if train_Yvar is not None:
            if likelihood is not None and not isinstance(likelihood, FixedNoiseGaussian):
                raise ValueError("train_Yvar (fixed noise) only goes with a FixedNoiseGaussian likelihood.")
            likelihood = likelihood or FixedNoiseGaussian()
        elif likelihood is None and num_out > 1:  # one learnable noise per output
            likelihood = Gaussian(get_gaussian_likelihood_with_lognormal_prior(batch_shape=self._out))
        elif isinstance(likelihood, FixedNoiseGaussian):
            raise ValueError("A FixedNoiseGaussian likelihood needs train_Yvar.")
        self.likelihood = likelihood if likelihood is not None else Gaussian()
        self.likelihood.check_targets(train_Y)
        train_Yvar = self._floor_train_Yvar(train_Y, train_Yvar)  # noise floor, with a warning
        self.fixed_noise = train_Yvar is not None
        if self._out:  # outcome scaling per output
            self.outcome_mean = torch.zeros(num_out).to(X)
            self.outcome_std = torch.ones(num_out).to(X)
        if standardize and self.likelihood.standardizable and train_Y.shape[0] > 1:
            std = train_Y.std(dim=0)
            self.outcome_mean = train_Y.mean(dim=0).to(X)
            self.outcome_std = torch.where(std > 0, std, torch.ones_like(std)).to(X)
        self.covar_module = covar_module or get_covar_module_with_dim_scaled_prior(
            ard_num_dims=dim, batch_shape=self._out
        )
        self.mean_module = ConstantMean(batch_shape=self._out)
        self.condition_steps = int(condition_steps)
        self.to(dtype=dtype, device=device)
        if inducing_points is None or isinstance(inducing_points, int):
            m = DEFAULT_NUM_INDUCING if inducing_points is None else int(inducing_points)
            Z = select_inducing_points(X, self._selection_kernel(), m, bounds=self.input_bounds)
        else:
            Z = torch.as_tensor(inducing_points).to(X)
            if Z.dim() != 2 or Z.shape[-1] != dim or Z.shape[0] < 1:
                raise ValueError(f"inducing_points must be m x {dim}, got {tuple(Z.shape)}.")
            check_finite("inducing_points", Z)
        self.inducing_points = torch.nn.Parameter(Z.clone())

        # Per-point state, stored with spare capacity so an update appends in O(q) amortised.
        n = X.shape[0]
        y = self._to_internal(self._standardise(train_Y.to(X)))  # (m x) n
        noise = None if train_Yvar is None else self._to_internal(train_Yvar.to(X) / self.outcome_std**2)
        self.register_buffer("num_data_", torch.tensor(n, device=device))
        self.register_buffer("_X", X.clone())
        self.register_buffer("_y", y.clone())
        self.register_buffer("_noise", None if noise is None else noise.clone())
        self.register_buffer("_g1", torch.zeros_like(y))  # sites, standardised units
        self.register_buffer("_beta", torch.zeros_like(y))
        # Sites added by conditioning a (fantasy) model: batched, kept apart from the shared base.
        for name in ("_cX", "_cy", "_cnoise", "_cg1", "_cbeta"):
            self.register_buffer(name, None)
        # Caches (functions of the sites and the hyperparameters).
        for name in ("chol_K", "chol_B", "lam_w", "v"):
            self.register_buffer(name, None)
        # A conditioned model's pending Gaussian sites: B = L_B L_B^T + U U^T kept in Woodbury form
        # (U, W = L_B^-1 U, C = chol(I + W^T W)) on the parent's shared L_B (see _B_factor).
        for name in ("_lr_U", "_lr_W", "_lr_C"):
            self.register_buffer(name, None)
        self._n = n
        self.ensure_caches()  # conjugate: exact sites; otherwise the prior (sites = 0)
        if not self.likelihood.conjugate:
            for _ in range(num_init_e_steps):
                self.e_step(rho=1.0)

    # ------------------------------------------------------------------ what the model is

    @property
    def num_data(self) -> int:
        return self._n

    @property
    def num_inducing(self) -> int:
        return int(self.inducing_points.shape[-2])

    @property
    def train_X(self) -> Tensor:
        return self._X[: self._n]

    @property
    def train_y(self) -> Tensor:
        """Standardised targets of the base data (``n``)."""
        return self._y[..., : self._n]

    @property
    def train_noise(self) -> Tensor | None:
        return None if self._noise is None else self._noise[..., : self._n]

    @property
    def sites(self) -> tuple[Tensor, Tensor]:
        r"""Per-point sites ``(g1, beta)`` of the base data (``n`` each, standardised units)."""
        return self._g1[..., : self._n], self._beta[..., : self._n]

    @property
    def train_inputs(self) -> tuple[Tensor]:
        return (self.train_X,)

    @property
    def train_targets(self) -> Tensor:
        """Training targets in the user's units (``n``)."""
        return self._user_units(self.train_y)

    def hyperparameters(self):
        r"""Kernel, mean and inducing points; the likelihood's parameters only for a Gaussian
        likelihood (its sites are exact functions of the noise). Non-Gaussian sites are frozen
        across hyperparameter changes (the M-step's tighter bound), so they do not key the caches."""
        for name, p in self.named_parameters():
            if name.startswith("likelihood.") and not self.likelihood.conjugate:
                continue
            yield p

    def _after_load(self) -> None:
        self._n = int(self.num_data_)

    # ------------------------------------------------------------------ several outputs
    # m > 1 independent outputs are an internal batch dimension (as BoTorch's batched
    # multi-output models): kernel, mean and noise have batch shape [m], per-point tensors
    # (y, sites, noise) are ``m x n``, caches ``batch x m x ...``; inducing inputs are shared.

    def _const(self) -> Tensor:
        r"""The constant prior mean, broadcastable against ``... x (m x) q``."""
        c = self.mean_module.constant
        return c.unsqueeze(-1) if self._out else c

    def _kx(self, X: Tensor) -> Tensor:
        r"""Inputs ``batch x q x d`` as the (output-batched) kernel wants them."""
        return X.unsqueeze(-3) if self._out else X

    def _user_units(self, Y: Tensor) -> Tensor:
        r"""Standardised ``... x (m x) q`` (internal layout) -> the user's units."""
        if self._out:
            return Y * self.outcome_std.unsqueeze(-1) + self.outcome_mean.unsqueeze(-1)
        return Y * self.outcome_std + self.outcome_mean

    def _selection_kernel(self) -> Kernel:
        r"""Kernel for choosing the shared inducing inputs: the model's own for one output; for
        several, an unbatched default kernel (the outputs share Z)."""
        if not self._out:
            return self.covar_module
        return get_covar_module_with_dim_scaled_prior(ard_num_dims=self.dim).to(
            self.outcome_mean
        )

    # ------------------------------------------------------------------ sites and caches

    def _point_noise(self, n_shape: torch.Size, noise: Tensor | None) -> Tensor | None:
        r"""Gaussian noise variance for sites: per-point if given, else the likelihood's."""
        if noise is not None:
            return noise
        if self.fixed_noise or not self.likelihood.conjugate:
            return None
        return self.likelihood.noise.expand(n_shape)

    def _exact_sites(self, y: Tensor, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        r"""Gaussian sites (docs/math.md §2): ``g1 = (y - c)/sigma^2``, ``beta = 1/sigma^2``."""
        s2 = self.likelihood._var(self._point_noise(y.shape, noise))
        c = self._const()
        return (y - c) / s2, (1.0 / s2).expand(y.shape)

    def _chunks(self) -> list[tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]]:
        r"""``(X, y, noise, g1, beta)`` for the base data and (for conditioned models) the added
        points; the conditioned chunk carries the model's batch dims."""
        chunks = [(self.train_X, self.train_y, self.train_noise, *self.sites)]
        if self._cX is not None:
            chunks.append((self._cX, self._cy, self._cnoise, self._cg1, self._cbeta))
        return chunks

    def _kuu_chol(self) -> Tensor:
        Z = self.inducing_points
        return psd_cholesky(self.covar_module(Z).to_dense())

    def _whiten(self, L_K: Tensor, X: Tensor) -> Tensor:
        r"""``a_X = L_K^-1 K_uX`` (``batch x m x q`` for ``X``: ``batch x q x d``).

        Without autograd the last result is memoised on ``(L_K, X)`` by identity and X's version
        counter: ``fantasize`` whitens the same X for the posterior it samples from and for the
        conditioning. (``L_K`` is a new tensor whenever the hyperparameters change.)
        """
        memo = self.__dict__.get("_whiten_memo")
        if memo is not None and memo[0] is L_K and memo[1] is X and memo[2] == X._version:
            return memo[3]
        Z = self.inducing_points
        Xk = self._kx(X)
        if Xk.dim() > 2:
            Z = Z.expand(*Xk.shape[:-2], *Z.shape)
        with gpytorch.settings.lazily_evaluate_kernels(False):  # dense at once: no lazy wrapper
            K_uX = self.covar_module(Z, Xk).to_dense()
        A = solve_lower(L_K, K_uX)
        if not torch.is_grad_enabled():  # never reuse a graph: a second backward would fail
            self.__dict__["_whiten_memo"] = (L_K, X, X._version, A)
        return A

    @staticmethod
    def _summaries(A: Tensor, g1: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
        r"""Whitened contributions ``(A g1, A diag(beta) A^T)`` of sites at points with ``A``."""
        lam_w = (A @ g1.unsqueeze(-1)).squeeze(-1)
        P = (A * beta.unsqueeze(-2)) @ A.transpose(-1, -2)
        return lam_w, P

    @staticmethod
    def _factor(P: Tensor, lam_w: Tensor) -> tuple[Tensor, Tensor]:
        r"""``L_B = chol(I + P)`` and ``v = (I + P)^-1 lam_w``."""
        eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device)
        L_B = psd_cholesky(eye + P)
        v = cholesky_solve(L_B, lam_w.unsqueeze(-1)).squeeze(-1)
        return L_B, v

    def _rebuild_caches(self) -> None:
        r"""Re-project the per-point sites onto the current hyperparameters, O(n m^2 + m^3)."""
        L_K = self._kuu_chol()
        lam_w, P = 0.0, 0.0
        for j, (X, y, noise, g1, beta) in enumerate(self._chunks()):
            if self.likelihood.conjugate:  # the exact E-step: sites follow sigma^2 and c
                g1, beta = self._exact_sites(y, noise)
                if j == 0:
                    self._g1[..., : self._n], self._beta[..., : self._n] = g1, beta
            A = self._whiten(L_K, X)
            lw, Pc = self._summaries(A, g1, beta)
            lam_w, P = lam_w + lw, P + Pc
        self.chol_K = L_K
        L_B, self.v = self._factor(P, lam_w)
        self._set_B_factor(LowRankUpdatedCholesky(L_B))
        self.lam_w = lam_w

    def set_sites(self, g1: Tensor, beta: Tensor) -> Self:
        r"""Replace the base data's per-point sites (``n`` each, standardised units, ``beta > 0``)
        and rebuild q from them (for tests, warm starts and custom inference loops)."""
        if self.batch_shape != torch.Size():
            raise ValueError("set_sites() is for a single model, not a fantasy/batched one.")
        n = self._n
        g1, beta = torch.as_tensor(g1).to(self._X), torch.as_tensor(beta).to(self._X)
        shape = (*self._out, n)
        if g1.shape != shape or beta.shape != shape:
            raise ValueError(f"Sites must have shape {shape}, got {tuple(g1.shape)}, {tuple(beta.shape)}.")
        check_finite("g1", g1)
        check_finite("beta", beta)
        if bool((beta < 0).any()):
            raise ValueError("Site precisions beta must be >= 0 (docs/math.md §2 sign convention).")
        self._set_base_sites(g1, beta)
        return self

    def _set_base_sites(self, g1: Tensor, beta: Tensor) -> None:
        with torch.no_grad():
            L_K = self._kuu_chol()
            A = self._whiten(L_K, self.train_X)
            lam_w, P = self._summaries(A, g1, beta)
            L_B, v = self._factor(P, lam_w)
        self._g1[..., : self._n], self._beta[..., : self._n] = g1, beta
        self.chol_K, self.lam_w, self.v = L_K, lam_w, v
        self._set_B_factor(LowRankUpdatedCholesky(L_B))
        self._cache_key = self._current_key()

    def _B_factor(self) -> LowRankUpdatedCholesky:
        r"""The whitened ``B = I + L_K^-1 Lam L_K^-T``: ``L_B`` plus any pending low-rank sites."""
        return LowRankUpdatedCholesky(self.chol_B, self._lr_U, self._lr_W, self._lr_C)

    def _set_B_factor(self, F: LowRankUpdatedCholesky) -> None:
        # straight into the registered buffers (Module.__setattr__ costs more than the maths
        # of a small fantasy)
        buffers = self._buffers
        buffers["chol_B"], buffers["_lr_U"], buffers["_lr_W"], buffers["_lr_C"] = F.L, F.U, F.W, F.C

    def _materialise_B(self) -> Tensor:
        r"""Fold pending low-rank sites into ``chol_B`` (O(m^2 r) or O(m^3)) and return it."""
        F = self._B_factor()
        if F.has_low_rank:
            self._set_B_factor(LowRankUpdatedCholesky(F.cholesky()))
        return self.chol_B

    # ------------------------------------------------------------------ prediction

    def _marginals(
        self, A: Tensor, B: Tensor | LowRankUpdatedCholesky, v: Tensor, X: Tensor
    ) -> tuple[Tensor, Tensor]:
        r"""Marginal mean of h = f - c and variance of f at points with whitened ``A``, given the
        factor of ``B`` (a Cholesky factor or a :class:`LowRankUpdatedCholesky`)."""
        if isinstance(B, Tensor):
            B = LowRankUpdatedCholesky(B)
        mean = (A.transpose(-1, -2) @ v.unsqueeze(-1)).squeeze(-1)
        kdiag = self.covar_module(self._kx(X), diag=True)
        var = kdiag - A.pow(2).sum(-2) + B.inv_quad_diag(A)
        return mean, var.clamp_min(1e-12)

    #: Up to this many points the posterior covariance is returned as a dense ``q x q`` tensor
    #: (computed once and shared, as a view, by every fantasy sample); beyond it as a lazy sum of
    #: low-rank products, so e.g. qNIPV's thousands of integration points never form ``q x q``.
    dense_posterior_max_q: int = 512

    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        # cov = k(X, X) - A^T A + A^T B^-1 A, with A^T B^-1 A = P^T P - H^T H (Woodbury form when
        # the model carries pending conditioned sites, H = None otherwise).
        A = self._whiten(self.chol_K, X)  # X batch x m x q
        P, H = self._B_factor().whiten(A)  # broadcast(X batch, model batch) x m x q, ... x r x q
        mean = self._const() + (self.v.unsqueeze(-2) @ A).squeeze(-2)  # one GEMM over samples
        cov_batch = P.shape[:-2] if H is None else broadcast_shapes(P.shape[:-2], H.shape[:-2])
        batch = broadcast_shapes(mean.shape[:-1], cov_batch)
        q, m = X.shape[-2], A.shape[-2]
        if q <= self.dense_posterior_max_q:
            gram = lambda T: T.transpose(-1, -2) @ T
            with gpytorch.settings.lazily_evaluate_kernels(False):
                prior = self.covar_module(self._kx(X)).to_dense()
            covar = prior - gram(A) + gram(P)
            if H is not None:
                covar = covar - gram(H)
            # wrapped: a tensor covariance would be Cholesky-factorised eagerly by torch's MVN
            covar = DenseLinearOperator(covar.expand(*batch, q, q))
            return MultivariateNormal(mean.expand(*batch, q), covar)
        prior = self.covar_module(self._kx(X))
        lazy = lambda T, k: MatmulLinearOperator(
            T.expand(*batch, k, q).transpose(-1, -2), T.expand(*batch, k, q)
        )
        covar = prior.expand(*batch, q, q) + lazy(P, m) + lazy(A, m) * -1.0
        if H is not None:
            covar = covar + lazy(H, H.shape[-2]) * -1.0
        return MultivariateNormal(mean.expand(*batch, q), covar)

    def _latent_mean(self, X: Tensor) -> Tensor:
        A = self._whiten(self.chol_K, X)
        return self._const() + (A.transpose(-1, -2) @ self.v.unsqueeze(-1)).squeeze(-1)

    def _noise_variance(self, X: Tensor) -> Tensor:
        lik = self.likelihood
        if self.fixed_noise:  # as BoTorch: the mean training noise at new points
            return self.train_noise.mean(-1, keepdim=True).expand(*X.shape[:-2], *self._out, X.shape[-2])
        if lik.conjugate:
            return lik.noise.expand(*X.shape[:-2], *self._out, X.shape[-2])
        # Non-Gaussian: Var[y | f] at the posterior mean of f (see the module docstring).
        return lik.noise_variance(self._latent_mean(X))

    def _default_fantasy_noise(self) -> Tensor | None:
        if self.fixed_noise:
            return self.train_noise.mean(-1).reshape(1, -1)
        return None

    # ------------------------------------------------------------------ conditioning

    def _new_sites(
        self, X: Tensor, A: Tensor, Y: Tensor, noise: Tensor | None
    ) -> tuple[LowRankUpdatedCholesky, Tensor, Tensor, Tensor, Tensor]:
        r"""``(B, lam_w, v, g1, beta)`` after adding the sites of ``(X, Y)``; ``B`` is this model's
        factor with the new whitened site columns ``A diag(beta)^1/2`` pending in Woodbury form.

        Gaussian: exact sites; ``B`` depends only on X and the noise, so it is updated once
        and shared by every fantasy sample (Y carries the sample dims). Otherwise: one E-step at
        the current marginal (rho = 1), then ``condition_steps`` further fixed-point steps on the
        new sites alone, each from the pre-conditioning state.
        """
        lik = self.likelihood
        if lik.conjugate:
            g1, beta = self._exact_sites(Y, noise)
            if noise is None and not self.fixed_noise:
                # one precision (per output) for all samples
                beta = (1.0 / self.likelihood._var(self.likelihood.noise)).expand(*self._out, X.shape[-2])
            elif noise is not None:  # noise is the same for every sample
                beta = beta.reshape(-1, *X.shape[:-2], *self._out, X.shape[-2])[0]
            parent = self._B_factor()
            B = parent.add(A * beta.sqrt().unsqueeze(-2))
            lam_w = self.lam_w + (A @ g1.unsqueeze(-1)).squeeze(-1)
            if parent.has_low_rank:
                return B, lam_w, B.solve(lam_w), g1, beta
            return B, lam_w, self._woodbury_v(B, A, beta, g1), g1, beta
        if noise is not None:
            raise ValueError(
                "noise can only be given for a Gaussian likelihood; this TSVGP has a "
                f"{type(lik).__name__} likelihood."
            )
        B, v = self._B_factor(), self.v
        c = self._const()
        for _ in range(1 + self.condition_steps):
            mean_h, var = self._marginals(A, B, v, X)
            alpha, beta = lik.expected_derivatives(Y, c + mean_h, var)
            g1 = beta * mean_h + alpha
            B = self._B_factor().add(A * beta.sqrt().unsqueeze(-2))
            lam_w = self.lam_w + (A @ g1.unsqueeze(-1)).squeeze(-1)
            v = B.solve(lam_w)
        return B, lam_w, v, g1, beta

    def _woodbury_v(self, B: LowRankUpdatedCholesky, A: Tensor, beta: Tensor, g1: Tensor) -> Tensor:
        r"""``v' = B'^-1 (lam_w + A g1)`` from the cached ``v = B^-1 lam_w``, for ``B' = B + U U^T``,
        ``U = A diag(beta)^1/2`` and ``B = L_B L_B^T`` (no pending sites). With ``G = B^-1 A``
        (two solves with q columns) and ``x = v + G g1``, Woodbury gives
        ``v' = x - G D C^-T C^-1 D A^T x`` (``D = diag(beta)^1/2``, ``C C^T = I + U^T B^-1 U``):
        every per-sample step is a small product, no solve with ``L_B`` per fantasy sample."""
        G = cholesky_solve(B.L, A)  # batch x m x q
        x = self.v + (G @ g1.unsqueeze(-1)).squeeze(-1)  # sample x batch x m
        s = beta.sqrt()
        t = (x.unsqueeze(-2) @ A).squeeze(-2) * s  # D A^T x: sample x batch x q
        t = torch.cholesky_solve(t.unsqueeze(-1), B.C).squeeze(-1) * s
        return x - (t.unsqueeze(-2) @ G.transpose(-1, -2)).squeeze(-2)

    def _condition(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> Self:
        self.likelihood.check_targets(self._user_units(Y))
        if noise is not None and self.likelihood.conjugate:
            noise = noise.expand(Y.shape)
        A = self._whiten(self.chol_K, X)  # X-batch x m x q, shared by every sample
        B, lam_w, v, g1, beta = self._new_sites(X, A, Y, noise)
        new = self._shallow_copy()
        new._set_B_factor(B)  # shares this model's L_B; the new sites stay in Woodbury form
        batch = broadcast_shapes(v.shape[:-1], B.batch_shape)  # model batch x (m)
        model_batch = batch[: len(batch) - len(self._out)]
        Xb = X.expand(*model_batch, *X.shape[-2:])
        yb, g1b, betab = (t.expand(*batch, X.shape[-2]) for t in (Y, g1, beta))
        nb = None if noise is None else noise.expand(*batch, X.shape[-2])
        if self._cX is not None:  # conditioning a conditioned model: extend its added chunk
            cat = lambda old, new_: torch.cat([old.expand(*batch, old.shape[-1]), new_], -1)
            Xb = torch.cat([self._cX.expand(*model_batch, *self._cX.shape[-2:]), Xb], -2)
            yb, g1b, betab = cat(self._cy, yb), cat(self._cg1, g1b), cat(self._cbeta, betab)
            if self._cnoise is not None or nb is not None:
                old_n = self._cnoise
                if old_n is None:
                    old_n = self._point_noise(self._cy.shape, None)
                if nb is None:
                    nb = self._point_noise(torch.Size([*batch, X.shape[-2]]), None)
                nb = cat(old_n, nb)
        # straight into the registered buffers (Module.__setattr__ is slow next to a small fantasy)
        new._buffers.update(lam_w=lam_w, v=v, _cX=Xb, _cy=yb, _cg1=g1b, _cbeta=betab, _cnoise=nb)
        new.__dict__["_batch_shape"] = model_batch
        return new

    def _update(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        lik = self.likelihood
        lik.check_targets(self._user_units(Y))
        if self.fixed_noise and noise is None:
            raise ValueError(
                "This TSVGP has fixed per-point noise: pass `noise` (variances) with every update."
            )
        if noise is not None and not self.fixed_noise:
            raise ValueError(
                "This TSVGP infers its noise (or has a non-Gaussian likelihood): do not pass "
                "`noise` to update(); build the model with train_Yvar for known noise."
            )
        with torch.no_grad():
            A = self._whiten(self.chol_K, X)
            B, lam_w, v, g1, beta = self._new_sites(X, A, Y, noise)
            L_B = B.cholesky()  # in place: fold the new sites into the factor, O(m^2 q)
            if self.lam_w.dim() != 1 + len(self._out) or L_B.dim() != 2 + len(self._out):
                raise ValueError("update() needs an unbatched model.")
        # Nothing has changed before this point (a failure above leaves the model as it was).
        self._append(X, Y, noise, g1, beta)
        self._set_B_factor(LowRankUpdatedCholesky(L_B))
        self.lam_w, self.v = lam_w, v

    def _append(self, X: Tensor, y: Tensor, noise: Tensor | None, g1: Tensor, beta: Tensor) -> None:
        n, q = self._n, X.shape[0]
        if n + q > self._X.shape[0]:  # grow the storage geometrically: amortised O(q) appends
            cap = max(2 * self._X.shape[0], n + q)
            self._X = torch.cat([self._X[:n], self._X.new_zeros(cap - n, self._X.shape[-1])], 0)
            grow = lambda t: torch.cat([t[..., :n], t.new_zeros(*t.shape[:-1], cap - n)], -1)
            self._y, self._g1, self._beta = map(grow, (self._y, self._g1, self._beta))
            if self._noise is not None:
                self._noise = grow(self._noise)
        self._X[n : n + q] = X
        self._y[..., n : n + q] = y
        self._g1[..., n : n + q] = g1
        self._beta[..., n : n + q] = beta
        if self._noise is not None:
            self._noise[..., n : n + q] = noise
        self._n = n + q
        # A new tensor, not fill_: models made by condition_on_observations share this buffer.
        self.num_data_ = self.num_data_.new_tensor(self._n)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """State with the per-point storage trimmed to the data held (no spare capacity)."""
        state = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        for name in ("_X", "_y", "_g1", "_beta", "_noise"):
            key = prefix + name
            if key in state and state[key] is not None:
                t = state[key]
                state[key] = (t[: self._n] if name == "_X" else t[..., : self._n]).clone()
        return state

    def fantasize(
        self,
        X: Tensor,
        sampler: MCSampler,
        observation_noise: Tensor | None = None,
        **kwargs: Any,
    ) -> Self:
        r"""Fantasy model conditioned on sampled observations at ``X`` (``batch x q x d``).

        Gaussian likelihoods: BoTorch's fantasize (Gaussian samples with noise), with one factor
        update shared by all samples. Other likelihoods: latent samples ``f`` from ``sampler``,
        then real likelihood samples ``y ~ p(y | f)`` (e.g. Bernoulli labels) by inverse CDF from
        uniforms fixed by the sampler's seed (so a fixed sampler gives fixed fantasies), and the
        model conditioned on them.
        """
        if self.likelihood.conjugate:
            return super().fantasize(X, sampler, observation_noise=observation_noise, **kwargs)
        if observation_noise is not None:
            raise ValueError("observation_noise only applies to Gaussian likelihoods.")
        post = self.posterior(X)
        F = sampler(post)  # sample x batch x q x 1, user units
        Fs = self._standardise(F)
        gen = torch.Generator(device="cpu").manual_seed(int(getattr(sampler, "seed", 0) or 0))
        U = torch.rand(Fs.shape, generator=gen, dtype=Fs.dtype).to(Fs.device)
        Ys = self.likelihood.sample_from_uniform(Fs, U)
        Y = Ys * self.outcome_std + self.outcome_mean  # user layout ... x q x m
        return self.condition_on_observations(X, Y.detach())

    # ------------------------------------------------------------------ the variational bound

    def elbo(self, frozen_sites: bool = True) -> Tensor:
        r"""The ELBO (sum over points) of q rebuilt from the per-point sites with the CURRENT
        hyperparameters and inducing points -- the tighter bound of the paper's Eq. 15 --,
        differentiable in them, O(n m^2 + m^3). For a Gaussian likelihood the sites are re-derived
        in closed form (exact E-step), so this is the collapsed SGPR bound.

        Returns:
            scalar ``sum_i E_q[log p(y_i | f_i)] - KL[q(u) || p(u)]`` (standardised units).
        """
        if self.batch_shape != torch.Size():
            raise ValueError("elbo() is for a single model, not a fantasy/batched one.")
        X, y, noise = self.train_X, self.train_y, self.train_noise
        L_K = self._kuu_chol()
        A = self._whiten(L_K, X)
        if self.likelihood.conjugate:
            g1, beta = self._exact_sites(y, noise)
        else:
            g1, beta = self.sites
        lam_w, P = self._summaries(A, g1, beta)
        L_B, v = self._factor(P, lam_w)
        mean_h, var = self._marginals(A, L_B, v, X)
        c = self._const()
        ell = self.likelihood.expected_log_prob(y, c + mean_h, var, noise).sum()
        return ell - self._kl(L_B, v).sum()  # summed over independent outputs

    def marginal_log_likelihood(self, include_priors: bool = True) -> Tensor:
        r"""The fit's objective per point: ``(elbo() + log priors) / n`` (standardised units).

        For a Gaussian likelihood with every data point among the inducing inputs (the default
        fit while ``n <= m``) this is the exact GP's log marginal likelihood, so it is comparable
        with :meth:`bo_online.models.exact.OnlineExactGP.marginal_log_likelihood`; the loops use
        it to choose between a warm-started refit and a fit from the defaults."""
        obj = self.elbo()
        if include_priors:
            for child in self.children():
                if hasattr(child, "named_priors"):
                    for _, module, prior, closure, _ in child.named_priors():
                        obj = obj + prior.log_prob(closure(module)).sum()
        return obj / self._n

    def _kl(self, L_B: Tensor, v: Tensor) -> Tensor:
        r"""KL[q(u) || p(u)] = 1/2 (logdet B + tr B^-1 - m + |v|^2) (docs/math.md §2, whitened)."""
        m = L_B.shape[-1]
        eye = torch.eye(m, dtype=L_B.dtype, device=L_B.device)
        tr_inv = solve_lower(L_B, eye).pow(2).sum((-1, -2))
        return 0.5 * (cholesky_logdet(L_B) + tr_inv - m + v.pow(2).sum(-1))

    def kl_divergence(self) -> Tensor:
        """KL[q(u) || p(u)] of the current q (from the caches)."""
        self.ensure_caches()
        return self._kl(self._B_factor().cholesky(), self.v)

    def q_u(self) -> tuple[Tensor, Tensor]:
        r"""``(m_u, S_u)`` of q(u) (standardised units; ``u`` is h = f - c at Z), docs/math.md §2:
        ``m_u = K (K + Lam)^-1 lam = L_K v``, ``S_u = K (K + Lam)^-1 K = L_K B^-1 L_K^T``."""
        self.ensure_caches()
        L_K = self.chol_K
        m_u = (L_K @ self.v.unsqueeze(-1)).squeeze(-1)
        R = solve_lower(self._B_factor().cholesky(), L_K.transpose(-1, -2))
        return m_u, R.transpose(-1, -2) @ R

    # ------------------------------------------------------------------ learning

    def e_step(
        self,
        rho: float = 1.0,
        batch_size: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Self:
        r"""One natural-gradient E-step on the sites (docs/math.md §2; paper Eqs. 18, 22-23).

        Full batch (``batch_size`` None or >= n): every site moves,
        ``lambda_i <- (1 - rho) lambda_i + rho g_i`` with ``g_i = (beta_i m_i + alpha_i, beta_i)``
        at the current marginals, and q is rebuilt from the sites -- identical to the tied update.
        Minibatch: the tied summaries move by Eqs. 22-23 with the ``N/|B|`` scaling,
        ``lam <- (1 - rho) lam + rho (N/|B|) sum_B k_u(x_i) g1_i`` (``Lam`` likewise), and the
        batch's own per-point sites take the untied step (so a later re-projection uses them).
        """
        if self.batch_shape != torch.Size():
            raise ValueError("e_step() is for a single model, not a fantasy/batched one.")
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1], got {rho}.")
        self.ensure_caches()
        self._materialise_B()
        n = self._n
        minibatch = batch_size is not None and batch_size < n
        idx = torch.randperm(n, generator=generator)[:batch_size] if minibatch else slice(None)
        with torch.no_grad():
            X, y = self.train_X[idx], self.train_y[..., idx]
            noise = None if self.train_noise is None else self.train_noise[..., idx]
            A = self._whiten(self.chol_K, X)
            mean_h, var = self._marginals(A, self.chol_B, self.v, X)
            c = self._const()
            noise_arg = noise if self.likelihood.conjugate else None
            if self.likelihood.conjugate and noise_arg is None:
                noise_arg = self._point_noise(y.shape, None)
            alpha, beta = self.likelihood.expected_derivatives(y, c + mean_h, var, noise_arg)
            g1 = beta * mean_h + alpha
            g1_old, beta_old = self.sites
            g1_new = (1 - rho) * g1_old[..., idx] + rho * g1
            beta_new = (1 - rho) * beta_old[..., idx] + rho * beta
            if not minibatch:
                self._set_base_sites(g1_new, beta_new)
                return self
            scale = n / X.shape[0]
            lam_b, P_b = self._summaries(A, g1, beta)
            L_B = self.chol_B
            P_old = L_B @ L_B.transpose(-1, -2) - torch.eye(L_B.shape[-1], dtype=L_B.dtype)
            lam_w = (1 - rho) * self.lam_w + rho * scale * lam_b
            P = (1 - rho) * P_old + rho * scale * P_b
            L_B, v = self._factor(P, lam_w)
            self._g1[..., idx], self._beta[..., idx] = g1_new, beta_new
            self.chol_B, self.lam_w, self.v = L_B, lam_w, v
        return self

    def fit(
        self,
        method: Literal["lbfgs", "adam"] = "lbfgs",
        max_iter: int = 100,
        lr: float = 0.05,
        num_em_iters: int = 3,
        num_e_steps: int = 5,
        rho: float = 1.0,
        batch_size: int | None = None,
        learn_inducing_points: bool | None = None,
        reinit_inducing: bool | None = None,
        restandardize: bool = True,
        include_priors: bool = True,
    ) -> Self:
        r"""Variational EM: ``num_em_iters`` x (``num_e_steps`` E-steps, one M-step), then
        ``num_e_steps`` final E-steps.

        The M-step maximises the tighter bound (:meth:`elbo`, sites frozen per point, q rebuilt
        with the new hyperparameters) plus log priors, over the kernel, the constant mean, the
        likelihood's parameters and (with ``learn_inducing_points``) the inducing inputs, by
        L-BFGS-B (``max_iter`` iterations) or Adam (``max_iter`` steps at ``lr``). For a Gaussian
        likelihood one M-step on the collapsed bound is the whole fit.

        Args:
            learn_inducing_points: move the inducing inputs in the M-step. Default (None): not
                while the inducing points can hold every data point (Gaussian likelihood and
                ``n <= m``, see ``reinit_inducing``), yes otherwise.
            reinit_inducing: re-select the inducing points (greedy variance reduction on the
                data held, Sobol fill) before fitting; the per-point sites re-project exactly.
                Default (None): yes for a Gaussian likelihood with ``n <= m``. The selection
                then keeps every (distinct) data point, so the collapsed bound is the exact
                marginal likelihood (Titsias, 2009: ``Q_XX = K_XX`` when ``X`` is among the
                inducing inputs) and the fit reaches an exact GP's hyperparameters; moving
                ``m x d`` inducing inputs there only slows L-BFGS down and lets the bound drift
                from the exact one as points arrive between fits (measured in a BO loop on
                Styblinski-Tang 4-D: lengthscales up to 4x off an exact GP's fit on the same
                data, fit time 1.0-1.4 s against 0.1-0.3 s).
            restandardize: recompute the outcome scaling from all data held (Gaussian
                likelihoods, whose sites are exact; other likelihoods keep their initial scaling
                because their sites are tied to it).
        """
        if self.batch_shape != torch.Size():
            raise ValueError("fit() is for a single model, not a fantasy/batched one.")
        if restandardize and self.likelihood.conjugate and self._n > 1:
            self._restandardize()
        exact_regime = self.likelihood.conjugate and self._n <= self.num_inducing
        if reinit_inducing is None:
            reinit_inducing = exact_regime
        if learn_inducing_points is None:
            learn_inducing_points = not exact_regime
        if reinit_inducing:
            with torch.no_grad():
                Z = select_inducing_points(
                    self.train_X, self._selection_kernel(), self.num_inducing,
                    bounds=self.input_bounds,
                )
                self.inducing_points.copy_(Z)
            self.invalidate_caches()
        conjugate = self.likelihood.conjugate
        # Every data point among the inducing inputs (or covered by them) and Z fixed: the
        # collapsed bound is the exact marginal likelihood, which costs O(n^3) per iteration
        # instead of O(n m^2 + m^3); at n = 35, m = 128 a fit from the defaults takes a third
        # of the time. One output only (several share Z but not hyperparameters).
        exact_objective = exact_regime and reinit_inducing and not learn_inducing_points
        exact_objective = exact_objective and not self._out
        iters = 1 if conjugate else num_em_iters
        for _ in range(iters):
            if not conjugate:
                for _ in range(num_e_steps):
                    self.e_step(rho=rho, batch_size=batch_size)
            self._m_step(
                method, max_iter, lr, learn_inducing_points, include_priors, exact_objective
            )
        if not conjugate:
            for _ in range(num_e_steps):
                self.e_step(rho=rho, batch_size=batch_size)
        return self

    def exact_log_marginal(self) -> Tensor:
        r"""``log N(y | c, K_XX + Sigma)`` of the data held (standardised units, one output, a
        Gaussian likelihood), differentiable in the hyperparameters, O(n^3). It is what
        :meth:`elbo` equals when every data point is among the inducing inputs (Titsias, 2009:
        ``Q_XX = K_XX``, the trace term vanishes)."""
        if self._out or not self.likelihood.conjugate:
            raise ValueError("exact_log_marginal() needs one output and a Gaussian likelihood.")
        X, y = self.train_X, self.train_y
        s2 = self.likelihood._var(self._point_noise(y.shape, self.train_noise))
        L = psd_cholesky(self.covar_module(X).to_dense() + torch.diag_embed(s2))
        w = solve_lower(L, (y - self._const()).unsqueeze(-1))
        n = y.shape[-1]
        return -0.5 * (w.pow(2).sum() + cholesky_logdet(L) + n * math.log(2 * math.pi))

    def _m_step(
        self,
        method: str,
        max_iter: int,
        lr: float,
        learn_z: bool,
        include_priors: bool,
        exact_objective: bool = False,
    ) -> None:
        params, bounds = {}, {}
        for child_name, child in self.named_children():
            if child_name == "likelihood" and self.fixed_noise:
                continue
            # Constraints without a transform (BoTorch's noise constraint) are enforced as
            # optimiser bounds, as fit_gpytorch_mll does.
            cp, cb = get_parameters_and_bounds(child, requires_grad=True)
            params.update({f"{child_name}.{k}": v for k, v in cp.items()})
            bounds.update({f"{child_name}.{k}": v for k, v in cb.items()})
        if learn_z and self.inducing_points.requires_grad:
            params["inducing_points"] = self.inducing_points
        bounds = {k: b for k, b in bounds.items() if k in params}
        n = self._n

        def loss() -> Tensor:
            obj = self.exact_log_marginal() if exact_objective else self.elbo()
            if include_priors:  # (OnlineModel is not a gpytorch Module: ask each child)
                for child in self.children():
                    if hasattr(child, "named_priors"):
                        for _, module, prior, closure, _ in child.named_priors():
                            obj = obj + prior.log_prob(closure(module)).sum()
            return -obj / n

        self.train()
        try:
            closure = ForwardBackwardClosure(forward=loss, parameters=params)
            if method == "lbfgs":
                scipy_minimize(closure, params, bounds=bounds, options={"maxiter": max_iter})
            elif method == "adam":
                torch_minimize(
                    closure,
                    params,
                    bounds=bounds,
                    optimizer=lambda ps: torch.optim.Adam(ps, lr=lr),
                    step_limit=max_iter,
                )
            else:
                raise ValueError(f"Unknown fit method {method!r}; use 'lbfgs' or 'adam'.")
        finally:
            self.eval()
        self.ensure_caches()

    def _restandardize(self) -> None:
        y = self.train_targets  # (m x) n
        mean, std = y.mean(-1).reshape(-1), y.std(-1).reshape(-1)
        std = torch.where(std > 0, std, torch.ones_like(std))
        ratio = self.outcome_std / std
        n = self._n
        col = (lambda t: t.unsqueeze(-1)) if self._out else (lambda t: t)
        if self._noise is not None:
            self._noise[..., :n] = self._noise[..., :n] * col(ratio) ** 2
        self._y[..., :n] = (y - col(mean)) / col(std)
        self.outcome_mean, self.outcome_std = mean, std
        self.invalidate_caches()
