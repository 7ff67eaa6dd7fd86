r"""A lazy covariance ``P P^T - Q Q^T`` with broadcast batch dimensions.

WISKI's posterior covariance at ``N`` test points is ``sigma^2 (E^T E - H^T H)`` (MATH.md
section 1): ``E`` (``m x N``) is shared by every fantasy model conditioned on the same base model
and ``H`` (``q x N`` per candidate batch) is the rank-q correction of a fantasy. Expanding ``E``
to the batch would copy ``batch x N x m`` numbers (gigabytes for qNIPV with 10,000 mc_points), so
this operator keeps the two roots with their own batch shapes and computes the diagonal as
``sum(P^2) - sum(Q^2)`` in O(N (m + q)) per batch element. ``linear_operator``'s
``MatmulLinearOperator``/``SumLinearOperator`` would broadcast the roots first, hence this class.
"""

from __future__ import annotations

import torch
from linear_operator.operators import LinearOperator
from torch import Tensor


class RootDifferenceLinearOperator(LinearOperator):
    r"""``P P^T - Q Q^T``.

    Args:
        P: ``batch_p x N x r`` (positive root).
        Q: ``batch_q x N x s`` (negative root; ``s`` may be 0); batches broadcast.
    """

    def __init__(self, P: Tensor, Q: Tensor) -> None:
        super().__init__(P, Q)
        self.P = P
        self.Q = Q

    def _size(self) -> torch.Size:
        batch = torch.broadcast_shapes(self.P.shape[:-2], self.Q.shape[:-2])
        N = self.P.shape[-2]
        return torch.Size([*batch, N, N])

    def _matmul(self, rhs: Tensor) -> Tensor:
        P, Q = self.P, self.Q
        return P @ (P.mT @ rhs) - Q @ (Q.mT @ rhs)

    def _transpose_nonbatch(self) -> LinearOperator:
        return self

    def _diagonal(self) -> Tensor:
        batch = self.batch_shape
        diag = self.P.pow(2).sum(-1) - self.Q.pow(2).sum(-1)
        return diag.expand(*batch, diag.shape[-1])

    def to_dense(self) -> Tensor:
        P, Q = self.P, self.Q
        dense = P @ P.mT - Q @ Q.mT
        return dense.expand(*self.shape)

    def _expand_batch(self, batch_shape: torch.Size | list[int]) -> LinearOperator:
        P = self.P.expand(*batch_shape, *self.P.shape[-2:])
        Q = self.Q.expand(*batch_shape, *self.Q.shape[-2:])
        return self.__class__(P, Q)

    def _get_indices(self, row_index: Tensor, col_index: Tensor, *batch_indices: Tensor) -> Tensor:
        batch = self.batch_shape
        P = self.P.expand(*batch, *self.P.shape[-2:])
        Q = self.Q.expand(*batch, *self.Q.shape[-2:])
        pr, pc = P[(*batch_indices, row_index)], P[(*batch_indices, col_index)]
        qr, qc = Q[(*batch_indices, row_index)], Q[(*batch_indices, col_index)]
        return (pr * pc).sum(-1) - (qr * qc).sum(-1)
