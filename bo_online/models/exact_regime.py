r"""The exact GP on a model's held rows, kept as a bordered Cholesky factor: the engine of the
"exact regime" in which a surrogate that holds few points predicts as the exact GP of its own
kernel (QSGP's kernel regime, :mod:`bo_online.models.qsgp.kernel_regime`; WISKI's exact regime,
:mod:`bo_online.models.wiski.exact_regime`).

With held rows ``H``, their noise variances ``N_H`` and standardised residuals ``r_H`` (targets
less the constant mean), ``K_HH + N_H = L L^T`` and ``z = L^-1 r_H`` (docs/math.md §4, "Kernel
regime"):

    mean(x) = c + v_x^T z,    cov(x, x') = k(x, x') - v_x^T v_x',    v_x = L^-1 k_H(x).

New rows border ``L`` in O(N^2 p) (:class:`BorderedCholesky`); a conditioned (fantasy) model
borders its parent's factor without copying it. The functions here take the kernel as a callable
``kernel(A, B=None)`` (``k(A, B)``, or ``k(A, A)`` without ``B``) returning a tensor or a
``LinearOperator``, so the same algebra serves any surrogate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from linear_operator.operators import DenseLinearOperator, LinearOperator, MatmulLinearOperator
from torch import Tensor

from bo_online.linalg import broadcast_shapes, psd_cholesky, solve_lower

__all__ = [
    "BorderedCholesky",
    "KernelFn",
    "KernelState",
    "bordered_kernel_state",
    "cat_last",
    "cat_rows",
    "kernel_moments",
    "kernel_state",
    "key_matches",
    "key_of",
]

#: ``kernel(A, B=None)``: the covariance ``k(A, B)`` (``... x a x b``), or ``k(A, A)``.
KernelFn = Callable[..., "Tensor | LinearOperator"]


def _dense(K: Tensor | LinearOperator) -> Tensor:
    return K.to_dense() if isinstance(K, LinearOperator) else K


class BorderedCholesky:
    r"""A lower Cholesky factor kept as a base block and a chain of borders: the factor of
    ``[[A, C^T], [C, D]]`` is ``[[F, 0], [B, L22]]`` with ``F`` the factor of ``A`` (itself
    bordered or not), ``B = C F^-T`` and ``L22 = chol(D - B B^T)``. The base ``L``
    (``... x N x N``) is shared with the model it came from, not copied, and so is every border
    a conditioned model inherits: a fantasy of a fantasy adds its own border only.

    Args:
        L: the base block, ``... x N x N``.
        borders: ``(B_i, L22_i)`` in order, ``B_i``: ``... x p_i x (N + p_1 + ... + p_{i-1})``,
            ``L22_i``: ``... x p_i x p_i``.
    """

    def __init__(self, L: Tensor, borders: tuple[tuple[Tensor, Tensor], ...] = ()) -> None:
        self.L, self.borders = L, tuple(borders)

    def block_roots(self, K: list[Tensor]) -> list[Tensor]:
        r"""``F^-1 K`` by row blocks: ``K`` is ``[K_0, K_1, ...]``, the rows of the base
        (``... x N x k``) and of each border (``... x p_i x k``), each with its own batch shape,
        which the roots keep (the base's root is not expanded to a border's batch)."""
        roots = [solve_lower(self.L, K[0])]
        for (B, L22), K_i in zip(self.borders, K[1:]):
            done = roots[0] if len(roots) == 1 else cat_rows(roots)
            roots.append(solve_lower(L22, K_i - B @ done))
        return roots

    def whiten(self, K: Tensor) -> Tensor:
        r"""``F^-1 K`` for the whole factor ``F`` (``K``: ``... x (N + sum p_i) x k``)."""
        sizes = [self.L.shape[-1], *(L22.shape[-1] for _, L22 in self.borders)]
        roots = self.block_roots(list(K.split(sizes, dim=-2)))
        return roots[0] if len(roots) == 1 else cat_rows(roots)

    def dense(self) -> Tensor:
        r"""The whole factor as one ``... x (N + sum p_i) x (N + sum p_i)`` tensor."""
        F = self.L
        for B, L22 in self.borders:
            n, p = F.shape[-1], L22.shape[-1]
            batch = broadcast_shapes(F.shape[:-2], B.shape[:-2], L22.shape[:-2])
            top = torch.cat([F.expand(*batch, n, n), F.new_zeros(*batch, n, p)], dim=-1)
            bottom = torch.cat([B.expand(*batch, p, n), L22.expand(*batch, p, p)], dim=-1)
            F = torch.cat([top, bottom], dim=-2)
        return F

    def bordered(self, C: Tensor, D: Tensor) -> BorderedCholesky:
        r"""The factor with ``p`` more rows: ``C`` (``... x p x (N + sum p_i)``) their
        covariance with the rows already factored, ``D`` (``... x p x p``) their own (noise
        included). O((N + sum p_i)^2 p); nothing of this factor is copied."""
        B = self.whiten(C.transpose(-1, -2)).transpose(-1, -2)
        L22 = psd_cholesky(D - B @ B.transpose(-1, -2))
        return BorderedCholesky(self.L, (*self.borders, (B, L22)))


def cat_rows(blocks: list[Tensor]) -> Tensor:
    r"""The ``blocks`` stacked along the row dim, their batch dims broadcast."""
    batch = broadcast_shapes(*(b.shape[:-2] for b in blocks))
    return torch.cat([b.expand(*batch, *b.shape[-2:]) for b in blocks], dim=-2)


def cat_last(a: Tensor, b: Tensor) -> Tensor:
    r"""``[a, b]`` along the last dim, the leading dims broadcast."""
    lead = broadcast_shapes(a.shape[:-1], b.shape[:-1])
    return torch.cat([a.expand(*lead, a.shape[-1]), b.expand(*lead, b.shape[-1])], dim=-1)


@dataclass
class KernelState:
    r"""The exact GP on the held rows: their inputs (transformed; ``inputs``, ``batch x N x d``,
    those of the factor's base block, then ``border_inputs``, ``batch x p_i x d``, those of each
    border), the factor of ``K_HH + N_H`` and ``z = F^-1 (y_H - c)`` (``sample x batch x
    (N + sum p_i)``), with the key (hyperparameters and held data) they were built for."""

    key: list[Tensor | None]
    inputs: Tensor
    factor: BorderedCholesky
    z: Tensor
    border_inputs: tuple[Tensor, ...] = ()

    def all_inputs(self) -> Tensor:
        r"""Every held row's inputs, ``batch x (N + sum p_i) x d``."""
        if not self.border_inputs:
            return self.inputs
        return cat_rows([self.inputs, *self.border_inputs])


