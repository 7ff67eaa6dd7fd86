r"""How the decoupled SVGP predicts from its state: the mean ``c + k_{x,Z} a`` and the covariance
``k(x,x') - V^T V`` with ``V = chol_H^{-1} L^T K_{beta,x}`` (O(M_alpha) and O(M_beta^2) per
point)."""

from __future__ import annotations

import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator, MatmulLinearOperator
from torch import Tensor

from bo_online.linalg import solve_lower

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
