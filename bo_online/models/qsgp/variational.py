r"""What QSGP stores about ``q(w) = N(mu, C C^T)`` and the moments it implies.

The variational factor ``C`` is a *chevron* (Evans & Nair, "Quadruply Stochastic Gaussian
Processes", 2018, arXiv:1812.03010): ``num_dense`` columns dense below the diagonal, the rest
diagonal. It is kept in three buffers of the model, ``var_mean`` (``mu``, ``m``),
``var_log_diag`` (``log diag C``, ``m``) and ``var_cols`` (the dense columns, ``m x k``).
:class:`QSGPVariationalMixin` reads them without ever forming an ``n x m`` feature matrix:
the basis is visited in contiguous column blocks (:meth:`~QSGPVariationalMixin._chunks`), and
the masked dense columns a posterior needs on every call are cached
(:meth:`~QSGPVariationalMixin._masked_cols`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["QSGPVariationalMixin"]

_CHUNK = 4096  # basis columns per block when a full pass over m is needed


class QSGPVariationalMixin:
    r"""The factor ``C`` of ``q(w)``, its cached dense columns, and the moments
    ``c + Phi_X mu`` / ``(Phi_X C)(Phi_X C)^T`` in column blocks (a mixin of :class:`QSGP`)."""

    def _prior_diag_all(self) -> Tensor:
        return torch.cat([self.basis.prior_precision_diag(idx) for idx in self._chunks()]).detach()

    def _chunks(self, size: int = _CHUNK) -> list[Tensor]:
        r"""Column blocks ``[0, size), [size, 2 size), ...`` of the basis. The index tensors are
        kept (never edited in place), so the RFF basis, which remembers the frequencies of the
        last block it generated, does not regenerate them on every posterior call."""
        dev = self.basis._dtype_ref.device
        key = (self.num_features, size, dev)
        cached = getattr(self, "_chunks_cache", None)
        if cached is None or cached[0] != key:
            blocks = [
                torch.arange(s, min(s + size, self.num_features), device=dev)
                for s in range(0, self.num_features, size)
            ]
            if torch.is_inference_mode_enabled():  # (inference tensors are not kept)
                return blocks
            cached = self._chunks_cache = (key, blocks)
        return cached[1]

    # ------------------------------------------------------------------ the variational factor

    def _lower_cols(self, rows: Tensor, cols: Tensor, vals: Tensor) -> Tensor:
        r"""Mask ``vals`` (``|rows| x |cols|``) to the strictly-lower part of ``C``."""
        return vals * (rows.unsqueeze(-1) > cols.unsqueeze(-2)).to(vals)

    def _masked_cols(self) -> Tensor:
        r"""The dense columns of ``C`` below the diagonal, ``m x k``: ``var_cols`` through
        :meth:`_lower_cols` over all rows.

        Kept until ``var_cols`` is replaced or edited in place (its identity and version counter
        are the key), so a posterior, which needs it on every call, does not rebuild an ``m x k``
        mask each time (``k = m`` for the full family: an ``m x m`` mask and product per
        acquisition evaluation). Not kept under inference mode (such a tensor could not enter a
        later autograd graph) or while ``var_cols`` requires a gradient."""
        src = self.var_cols
        cached = getattr(self, "_masked_cols_cache", None)
        if torch.is_inference_mode_enabled() or src.is_inference() or src.requires_grad:
            cached = None
            version = None
        else:
            version = src._version
            if cached is not None and cached[0] is src and cached[1] == version:
                return cached[2]
        idx = torch.arange(self.num_features, device=src.device)
        out = self._lower_cols(idx, idx[: self.num_dense], src)
        if version is not None:
            self._masked_cols_cache = (src, version, out.detach())
        return out

    def dense_C(self) -> Tensor:
        r"""``C`` as a dense ``m x m`` matrix (small ``m`` only: tests and closed-form fits)."""
        k = self.num_dense
        C = torch.diag(self.var_log_diag.exp())
        if k:
            C[:, :k] = C[:, :k] + self._masked_cols()
        return C

    def _C_times(self, M: Tensor) -> Tensor:
        r"""``C @ M`` for ``M``: ``m x p`` without forming ``C``."""
        out = self.var_log_diag.exp().unsqueeze(-1) * M
        k = self.num_dense
        if k:
            out = out + self._masked_cols() @ M[:k]
        return out

    def _moments(self, X: Tensor, cov: bool = True) -> tuple[Tensor, Tensor]:
        r"""Mean ``c + Phi_X mu`` (``... x q``) and covariance ``(Phi_X C)(Phi_X C)^T``
        (``... x q x q``, or its diagonal ``... x q`` if ``cov=False``), one pass over ``m`` in
        column blocks (never an ``n x m`` matrix)."""
        k = self.num_dense
        mean = self.mean_constant.to(X).expand(X.shape[:-1])  # the constant prior mean c
        out = torch.zeros(
            X.shape[:-1] + (X.shape[-2:-1] if cov else ()), dtype=X.dtype, device=X.device
        )
        dense = None  # ... x q x k: Phi_X C[:, :k]
        masked = self._masked_cols() if k else None
        for idx in self._chunks():
            F = self.basis.features(X, idx)
            mean = mean + F @ self.var_mean[idx]
            V = F * self.var_log_diag[idx].exp()
            if k:
                d = F @ masked[int(idx[0]) : int(idx[-1]) + 1]  # chunks are contiguous ranges
                dense = d if dense is None else dense + d
                keep = idx >= k  # diagonal columns of this block
                V = V[..., keep]
                head_idx = idx[idx < k]
                if head_idx.numel():  # the c_rr spike of dense columns
                    head = F[..., idx < k] * self.var_log_diag[head_idx].exp()
                    dense = dense.index_add(-1, head_idx, head)
            out = out + (V @ V.transpose(-1, -2) if cov else V.pow(2).sum(-1))
        if dense is not None:
            out = out + (dense @ dense.transpose(-1, -2) if cov else dense.pow(2).sum(-1))
        return mean, out

    def _features_times_C(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Mean ``c + Phi_X mu`` (``... x q``) and ``A = Phi_X C`` (``... x q x m``), in column
        blocks (so ``A A^T`` is the covariance :meth:`_moments` returns)."""
        k = self.num_dense
        mean = self.mean_constant.to(X).expand(X.shape[:-1])  # the constant prior mean c
        A = torch.zeros(*X.shape[:-1], self.num_features, dtype=X.dtype, device=X.device)
        masked = self._masked_cols() if k else None
        for idx in self._chunks():
            F = self.basis.features(X, idx)
            mean = mean + F @ self.var_mean[idx]
            start, stop = int(idx[0]), int(idx[-1]) + 1  # chunks are contiguous ranges
            A[..., start:stop] += F * self.var_log_diag[idx].exp()
            if k:
                A[..., :k] += F @ masked[start:stop]
        return mean, A
