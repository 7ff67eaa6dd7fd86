r"""What q(u) is built from: the whitened site summaries and the factor of ``B``.

With ``L_K L_K^T = K_uu`` and ``a_X = L_K^-1 K_uX``, the sites enter q(u) only through
``lam_w = L_K^-1 lam = sum_i a_i g1_i`` and ``B = I + sum_i a_i beta_i a_i^T = L_B L_B^T``
(eigenvalues >= 1, so the factorisation is stable); ``v = B^-1 lam_w``. A conditioned model keeps
its parent's ``L_B`` and its new whitened site columns pending in Woodbury form
(:class:`~bo_online.linalg.LowRankUpdatedCholesky`).

Every sum over the stored points (the summaries, the bound's expected log-likelihood, the
E-step's marginals) visits them in row blocks (:meth:`~TSVGPCachesMixin._row_blocks`), so its
working set is a few ``m x rows`` matrices whatever n is; under autograd each block is
recomputed in the backward pass (:func:`blockwise`), so an M-step's graph holds the blocks' small
results, not ``m x n`` kernel matrices. Only the per-point sites themselves grow with n.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gpytorch
import torch
from torch import Tensor

from bo_online.linalg import (
    LowRankUpdatedCholesky,
    cholesky_solve,
    psd_cholesky,
    solve_lower,
)

__all__ = ["TSVGPCachesMixin", "whitened_factor", "whitened_summaries"]


def whitened_summaries(A: Tensor, g1: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    r"""Whitened contributions ``(A g1, A diag(beta) A^T)`` of sites at points with ``A``.

    Args:
        A: ``batch x m x q`` whitened cross-covariances ``L_K^-1 K_uX``.
        g1: ``batch x q`` first site parameters.
        beta: ``batch x q`` site precisions.

    Returns:
        ``lam_w`` (``batch x m``) and ``P`` (``batch x m x m``).
    """
    lam_w = (A @ g1.unsqueeze(-1)).squeeze(-1)
    P = (A * beta.unsqueeze(-2)) @ A.transpose(-1, -2)
    return lam_w, P


def whitened_factor(P: Tensor, lam_w: Tensor) -> tuple[Tensor, Tensor]:
    r"""``L_B = chol(I + P)`` and ``v = (I + P)^-1 lam_w``.

    Args:
        P: ``batch x m x m`` summed site contributions ``A diag(beta) A^T``.
        lam_w: ``batch x m`` summed ``A g1``.

    Returns:
        ``L_B`` (``batch x m x m``, lower) and ``v`` (``batch x m``).
    """
    eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device)
    L_B = psd_cholesky(eye + P)
    v = cholesky_solve(L_B, lam_w.unsqueeze(-1)).squeeze(-1)
    return L_B, v


class _Recomputed(torch.autograd.Function):
    r"""``fn(*inputs)`` whose intermediates are not kept for the backward pass but recomputed
    there (``params``: the leaf tensors ``fn`` reads besides its inputs, e.g. a module's
    parameters, which receive their gradients through this node).

    Written by hand rather than with :func:`torch.utils.checkpoint.checkpoint`: its first call
    imports some 800 modules (the compiler stack), measured +45 to +75 MB of resident memory
    once per process, which alone exceeds what the blocks save at n = 20,000."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[..., Any], n_in: int, *args: Any) -> Any:
        ctx.fn, ctx.n_in, ctx.params = fn, n_in, args[n_in:]
        ctx.save_for_backward(*args[:n_in])
        with torch.no_grad():
            return fn(*args[:n_in])

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        ins = [
            None if a is None else a.detach().requires_grad_(a.requires_grad)
            for a in ctx.saved_tensors
        ]
        with torch.enable_grad():
            out = ctx.fn(*ins)
        outs = out if isinstance(out, tuple) else (out,)
        leaves = [*ins, *ctx.params]
        wrt = [i for i, t in enumerate(leaves) if t is not None and t.requires_grad]
        found = torch.autograd.grad(
            outs, [leaves[i] for i in wrt], grads, allow_unused=True, materialize_grads=True
        )
        result: list[Tensor | None] = [None] * len(leaves)
        for i, g in zip(wrt, found, strict=True):
            result[i] = g
        return (None, None, *result)


def blockwise(fn: Callable[..., Any], params: list[Tensor], *args: Any) -> Any:
    r"""``fn(*args)``; under autograd recomputed in the backward pass (:class:`_Recomputed`), so
    the block's intermediates (its ``m x rows`` kernel matrices) are not kept in the graph: the
    gradient is the same and the graph's memory does not grow with the number of blocks.
    ``params``: the leaf tensors ``fn`` reads besides ``args`` (the model's parameters)."""
    if torch.is_grad_enabled():
        return _Recomputed.apply(fn, len(args), *args, *params)
    return fn(*args)


