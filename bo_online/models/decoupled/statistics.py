r"""What the decoupled SVGP stores: the variational state ``(beta, L, a_beta, alpha, a_alpha)``,
the site statistics ``Q = K_ZX N^{-1} K_XZ`` and ``s = K_ZX N^{-1} (y - c)`` of the held data on
the mean basis ``Z = [beta; alpha]`` with the closed-form optimum of ``a, B`` they give, and the
cached factor ``chol_H`` (``H = I + L^T K_beta L``)."""

from __future__ import annotations

import torch
from torch import Tensor
from typing_extensions import Self

from bo_online.linalg import cholesky_solve, psd_cholesky
from bo_online.models.validation import check_finite

__all__ = ["DecoupledStatisticsMixin"]

# The stated jitters of the closed-form optimum: K_j = K_beta + 1e-8 I and P~ = P + 1e-6 I.
_K_JITTER = 1e-8
_P_JITTER = 1e-6


def site_dtype(dtype: torch.dtype) -> torch.dtype:
    r"""The dtype the site statistics and their ``M x M`` factors are held and solved in: float64
    for a model of lower precision, else the model's own (so a float64 model is unchanged).

    Why: these matrices are far beyond single precision. ``K_beta`` of 128 bases in 6 inputs has
    condition ~1e10 at fitted lengthscales (a smooth function), ``K_Z + Q`` ~1e11, while float32
    resolves ~1e-7 of the diagonal: the jitters 1e-8 and 1e-6 vanish in the rounding (1 + 1e-8 ==
    1 in float32), ``L = K_j^{-1} chol(P~)`` carries entries ~1e8 times ``chol(P~)``, and ``H = I +
    L^T K_j L`` formed from it lost all its digits (indefinite: ``NotPositiveDefiniteError`` from
    every fit beyond ``num_cov_bases`` points), while the folds' ``a = (K_Z + Q)^{-1} s`` were off
    by 0.3 of the outcome's standard deviation. In float64 they are ``O(M^3)`` once per fit and
    ``O(M^2 q)`` per update, small next to the kernel evaluations (kept in the model's dtype,
    but for those of the greedy base selection, ``pivoted_cholesky_select``, which runs here)."""
    return torch.float64 if dtype.is_floating_point and torch.finfo(dtype).bits < 64 else dtype


