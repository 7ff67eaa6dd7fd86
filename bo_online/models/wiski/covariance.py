r"""A lazy covariance ``P P^T - Q Q^T`` with broadcast batch dimensions.

WISKI's posterior covariance at ``N`` test points is ``sigma^2 (E^T E - H^T H)`` (docs/math.md
§1): ``E`` (``m x N``) is shared by every fantasy model conditioned on the same base model
and ``H`` (``q x N`` per candidate batch) is the rank-q correction of a fantasy. Expanding ``E``
to the batch would copy ``batch x N x m`` numbers (gigabytes for qNIPV with 10,000 mc_points), so
this operator keeps the two roots with their own batch shapes and computes the diagonal as
``sum(P^2) - sum(Q^2)`` in O(N (m + q)) per batch element. ``linear_operator``'s
``MatmulLinearOperator``/``SumLinearOperator`` would broadcast the roots first, hence this class.
"""

from __future__ import annotations

from typing import Any

import torch
from linear_operator.operators import DenseLinearOperator, LinearOperator
from linear_operator.utils.getitem import _is_noop_index
from torch import Tensor

__all__ = ["RootDifferenceLinearOperator"]


class RootDifferenceLinearOperator(LinearOperator):
    r"""``P P^T - Q Q^T``.

    Args:
        P: ``batch_p x N x r`` (positive root).
        Q: ``batch_q x N x s`` (negative root; ``s`` may be 0); batches broadcast.
        batch_shape: optional batch shape of the operator (broadcast with the roots' batches), so
            that a covariance shared across samples can match the mean's batch without copies.
    """

    def __init__(
        self,
        P: Tensor,
        Q: Tensor,
        batch_shape: tuple[int, ...] = (),
        P_diag: Tensor | None = None,
    ) -> None:
        batch = tuple(torch.broadcast_shapes(P.shape[:-2], Q.shape[:-2], torch.Size(batch_shape)))
        if P_diag is None:
            super().__init__(P, Q, batch_shape=batch)
        else:
            super().__init__(P, Q, batch_shape=batch, P_diag=P_diag)
        self.P = P
        self.Q = Q
        self.P_diag = P_diag  # optional precomputed row norms of P (shared across batches)
        self._batch = torch.Size(batch)

    def _size(self) -> torch.Size:
        N = self.P.shape[-2]
        return torch.Size([*self._batch, N, N])

    def _matmul(self, rhs: Tensor) -> Tensor:
        P, Q = self.P, self.Q
        out = P @ (P.mT @ rhs) - Q @ (Q.mT @ rhs)
        batch = torch.broadcast_shapes(self._batch, out.shape[:-2])
        return out.expand(*batch, *out.shape[-2:])

    def _permute_batch(self, *dims: int) -> LinearOperator:
        batch = self._batch
        P = self.P.expand(*batch, *self.P.shape[-2:])
        Q = self.Q.expand(*batch, *self.Q.shape[-2:])
        return self.__class__(P.permute(*dims, -2, -1), Q.permute(*dims, -2, -1))

    def _transpose_nonbatch(self) -> LinearOperator:
        return self

    def _diagonal(self) -> Tensor:
        batch = self.batch_shape
        p_diag = self.P.pow(2).sum(-1) if self.P_diag is None else self.P_diag
        diag = p_diag - self.Q.pow(2).sum(-1)
        return diag.expand(*batch, diag.shape[-1])

    def to_dense(self) -> Tensor:
        P, Q = self.P, self.Q
        dense = P @ P.mT - Q @ Q.mT
        return dense.expand(*self.shape)

    def _expand_batch(self, batch_shape: torch.Size | list[int]) -> LinearOperator:
        return self.__class__(self.P, self.Q, batch_shape=tuple(batch_shape), P_diag=self.P_diag)

    def _getitem(self, row_index: Any, col_index: Any, *batch_indices: Any) -> LinearOperator:
        batch = self.batch_shape
        P = self.P.expand(*batch, *self.P.shape[-2:])
        Q = self.Q.expand(*batch, *self.Q.shape[-2:])
        if _is_noop_index(row_index) and _is_noop_index(col_index):
            full = slice(None, None, None)
            return self.__class__(P[(*batch_indices, full, full)], Q[(*batch_indices, full, full)])
        dense = self.to_dense()[(*batch_indices, row_index, col_index)]
        return DenseLinearOperator(dense)

    def _get_indices(self, row_index: Tensor, col_index: Tensor, *batch_indices: Tensor) -> Tensor:
        batch = self.batch_shape
        P = self.P.expand(*batch, *self.P.shape[-2:])
        Q = self.Q.expand(*batch, *self.Q.shape[-2:])
        pr, pc = P[(*batch_indices, row_index)], P[(*batch_indices, col_index)]
        qr, qc = Q[(*batch_indices, row_index)], Q[(*batch_indices, col_index)]
        return (pr * pc).sum(-1) - (qr * qc).sum(-1)
