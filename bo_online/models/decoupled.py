r"""Decoupled sparse variational GP (Cheng & Boots, 2017) with exact online conditioning.

``DecoupledSVGP`` approximates the GP posterior with separate bases for the mean and the
covariance (docs/math.md §3, the paper's Eqs. 7-10)::

    mean(x)   = c + k_{x,alpha} a
    cov(x,x') = k(x,x') - k_{x,beta} L H^{-1} L^T k_{beta,x'},      H = I + L^T K_beta L

with ``M_alpha`` mean bases (coefficients ``a``) and ``M_beta`` covariance bases (``B = L L^T``).
Prediction costs O(M_alpha) per point for the mean and O(M_beta^2) for the variance, so the mean
can use many more bases than a coupled SVGP of the same cost.

Design choices (documented because the paper leaves them open):

* **Partially shared bases** (the paper's Appendix A.2): the mean basis is ``[beta; alpha]``, i.e.
  the ``M_beta`` covariance bases are also the first ``M_beta`` mean bases (coefficients
  ``a_beta``), followed by ``M_alpha - M_beta`` mean-only bases ``alpha`` (coefficients
  ``a_alpha``). This is what keeps Gaussian conditioning *closed and exact* at O(M_beta^2 q +
  M_alpha q): the correction ``- k_{x,beta} L H^{-1} L^T K_{beta,X*} c`` folds into ``a_beta``.
  ``num_mean_bases`` counts all ``M_alpha`` mean bases; ``num_mean_bases == num_cov_bases`` is the
  coupled SVGP (alpha = beta).
* ``L`` is a general square ``M_beta x M_beta`` matrix (``B = L L^T`` for any square L); it is
  never initialised to zero (a fixed point of gradient ascent).
* **Conditioning** on ``(X*, y*, noise N*)`` (docs/math.md §3): ``beta' = [beta; X*]``,
  ``L' = blockdiag(L, N*^{-1/2})`` (precisions add), ``H`` grows by a bordered Cholesky
  (``bo_online.linalg.cholesky_append``), and with ``c = (k^(X*,X*) + N*)^{-1} (y* - mean(X*))``:
  ``a_beta' = [a_beta - L H^{-1} L^T K_{beta,X*} c; c]``. Exact (it equals conditioning the
  model's own posterior GP), so noise must be positive. Used for fantasies
  (``condition_on_observations``) and, in :meth:`update`, while the state is not a site optimum
  (set by hand, or bases = data), for at most ``max_basis_growth`` (default 128) bases beyond the
  cap.
* **Capped bases in streams (fold mode)**: after :meth:`fit` (or construction on more points than
  ``num_cov_bases``) the state is the closed-form ELBO optimum of ``a, B`` for fixed bases, kept
  as site statistics ``Q = K_ZX N^{-1} K_XZ`` and ``s = K_ZX N^{-1} (y - c)`` on the mean basis
  ``Z = [beta; alpha]``. :meth:`update` adds the new points' terms to ``Q, s`` and re-solves
  ``a = (K_Z + Q)^{-1} s``, ``B = K_beta^{-1} Q_beta K_beta^{-1}``: the bases never grow, the
  cost is O(M_alpha^3) per update whatever the stream length, and after any chain of updates
  the model equals the same fixed-basis optimum computed in one batch on all held data (the
  collapsed bound of Titsias, "Variational learning of inducing variables in sparse Gaussian
  processes", 2009, in the decoupled parameterisation). Changing hyperparameters by hand drops
  the statistics (back to exact growth until the next fit).
* **What the model keeps to refit**: the observed ``(X, y)`` (and fixed noises) as buffers, O(n)
  memory like an exact GP's data but never used in :meth:`posterior` or conditioning, whose costs
  do not depend on n. :meth:`fit` trains on them.
* Training (:meth:`fit`), default (``method=None`` -> ``"auto"``): L-BFGS-B on the exact GP
  marginal likelihood of the held data (all of it up to ``exact_fit_points = 512``, else a
  random subset of that size, O(512^3) per iteration whatever n), bases re-selected by pivoted
  Cholesky of the fitted kernel on the held data, then the closed-form ``a, B`` (fold mode).
  Plain Adam from the median heuristic, the previous default, barely moved the hyperparameters
  in a BO loop's budget. ``method="adam"`` (or passing ``lr``): Adam on ``a, L, beta, alpha``
  and the hyperparameters with the paper's step size ``gamma_t = gamma_0 / (1 + 0.1 sqrt(t))``, unbiased minibatch ELBO (Eq. 10 scaled by
  ``n / |batch|``, optional column subsampling of ``a^T K_alpha a``), online basis growth
  (``N_delta`` new bases per step from the minibatch, up to the caps), median-heuristic
  lengthscales. The covariance block is trained in whitened coordinates ``L = R^{-T} L0``,
  ``a_beta = R^{-T} a0`` (``R R^T = K_beta``; the paper's Appendix A.1 preconditioner). Options:
  hyperparameters from an exact GP on a data subset, and a closed-form (Gaussian) refresh of
  ``a, B`` after Adam; see :meth:`fit` and ``experiments/decoupled_sinc_kin40k.py`` for why.

Use it when the data outgrow an exact GP (thousands of points and more) and the mean needs more
resolution than the covariance; for small n it starts as the exact GP (bases = data).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Literal

import torch
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood, Likelihood
from gpytorch.means import ConstantMean
from linear_operator.operators import (
    DenseLinearOperator,
    DiagLinearOperator,
    MatmulLinearOperator,
)
from torch import Tensor
from typing_extensions import Self

from bo_online.linalg import (
    cholesky_append,
    cholesky_update,
    cholesky_solve,
    psd_cholesky,
    solve_lower,
    solve_lower_transpose,
)
from bo_online.models.base import HeldDataMixin, OnlineModel
from botorch.optim.closures import ForwardBackwardClosure
from botorch.optim.core import scipy_minimize
from bo_online.models.validation import check_finite

__all__ = ["DecoupledSVGP", "median_lengthscale", "pivoted_cholesky_select"]


def median_lengthscale(
    X: Tensor, max_points: int = 1000, generator: torch.Generator | None = None
) -> Tensor:
    r"""Median of the pairwise Euclidean distances of (at most ``max_points`` of) ``X`` (``n x d``):
    the paper's median-heuristic lengthscale (Appendix C.2). Returns a scalar tensor (1.0 if n < 2
    or all points coincide)."""
    if X.shape[0] > max_points:
        idx = torch.randperm(X.shape[0], generator=generator)[:max_points]
        X = X[idx]
    if X.shape[0] < 2:
        return torch.ones((), dtype=X.dtype, device=X.device)
    D = torch.cdist(X, X)
    iu = torch.triu_indices(X.shape[0], X.shape[0], offset=1, device=X.device)
    med = D[iu[0], iu[1]].median()
    return med if bool(med > 0) else torch.ones_like(med)


def pivoted_cholesky_select(
    K: Tensor | None, k: int, diag: Tensor | None = None, row: Callable[[int], Tensor] | None = None
) -> Tensor:
    r"""Indices of ``k`` points chosen greedily by largest residual variance (pivoted Cholesky of
    the kernel matrix, ``m x m``), a cheap way to keep a diverse subset of bases. O(m k^2).

    Give the dense ``K``, or its diagonal ``diag`` (``m``) and ``row(i)`` returning row ``i``
    (``m``), so that only the ``k`` chosen rows are ever computed (O(m k) memory).
    Hand-written because ``linear_operator``'s pivoted Cholesky does not return the pivots."""
    if K is not None:
        diag, row = torch.diagonal(K), (lambda i: K[i])
    m = diag.shape[-1]
    k = min(k, m)
    resid = diag.clone()
    rows = torch.zeros(k, m, dtype=diag.dtype, device=diag.device)
    chosen: list[int] = []
    for j in range(k):
        if chosen:
            resid[chosen] = -math.inf
        i = int(torch.argmax(resid))
        chosen.append(i)
        piv = resid[i].clamp_min(1e-300).sqrt()
        rows[j] = (row(i) - rows[:j, i] @ rows[:j]) / piv
        resid = resid - rows[j].pow(2)
    return torch.tensor(chosen, dtype=torch.long, device=diag.device)