class DecoupledStatisticsMixin:
    r"""Variational state, site statistics and caches of
    :class:`~bo_online.models.decoupled.DecoupledSVGP` (docs/math.md §3)."""

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
            beta_points.dim() == 2
            and beta_points.shape[1] == d
            and L.shape == (mb, mb)
            and a_beta.shape == (mb,)
            and alpha_points.dim() == 2
            and alpha_points.shape[1] == d
            and a_alpha is not None
            and a_alpha.shape == (alpha_points.shape[0],)
        )
        if not ok:
            raise ValueError(
                "Variational parameters must be beta_points M_b x d, L M_b x M_b, a_beta M_b, "
                "alpha_points M x d, a_alpha M."
            )
        for name, t in [
            ("beta_points", beta_points),
            ("L", L),
            ("a_beta", a_beta),
            ("alpha_points", alpha_points),
            ("a_alpha", a_alpha),
        ]:
            check_finite(name, t)
        kw = self._dtype_device
        self.beta_points, self.L, self.a_beta = (
            t.detach().to(**kw) for t in (beta_points, L, a_beta)
        )
        self.alpha_points, self.a_alpha = alpha_points.detach().to(**kw), a_alpha.detach().to(**kw)
        self.site_Q, self.site_s = None, None  # a state set by hand is not a site optimum
        self.invalidate_caches()
        return self

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
        alpha]`` (maximisers of the ELBO in ``a`` and ``B``, docs/math.md §3 / the paper's
        Eq. 9-10)."""
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
        wd = site_dtype(Z.dtype)  # summed in float64 for a float32 model (see site_dtype)
        Q = torch.zeros(M, M, dtype=wd, device=Z.device)
        s = torch.zeros(M, dtype=wd, device=Z.device)
        c = self.mean_module.constant.detach().to(wd)
        Z = Z.to(wd)
        for chunk in idx.split(4096):
            K = self.covar_module(Z, self.train_X[chunk].to(wd)).to_dense()  # M x chunk
            w = self._train_noise_diag(chunk).to(wd).reciprocal()
            Q = Q + (K * w) @ K.transpose(-1, -2)
            s = s + K @ (w * (self.train_y[chunk].to(wd) - c))
        return Q, s

    def _closed_form(
        self,
        beta: Tensor,
        alpha: Tensor,
        Q: Tensor,
        s: Tensor,
        factors: tuple[Tensor, Tensor, Tensor] | None = None,
    ) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor]:
        r"""Set ``a, L`` to the Gaussian ELBO optimum for bases ``beta, alpha`` given the site
        statistics ``Q, s`` on ``Z = [beta; alpha]`` (see :meth:`_site_statistics`):
        ``a = (K_Z + Q)^{-1} s`` and ``B = L L^T = K_j^{-1} P~ K_j^{-1}`` with ``P~ = Q_{beta,beta}
        + 1e-6 I`` and ``K_j = K_b + 1e-8 I``, i.e. ``L = K_j^{-1} chol(P~)`` (the jitters keep the
        factors defined).

        ``factors``: :meth:`_fold_factorisations` of these bases and ``Q`` where already known;
        returns them (fold mode keeps them, :meth:`_set_sites`) and ``L`` in their dtype
        (:func:`site_dtype`; the buffer ``L`` holds it rounded to the model's)."""
        if factors is None:
            factors = self._fold_factorisations(beta, alpha, Q)
        Rb, RA, _ = factors
        mb = beta.shape[-2]
        a = cholesky_solve(RA, s.to(RA.dtype).unsqueeze(-1)).squeeze(-1)
        L = self._covariance_factor(Rb, Q)
        self.set_variational_parameters(beta, L, a[:mb], alpha, a[mb:])
        return factors, L

    def _fold_factorisations(
        self, beta: Tensor, alpha: Tensor, Q: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        r"""``(chol(K_j), chol(K_Z + Q), chol(K_j + P~))`` for bases ``beta, alpha`` and site
        statistics ``Q`` (O(M_alpha^3)): what the closed form and fold mode's prediction use, in
        :func:`site_dtype` (float64 for a float32 model)."""
        mb = beta.shape[-2]
        wd = site_dtype(beta.dtype)
        beta, alpha, Q = beta.to(wd), alpha.to(wd), Q.to(wd)
        eye = torch.eye(mb, dtype=wd, device=Q.device)
        Kj = self.covar_module(beta).to_dense() + _K_JITTER * eye
        KZ = self.covar_module(torch.cat([beta, alpha], dim=-2)).to_dense()
        RA = psd_cholesky(KZ + Q, jitter=1e-8)
        return psd_cholesky(Kj), RA, psd_cholesky(Kj + Q[:mb, :mb] + _P_JITTER * eye)

    @staticmethod
    def _covariance_factor(Rb: Tensor, Q: Tensor) -> Tensor:
        r"""``L = K_j^{-1} chol(P~)`` (``M_beta x M_beta``) from ``Rb = chol(K_j)`` and ``Q``."""
        mb = Rb.shape[-1]
        eye = torch.eye(mb, dtype=Rb.dtype, device=Rb.device)
        return cholesky_solve(Rb, psd_cholesky(Q[:mb, :mb].to(Rb.dtype) + _P_JITTER * eye))

    def _set_sites(self, beta: Tensor, alpha: Tensor) -> None:
        r"""Closed-form optimum of ``a, B`` on all held data for the given bases, keeping the site
        statistics so that later updates fold into the fixed bases (:meth:`_fold`)."""
        Q, s = self._site_statistics(torch.cat([beta, alpha], dim=-2))
        factors, L = self._closed_form(beta, alpha, Q, s)
        self.site_Q, self.site_s = Q, s
        self._kept_fold_factors = (Q, *factors)
        # From L as solved (float64 for a float32 model), not the buffer rounded to the model's
        # dtype: its entries are ~cond(K_j) times chol(P~)'s, and H = I + L^T K_j L cancels them.
        self.chol_H = self._chol_H(self.beta_points, L, self._state_jitter())
        self._cache_key = self._current_key()

    def _fold_factors(self) -> tuple[Tensor, Tensor, Tensor]:
        r""":meth:`_fold_factorisations` for the current sites: the ones kept up to date by
        :meth:`_fold`, or factorised afresh (once) where none are kept for this very ``site_Q``
        (after ``to`` or a hand edit)."""
        kept = getattr(self, "_kept_fold_factors", None)
        if kept is None or kept[0] is not self.site_Q:
            with torch.no_grad():  # a cache: no graph to the hyperparameters, whoever asks
                factors = self._fold_factorisations(
                    self.beta_points, self.alpha_points, self.site_Q
                )
            self._kept_fold_factors = (self.site_Q, *factors)
        return self._kept_fold_factors[1:]

    def _materialise_covariance(self) -> None:
        r"""Form ``L = K_j^{-1} chol(P~)`` and ``chol_H`` (O(M_beta^3)) after folds, which keep
        only the factors fold mode predicts with (:meth:`_fold`); called on first read of ``L``
        or ``chol_H`` (fantasies, refits, ``state_dict``). A fantasy model's bordered state
        (:meth:`_condition`) is formed whole the same way."""
        self.__dict__["_covariance_pending"] = False
        bordered = self.__dict__.pop("_bordered", None)
        if bordered is not None:
            self._buffers["L"], self._buffers["chol_H"] = bordered.L(), bordered.chol_H()
            return
        Q, Rb = self._kept_fold_factors[:2]
        with torch.no_grad():  # buffers: no graph to the hyperparameters, whoever reads them
            L = self._covariance_factor(Rb, Q)  # in site_dtype, for chol_H (see _set_sites)
            self._buffers["chol_H"] = self._chol_H(self.beta_points, L, _K_JITTER)
            self._buffers["L"] = L.to(self.beta_points.dtype)

    def _state_jitter(self) -> float:
        r"""The jitter on ``K_beta`` in this state's ``H``: ``1e-8`` in fold mode, else 0."""
        return _K_JITTER if self._in_fold_mode() else 0.0

    def _in_fold_mode(self) -> bool:
        return self.site_Q is not None and self._gaussian()

    # ------------------------------------------------------------------ caches

    def _chol_H(self, beta: Tensor, L: Tensor, jitter: float = 0.0) -> Tensor:
        r"""Lower factor of ``H = I + L^T (K_beta + jitter I) L``; fold mode's state uses
        ``jitter = 1e-8`` (``K_j``, see :meth:`_whitened`), every other state none. Formed and
        factorised in :func:`site_dtype` (float64 for a float32 model: ``L^T K L`` cancels
        ``cond(K_beta)``-sized terms), returned in ``beta``'s dtype."""
        dtype = beta.dtype
        wd = site_dtype(dtype)
        K = self.covar_module(beta.to(wd)).to_dense()
        if jitter:
            K = K + jitter * torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
        L = L.to(wd)
        H = L.transpose(-1, -2) @ K @ L
        H = H + torch.eye(H.shape[-1], dtype=H.dtype, device=H.device)
        return psd_cholesky(H).to(dtype)

    def _chol_K(self, beta: Tensor) -> Tensor:
        r"""Lower factor of ``K_beta + 1e-8 I`` (the whitening map used in training)."""
        K = self.covar_module(beta).to_dense()
        return psd_cholesky(K + 1e-8 * torch.eye(K.shape[-1], dtype=K.dtype, device=K.device))

    def _rebuild_caches(self) -> None:
        # Hyperparameters changed since the sites were summed: they no longer describe the data
        # under the current kernel, so updates go back to exact growth until the next fit.
        self.site_Q, self.site_s = None, None
        self.chol_H = self._chol_H(self.beta_points, self.L)
