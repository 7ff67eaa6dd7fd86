r"""The decoupled SVGP's training objectives: the ELBO (expected log likelihood minus KL, the
paper's Eqs. 9-10), Titsias's collapsed bound for fixed bases, and the exact GP marginal
likelihood of the held data that the default fit maximises at small n."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DiagLinearOperator
from torch import Tensor

from bo_online.linalg import psd_cholesky, solve_lower
from bo_online.models.base import OnlineModel

if TYPE_CHECKING:
    from bo_online.models.exact import OnlineExactGP

__all__ = ["DecoupledObjectivesMixin"]


class DecoupledObjectivesMixin:
    r"""Objectives of :class:`~bo_online.models.decoupled.DecoupledSVGP` (standardised units)."""

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
            L: covariance factor (default: the model's). With both defaults ``H`` is the
                model's own, ``K_beta + 1e-8 I`` in it in fold mode (see ``_whitened``).
            a: all mean coefficients (default: the model's).
            Z: all mean bases ``[beta; alpha]`` (default: the model's).
            num_columns: if given, ``a^T K_Z a`` is estimated without bias from that many
                columns drawn without replacement, ``(M/s) a^T K_{Z,S} a_S`` (O(M_alpha s)).
            columns: explicit column indices ``S`` for that estimate (overrides the draw).
        """
        jitter = self._state_jitter() if beta is None and L is None else 0.0
        beta = self.beta_points if beta is None else beta
        L = self.L if L is None else L
        if a is None:
            a = torch.cat([self.a_beta, self.a_alpha.expand(*self.a_beta.shape[:-1], -1)], dim=-1)
            Z = torch.cat([self.beta_points, self.alpha_points], dim=-2)
        chol_H = self._chol_H(beta, L, jitter)
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
        jitter = self._state_jitter() if beta is None and L is None else 0.0
        beta = self.beta_points if beta is None else beta
        L = self.L if L is None else L
        if a is None:
            a = torch.cat([self.a_beta, self.a_alpha], dim=-1)
            Z = torch.cat([self.beta_points, self.alpha_points], dim=-2)
        chol_H = self._chol_H(beta, L, jitter)
        mean = self.mean_module.constant + self.covar_module(X, Z).to_dense() @ a
        V = solve_lower(chol_H, L.transpose(-1, -2) @ self.covar_module(beta, X).to_dense())
        var = (self.covar_module(X, diag=True) - V.pow(2).sum(-2)).clamp_min(1e-12)
        if self._gaussian():
            # Given, else the likelihood's: the base fallback, not DecoupledSVGP's override (its
            # noise > 0 check is for the precisions of conditioning, not this expectation).
            noise = OnlineModel._noise_of_points(self, X, noise)
            return -0.5 * (torch.log(2 * math.pi * noise) + ((y - mean).pow(2) + var) / noise).sum(
                -1
            )
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
            -0.5 * X.shape[0] * math.log(2 * math.pi)
            - L_B.diagonal().log().sum()
            - 0.5 * noise.log().sum()
            - 0.5 * (r @ r)
            + 0.5 * (c @ c)
            - 0.5 * (self.covar_module(X, diag=True) / noise).sum()
            + 0.5 * (A * A).sum()
        )

    def _exact_gp_on(self, idx: Tensor | None) -> OnlineExactGP:
        r"""An exact GP on the held points ``idx`` (all if None; standardised units) sharing this
        model's kernel, mean and likelihood (or its fixed per-point noise), so its marginal
        likelihood is differentiable in this model's hyperparameters."""
        from bo_online.models.exact import OnlineExactGP

        rows = slice(None) if idx is None else idx
        X, Y = self.train_X[rows], self.train_y[rows].unsqueeze(-1)
        if self.fixed_noise:
            sub = OnlineExactGP(
                X,
                Y,
                train_Yvar=self.train_noise[rows].unsqueeze(-1),
                covar_module=self.covar_module,
                standardize=False,
            )
        else:
            sub = OnlineExactGP(
                X, Y, covar_module=self.covar_module, likelihood=self.likelihood, standardize=False
            )
        sub.mean_module = self.mean_module
        return sub

    def marginal_log_likelihood(self, include_priors: bool = True) -> Tensor:
        r"""Per point: the exact GP log marginal likelihood of all held data under this model's
        kernel, mean and noise (plus log priors / n), i.e. the objective of the default fit
        while ``n <= exact_fit_points``. O(n^3): the loops call it only at small n, where the
        model is not the exact GP, to choose between a warm-started refit and a fit from the
        defaults."""
        X = self.train_X
        mll = self._exact_gp_on(None).marginal_log_likelihood(include_priors=False)
        return mll + self._log_prior() / X.shape[0] if include_priors else mll