class DecoupledSVGP(HeldDataMixin, OnlineModel):
    r"""Decoupled SVGP with exact O(M_beta^2 q + M_alpha q) Gaussian conditioning.

    Args:
        train_X: ``n x d`` initial inputs (n >= 1), kept (with ``train_Y``) for refits.
        train_Y: ``n x 1`` initial observations.
        train_Yvar: optional ``n x 1`` fixed noise variances (user units); if given, every later
            ``update`` must pass ``noise``.
        num_mean_bases: cap ``M_alpha`` on the mean bases (including the shared covariance bases).
        num_cov_bases: cap ``M_beta`` on the covariance bases (``<= num_mean_bases``). The
            default 128 is a trade-off measured on a 1,500-point pol stream (26 inputs): test NLL
            3.86 against 4.02 with 64 (an exact GP on 600 rows in hindsight: 3.77), for 1.1-1.5x
            the update time (an update is ``O(M_beta^2 q)``).
        covar_module: GPyTorch kernel; default BoTorch's RBF with dimension-scaled priors, its
            lengthscales initialised as ``lengthscale_init`` says.
        likelihood: GPyTorch likelihood; default BoTorch's ``GaussianLikelihood``. Non-Gaussian
            likelihoods are trained with Gauss-Hermite expected log likelihoods but cannot be
            conditioned in closed form.
        bounds: optional ``2 x d`` input box.
        standardize: standardise outcomes with the initial data's mean and std (Gaussian
            likelihoods only; labels or counts for other likelihoods are used as given).
        input_transform: optional BoTorch input transform.
        seed: seed for the random choices (basis seeding, minibatches).
        lengthscale_init: starting lengthscales of the default kernel. ``"prior"`` (default):
            BoTorch's (the mode of the dimension-scaled prior), where ``SingleTaskGP`` and
            :class:`~bo_online.models.exact.OnlineExactGP` start, so the default fit on small
            data (the exact marginal likelihood by L-BFGS) reaches the exact GP's optimum rather
            than another local one (Branin, 5 points: the median start ended 0.022 nats per
            point lower). ``"median"``: the median heuristic of Cheng & Boots (2017,
            arXiv:1711.10127, Appendix C.2), for the paper's Adam training from scratch.

    The bases are seeded from the data: if ``n <= num_cov_bases`` then ``beta = train_X``, no
    mean-only bases, ``a = (K + N)^{-1} (y - c)`` and ``L = N^{-1/2}`` -- exactly the exact GP.
    Otherwise ``num_cov_bases`` random data points seed ``beta`` and up to ``num_mean_bases -
    num_cov_bases`` others seed ``alpha``, with the closed-form Gaussian optimum of ``a`` and ``B``
    on a data subsample as the starting point.

    Example:
        >>> model = DecoupledSVGP(train_X, train_Y, num_mean_bases=512, num_cov_bases=64)
        >>> model.fit(max_iter=200)
        >>> model.update(new_X, new_Y)      # exact, O(M_beta^2 q + M_alpha q), in place
        >>> post = model.posterior(test_X)
    """

    #: above this many points per batch the posterior covariance stays a lazy operator, so that
    #: ``.variance`` at many points forms no ``q x q`` matrix (below it a dense one is faster)
    dense_posterior_max_q: int = 512
    #: a BO loop's refit at small n also fits a model rebuilt from its defaults and keeps the
    #: one with the higher ``marginal_log_likelihood`` (see ``OnlineLoop._restart_due``)
    restart_fit_from_defaults = True

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        num_mean_bases: int = 256,
        num_cov_bases: int = 128,
        covar_module: Kernel | None = None,
        likelihood: Likelihood | None = None,
        bounds: Tensor | None = None,
        standardize: bool = True,
        input_transform: Any | None = None,
        seed: int = 0,
        warm_start_points: int = 1024,
        max_basis_growth: int = 128,
        exact_fit_points: int = 512,
        lengthscale_init: Literal["prior", "median"] = "prior",
    ) -> None:
        dtype, device = train_X.dtype, train_X.device
        if lengthscale_init not in ("prior", "median"):
            raise ValueError(
                f"lengthscale_init must be 'prior' or 'median', got {lengthscale_init!r}."
            )
        if not isinstance(train_X, Tensor) or train_X.dim() != 2:
            shape = getattr(train_X, "shape", train_X)
            raise ValueError(f"train_X must be an n x d tensor, got {shape}.")
        if num_cov_bases < 1 or num_mean_bases < num_cov_bases:
            raise ValueError(
                f"Need 1 <= num_cov_bases <= num_mean_bases, got num_cov_bases={num_cov_bases}, "
                f"num_mean_bases={num_mean_bases}."
            )
        dim = OnlineModel.transformed_dim(train_X, input_transform)  # after the transform
        super().__init__(
            dim=dim, bounds=bounds, input_transform=input_transform, dtype=dtype, device=device
        )
        X = self._checked_training_data(train_X, train_Y, train_Yvar)
        if train_Yvar is not None and bool((train_Yvar <= 0).any()):
            raise ValueError("train_Yvar must be > 0: the decoupled model's conditioning adds "
                             "precisions 1/noise, so zero noise is not representable.")
        train_Yvar = self._floor_train_Yvar(train_Y, train_Yvar)  # noise floor, with a warning
        gaussian = likelihood is None or isinstance(likelihood, GaussianLikelihood)
        if standardize and gaussian and train_Y.shape[0] > 1:  # labels/counts stay as given
            std = train_Y.std(dim=0)
            self.outcome_mean = train_Y.mean(dim=0).to(X)
            self.outcome_std = torch.where(std > 0, std, torch.ones_like(std)).to(X)
        self.num_mean_bases = int(num_mean_bases)
        self.num_cov_bases = int(num_cov_bases)
        self.warm_start_points = int(warm_start_points)
        if max_basis_growth < 0 or exact_fit_points < 1:
            raise ValueError(
                f"Need max_basis_growth >= 0 and exact_fit_points >= 1, got {max_basis_growth} "
                f"and {exact_fit_points}."
            )
        self.max_basis_growth = int(max_basis_growth)
        self.exact_fit_points = int(exact_fit_points)
        self.seed = int(seed)
        self._generator = torch.Generator().manual_seed(self.seed)
        self.fixed_noise = train_Yvar is not None
        if self.fixed_noise and likelihood is not None:
            raise ValueError("Pass either train_Yvar (fixed noise) or a likelihood, not both.")
        if covar_module is None:
            covar_module = get_covar_module_with_dim_scaled_prior(ard_num_dims=dim)
        if covar_module is not None and lengthscale_init == "median":
            with torch.no_grad():  # the paper's median heuristic (Appendix C.2)
                covar_module.lengthscale = median_lengthscale(X, generator=self._generator).to(
                    covar_module.lengthscale
                ).expand_as(covar_module.lengthscale).clamp_min(0.05)
        self.covar_module = covar_module
        self.likelihood = likelihood or get_gaussian_likelihood_with_lognormal_prior()
        self.mean_module = ConstantMean()
        self.to(dtype=dtype, device=device)
        self.register_buffer("train_X", X)
        self.register_buffer("train_y", self._standardise(train_Y.to(X)).squeeze(-1))
        self.register_buffer(
            "train_noise",
            None if train_Yvar is None else (train_Yvar.to(X) / self.outcome_std**2).squeeze(-1),
        )
        # Variational state (buffers; fit() turns copies into leaves and writes them back).
        self.register_buffer("beta_points", None)  # batch x M_beta x d
        self.register_buffer("L", None)  # batch x M_beta x M_beta, B = L L^T
        self.register_buffer("a_beta", None)  # sample x batch x M_beta
        self.register_buffer("alpha_points", None)  # (M_alpha - M_beta) x d, mean-only bases
        self.register_buffer("a_alpha", None)  # (M_alpha - M_beta)
        # Cache: lower Cholesky factor of H = I + L^T K_beta L.
        self.register_buffer("chol_H", None)
        # Site statistics of the held data on the mean basis Z = [beta; alpha] (fold mode, see
        # _fold): Q = K_ZX N^{-1} K_XZ (M_alpha x M_alpha), s = K_ZX N^{-1} (y - c) (M_alpha).
        # Set once the hyperparameters were refined on the collapsed bound (see _fit_auto).
        self.register_buffer("collapsed_fit", None)
        self.register_buffer("site_Q", None)
        self.register_buffer("site_s", None)
        self._seed_bases()

    # ------------------------------------------------------------------ what the model is

    @property
    def num_beta(self) -> int:
        return int(self.beta_points.shape[-2])

    @property
    def num_alpha(self) -> int:
        """Total number of mean bases, ``M_beta + #mean-only bases``."""
        return self.num_beta + int(self.alpha_points.shape[-2])

    def hyperparameters(self):
        if self.fixed_noise or not isinstance(self.likelihood, GaussianLikelihood):
            return (p for n, p in self.named_parameters() if not n.startswith("likelihood."))
        return self.parameters()

    def _gaussian(self) -> bool:
        return self.fixed_noise or isinstance(self.likelihood, GaussianLikelihood)

    def _noise_of_points(self, X: Tensor, noise: Tensor | None) -> Tensor:
        r"""Positive per-point noise (``batch x q``) for new points, given or the likelihood's."""
        if not self._gaussian():
            raise ValueError(
                "Closed-form conditioning of DecoupledSVGP needs a Gaussian likelihood; refit with "
                "the new data (append it to train_X/train_y and call fit) instead."
            )
        if noise is None:
            if self.fixed_noise:
                raise ValueError(
                    "This DecoupledSVGP has fixed per-point noise: pass `noise` (variances) with "
                    "every new observation."
                )
            noise = self.likelihood.noise.squeeze(-1).expand(X.shape[:-1])
        if bool((noise <= 0).any()):
            raise ValueError(
                "DecoupledSVGP conditioning adds the precisions 1/noise of the new points, so the "
                "noise variances must be > 0 (got a zero); pass a small positive noise instead."
            )
        return noise

    def _noise_variance(self, X: Tensor) -> Tensor:
        if self.fixed_noise:
            return self.train_noise.mean(-1, keepdim=True).expand(X.shape[:-1])
        if not isinstance(self.likelihood, GaussianLikelihood):
            raise ValueError("observation_noise=True needs a Gaussian likelihood.")
        return self.likelihood.noise.squeeze(-1).expand(X.shape[:-1])

    def _default_fantasy_noise(self) -> Tensor | None:
        if self.fixed_noise:
            return self.train_noise.mean().reshape(1, 1)
        return None

    def _train_noise_diag(self, idx: Tensor | None = None) -> Tensor:
        r"""Per-point noise of held data; for a non-Gaussian likelihood a unit pseudo-noise, used
        only to initialise ``a`` and ``L``."""
        if self.fixed_noise:
            return self.train_noise if idx is None else self.train_noise[idx]
        n = self.num_data if idx is None else idx.shape[0]
        if not self._gaussian():
            return torch.ones(n, **self._dtype_device)
        return self.likelihood.noise.squeeze(-1).expand(n)

    # ------------------------------------------------------------------ the variational state

    def set_variational_parameters(
        self,
        beta_points: Tensor,
        L: Tensor,
        a_beta: Tensor,
        alpha_points: Tensor | None = None,
        a_alpha: Tensor | None = None,
    ) -> Self:
        r"""Set the variational state directly (non-batched model).

        Args:
            beta_points: ``M_beta x d`` covariance (and shared mean) bases.
            L: ``M_beta x M_beta`` square factor, ``B = L L^T``.
            a_beta: ``M_beta`` mean coefficients on ``beta``.
            alpha_points: optional ``M x d`` mean-only bases.
            a_alpha: ``M`` mean coefficients on ``alpha_points``.
        """
        d = self.dim
        if alpha_points is None:
            alpha_points = beta_points.new_zeros(0, d)
            a_alpha = beta_points.new_zeros(0)
        mb = beta_points.shape[0] if beta_points.dim() == 2 else -1
        ok = (
            beta_points.dim() == 2 and beta_points.shape[1] == d and L.shape == (mb, mb)
            and a_beta.shape == (mb,) and alpha_points.dim() == 2 and alpha_points.shape[1] == d
            and a_alpha is not None and a_alpha.shape == (alpha_points.shape[0],)
        )
        if not ok:
            raise ValueError(
                "Variational parameters must be beta_points M_b x d, L M_b x M_b, a_beta M_b, "
                "alpha_points M x d, a_alpha M."
            )
        for name, t in [("beta_points", beta_points), ("L", L), ("a_beta", a_beta),
                        ("alpha_points", alpha_points), ("a_alpha", a_alpha)]:
            check_finite(name, t)
        kw = self._dtype_device
        self.beta_points, self.L, self.a_beta = (
            t.detach().to(**kw) for t in (beta_points, L, a_beta)
        )
        self.alpha_points, self.a_alpha = alpha_points.detach().to(**kw), a_alpha.detach().to(**kw)
        self.site_Q, self.site_s = None, None  # a state set by hand is not a site optimum
        self.invalidate_caches()
        return self

    def _seed_bases(self) -> None:
        r"""Seed the bases from the data (capped) and initialise ``a`` and ``L`` (see class doc)."""
        X, n = self.train_X, self.num_data
        if n <= self.num_cov_bases:
            with torch.no_grad():
                self._set_exact_state(X)
            return
        perm = torch.randperm(n, generator=self._generator)
        n_alpha = min(n, self.num_mean_bases) - self.num_cov_bases
        beta = X[perm[: self.num_cov_bases]]
        alpha = X[perm[self.num_cov_bases : self.num_cov_bases + n_alpha]]
        with torch.no_grad():
            self._set_sites(beta, alpha)

    def _set_exact_state(self, beta: Tensor) -> None:
        r"""Bases = all data: ``a = (K + N)^{-1} (y - c)``, ``L = N^{-1/2}``, the exact GP."""
        noise = self._train_noise_diag()
        K = self.covar_module(beta).to_dense() + torch.diag_embed(noise)
        resid = (self.train_y - self.mean_module.constant).unsqueeze(-1)
        a = cholesky_solve(psd_cholesky(K), resid)
        self.set_variational_parameters(beta, torch.diag_embed(noise.rsqrt()), a.squeeze(-1))

    def _warm_start(self, beta: Tensor, alpha: Tensor) -> None:
        r"""Closed-form Gaussian-likelihood optimum of ``a`` and ``B`` for given bases, on a random
        data subsample of at most ``warm_start_points`` (rescaled to the full n).

        ``B* = K_b^{-1} P K_b^{-1}``, ``P = K_bX N^{-1} K_Xb``, so ``L = K_b^{-1} chol(P)``; and
        ``a* = (K_Z + K_ZX N^{-1} K_XZ)^{-1} K_ZX N^{-1} (y - c)`` for the mean basis ``Z = [beta;
        alpha]`` (maximisers of the ELBO in ``a`` and ``B``, docs/math.md §3 / the paper's Eq. 9-10)."""
        n = self.num_data
        if n > self.warm_start_points:
            idx = torch.randperm(n, generator=self._generator)[: self.warm_start_points]
        else:
            idx = torch.arange(n)
        Z = torch.cat([beta, alpha], dim=-2)
        Q, s = self._site_statistics(Z, idx)
        scale = n / idx.shape[0]
        self._closed_form(beta, alpha, scale * Q, scale * s)

    def _site_statistics(self, Z: Tensor, idx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""``Q = K_ZX N^{-1} K_XZ`` (``M x M``) and ``s = K_ZX N^{-1} (y - c)`` (``M``) over the
        held data (rows ``idx``, default all), accumulated in chunks of 4,096 rows."""
        idx = torch.arange(self.num_data) if idx is None else idx
        M = Z.shape[-2]
        Q = torch.zeros(M, M, **self._dtype_device)
        s = torch.zeros(M, **self._dtype_device)
        c = self.mean_module.constant.detach()
        for chunk in idx.split(4096):
            K = self.covar_module(Z, self.train_X[chunk]).to_dense()  # M x chunk
            w = self._train_noise_diag(chunk).reciprocal()
            Q = Q + (K * w) @ K.transpose(-1, -2)
            s = s + K @ (w * (self.train_y[chunk] - c))
        return Q, s

    def _closed_form(
        self,
        beta: Tensor,
        alpha: Tensor,
        Q: Tensor,
        s: Tensor,
        factors: tuple[Tensor, Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        r"""Set ``a, L`` to the Gaussian ELBO optimum for bases ``beta, alpha`` given the site
        statistics ``Q, s`` on ``Z = [beta; alpha]`` (see :meth:`_site_statistics`):
        ``a = (K_Z + Q)^{-1} s`` and ``B = L L^T = K_b^{-1} P K_b^{-1}`` with ``P = Q_{beta,beta}``,
        i.e. ``L = (K_b + 1e-8 I)^{-1} chol(P + 1e-6 I)`` (jitters keep the factors defined).

        ``factors``: the Cholesky factors ``(chol(K_b + 1e-8 I), chol(P + 1e-6 I), chol(K_Z +
        Q))`` when already known (kept up to date by rank-q updates in :meth:`_fold`); returns
        them."""
        mb = beta.shape[-2]
        if factors is None:
            Kb = self.covar_module(beta).to_dense()
            eye = torch.eye(mb, dtype=Kb.dtype, device=Kb.device)
            KZ = self.covar_module(torch.cat([beta, alpha], dim=-2)).to_dense()
            factors = (
                psd_cholesky(Kb + 1e-8 * eye),
                psd_cholesky(Q[:mb, :mb] + 1e-6 * eye),
                psd_cholesky(KZ + Q, jitter=1e-8),
            )
        Rb, RP, RA = factors
        L = cholesky_solve(Rb, RP)
        a = cholesky_solve(RA, s.unsqueeze(-1)).squeeze(-1)
        self.set_variational_parameters(beta, L, a[:mb], alpha, a[mb:])
        return factors

    def _set_sites(self, beta: Tensor, alpha: Tensor) -> None:
        r"""Closed-form optimum of ``a, B`` on all held data for the given bases, keeping the site
        statistics so that later updates fold into the fixed bases (:meth:`_fold`)."""
        Q, s = self._site_statistics(torch.cat([beta, alpha], dim=-2))
        factors = self._closed_form(beta, alpha, Q, s)
        self.site_Q, self.site_s = Q, s
        # Not a buffer: valid only while ``site_Q`` is this very tensor (any change of the sites
        # replaces it), so stale factors are never used.
        self._site_factors = (Q, *factors)
        self.chol_H = self._chol_H(self.beta_points, self.L)
        self._cache_key = self._current_key()

    def _in_fold_mode(self) -> bool:
        return self.site_Q is not None and self._gaussian()

    # ------------------------------------------------------------------ caches

    def _chol_H(self, beta: Tensor, L: Tensor) -> Tensor:
        K = self.covar_module(beta).to_dense()
        H = L.transpose(-1, -2) @ K @ L
        H = H + torch.eye(H.shape[-1], dtype=H.dtype, device=H.device)
        return psd_cholesky(H)

    def _chol_K(self, beta: Tensor) -> Tensor:
        r"""Lower factor of ``K_beta + 1e-8 I`` (the whitening map used in training)."""
        K = self.covar_module(beta).to_dense()
        return psd_cholesky(K + 1e-8 * torch.eye(K.shape[-1], dtype=K.dtype, device=K.device))

    def _rebuild_caches(self) -> None:
        # Hyperparameters changed since the sites were summed: they no longer describe the data
        # under the current kernel, so updates go back to exact growth until the next fit.
        self.site_Q, self.site_s = None, None
        self.chol_H = self._chol_H(self.beta_points, self.L)

    # ------------------------------------------------------------------ prediction

    def _mean_at(self, X: Tensor) -> Tensor:
        r"""Posterior mean at ``X`` (``batch x q x d``):
        ``c + k_{X,beta} a_beta + k_{X,alpha} a_alpha``."""
        mean = self.mean_module.constant + (
            self.covar_module(X, self.beta_points).to_dense() @ self.a_beta.unsqueeze(-1)
        ).squeeze(-1)
        if self.alpha_points.shape[-2] > 0:
            mean = mean + self.covar_module(X, self.alpha_points).to_dense() @ self.a_alpha
        return mean

    def _whitened(self, X: Tensor) -> Tensor:
        r"""``V = chol_H^{-1} L^T K_{beta,X}`` (``batch x M_beta x q``), so ``cov = k - V^T V``."""
        K_bX = self.covar_module(self.beta_points, X).to_dense()
        return solve_lower(self.chol_H, self.L.transpose(-1, -2) @ K_bX)

    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        if self.beta_points.dim() == 2 and self.a_beta.dim() == 1:
            return self._latent_posterior_folded(X)
        mean = self._mean_at(X)
        V = self._whitened(X)
        prior = self.covar_module(X)
        batch = torch.broadcast_shapes(mean.shape[:-1], V.shape[:-2], X.shape[:-2])
        Vt = V.transpose(-1, -2).expand(*batch, V.shape[-1], V.shape[-2])
        covar = prior + MatmulLinearOperator(Vt, V.expand(*batch, *V.shape[-2:])) * -1.0
        return MultivariateNormal(mean.expand(*batch, mean.shape[-1]), covar)

    def _latent_posterior_folded(self, X: Tensor) -> MultivariateNormal:
        r"""Posterior of a non-batched model at ``X`` (``batch x q x d``) with the batch folded
        into columns: one ``M_beta x (batch * q)`` solve against ``chol_H``, so memory is
        O(batch * q * (M_beta + q)) and no ``M_beta x M_beta`` factor is copied per batch element
        (``solve_triangular`` broadcasting would copy it)."""
        batch, q, d = X.shape[:-2], X.shape[-2], X.shape[-1]
        Xf = X.reshape(-1, d)  # (batch * q) x d
        mean = self._mean_at(Xf).reshape(*batch, q)
        V = self._whitened(Xf)  # M_beta x (batch * q)
        Vb = V.reshape(V.shape[0], -1, q)  # M_beta x B x q
        if q > self.dense_posterior_max_q:  # many points: a lazy covariance (docs/contract.md)
            Vt = Vb.permute(1, 2, 0).reshape(*batch, q, -1)  # batch x q x M_beta
            covar = self.covar_module(X) + MatmulLinearOperator(Vt, Vt.transpose(-1, -2)) * -1.0
            return MultivariateNormal(mean, covar)
        VtV = torch.einsum("mbi,mbj->bij", Vb, Vb).reshape(*batch, q, q)
        covar = self.covar_module(X).to_dense() - VtV
        # Lazy wrapper: a dense tensor would be Cholesky-factorised at construction.
        return MultivariateNormal(mean, DenseLinearOperator(covar))

    # ------------------------------------------------------------------ conditioning (docs/math.md §3)

    def _conditioned_state(self, X: Tensor, noise: Tensor | None):
        r"""The Y-independent part of conditioning on ``X`` (``batch x q x d``), shared by
        fantasies: the grown ``beta``, ``L``, ``chol_H``, and what ``a`` needs. Raises before
        anything changes."""
        N = self._noise_of_points(X, noise)  # batch x q, > 0
        batch = torch.broadcast_shapes(self.beta_points.shape[:-2], X.shape[:-2], N.shape[:-1])
        beta = self.beta_points.expand(*batch, *self.beta_points.shape[-2:])
        Xb = X.expand(*batch, *X.shape[-2:])
        Nb = N.expand(*batch, N.shape[-1])
        L = self.L.expand(*batch, *self.L.shape[-2:])
        K_bX = self.covar_module(beta, Xb).to_dense()  # batch x M_b x q
        K_XX = self.covar_module(Xb).to_dense()  # batch x q x q
        LtK = L.transpose(-1, -2) @ K_bX  # batch x M_b x q, O(M_b^2 q)
        V = solve_lower(self.chol_H, LtK)  # batch x M_b x q
        # Posterior covariance at the new points plus their noise, factorised (q x q).
        S = K_XX - V.transpose(-1, -2) @ V + torch.diag_embed(Nb)
        R_S = psd_cholesky(S)
        # Bordered Cholesky of H' = I + L'^T K_beta' L' with L' = blockdiag(L, N^{-1/2}).
        r = Nb.rsqrt()
        border = LtK * r.unsqueeze(-2)  # L^T K_{beta,X*} N^{-1/2}
        corner = r.unsqueeze(-1) * K_XX * r.unsqueeze(-2)
        corner = corner + torch.eye(corner.shape[-1], dtype=corner.dtype, device=corner.device)
        chol_H = cholesky_append(self.chol_H, border, corner)
        m, q = L.shape[-1], Xb.shape[-2]
        L_new = torch.cat(
            [
                torch.cat([L, L.new_zeros(*batch, m, q)], dim=-1),
                torch.cat([L.new_zeros(*batch, q, m), torch.diag_embed(r)], dim=-1),
            ],
            dim=-2,
        )
        # The a-correction map: L H^{-1} L^T K_{beta,X*} = L chol_H^{-T} V (batch x M_b x q).
        corr = L @ solve_lower_transpose(self.chol_H, V)
        beta_new = torch.cat([beta, Xb], dim=-2)
        return beta_new, L_new, chol_H, R_S, corr

    def _conditioned_a(self, X: Tensor, Y: Tensor, R_S: Tensor, corr: Tensor) -> Tensor:
        r"""New ``a_beta`` (``sample x batch x (M_beta + q)``) for observations ``Y``."""
        resid = Y - self._mean_at(X)  # sample x batch x q
        c = cholesky_solve(R_S, resid.unsqueeze(-1))  # sample x batch x q x 1
        a_old = self.a_beta.unsqueeze(-1) - corr @ c  # sample x batch x M_b x 1
        return torch.cat([a_old, c], dim=-2).squeeze(-1)

    def _condition(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> Self:
        if noise is not None and noise.dim() > X.dim() - 1:
            # Noise carries fantasy sample dims; it is the same for every sample.
            noise = noise.reshape(-1, *noise.shape[-(X.dim() - 1):])[0]
        beta, L, chol_H, R_S, corr = self._conditioned_state(X, noise)
        a_beta = self._conditioned_a(X, Y, R_S, corr)
        new = self._shallow_copy()
        new.beta_points, new.L, new.chol_H, new.a_beta = beta, L, chol_H, a_beta
        new.site_Q, new.site_s = None, None  # grown bases: exact conditioning, no sites
        new._batch_shape = torch.broadcast_shapes(a_beta.shape[:-1], beta.shape[:-2])
        if new._batch_shape == torch.Size():  # a plain (non-fantasy) model keeps the data
            new.train_X = torch.cat([self.train_X, X], dim=-2)
            new.train_y = torch.cat([self.train_y, Y], dim=-1)
            if self.fixed_noise:
                new.train_noise = torch.cat([self.train_noise, noise.expand(Y.shape)], dim=-1)
        new._cache_key = self._cache_key
        return new

    def _update(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        r"""In place. In fold mode (the state is the site optimum for fixed bases, as after
        :meth:`fit` or construction on more points than ``num_cov_bases``) the new points are
        folded into the site statistics and the bases stay capped (:meth:`_fold`). Otherwise the
        exact conditioning grows the covariance basis by ``q``; once it would exceed
        ``num_cov_bases + max_basis_growth`` the bases are compressed back to the caps and the
        model switches to fold mode on all held data (a one-off O(n M_alpha^2))."""
        if self._in_fold_mode():
            self._fold(X, Y, noise)
            return
        beta, L, chol_H, R_S, corr = self._conditioned_state(X, noise)  # raises before changes
        a_beta = self._conditioned_a(X, Y, R_S, corr)
        train_noise = self.train_noise
        if self.fixed_noise:
            train_noise = torch.cat([self.train_noise, noise], dim=-1)
        self.beta_points, self.L, self.chol_H, self.a_beta = beta, L, chol_H, a_beta
        self.train_X = torch.cat([self.train_X, X], dim=-2)
        self.train_y = torch.cat([self.train_y, Y], dim=-1)
        self.train_noise = train_noise
        if self._gaussian() and self.num_beta > self.num_cov_bases + self.max_basis_growth:
            self._compress()
            self._set_sites(self.beta_points, self.alpha_points)

    def _fold(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        r"""Fold ``q`` points into fixed bases: ``Q += K_{Z,X*} N*^{-1} K_{X*,Z}``, ``s +=
        K_{Z,X*} N*^{-1} (y* - c)``, then the closed-form ``a, B`` (:meth:`_closed_form`).

        After any chain of folds the state equals :meth:`_set_sites` on all held data with the
        same bases and hyperparameters, i.e. the optimum of the ELBO over ``(a, B)`` for those
        fixed bases (Titsias-style collapsed optimum; the paper's Eqs. 9-10 maximised in closed
        form). Cost O(M_alpha^2 q + M_beta^3) per update (rank-q Cholesky updates of the kept
        factors), independent of n and of the number of updates."""
        N = self._noise_of_points(X, noise)  # q, > 0 (raises before any change)
        Z = torch.cat([self.beta_points, self.alpha_points], dim=-2)
        K = self.covar_module(Z, X).to_dense()  # M x q
        w = N.reciprocal()
        Q = self.site_Q + (K * w) @ K.transpose(-1, -2)
        s = self.site_s + K @ (w * (Y - self.mean_module.constant.detach()))
        train_noise = self.train_noise
        if self.fixed_noise:
            train_noise = torch.cat([self.train_noise, noise], dim=-1)
        beta, alpha = self.beta_points, self.alpha_points
        kept = getattr(self, "_site_factors", None)
        factors = None
        if kept is not None and kept[0] is self.site_Q:
            Kw = K * w.sqrt()  # Q' = Q + Kw Kw^T
            Rb, RP, RA = kept[1:]
            factors = (Rb, cholesky_update(RP, Kw[: beta.shape[-2]]), cholesky_update(RA, Kw))
        factors = self._closed_form(beta, alpha, Q, s, factors)  # clears the sites and caches
        self.site_Q, self.site_s = Q, s
        self._site_factors = (Q, *factors)
        self.chol_H = self._chol_H(self.beta_points, self.L)
        self._cache_key = self._current_key()
        self.train_X = torch.cat([self.train_X, X], dim=-2)
        self.train_y = torch.cat([self.train_y, Y], dim=-1)
        self.train_noise = train_noise

    # ------------------------------------------------------------------ the objective

    def kl_divergence(
        self,
        beta: Tensor | None = None,
        L: Tensor | None = None,
        a: Tensor | None = None,
        Z: Tensor | None = None,
        num_columns: int | None = None,
        generator: torch.Generator | None = None,
        columns: Tensor | None = None,
    ) -> Tensor:
        r"""KL[q || p] of the paper's Eq. 9 in the stable form (docs/math.md §3)::

            KL = 1/2 a^T K_Z a + 1/2 logdet H - 1/2 tr(K_beta L H^{-1} L^T),

        with ``tr(K_beta L H^{-1} L^T) = tr(H^{-1} (H - I)) = M_beta - tr(H^{-1})``.

        Args:
            beta: covariance bases (default: the model's).
            L: covariance factor (default: the model's).
            a: all mean coefficients (default: the model's).
            Z: all mean bases ``[beta; alpha]`` (default: the model's).
            num_columns: if given, ``a^T K_Z a`` is estimated without bias from that many
                columns drawn without replacement, ``(M/s) a^T K_{Z,S} a_S`` (O(M_alpha s)).
            columns: explicit column indices ``S`` for that estimate (overrides the draw).
        """
        beta = self.beta_points if beta is None else beta
        L = self.L if L is None else L
        if a is None:
            a = torch.cat([self.a_beta, self.a_alpha.expand(*self.a_beta.shape[:-1], -1)], dim=-1)
            Z = torch.cat([self.beta_points, self.alpha_points], dim=-2)
        chol_H = self._chol_H(beta, L)
        M = Z.shape[-2]
        if columns is None and num_columns is not None and num_columns < M:
            columns = torch.randperm(M, generator=generator)[:num_columns].to(Z.device)
        if columns is not None:
            S = columns
            K = self.covar_module(Z, Z[..., S, :]).to_dense()
            quad = (M / S.shape[0]) * ((a.unsqueeze(-2) @ K).squeeze(-2) * a[..., S]).sum(-1)
        else:
            KZ = self.covar_module(Z).to_dense()
            quad = (a.unsqueeze(-2) @ KZ @ a.unsqueeze(-1)).squeeze(-1).squeeze(-1)
        eye = torch.eye(chol_H.shape[-1], dtype=chol_H.dtype, device=chol_H.device)
        tr_Hinv = solve_lower(chol_H, eye).pow(2).sum((-1, -2))
        logdet = 2.0 * torch.diagonal(chol_H, dim1=-2, dim2=-1).log().sum(-1)
        return 0.5 * quad + 0.5 * logdet - 0.5 * (chol_H.shape[-1] - tr_Hinv)

    def expected_log_likelihood(
        self,
        X: Tensor,
        y: Tensor,
        noise: Tensor | None = None,
        beta: Tensor | None = None,
        L: Tensor | None = None,
        a: Tensor | None = None,
        Z: Tensor | None = None,
    ) -> Tensor:
        r"""``sum_i E_q[log p(y_i | f(x_i))]`` (the paper's Eq. 10) over ``X`` (``n x d``), ``y``
        (``n``, standardised). Closed form for Gaussian noise (``noise``: ``n`` variances or the
        likelihood's); otherwise the likelihood's Gauss-Hermite ``expected_log_prob``."""
        beta = self.beta_points if beta is None else beta
        L = self.L if L is None else L
        if a is None:
            a = torch.cat([self.a_beta, self.a_alpha], dim=-1)
            Z = torch.cat([self.beta_points, self.alpha_points], dim=-2)
        chol_H = self._chol_H(beta, L)
        mean = self.mean_module.constant + self.covar_module(X, Z).to_dense() @ a
        V = solve_lower(chol_H, L.transpose(-1, -2) @ self.covar_module(beta, X).to_dense())
        var = (self.covar_module(X, diag=True) - V.pow(2).sum(-2)).clamp_min(1e-12)
        if self._gaussian():
            if noise is None:
                noise = self.likelihood.noise.squeeze(-1).expand_as(y)
            return -0.5 * (
                torch.log(2 * math.pi * noise) + ((y - mean).pow(2) + var) / noise
            ).sum(-1)
        f = MultivariateNormal(mean, DiagLinearOperator(var))
        return self.likelihood.expected_log_prob(y, f).sum(-1)

    def elbo(
        self,
        batch_idx: Tensor | None = None,
        num_kl_columns: int | None = None,
        generator: torch.Generator | None = None,
        **state: Tensor,
    ) -> Tensor:
        r"""Unbiased (minibatch) estimate of the ELBO ``E_q[log p(y|f)] - KL`` on the held data,
        in standardised units: ``(n / |batch|) ELL(batch) - KL`` (column-subsampled ``a^T K a``
        with ``num_kl_columns``). ``state`` may override ``beta, L, a, Z`` (used by :meth:`fit`)."""
        idx = batch_idx if batch_idx is not None else torch.arange(self.num_data)
        X, y = self.train_X[idx], self.train_y[idx]
        noise = self.train_noise[idx] if self.fixed_noise else None
        ell = self.expected_log_likelihood(X, y, noise, **state)
        kl = self.kl_divergence(num_columns=num_kl_columns, generator=generator, **state)
        return ell * (self.num_data / idx.shape[0]) - kl

    # ------------------------------------------------------------------ training

    def fit(
        self,
        method: Literal["auto", "adam", "lbfgs"] | None = None,
        max_iter: int = 200,
        lr: float | None = None,
        lr_variational: float | None = None,
        batch_size: int = 1024,
        num_kl_columns: int | None = None,
        grow: int = 0,
        learn_inducing: bool | None = None,
        train_hyperparameters: bool = True,
        restandardize: bool = True,
        compress: bool = True,
        init_hyperparameters: int = 0,
        refresh: bool = False,
        timeout_sec: float | None = None,
    ) -> Self:
        r"""Train ``a, L, beta, alpha`` and the hyperparameters on the data the model holds.

        1. With ``restandardize``, recompute the outcome scaling from the held data (mean
           coefficients rescaled so the mean is unchanged).
        2. With ``compress``, bring bases grown by conditioning back to the caps: keep a diverse
           subset (pivoted Cholesky of the kernel) and warm-start ``a, L`` at the Gaussian
           closed-form optimum on a data subsample. When all data fit in the covariance bases the
           bases are the data and the model starts as the exact GP.
        3. ``method="adam"``: ``max_iter`` Adam steps on the minibatch ELBO with the paper's
           schedule ``lr_t = lr / (1 + 0.1 sqrt(t))``; each step first adds ``grow`` (N_delta) new
           bases from the minibatch while below the caps (``L`` extended by ``N^{-1/2}``, new
           coefficients zero). ``method="lbfgs"``: full-batch L-BFGS-B (small n).
        4. If the bases are exactly all the data (and did not move), finish at the closed-form
           optimum ``a = (K + N)^{-1}(y - c), L = N^{-1/2}`` for the fitted hyperparameters.

        **Default** (``method=None``): ``"auto"`` for a Gaussian likelihood when no Adam step
        size ``lr`` is given and ``max_iter > 0``, else ``"adam"``. ``"auto"`` is
        :meth:`_fit_auto`: L-BFGS on the exact marginal likelihood of all held data when ``n <=
        exact_fit_points`` (default 512), else of a random subset of that size, then refined on
        the collapsed bound of the selected bases (:meth:`collapsed_bound`, at most 2,048 held
        points); then bases by pivoted Cholesky of the kernel on the held data and ``a, B`` at
        their closed-form optimum on all held data (fold mode). Plain Adam from the median heuristic barely moves the
        hyperparameters in a BO loop's few steps. ``"auto"`` uses ``max_iter`` (L-BFGS
        iterations), ``train_hyperparameters``, ``restandardize`` and ``timeout_sec``; the other
        options belong to ``"adam"``/``"lbfgs"``.

        Args:
            method: ``None`` (see above), ``"auto"``, ``"adam"`` or ``"lbfgs"`` (ELBO, full batch).
            lr: Adam's initial step ``gamma_0`` for hyperparameters and basis locations.
            lr_variational: initial step for ``a`` and ``L`` (default ``lr / 10``): a smaller
                one keeps Adam's sign-like first steps from undoing a good warm start of ``a``.
            batch_size: minibatch size (full batch when n is smaller).
            num_kl_columns: columns sampled for ``a^T K_alpha a`` (None: exact).
            grow: bases added per step (N_delta) until the caps are reached.
            learn_inducing: move the basis locations (default: yes unless bases = data).
            init_hyperparameters: if > 0, first fit the hyperparameters by the exact marginal
                likelihood (L-BFGS) of a random data subset of this size, O(size^3), and re-solve
                the closed-form warm start of ``a, L``; a common SVGP initialisation that spares
                Adam the slow joint drift of hyperparameters and coefficients.
            refresh: finish by re-solving ``a`` and ``B`` at their closed-form Gaussian optimum
                for the trained hyperparameters and bases (on ``warm_start_points`` data points,
                O(points * M_alpha^2 + M_alpha^3)); Adam converges slowly in the raw mean-only
                coefficients when ``K_alpha`` is ill-conditioned (the paper's Appendix A.1).
            timeout_sec: wall-clock budget for the optimiser (Adam stops after the step that
                exceeds it; ``self.last_fit_steps`` records the Adam steps taken), e.g. to
                compare models at equal training time.
        """
        if self.batch_shape != torch.Size():
            raise ValueError("fit() is for a single model, not a fantasy/batched one.")
        if method is None:
            method = "auto" if (lr is None and self._gaussian() and max_iter > 0) else "adam"
        if method not in ("auto", "adam", "lbfgs"):
            raise ValueError(f"Unknown fit method {method!r}; use 'auto', 'adam' or 'lbfgs'.")
        if method == "auto" and not self._gaussian():
            raise ValueError("fit(method='auto') needs a Gaussian likelihood; use 'adam'.")
        lr = 0.01 if lr is None else float(lr)
        self.site_Q, self.site_s = None, None
        if restandardize and self.num_data > 1 and self._gaussian():
            self._restandardize()
        if method == "auto":
            return self._fit_auto(max_iter, train_hyperparameters, timeout_sec)
        bases_are_data = self._bases_are_data()
        grown = self.num_beta > self.num_cov_bases or self.num_alpha > self.num_mean_bases
        if compress and grown:
            with torch.no_grad():
                self._compress()
            bases_are_data = False
        if init_hyperparameters > 0:
            self._init_hyperparameters(init_hyperparameters, bases_are_data)
        if learn_inducing is None:
            learn_inducing = not bases_are_data
        # Training coordinates: the covariance-basis block is whitened by R = chol(K_beta), i.e.
        # L = R^{-T} L0 and a_beta = R^{-T} a0 (the paper's Appendix A.1 "full preconditioner",
        # affordable since M_beta is small); without it Adam is very slow and unstable because
        # B and a_beta carry entries of size cond(K_beta). The mean-only coefficients stay raw
        # (their Jacobi preconditioner is the identity for stationary kernels).
        with torch.no_grad():
            R = self._chol_K(self.beta_points)
            L0 = R.transpose(-1, -2) @ self.L
            a0 = (R.transpose(-1, -2) @ self.a_beta.unsqueeze(-1)).squeeze(-1)
        var = {
            "beta": self.beta_points.detach().clone().requires_grad_(learn_inducing),
            "alpha": self.alpha_points.detach().clone().requires_grad_(learn_inducing),
            "L0": L0.clone().requires_grad_(True),
            "a0": a0.clone().requires_grad_(True),
            "a_alpha": self.a_alpha.detach().clone().requires_grad_(True),
        }
        hyper = {}
        if train_hyperparameters:
            names = {id(p) for p in self.hyperparameters()}
            hyper = {n: p for n, p in self.named_parameters() if p.requires_grad and id(p) in names}
        n = self.num_data
        gen = torch.Generator().manual_seed(self.seed + 7919 * n)

        def unwhiten() -> tuple[Tensor, Tensor]:
            R = self._chol_K(var["beta"])
            L = solve_lower_transpose(R, var["L0"])
            a_b = solve_lower_transpose(R, var["a0"].unsqueeze(-1)).squeeze(-1)
            return L, a_b

        def loss(idx: Tensor | None) -> Tensor:
            L, a_b = unwhiten()
            a = torch.cat([a_b, var["a_alpha"]], dim=-1)
            Z = torch.cat([var["beta"], var["alpha"]], dim=-2)
            elbo = self.elbo(idx, num_kl_columns, gen, beta=var["beta"], L=L, a=a, Z=Z)
            return -(elbo + self._log_prior()) / n

        self.train()
        try:
            if method == "lbfgs":
                params = {**{k: v for k, v in var.items() if v.requires_grad}, **hyper}
                closure = ForwardBackwardClosure(forward=lambda: loss(None), parameters=params)
                scipy_minimize(closure=closure, parameters=params, bounds=self._bounds(params),
                               options={"maxiter": max_iter}, timeout_sec=timeout_sec)
            elif method == "adam":
                lr_v = 0.1 * lr if lr_variational is None else lr_variational
                self._adam(var, hyper, loss, max_iter, lr, lr_v, batch_size, grow, gen, timeout_sec)
            else:
                raise ValueError(f"Unknown fit method {method!r}; use 'adam' or 'lbfgs'.")
        finally:
            self.eval()
        with torch.no_grad():
            if bases_are_data and not learn_inducing and self._gaussian():
                self._set_exact_state(self.train_X)
            else:
                L, a_b = unwhiten()
                self.set_variational_parameters(var["beta"], L, a_b, var["alpha"], var["a_alpha"])
                if refresh and self._gaussian():
                    self._warm_start(self.beta_points, self.alpha_points)
        self.invalidate_caches()
        self.ensure_caches()
        return self

    def _fit_auto(self, max_iter: int, train_hyperparameters: bool, timeout_sec) -> Self:
        r"""The default fit (see :meth:`fit`): exact-marginal-likelihood hyperparameters on (a
        subset of) the held data, bases re-selected by pivoted Cholesky, closed-form ``a, B``."""
        n = self.num_data
        beyond_subset = n > max(self.exact_fit_points, self.num_cov_bases)
        # Once refined on the collapsed bound, later refits start from there: the subset's
        # exact fit would only pull the hyperparameters back (and double a stream refit's cost).
        if train_hyperparameters and not (beyond_subset and self.collapsed_fit is not None):
            self._exact_hyperparameters(self.exact_fit_points, max_iter, timeout_sec)
        if train_hyperparameters and beyond_subset:
            # The subset's exact-GP hyperparameters suit an exact GP on that subset (short
            # lengthscales in many dimensions), not the sparse model: with them the prediction
            # is far from every basis and its variance falls back to the prior (pol, 26 inputs,
            # 1,000 points: mean z^2 = 0.10, test NLL +0.7 nats above a t-SVGP). Refine them on
            # the sparse model's own bound over the chosen bases (collapsed, see
            # :meth:`_collapsed_hyperparameters`), then re-select the bases.
            with torch.no_grad():
                beta, alpha = self._select_bases()
            self._collapsed_hyperparameters(torch.cat([beta, alpha], dim=-2), max_iter,
                                            timeout_sec)
            self.collapsed_fit = torch.ones((), **self._dtype_device)
        with torch.no_grad():
            if n <= self.num_cov_bases:
                self._set_exact_state(self.train_X)
                self.site_Q, self.site_s = None, None
            else:
                beta, alpha = self._select_bases()
                self._set_sites(beta, alpha)
        self.last_fit_steps = 0
        return self

    def _select_bases(self, pool_size: int = 4096) -> tuple[Tensor, Tensor]:
        r"""``num_mean_bases`` held points (from a random pool of at most ``pool_size``) chosen by
        pivoted Cholesky of the kernel (greedy largest residual variance): the first
        ``num_cov_bases`` are the covariance bases, the rest mean-only bases."""
        n = self.num_data
        pool = torch.randperm(n, generator=self._generator)[: min(n, pool_size)]
        Xp = self.train_X[pool]
        with torch.no_grad():
            chosen = pivoted_cholesky_select(
                None,
                self.num_mean_bases,
                diag=self.covar_module(Xp, diag=True),
                row=lambda i: self.covar_module(Xp[i : i + 1], Xp).to_dense().squeeze(-2),
            )
        Z = Xp[chosen]
        return Z[: self.num_cov_bases], Z[self.num_cov_bases :]

    def _exact_hyperparameters(self, size: int, max_iter: int, timeout_sec) -> None:
        r"""L-BFGS-B on the exact GP marginal likelihood (plus hyperpriors) of a random subset of
        at most ``size`` held points (all of them when n is smaller), warm-started."""
        from bo_online.models.exact import OnlineExactGP

        n = self.num_data
        idx = torch.randperm(n, generator=self._generator)[: min(size, n)]
        X, Y = self.train_X[idx], self.train_y[idx].unsqueeze(-1)
        if self.fixed_noise:
            sub = OnlineExactGP(X, Y, train_Yvar=self.train_noise[idx].unsqueeze(-1),
                                covar_module=self.covar_module, standardize=False)
        else:
            sub = OnlineExactGP(X, Y, covar_module=self.covar_module, likelihood=self.likelihood,
                                standardize=False)
        sub.mean_module = self.mean_module
        names = {id(p) for p in self.hyperparameters()}
        params = {k: p for k, p in self.named_parameters() if p.requires_grad and id(p) in names}
        # OnlineExactGP.marginal_log_likelihood(include_priors=True) needs ``named_priors``, which
        # OnlineModel lacks (torch Module, not a GPyTorch one): add the priors here instead, and
        # pass the constraint bounds (BoTorch's default constraints are untransformed).
        closure = ForwardBackwardClosure(
            forward=lambda: -(sub.marginal_log_likelihood(include_priors=False)
                              + self._log_prior() / X.shape[0]),
            parameters=params,
        )
        self.train()
        try:
            scipy_minimize(closure=closure, parameters=params, bounds=self._bounds(params),
                           options={"maxiter": max_iter}, timeout_sec=timeout_sec)
        finally:
            self.eval()

    def collapsed_bound(self, Z: Tensor, idx: Tensor | None = None) -> Tensor:
        r"""The collapsed bound of Titsias ("Variational learning of inducing variables in sparse
        Gaussian processes", AISTATS 2009) of the held data (rows ``idx``, default all) for
        inducing inputs ``Z`` (``M x d``) at the current hyperparameters (differentiable in
        them), O(|idx| M^2)::

            log N(y | c, K_XZ K_Z^-1 K_ZX + N) - tr(N^-1 (K_XX - K_XZ K_Z^-1 K_ZX)) / 2

        ``N``: the noise (the likelihood's, or the fixed per-point noises); a jitter of 1e-6 is
        added to ``K_Z``. Standardised units, scalar tensor."""
        idx = torch.arange(self.num_data) if idx is None else idx
        X, y = self.train_X[idx], self.train_y[idx]
        eye = torch.eye(Z.shape[-2], dtype=Z.dtype, device=Z.device)
        noise = self._train_noise_diag(idx)  # |idx|
        L_Z = psd_cholesky(self.covar_module(Z).to_dense() + 1e-6 * eye)
        A = solve_lower(L_Z, self.covar_module(Z, X).to_dense()) * noise.rsqrt()  # M x |idx|
        L_B = psd_cholesky(eye + A @ A.transpose(-1, -2))
        r = (y - self.mean_module.constant) * noise.rsqrt()
        c = solve_lower(L_B, (A @ r).unsqueeze(-1)).squeeze(-1)
        # Matrix determinant lemma and Woodbury on N^-1/2 (Q + N) N^-1/2 = I + A^T A.
        return (
            -0.5 * X.shape[0] * math.log(2 * math.pi) - L_B.diagonal().log().sum()
            - 0.5 * noise.log().sum() - 0.5 * (r @ r) + 0.5 * (c @ c)
            - 0.5 * (self.covar_module(X, diag=True) / noise).sum() + 0.5 * (A * A).sum()
        )

    def _collapsed_hyperparameters(self, Z: Tensor, max_iter: int, timeout_sec,
                                   size: int = 2048) -> None:
        r"""L-BFGS-B on :meth:`collapsed_bound` for the bases ``Z`` (fixed) over a random subset
        of at most ``size`` held points (plus the hyperpriors), warm-started."""
        n = self.num_data
        idx = torch.randperm(n, generator=self._generator)[: min(size, n)]
        names = {id(p) for p in self.hyperparameters()}
        params = {k: p for k, p in self.named_parameters() if p.requires_grad and id(p) in names}
        loss = lambda: -(self.collapsed_bound(Z, idx) + self._log_prior()) / idx.shape[0]  # noqa
        self.train()
        try:
            scipy_minimize(closure=ForwardBackwardClosure(forward=loss, parameters=params),
                           parameters=params, bounds=self._bounds(params),
                           options={"maxiter": max_iter}, timeout_sec=timeout_sec)
        finally:
            self.eval()

    def marginal_log_likelihood(self, include_priors: bool = True) -> Tensor:
        r"""Per point: the exact GP log marginal likelihood of all held data under this model's
        kernel, mean and noise (plus log priors / n), i.e. the objective of the default fit
        while ``n <= exact_fit_points``. O(n^3): the loops call it only at small n, to choose
        between a warm-started refit and a fit from the defaults."""
        from bo_online.models.exact import OnlineExactGP

        X, Y = self.train_X, self.train_y.unsqueeze(-1)
        if self.fixed_noise:
            sub = OnlineExactGP(X, Y, train_Yvar=self.train_noise.unsqueeze(-1),
                                covar_module=self.covar_module, standardize=False)
        else:
            sub = OnlineExactGP(X, Y, covar_module=self.covar_module, likelihood=self.likelihood,
                                standardize=False)
        sub.mean_module = self.mean_module
        mll = sub.marginal_log_likelihood(include_priors=False)
        return mll + self._log_prior() / X.shape[0] if include_priors else mll

    def _init_hyperparameters(self, size: int, bases_are_data: bool) -> None:
        r"""Exact-GP marginal likelihood on a random subset (shares this model's kernel,
        likelihood and mean modules), then the closed-form variational warm start."""
        self._exact_hyperparameters(size, max_iter=200, timeout_sec=None)
        with torch.no_grad():
            if bases_are_data and self._gaussian():
                self._set_exact_state(self.train_X)
            else:
                self._warm_start(self.beta_points, self.alpha_points)

    def _log_prior(self) -> Tensor:
        """Sum of the hyperparameter log priors (GPyTorch modules' registered priors)."""
        total = torch.zeros((), **self._dtype_device)
        for child in (self.covar_module, self.likelihood, self.mean_module):
            if hasattr(child, "named_priors"):
                for _, module, prior, closure, _ in child.named_priors():
                    total = total + prior.log_prob(closure(module)).sum()
        return total

    def _bounds(self, params: dict[str, Tensor]) -> dict[str, tuple[float | None, float | None]]:
        r"""L-BFGS-B bounds for parameters whose constraint is not enforced by a transform."""
        out = {}
        for prefix in ("covar_module", "likelihood", "mean_module"):
            child = getattr(self, prefix)
            if not hasattr(child, "named_parameters_and_constraints"):
                continue
            for name, _, constraint in child.named_parameters_and_constraints():
                full = f"{prefix}.{name}"
                if full in params and constraint is not None and not constraint.enforced:
                    lb = float(constraint.lower_bound.min())
                    ub = float(constraint.upper_bound.max())
                    out[full] = (
                        lb if math.isfinite(lb) else None, ub if math.isfinite(ub) else None
                    )
        return out

    @torch.no_grad()
    def _clamp_to_constraints(self) -> None:
        r"""Project parameters with untransformed constraints (BoTorch's defaults use
        ``transform=None``) back into their bounds after an Adam step, as BoTorch's own
        optimisers do through parameter bounds."""
        for child in (self.covar_module, self.likelihood, self.mean_module):
            if not hasattr(child, "named_parameters_and_constraints"):
                continue
            for _, param, constraint in child.named_parameters_and_constraints():
                if constraint is not None and not constraint.enforced:
                    lb = float(constraint.lower_bound.min())
                    param.clamp_(lb, float(constraint.upper_bound.max()))

    def _adam(
        self, var, hyper, loss, max_iter, lr, lr_v, batch_size, grow, gen, timeout_sec
    ) -> None:
        r"""Adam with the paper's step schedule and online basis growth (Algorithm 1)."""
        import time

        coef = [var[k] for k in ("L0", "a0", "a_alpha")]
        locs = [var[k] for k in ("beta", "alpha") if var[k].requires_grad]
        opt = torch.optim.Adam(
            [{"params": coef, "lr": lr_v}, {"params": locs + list(hyper.values()), "lr": lr}]
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1.0 + 0.1 * math.sqrt(t)))
        n = self.num_data
        start = time.monotonic()
        self.last_fit_steps = 0  # Adam steps taken (fewer than max_iter when timeout_sec hit)
        for t in range(max_iter):
            idx = None if n <= batch_size else torch.randperm(n, generator=gen)[:batch_size]
            if grow > 0:
                self._grow(var, opt, idx, grow, gen)
            opt.zero_grad()
            value = loss(idx)
            value.backward()
            opt.step()
            self._clamp_to_constraints()
            sched.step()
            self.last_fit_steps = t + 1
            if timeout_sec is not None and time.monotonic() - start > timeout_sec:
                break

    def _grow(self, var, opt, idx, grow, gen) -> None:
        r"""Add up to ``grow`` bases of each kind from the minibatch while below the caps; new
        ``L`` entries are ``N^{-1/2}`` (never zero), new coefficients zero. Adam's moments are
        padded with zeros so the optimiser state carries over."""
        pool = idx if idx is not None else torch.arange(self.num_data)
        pool = pool[torch.randperm(pool.shape[0], generator=gen)]
        n_b = min(grow, self.num_cov_bases - var["beta"].shape[-2])
        m_now = var["beta"].shape[-2] + var["alpha"].shape[-2]
        n_a = min(grow, self.num_mean_bases - m_now - max(n_b, 0))
        if n_b > 0:
            pick = pool[:n_b]
            noise = self._train_noise_diag(pick).detach()
            self._extend(var, opt, "beta", torch.cat([var["beta"].detach(), self.train_X[pick]]))
            m = var["L0"].shape[-1]
            Lnew = torch.zeros(m + n_b, m + n_b, **self._dtype_device)
            Lnew[:m, :m] = var["L0"].detach()
            Lnew[m:, m:] = torch.diag_embed(noise.rsqrt())
            self._extend(var, opt, "L0", Lnew)
            zeros = torch.zeros(n_b, **self._dtype_device)
            self._extend(var, opt, "a0", torch.cat([var["a0"].detach(), zeros]))
            pool = pool[n_b:]
        if n_a > 0:
            pick = pool[:n_a]
            self._extend(var, opt, "alpha", torch.cat([var["alpha"].detach(), self.train_X[pick]]))
            zeros = torch.zeros(pick.shape[0], **self._dtype_device)
            self._extend(var, opt, "a_alpha", torch.cat([var["a_alpha"].detach(), zeros]))

    @staticmethod
    def _extend(var: dict, opt: torch.optim.Optimizer, key: str, value: Tensor) -> None:
        old = var[key]
        new = value.detach().clone().requires_grad_(old.requires_grad)
        var[key] = new
        if not old.requires_grad:
            return
        for group in opt.param_groups:
            for i, p in enumerate(group["params"]):
                if p is old:
                    group["params"][i] = new
        state = opt.state.pop(old, None)
        if state:
            padded = {}
            for k, v in state.items():
                if torch.is_tensor(v) and v.shape == old.shape:
                    z = torch.zeros_like(new)
                    z[tuple(slice(0, s) for s in old.shape)] = v
                    padded[k] = z
                else:
                    padded[k] = v
            opt.state[new] = padded

    def _bases_are_data(self) -> bool:
        return (
            self.alpha_points.shape[-2] == 0
            and self.beta_points.shape == self.train_X.shape
            and torch.equal(self.beta_points, self.train_X)
            and self.num_data <= self.num_cov_bases
        )

    def _compress(self) -> None:
        r"""Back to the caps: if all data fit in the covariance bases, bases = data (exact GP);
        otherwise keep a pivoted-Cholesky subset of ``beta`` and of the remaining bases for
        ``alpha``, then the closed-form warm start."""
        if self.num_data <= self.num_cov_bases:
            self._set_exact_state(self.train_X)
            return
        K = self.covar_module(self.beta_points).to_dense()
        keep = pivoted_cholesky_select(K, self.num_cov_bases)
        mask = torch.ones(self.num_beta, dtype=torch.bool)
        mask[keep] = False
        beta = self.beta_points[keep]
        rest = torch.cat([self.beta_points[mask], self.alpha_points], dim=-2)
        room = self.num_mean_bases - self.num_cov_bases
        if rest.shape[-2] > room:
            rest = rest[pivoted_cholesky_select(self.covar_module(rest).to_dense(), room)]
        self._warm_start(beta, rest)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        r"""As :meth:`OnlineModel.load_state_dict`; a saved state without site statistics (not in
        fold mode) leaves this model without them too."""
        for name in ("site_Q", "site_s", "collapsed_fit"):
            if name not in state_dict:
                self._buffers[name] = None
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _restandardize(self) -> None:
        y = self.train_targets
        mean, std = y.mean(-1, keepdim=True).reshape(1), y.std(-1).reshape(1)
        std = torch.where(std > 0, std, torch.ones_like(std))
        ratio = self.outcome_std / std
        with torch.no_grad():
            # Keep the mean in user units: f_new = (f_old * s_old + m_old - m_new) / s_new.
            self.mean_module.constant.copy_(
                ((self.mean_module.constant * self.outcome_std + self.outcome_mean - mean) / std)
                .reshape(self.mean_module.constant.shape)
            )
        self.a_beta, self.a_alpha = self.a_beta * ratio, self.a_alpha * ratio
        if self.train_noise is not None:
            self.train_noise = self.train_noise * ratio**2
        self.train_y = (y - mean) / std
        self.outcome_mean, self.outcome_std = mean, std
        self.invalidate_caches()
