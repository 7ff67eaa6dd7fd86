r"""The decoupled SVGP's bases: where the mean bases ``[beta; alpha]`` and the covariance bases
``beta`` sit, how they are seeded and selected (median-heuristic lengthscale, pivoted Cholesky),
grown during Adam training and compressed back to the caps."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from bo_online.models.decoupled.statistics import site_dtype

__all__ = ["DecoupledBasesMixin", "median_lengthscale", "pivoted_cholesky_select"]


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
    Hand-written because ``linear_operator``'s pivoted Cholesky does not return the pivots.

    Runs in :func:`site_dtype` (float64 for float32 input; give ``K`` or the rows in it too). The
    residual variance ``k(x, x) - sum_j R_jx^2`` of a point nearly uncorrelated with the chosen
    ones (``k(x, x_j) ~ 1e-5`` at a few lengthscales, as among the first picks) is ``1 - 1e-10``,
    which float32 rounds to 1: the argmax then took the first index of a tie made by rounding,
    not the point farthest from those chosen, and a float32 model held other bases than the
    float64 model on the same data."""
    if K is not None:
        diag, row = torch.diagonal(K), (lambda i: K[i])
    m = diag.shape[-1]
    k = min(k, m)
    wd = site_dtype(diag.dtype)
    resid = diag.to(wd, copy=True)
    rows = torch.zeros(k, m, dtype=wd, device=diag.device)
    chosen: list[int] = []
    for j in range(k):
        if chosen:
            resid[chosen] = -math.inf
        i = int(torch.argmax(resid))
        chosen.append(i)
        piv = resid[i].clamp_min(1e-300).sqrt()
        rows[j] = (row(i).to(wd) - rows[:j, i] @ rows[:j]) / piv
        resid = resid - rows[j].pow(2)
    return torch.tensor(chosen, dtype=torch.long, device=diag.device)


class DecoupledBasesMixin:
    r"""Basis bookkeeping of :class:`~bo_online.models.decoupled.DecoupledSVGP`: sizes, seeding
    from the data, selection by pivoted Cholesky, growth during Adam and compression to the caps
    (``num_cov_bases`` covariance bases ``beta``, ``num_mean_bases`` mean bases in all)."""

    @property
    def num_beta(self) -> int:
        return int(self.beta_points.shape[-2])

    @property
    def num_alpha(self) -> int:
        """Total number of mean bases, ``M_beta + #mean-only bases``."""
        return self.num_beta + int(self.alpha_points.shape[-2])

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

    def _select_bases(self, pool_size: int = 4096) -> tuple[Tensor, Tensor]:
        r"""``num_mean_bases`` held points (from a random pool of at most ``pool_size``) chosen by
        pivoted Cholesky of the kernel (greedy largest residual variance): the first
        ``num_cov_bases`` are the covariance bases, the rest mean-only bases. The kernel is
        evaluated in :func:`site_dtype`, as the selection runs (:func:`pivoted_cholesky_select`)."""
        n = self.num_data
        pool = torch.randperm(n, generator=self._generator)[: min(n, pool_size)]
        Xp = self.train_X[pool]
        Xw = Xp.to(site_dtype(Xp.dtype))
        with torch.no_grad():
            chosen = pivoted_cholesky_select(
                None,
                self.num_mean_bases,
                diag=self.covar_module(Xw, diag=True),
                row=lambda i: self.covar_module(Xw[i : i + 1], Xw).to_dense().squeeze(-2),
            )
        Z = Xp[chosen]
        return Z[: self.num_cov_bases], Z[self.num_cov_bases :]

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
        ``alpha``, then the closed-form warm start. Kernels in :func:`site_dtype`, as the
        selection runs (:func:`pivoted_cholesky_select`)."""
        if self.num_data <= self.num_cov_bases:
            self._set_exact_state(self.train_X)
            return
        wd = site_dtype(self.beta_points.dtype)
        K = self.covar_module(self.beta_points.to(wd)).to_dense()
        keep = pivoted_cholesky_select(K, self.num_cov_bases)
        mask = torch.ones(self.num_beta, dtype=torch.bool, device=K.device)
        mask[keep] = False
        beta = self.beta_points[keep]
        rest = torch.cat([self.beta_points[mask], self.alpha_points], dim=-2)
        room = self.num_mean_bases - self.num_cov_bases
        if rest.shape[-2] > room:
            rest = rest[pivoted_cholesky_select(self.covar_module(rest.to(wd)).to_dense(), room)]
        self._warm_start(beta, rest)

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
