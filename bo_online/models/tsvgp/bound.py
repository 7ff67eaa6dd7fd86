r"""The variational bound of t-SVGP (the M-step's objective) and what q(u) is.

:meth:`~TSVGPBoundMixin.elbo` rebuilds q(u) from the frozen per-point sites with the current
hyperparameters and inducing inputs -- the tighter bound of Adam, Chang, Khan & Solin, "Dual
Parameterization of Sparse Variational Gaussian Processes", NeurIPS 2021, arXiv:2111.03412,
Eq. 15 -- which for a Gaussian likelihood is the collapsed SGPR bound (Titsias 2009).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from bo_online.linalg import cholesky_logdet, psd_cholesky, solve_lower
from bo_online.models.fitting import sum_log_priors
from bo_online.models.tsvgp.caches import blockwise

__all__ = ["TSVGPBoundMixin", "whitened_kl"]


def whitened_kl(L_B: Tensor, v: Tensor) -> Tensor:
    r"""KL[q(u) || p(u)] = 1/2 (logdet B + tr B^-1 - m + |v|^2) (docs/math.md §2, whitened).

    Args:
        L_B: ``batch x m x m`` lower Cholesky factor of ``B = I + L_K^-1 Lam L_K^-T``.
        v: ``batch x m``, ``B^-1 lam_w``.

    Returns:
        ``batch`` KL divergences.
    """
    m = L_B.shape[-1]
    eye = torch.eye(m, dtype=L_B.dtype, device=L_B.device)
    tr_inv = solve_lower(L_B, eye).pow(2).sum((-1, -2))
    return 0.5 * (cholesky_logdet(L_B) + tr_inv - m + v.pow(2).sum(-1))


class TSVGPBoundMixin:
    r"""ELBO, marginal-likelihood objective, log prior, KL and q(u) of
    :class:`~bo_online.models.tsvgp.TSVGP`."""

    def elbo(self, frozen_sites: bool = True) -> Tensor:
        r"""The ELBO (sum over points) of q rebuilt from the per-point sites with the CURRENT
        hyperparameters and inducing points -- the tighter bound of the paper's Eq. 15 --,
        differentiable in them, O(n m^2 + m^3) time; its memory (with the autograd graph) grows
        with n only through the per-point sites, the sums running over row blocks. For a
        Gaussian likelihood the sites are re-derived in closed form (exact E-step), so this is
        the collapsed SGPR bound, computed in one pass over the points
        (:meth:`_collapsed_bound`).

        Returns:
            scalar ``sum_i E_q[log p(y_i | f_i)] - KL[q(u) || p(u)]`` (standardised units).
        """
        if self.batch_shape != torch.Size():
            raise ValueError("elbo() is for a single model, not a fantasy/batched one.")
        X, y, noise = self.train_X, self.train_y, self.train_noise
        L_K = self._kuu_chol()
        if self.likelihood.conjugate:
            return self._collapsed_bound(L_K, X, y, noise)
        return self._sites_elbo(L_K, X, y, noise, *self.sites)

    def _sites_elbo(
        self, L_K: Tensor, X: Tensor, y: Tensor, noise: Tensor | None, g1: Tensor, beta: Tensor
    ) -> Tensor:
        r"""The ELBO of q built from the sites ``g1, beta`` (``(out x) n``) at the points ``X``
        (``n x d``, targets ``y``): the summaries in one pass over the row blocks, then the
        expected log-likelihood under the marginals in a second, minus the KL."""
        blocks = self._row_blocks(X.shape[-2])
        if len(blocks) == 1:  # all rows at once: the whitened A is shared by both sums
            A = self._whiten(L_K, X)
            lam_w, P = self._summaries(A, g1, beta)
            L_B, v = self._factor(P, lam_w)
            ell = self._expected_log_lik(A, L_B, v, X, y, noise)
        else:  # row blocks (see caches._row_blocks): memory flat in n, A computed per pass
            lam_w, P = self._site_summaries(L_K, X, g1, beta)
            L_B, v = self._factor(P, lam_w)

            def block(
                L_K: Tensor, L_B: Tensor, v: Tensor, Xb: Tensor, yb: Tensor, nb: Tensor | None
            ) -> Tensor:
                return self._expected_log_lik(self._whiten(L_K, Xb), L_B, v, Xb, yb, nb)

            params = [p for p in self.parameters() if p.requires_grad]
            ell = sum(
                blockwise(
                    block,
                    params,
                    L_K,
                    L_B,
                    v,
                    X[s],
                    y[..., s],
                    None if noise is None else noise[..., s],
                )
                for s in blocks
            )
        return ell - self._kl(L_B, v).sum()  # summed over independent outputs

    def _collapsed_bound(self, L_K: Tensor, X: Tensor, y: Tensor, noise: Tensor | None) -> Tensor:
        r"""The ELBO for a Gaussian likelihood in one pass over the points: Titsias' collapsed
        bound written with the whitened summaries (docs/math.md §2).

        With exact sites ``beta_i = 1 / s2_i``, ``g1_i = r_i / s2_i`` (``r = y - c``), ``A`` the
        whitened cross-covariances, ``P = A diag(beta) A^T``, ``lam_w = A g1``, ``B = I + P`` and
        ``v = B^-1 lam_w``, the matrix determinant lemma and Woodbury give
        ``log N(r | 0, A^T A + S) = -1/2 (n log 2 pi + sum log s2_i + log det B + r^T S^-1 r
        - lam_w^T v)`` and the trace term is ``-1/2 (sum_i beta_i k_ii - tr P)``. Only ``P`` and
        ``lam_w`` need ``A``, so each row block is whitened once (and once more when the backward
        pass recomputes it), where the expected log-likelihood of :meth:`elbo`'s general path
        needs a second pass over ``A`` after ``B`` is known: half the work of an M-step
        evaluation.

        Args:
            L_K: ``(out x) m x m`` Cholesky factor of ``K_uu``.
            X: ``n x d`` inputs, ``y``: ``(out x) n`` targets (standardised), ``noise``: optional
                ``(out x) n`` per-point noise variances.

        Returns:
            the scalar bound, summed over independent outputs.
        """
        g1, beta = self._exact_sites(y, noise)
        lam_w, P = self._site_summaries(L_K, X, g1, beta)
        L_B, v = self._factor(P, lam_w)
        r = y - self._const()
        s2 = self.likelihood._var(self._point_noise(y.shape, noise)).expand(y.shape)
        kdiag = self.covar_module(self._kx(X), diag=True)
        quad = (r * g1).sum(-1) - (lam_w * v).sum(-1)
        trace = (beta * kdiag).sum(-1) - torch.diagonal(P, dim1=-2, dim2=-1).sum(-1)
        log_2pi = y.shape[-1] * math.log(2 * math.pi)
        logdets = s2.log().sum(-1) + cholesky_logdet(L_B)
        return -0.5 * (log_2pi + logdets + quad + trace).sum()

    def _expected_log_lik(
        self, A: Tensor, L_B: Tensor, v: Tensor, X: Tensor, y: Tensor, noise: Tensor | None
    ) -> Tensor:
        r"""``sum_i E_q[log p(y_i | f_i)]`` over points ``X`` (``q x d``) with whitened ``A``
        (``(out x) m x q``), for q given by ``L_B`` and ``v``."""
        mean_h, var = self._marginals(A, L_B, v, X)
        return self.likelihood.expected_log_prob(y, self._const() + mean_h, var, noise).sum()

    def marginal_log_likelihood(self, include_priors: bool = True) -> Tensor:
        r"""The fit's objective per point: ``(elbo() + log priors) / n`` (standardised units).

        For a Gaussian likelihood with every data point among the inducing inputs (the default
        fit while ``n <= m``) this is the exact GP's log marginal likelihood, so it is comparable
        with :meth:`bo_online.models.exact.OnlineExactGP.marginal_log_likelihood`. Where the
        model is not the exact GP, the loops use it at small n to choose between a warm-started
        refit and a fit from the defaults."""
        obj = self.elbo()
        if include_priors:
            obj = obj + self.log_prior()
        return obj / self._n

    def log_prior(self) -> Tensor:
        r"""Sum of the log densities of the priors on the kernel, mean and likelihood (every
        child module: ``OnlineModel`` is not itself a prior-carrying GPyTorch module)."""
        return sum_log_priors(self.children(), self.inducing_points)

    #: KL[q(u) || p(u)] from ``L_B`` and ``v`` (see :func:`whitened_kl`)
    _kl = staticmethod(whitened_kl)

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
