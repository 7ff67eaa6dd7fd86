r"""How the decoupled SVGP predicts from its state: the mean ``c + k_{x,Z} a`` and the covariance
``k(x,x') - V^T V + U^T U`` (O(M_alpha) and O(M_beta^2) per point), where ``V = chol_H^{-1} L^T
K_{beta,x}`` and no ``U`` in general, and in fold mode (the closed-form optimum for fixed bases,
docs/math.md §3) ``V = chol(K_j)^{-1} K_{beta,x}`` and ``U = chol(K_j + P~)^{-1} K_{beta,x}``."""

from __future__ import annotations

import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator, MatmulLinearOperator
from torch import Tensor

from bo_online.linalg import matmul_folded, solve_lower

__all__ = ["DecoupledPredictionMixin"]


class DecoupledPredictionMixin:
    r"""Latent posterior of :class:`~bo_online.models.decoupled.DecoupledSVGP`."""

    #: above this many points per batch the posterior covariance stays a lazy operator, so that
    #: ``.variance`` at many points forms no ``q x q`` matrix (below it a dense one is faster)
    dense_posterior_max_q: int = 512

    def _mean_at(self, X: Tensor) -> Tensor:
        r"""Posterior mean at ``X`` (``batch x q x d``):
        ``c + k_{X,beta} a_beta + k_{X,alpha} a_alpha``."""
        mean = self.mean_module.constant + (
            self.covar_module(X, self.beta_points).to_dense() @ self.a_beta.unsqueeze(-1)
        ).squeeze(-1)
        if self.alpha_points.shape[-2] > 0:
            mean = mean + self.covar_module(X, self.alpha_points).to_dense() @ self.a_alpha
        return mean

    def _whitened(self, X: Tensor) -> tuple[Tensor, Tensor | None]:
        r"""``(V, U)``, each ``batch x M_beta x q`` (``U`` may be ``None``), with ``cov = k - V^T V
        + U^T U`` at ``X``.

        In fold mode ``B = K_j^{-1} P~ K_j^{-1}``, so ``L H^{-1} L^T = (B^{-1} + K_j)^{-1} =
        K_j^{-1} - (K_j + P~)^{-1}`` (docs/math.md §3, with ``K_j`` for ``K_beta`` in ``H``): two
        solves against factors that :meth:`_fold` updates by rank q, so no O(M_beta^3) re-forming
        of ``L`` and ``chol_H`` per update. Otherwise ``V = chol_H^{-1} L^T K_{beta,X}``."""
        K_bX = self.covar_module(self.beta_points, X).to_dense()
        if self._in_fold_mode():
            Rb, _, RC = self._fold_factors()  # float64 for a float32 model (see site_dtype)
            K = K_bX.to(Rb.dtype)
            return solve_lower(Rb, K).to(K_bX.dtype), solve_lower(RC, K).to(K_bX.dtype)
        # Folded: a fantasy model's ``L`` (``b x M_b x M_b``) against ``sample x b`` points is
        # not copied per sample (``torch.matmul`` broadcasting would).
        return solve_lower(self.chol_H, matmul_folded(self.L.transpose(-1, -2), K_bX)), None

    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        if self.beta_points.dim() == 2 and self.a_beta.dim() == 1:
            return self._latent_posterior_folded(X)
        mean = self._mean_at(X)
        V, U = self._whitened(X)
        batch = torch.broadcast_shapes(mean.shape[:-1], V.shape[:-2], X.shape[:-2])
        covar = self.covar_module(X)
        for W, sign in ((V, -1.0), (U, 1.0)):
            if W is not None:
                Wt = W.transpose(-1, -2).expand(*batch, W.shape[-1], W.shape[-2])
                covar = covar + MatmulLinearOperator(Wt, W.expand(*batch, *W.shape[-2:])) * sign
        return MultivariateNormal(mean.expand(*batch, mean.shape[-1]), covar)

    def _latent_posterior_folded(self, X: Tensor) -> MultivariateNormal:
        r"""Posterior of a non-batched model at ``X`` (``batch x q x d``) with the batch folded
        into columns: ``M_beta x (batch * q)`` solves (:meth:`_whitened`), so memory is
        O(batch * q * (M_beta + q)) and no ``M_beta x M_beta`` factor is copied per batch element
        (``solve_triangular`` broadcasting would copy it)."""
        batch, q, d = X.shape[:-2], X.shape[-2], X.shape[-1]
        Xf = X.reshape(-1, d)  # (batch * q) x d
        mean = self._mean_at(Xf).reshape(*batch, q)
        terms = [(W, sign) for W, sign in zip(self._whitened(Xf), (-1.0, 1.0)) if W is not None]
        # Each W: M_beta x (batch * q), viewed M_beta x B x q.
        if q > self.dense_posterior_max_q:  # many points: a lazy covariance (docs/contract.md)
            covar = self.covar_module(X)
            for W, sign in terms:
                Wt = W.reshape(W.shape[0], -1, q).permute(1, 2, 0).reshape(*batch, q, -1)
                covar = covar + MatmulLinearOperator(Wt, Wt.transpose(-1, -2)) * sign
            return MultivariateNormal(mean, covar)
        covar = self.covar_module(X).to_dense()
        for W, sign in terms:
            Wb = W.reshape(W.shape[0], -1, q)
            covar = covar + sign * torch.einsum("mbi,mbj->bij", Wb, Wb).reshape(*batch, q, q)
        # Lazy wrapper: a dense tensor would be Cholesky-factorised at construction.
        return MultivariateNormal(mean, DenseLinearOperator(covar))
