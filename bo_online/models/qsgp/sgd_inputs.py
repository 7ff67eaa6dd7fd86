r"""What one step of QSGP's stochastic procedure works on, as small typed containers.

A step of :meth:`~bo_online.models.qsgp.sgd.QSGPSGDMixin.fit_sgd` draws an
:class:`~bo_online.models.qsgp.estimators.IndexSample`, gathers the basis functions it touches
once (:class:`ColumnSample`), makes the variational coordinates at those columns autograd leaves
(:class:`VariationalLeaves`) and, with control variates, reads the fixed support rows of Evans &
Nair, "Quadruply Stochastic Gaussian Processes" (2018, arXiv:1812.03010), Eq. 3 / Prop. 3
(:class:`ControlVariateState`).

Sizes: ``m~`` basis functions in each of the samples ``i`` and ``j``, ``m_r`` diagonal columns
``r``, ``k~`` dense columns ``dr``, ``u = |U|`` distinct columns touched, ``k_u`` distinct dense
columns in ``dr``, ``n_bar`` control-variate support rows, ``k`` dense columns of ``C``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from bo_online.models.qsgp.estimators import IndexSample

__all__ = ["ColumnSample", "ControlVariateState", "VariationalLeaves"]


@dataclass(frozen=True)
class ColumnSample:
    r"""An index sample and where its basis indices sit among the columns the step touches.

    The step evaluates features and gathers ``q(w)`` once, at the sorted distinct columns ``U`` of
    ``i``, ``j``, ``r`` and ``dr``; the estimators index those gathered blocks with the inverse maps
    below. When ``i`` and ``j`` are both all ``m`` columns (``m~ = m`` without replacement,
    ``i = j = arange(m)``) no ``unique`` is needed: ``U``, ``inv_i`` and ``inv_j`` are then the
    same tensor as ``index.i`` (:attr:`all_columns`).

    Attributes:
        index: the draw of the four index samplers (rows, ``i``, ``j``, ``r``, ``dr``, sizes).
        U: ``(u,)`` distinct basis indices touched.
        inv_i: ``(m~,)`` positions of ``i`` in ``U``.
        inv_j: ``(m~,)`` positions of ``j`` in ``U``.
        inv_r: ``(m_r,)`` positions of ``r`` in ``U``.
        inv_dr: ``(k~,)`` positions of ``dr`` in ``U``.
        dr_u: ``(k_u,)`` sorted distinct dense-column indices of ``dr``.
        dr_inv: ``(k~,)`` positions of ``dr`` in ``dr_u``.
    """

    index: IndexSample
    U: Tensor
    inv_i: Tensor
    inv_j: Tensor
    inv_r: Tensor
    inv_dr: Tensor
    dr_u: Tensor
    dr_inv: Tensor

    @classmethod
    def from_index_sample(cls, s: IndexSample) -> ColumnSample:
        r"""The touched columns of ``s`` and the inverse maps into them."""
        if s.i is s.j and s.i.numel() == s.m:  # all columns (m~ = m without replacement)
            U = inv_i = inv_j = s.i
            inv_r, inv_dr = s.r, s.dr
        else:
            U, inv = torch.unique(torch.cat([s.i, s.j, s.r, s.dr]), return_inverse=True)
            ni, nrr = s.i.numel(), s.r.numel()
            inv_i, inv_j = inv[:ni], inv[ni : 2 * ni]
            inv_r, inv_dr = inv[2 * ni : 2 * ni + nrr], inv[2 * ni + nrr :]
        dr_u, dr_inv = torch.unique(s.dr, return_inverse=True)
        return cls(s, U, inv_i, inv_j, inv_r, inv_dr, dr_u, dr_inv)

    @property
    def all_columns(self) -> bool:
        r"""Whether ``i = j = U`` are all columns (features need no gathers by ``inv_i``)."""
        return self.inv_i is self.U


@dataclass(frozen=True)
class VariationalLeaves:
    r"""The variational coordinates one step moves: copies of ``q(w)``'s parameters at the touched
    columns, made autograd leaves (the loss is differentiated in them, then sparse AdaGrad writes
    the update back at the same coordinates).

    Attributes:
        mu: ``(u,)`` the mean ``mu[U]``.
        log_diag: ``(u,)`` the log diagonal ``log c_rr`` of ``C`` at ``U``.
        cols: ``(u, k_u)`` the strictly-lower entries ``l[U, dr_u]`` of the dense columns
            sampled, or None when ``C`` has no dense column (``k = 0``).
    """

    mu: Tensor
    log_diag: Tensor
    cols: Tensor | None

    def tensors(self) -> list[Tensor]:
        r"""``[mu, log_diag]`` and ``cols`` when present, in the order of the gradients."""
        return [self.mu, self.log_diag] + ([] if self.cols is None else [self.cols])


class ControlVariateState(NamedTuple):
    r"""The fixed support of the Eq. 3 control variates and its running products (Prop. 3).

    A tuple, so ``p, X_p, frozen, a = state`` unpacks it.

    Attributes:
        p: ``(n_bar,)`` support rows (drawn once, without replacement).
        X_p: ``(n_bar, d)`` their training inputs.
        frozen: the basis hyperparameters the support features are evaluated with, frozen when
            the state is made (App. F.3), as returned by the basis' ``frozen_state()``.
        a: ``(n_bar, 1 + k)`` ``Phi_p [mu, l_0, ..., l_{k-1}]``; each SGD step updates it in place
            with the change of the coordinates it moved.
    """

    p: Tensor
    X_p: Tensor
    frozen: dict
    a: Tensor