class TSVGPCachesMixin:
    r"""The caches of :class:`~bo_online.models.tsvgp.TSVGP` (``chol_K``, ``chol_B`` with any
    pending low-rank sites, ``lam_w``, ``v``) and how they are rebuilt from the sites."""

    #: Sums over the stored points visit at most ``summary_block_elements // (m * outputs)``
    #: rows at once (2,048 rows for m = 128: 2 MiB per ``m x rows`` float64 matrix). Measured on
    #: protein (9 inputs, m = 128, float64): a refit's peak tensor memory was 16.7 MiB at
    #: n = 2,000 and 161 MiB at n = 20,000 when every sum ran over all n at once.
    summary_block_elements: int = 2**18

    def _row_blocks(self, n: int) -> list[slice]:
        r"""Row slices covering ``range(n)``: one (all rows) while ``n`` fits in a block."""
        width = self.num_inducing * max(1, self._num_outputs)
        rows = max(1, self.summary_block_elements // width)
        if n <= rows:
            return [slice(None)]
        return [slice(i, min(i + rows, n)) for i in range(0, n, rows)]

    def _site_summaries(
        self, L_K: Tensor, X: Tensor, g1: Tensor, beta: Tensor
    ) -> tuple[Tensor, Tensor]:
        r"""``(lam_w, P)`` of the sites ``g1, beta`` (``batch x n``) at ``X`` (``batch x n x d``):
        :func:`whitened_summaries` summed over row blocks (:meth:`_row_blocks`, each
        recomputed in the backward pass under autograd)."""

        def block(L_K: Tensor, Xb: Tensor, g1b: Tensor, betab: Tensor) -> tuple[Tensor, Tensor]:
            return self._summaries(self._whiten(L_K, Xb), g1b, betab)

        blocks = self._row_blocks(X.shape[-2])
        if len(blocks) == 1:
            return block(L_K, X, g1, beta)
        lam_w = P = None
        params = [p for p in self.parameters() if p.requires_grad]
        for s in blocks:
            lw, Pb = blockwise(block, params, L_K, X[..., s, :], g1[..., s], beta[..., s])
            lam_w, P = (lw, Pb) if lam_w is None else (lam_w + lw, P + Pb)
        return lam_w, P

    def _kuu_chol(self) -> Tensor:
        Z = self.inducing_points
        return psd_cholesky(self.covar_module(Z).to_dense())

    def _whiten(self, L_K: Tensor, X: Tensor) -> Tensor:
        r"""``a_X = L_K^-1 K_uX`` (``batch x m x q`` for ``X``: ``batch x q x d``).

        Without autograd the last result is memoised on ``(L_K, X)`` by identity and X's version
        counter: ``fantasize`` whitens the same X for the posterior it samples from and for the
        conditioning. (``L_K`` is a new tensor whenever the hyperparameters change.) With
        autograd the memo is not read: made without a graph, it would give no gradient.

        A single-output model folds the batch of ``X`` into columns (one ``m x (batch q)``
        cross-covariance and solve), so a ``b x 1 x d`` request costs the memory of a ``b x d``
        one rather than the kernel's ``b`` copies of the inducing inputs.
        """
        memo = self.__dict__.get("_whiten_memo")
        if (
            memo is not None
            and not torch.is_grad_enabled()
            and memo[0] is L_K
            and memo[1] is X
            and memo[2] == X._version
        ):
            return memo[3]
        Z = self.inducing_points
        Xk = self._kx(X)
        with gpytorch.settings.lazily_evaluate_kernels(False):  # dense at once: no lazy wrapper
            if Xk.dim() > 2 and Z.dim() == 2 and L_K.dim() == 2:
                rows = Xk.reshape(-1, Xk.shape[-1])  # (batch q) x d
                A = solve_lower(L_K, self.covar_module(Z, rows).to_dense())  # m x (batch q)
                A = A.reshape(A.shape[0], *Xk.shape[:-1]).movedim(0, -2)  # batch x m x q
            else:
                if Xk.dim() > 2:
                    Z = Z.expand(*Xk.shape[:-2], *Z.shape)
                A = solve_lower(L_K, self.covar_module(Z, Xk).to_dense())
        if not torch.is_grad_enabled():  # never reuse a graph: a second backward would fail
            self.__dict__["_whiten_memo"] = (L_K, X, X._version, A)
        return A

    #: whitened contributions of sites (see :func:`whitened_summaries`)
    _summaries = staticmethod(whitened_summaries)
    #: ``chol(I + P)`` and ``(I + P)^-1 lam_w`` (see :func:`whitened_factor`)
    _factor = staticmethod(whitened_factor)

    def _rebuild_caches(self) -> None:
        r"""Re-project the per-point sites onto the current hyperparameters, O(n m^2 + m^3)."""
        L_K = self._kuu_chol()
        lam_w, P = 0.0, 0.0
        for j, (X, y, noise, g1, beta) in enumerate(self._chunks()):
            if self.likelihood.conjugate:  # the exact E-step: sites follow sigma^2 and c
                g1, beta = self._exact_sites(y, noise)
                if j == 0:
                    self._g1[..., : self._n], self._beta[..., : self._n] = g1, beta
            lw, Pc = self._site_summaries(L_K, X, g1, beta)
            lam_w, P = lam_w + lw, P + Pc
        self.chol_K = L_K
        L_B, self.v = self._factor(P, lam_w)
        self._set_B_factor(LowRankUpdatedCholesky(L_B))
        self.lam_w = lam_w

    def _B_factor(self) -> LowRankUpdatedCholesky:
        r"""The whitened ``B = I + L_K^-1 Lam L_K^-T``: ``L_B`` plus any pending low-rank sites."""
        return LowRankUpdatedCholesky(self.chol_B, self._lr_U, self._lr_W, self._lr_C)

    def _set_B_factor(self, F: LowRankUpdatedCholesky) -> None:
        # straight into the registered buffers (Module.__setattr__ costs more than the maths
        # of a small fantasy)
        buffers = self._buffers
        buffers["chol_B"], buffers["_lr_U"], buffers["_lr_W"], buffers["_lr_C"] = F.L, F.U, F.W, F.C

    def _materialize_B(self) -> Tensor:
        r"""Fold pending low-rank sites into ``chol_B`` (O(m^2 r) or O(m^3)) and return it."""
        F = self._B_factor()
        if F.has_low_rank:
            self._set_B_factor(LowRankUpdatedCholesky(F.cholesky()))
        return self.chol_B
