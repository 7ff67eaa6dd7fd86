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

    def _bordered_parts(self, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""For a model holding a bordered state (a fantasy model, see
        :class:`~bo_online.models.decoupled.conditioning.BorderedState`), at ``X`` (``batch_X x
        k x d``): ``(V0, V1, mean)`` with ``cov = k - V0^T V0 - V1^T V1``, the blocks of
        ``chol_H'^{-1} L'^T K_{beta',X}``: ``V0 = C0^{-1} L0^T K_{beta0,X}`` (``batch_X x M_b x
        k``, batched like ``X`` and the parent, not like the fantasies) and ``V1 = D^{-1} (r
        K_{X*,X} - S_t V0)`` (``batch x q x k``); and the mean ``c + a_0^T K_{beta0,X} + a_*^T
        K_{X*,X} + k_{X,alpha} a_alpha`` (``a_beta = [a_0, a_*]``) from the same kernel blocks,
        so no ``batch x k x (M_b + q)`` block against the grown bases is formed."""
        st = self.__dict__["_bordered"]
        m = st.L0.shape[-1]
        K_old = self.covar_module(st.beta0, X).to_dense()  # batch_X x M_b x k
        V0 = solve_lower(st.C0, matmul_folded(st.L0.transpose(-1, -2), K_old))
        K_new = self.covar_module(self.beta_points[..., m:, :], X).to_dense()  # batch x q x k
        V1 = solve_lower(st.D, st.r.unsqueeze(-1) * K_new - st.S_t @ V0)
        a = self.a_beta.unsqueeze(-2)  # sample x batch x 1 x (M_b + q)
        mean = self.mean_module.constant + (
            (a[..., :m] @ K_old).squeeze(-2) + (a[..., m:] @ K_new).squeeze(-2)
        )
        if self.alpha_points.shape[-2] > 0:
            mean = mean + self.covar_module(X, self.alpha_points).to_dense() @ self.a_alpha
        return V0, V1, mean

    def _latent_posterior_bordered(self, X: Tensor) -> MultivariateNormal:
        r"""Posterior of a fantasy model at ``X`` (``batch_X x k x d``) from its bordered state:
        the parent's part ``k(X, X) - V0^T V0`` is formed once per element of ``X``'s batch (not
        per fantasy), dense up to ``dense_posterior_max_q`` points, the new points' part lazily
        (memory O(batch q k) beyond the parent's; qNIPV's shared integration points against
        ``b`` fantasies cost ``b q k``, not ``b (M_b + q)^2``)."""
        V0, V1, mean = self._bordered_parts(X)
        k = X.shape[-2]
        batch = torch.broadcast_shapes(mean.shape[:-1], V1.shape[:-2], V0.shape[:-2])
        if k > self.dense_posterior_max_q:  # many points: a lazy covariance (docs/contract.md)
            covar = self.covar_module(X)
            for W in (V0, V1):
                Wt = W.transpose(-1, -2).expand(*batch, k, W.shape[-2])
                covar = covar + MatmulLinearOperator(Wt, W.expand(*batch, *W.shape[-2:])) * -1.0
            return MultivariateNormal(mean.expand(*batch, k), covar)
        shared = self.covar_module(X).to_dense() - V0.transpose(-1, -2) @ V0
        V1 = V1.expand(*batch, *V1.shape[-2:])
        covar = DenseLinearOperator(shared.expand(*batch, k, k)) + (
            MatmulLinearOperator(V1.transpose(-1, -2), V1) * -1.0
        )
        return MultivariateNormal(mean.expand(*batch, k), covar)

    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        if self.beta_points.dim() == 2 and self.a_beta.dim() == 1:
            return self._latent_posterior_folded(X)
        if self.__dict__.get("_bordered") is not None:
            return self._latent_posterior_bordered(X)
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