def _negated_gram(V: Tensor, batch: torch.Size) -> LinearOperator:
    r"""``-V^T V`` (``batch x q x q``) as a lazy operator of its roots (``V``: ``... x r x q``)."""
    Vt = V.transpose(-1, -2).expand(*batch, V.shape[-1], V.shape[-2])
    return MatmulLinearOperator(Vt, V.expand(*batch, *V.shape[-2:])) * -1.0


def key_of(tensors: list[Tensor | None]) -> list[Tensor | None]:
    r"""Detached copies of ``tensors`` (None kept): the key a :class:`KernelState` was built for."""
    return [None if t is None else t.detach().clone() for t in tensors]


def key_matches(current: list[Tensor | None], key: list[Tensor | None]) -> bool:
    r"""Whether ``current`` equals ``key`` entry by entry (None where None; the same shape,
    dtype, device and values otherwise): compared by value, so a deep copy or a loaded state with
    the same hyperparameters and data keeps its caches."""
    if len(current) != len(key):
        return False
    for x, y in zip(current, key):
        if (x is None) != (y is None):
            return False
        if x is None:
            continue
        if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
            return False
        if not torch.equal(x, y):
            return False
    return True


def kernel_state(kernel: KernelFn, inputs: Tensor, residual: Tensor, noise: Tensor) -> KernelState:
    r"""The exact GP on rows ``inputs`` (``batch x N x d``) with standardised residuals
    ``residual`` (``sample x batch x N``: targets less the constant mean) and noise variances
    ``noise`` (``batch x N``): the factor of ``K_HH + N_H`` and ``z = L^-1 r``. O(N^3), no
    gradient. The key is left empty for the caller to set."""
    with torch.no_grad():
        K = _dense(kernel(inputs)) + torch.diag_embed(noise)
        factor = BorderedCholesky(psd_cholesky(K))
        z = factor.whiten(residual.unsqueeze(-1)).squeeze(-1)
    return KernelState([], inputs, factor, z)


