r"""Closed-form conditioning of t-SVGP: new observations are new sites, added to ``B``.

Conditioning on q points adds their sites' whitened columns ``A diag(beta)^1/2`` to
``B = L_B L_B^T``: a conditioned (fantasy) model keeps its parent's ``L_B`` and solves in
Woodbury form, O(m^2 q + S m^2) for S fantasy samples with a Gaussian likelihood; ``update`` (in
place) folds them into the factor, O(m^2 q). Non-Gaussian likelihoods take one E-step at the
current marginal (plus ``condition_steps`` fixed-point steps) for the new sites.
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.sampling.base import MCSampler
from torch import Tensor
from typing_extensions import Self

from bo_online.linalg import LowRankUpdatedCholesky, broadcast_shapes, cholesky_solve

__all__ = ["TSVGPConditioningMixin"]


class TSVGPConditioningMixin:
    r"""``condition_on_observations`` / ``update`` / ``fantasize`` of
    :class:`~bo_online.models.tsvgp.TSVGP` (the ``_condition`` and ``_update`` hooks of
    :class:`~bo_online.models.base.OnlineModel`)."""

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
                beta = 1.0 / lik._var(
                    self._point_noise(torch.Size([*self._out, X.shape[-2]]), None)
                )
            elif noise is not None:  # noise is the same for every sample
                beta = beta[(0,) * (beta.dim() - X.dim() + 1 - len(self._out))]
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
        r"""``v' = B'^-1 (lam_w + A g1)`` from the cached ``v = B^-1 lam_w``, for
        ``B' = B + U U^T``, ``U = A diag(beta)^1/2`` and ``B = L_B L_B^T`` (no pending sites). With
        ``G = B^-1 A`` (two solves with q columns) and ``x = v + G g1``, Woodbury gives
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

            def cat(old: Tensor, new_: Tensor) -> Tensor:
                return torch.cat([old.expand(*batch, old.shape[-1]), new_], -1)

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
        if isinstance(X, Tensor) and X.dim() >= 2 and X.shape[-2] == 0:
            # no points, nothing to sample (the sampler refuses 0 dims): empty observations
            batch = torch.broadcast_shapes(X.shape[:-2], self.batch_shape)
            Y = X.new_empty(*sampler.sample_shape, *batch, 0, self.num_outputs)
            return self.condition_on_observations(X, Y)
        post = self.posterior(X)
        F = sampler(post)  # sample x batch x q x 1, user units
        Fs = self._standardize(F)
        gen = torch.Generator(device="cpu").manual_seed(int(getattr(sampler, "seed", 0) or 0))
        U = torch.rand(Fs.shape, generator=gen, dtype=Fs.dtype).to(Fs.device)
        Ys = self.likelihood.sample_from_uniform(Fs, U)
        Y = Ys * self.outcome_std + self.outcome_mean  # user layout ... x q x m
        return self.condition_on_observations(X, Y.detach())
