r"""The per-point sites of t-SVGP: their storage, the exact Gaussian sites and the E-step.

Every observation ``i`` owns a Gaussian site ``exp(g1_i f_i - beta_i f_i^2 / 2)`` on ``h = f - c``
(standardised units, ``beta_i >= 0``). For a Gaussian likelihood the sites are exact,
``g1 = (y - c)/sigma^2`` and ``beta = 1/sigma^2``; otherwise natural-gradient E-steps move them
(Adam, Chang, Khan & Solin, "Dual Parameterization of Sparse Variational Gaussian Processes",
NeurIPS 2021, arXiv:2111.03412, Eqs. 18, 22-23). The per-point sites are kept (O(n)) so that q(u)
can be re-projected exactly onto any new hyperparameters.
"""

from __future__ import annotations

import torch
from torch import Tensor
from typing_extensions import Self

from bo_online.linalg import LowRankUpdatedCholesky
from bo_online.models.validation import check_finite, whole_number

__all__ = ["TSVGPSitesMixin"]


class TSVGPSitesMixin:
    r"""Per-point data and sites of :class:`~bo_online.models.tsvgp.TSVGP` (buffers ``_X``,
    ``_y``, ``_noise``, ``_g1``, ``_beta`` with spare capacity; ``_c*`` for the points a
    conditioned model adds) and the E-step that moves the sites."""

    def _point_noise(self, n_shape: torch.Size, noise: Tensor | None) -> Tensor | None:
        r"""Gaussian noise variance for sites (``n_shape``, e.g. ``batch x m x n``): per-point if
        given, else the likelihood's; None where the likelihood has no noise of its own."""
        # Not OnlineModel._noise_of_points: sites carry the output dim (per-output noise m x 1
        # is expanded, not squeezed), and fixed-noise / non-Gaussian models get None, not an error.
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

    def set_sites(self, g1: Tensor, beta: Tensor) -> Self:
        r"""Replace the base data's per-point sites (``n`` each, standardised units, ``beta > 0``)
        and rebuild q from them (for tests, warm starts and custom inference loops)."""
        if self.batch_shape != torch.Size():
            raise ValueError("set_sites() is for a single model, not a fantasy/batched one.")
        n = self._n
        g1, beta = torch.as_tensor(g1).to(self._X), torch.as_tensor(beta).to(self._X)
        shape = (*self._out, n)
        if g1.shape != shape or beta.shape != shape:
            raise ValueError(
                f"Sites must have shape {shape}, got {tuple(g1.shape)}, {tuple(beta.shape)}."
            )
        check_finite("g1", g1)
        check_finite("beta", beta)
        if bool((beta < 0).any()):
            raise ValueError("Site precisions beta must be >= 0 (docs/math.md §2 sign convention).")
        self._set_base_sites(g1, beta)
        return self

    def _sites_at_initial_latent(self) -> None:
        r"""Sites linearised at the likelihood's :meth:`~SiteLikelihood.initial_latent` ``f0``
        (a point mass there): ``beta = max(-d2, beta_min)``, ``g1 = beta (f0 - c) + d1`` with
        ``c`` the constant mean; left at the prior where the likelihood gives none."""
        f0 = self.likelihood.initial_latent(self._y[..., : self._n])
        if f0 is None:
            return
        y = self._y[..., : self._n]
        with torch.no_grad():
            beta = (-self.likelihood.d2(y, f0)).clamp_min(self.likelihood.beta_min)
            g1 = beta * (f0 - self._const()) + self.likelihood.d1(y, f0)
            self._set_base_sites(g1, beta)

    def _set_base_sites(self, g1: Tensor, beta: Tensor) -> None:
        with torch.no_grad():
            L_K = self._kuu_chol()
            lam_w, P = self._site_summaries(L_K, self.train_X, g1, beta)
            L_B, v = self._factor(P, lam_w)
        self._g1[..., : self._n], self._beta[..., : self._n] = g1, beta
        self.chol_K, self.lam_w, self.v = L_K, lam_w, v
        self._set_B_factor(LowRankUpdatedCholesky(L_B))
        self._cache_key = self._current_key()

    def _append(self, X: Tensor, y: Tensor, noise: Tensor | None, g1: Tensor, beta: Tensor) -> None:
        n, q = self._n, X.shape[0]
        if n + q > self._X.shape[0]:  # grow the storage geometrically: amortised O(q) appends
            cap = max(2 * self._X.shape[0], n + q)
            self._X = torch.cat([self._X[:n], self._X.new_zeros(cap - n, self._X.shape[-1])], 0)

            def grow(t: Tensor) -> Tensor:
                return torch.cat([t[..., :n], t.new_zeros(*t.shape[:-1], cap - n)], -1)

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

    # ------------------------------------------------------------------ learning

    # ------------------------------------------------------------------ the E-step

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
        if batch_size is not None:  # a negative one sliced "all but |batch_size|" points
            batch_size = whole_number("batch_size", batch_size, 1)
        self.ensure_caches()
        self._materialize_B()
        n = self._n
        minibatch = batch_size is not None and batch_size < n
        idx = torch.randperm(n, generator=generator)[:batch_size] if minibatch else slice(None)
        with torch.no_grad():
            X, y = self.train_X[idx], self.train_y[..., idx]
            noise = None if self.train_noise is None else self.train_noise[..., idx]
            blocks = self._row_blocks(n)
            if minibatch or len(blocks) == 1:
                g1, beta = self._site_targets(X, y, noise)
            else:  # full batch in row blocks (memory flat in n), see caches._row_blocks
                parts = [
                    self._site_targets(X[s], y[..., s], None if noise is None else noise[..., s])
                    for s in blocks
                ]
                g1, beta = (torch.cat(t, -1) for t in zip(*parts, strict=True))
            g1_old, beta_old = self.sites
            g1_new = (1 - rho) * g1_old[..., idx] + rho * g1
            beta_new = (1 - rho) * beta_old[..., idx] + rho * beta
            if not minibatch:
                self._set_base_sites(g1_new, beta_new)
                return self
            scale = n / X.shape[0]
            A = self._whiten(self.chol_K, X)  # memoised by _site_targets (no autograd here)
            lam_b, P_b = self._summaries(A, g1, beta)
            L_B = self.chol_B
            P_old = L_B @ L_B.transpose(-1, -2) - torch.eye(
                L_B.shape[-1], dtype=L_B.dtype, device=L_B.device
            )
            lam_w = (1 - rho) * self.lam_w + rho * scale * lam_b
            P = (1 - rho) * P_old + rho * scale * P_b
            L_B, v = self._factor(P, lam_w)
            self._g1[..., idx], self._beta[..., idx] = g1_new, beta_new
            self.chol_B, self.lam_w, self.v = L_B, lam_w, v
        return self

    def _site_targets(self, X: Tensor, y: Tensor, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        r"""The E-step's targets ``(g1, beta)`` (``(out x) q`` each) at points ``X`` (``q x d``):
        ``beta = -E_q[d^2 log p/df^2]``, ``g1 = beta m + E_q[d log p/df]`` at the current
        marginals (no autograd)."""
        A = self._whiten(self.chol_K, X)
        mean_h, var = self._marginals(A, self.chol_B, self.v, X)
        noise_arg = noise if self.likelihood.conjugate else None
        if self.likelihood.conjugate and noise_arg is None:
            noise_arg = self._point_noise(y.shape, None)
        alpha, beta = self.likelihood.expected_derivatives(
            y, self._const() + mean_h, var, noise_arg
        )
        return beta * mean_h + alpha, beta