def bordered_kernel_state(
    kernel: KernelFn, state: KernelState, X: Tensor, residual: Tensor, noise: Tensor
) -> KernelState:
    r"""``state`` with ``p`` more rows (its key still to be set): ``X`` (``batch x p x d``),
    their standardised residuals (``sample x batch x p``) and noise (``batch x p``). O(N^2 p);
    the new factor is ``state``'s with one more border (nothing copied)."""
    C = _dense(kernel(X, state.all_inputs()))  # batch x p x N
    D = _dense(kernel(X)) + torch.diag_embed(noise)
    factor = state.factor.bordered(C, D)
    B, L22 = factor.borders[-1]
    z_old = state.z
    Bz = (B @ z_old.unsqueeze(-1)).squeeze(-1)
    z_new = solve_lower(L22, (residual - Bz).unsqueeze(-1)).squeeze(-1)
    return KernelState([], state.inputs, factor, cat_last(z_old, z_new), (*state.border_inputs, X))


def kernel_moments(
    kernel: KernelFn, state: KernelState, X: Tensor, c: Tensor, lazy: bool
) -> tuple[Tensor, Tensor | LinearOperator]:
    r"""Latent mean (``sample x batch x q``) and covariance (``batch x q x q``; a lazy
    ``k(X, X) - V^T V`` when ``lazy`` or when ``X`` is shared by the state's batch) of the exact
    GP of ``state`` at ``X`` (``batch x q x d``), standardised units, constant mean ``c``."""
    # v_x = F^-1 k_H(x) by blocks: V1 = L^-1 k(inputs, X) over the factor's base (shared by
    # a fantasy model's batch), then V_i = L22_i^-1 (k(border_i, X) - B_i [V1; ...]) over
    # each border, each with its own batch shape
    K = [_dense(kernel(rows, X)) for rows in (state.inputs, *state.border_inputs)]
    roots = state.factor.block_roots(K)
    mean, start = c, 0
    for V in roots:
        z = state.z[..., start : start + V.shape[-2]]
        mean = mean + (z.unsqueeze(-2) @ V).squeeze(-2)
        start += V.shape[-2]
    V1 = roots[0]
    q = X.shape[-2]
    batch = broadcast_shapes(X.shape[:-2], *(V.shape[:-2] for V in roots))
    prior = kernel(X)
    if lazy:  # many points: no q x q tensor at all
        if not isinstance(prior, LinearOperator):
            prior = DenseLinearOperator(prior)
        cov = prior.expand(*batch, q, q)
        for V in roots:
            cov = cov + _negated_gram(V, batch)
        return mean, cov
    shared = _dense(prior) - V1.transpose(-1, -2) @ V1
    if len(roots) == 1:
        return mean, shared
    if V1.shape[:-2].numel() < batch.numel():
        # Points shared by the batch of a fantasy model (qNIPV's integration points): the
        # shared block once, each element's border terms lazily, so .variance forms no
        # batch x q x q tensor.
        cov = DenseLinearOperator(0.5 * (shared + shared.transpose(-1, -2))).expand(*batch, q, q)
        for V in roots[1:]:
            cov = cov + _negated_gram(V, batch)
        return mean, cov
    for V in roots[1:]:
        shared = shared - V.transpose(-1, -2) @ V
    return mean, shared
