"""The blocked rank-q Cholesky update on a column-major factor (``bo_online.linalg.
_panels_column_major``, the layout ``torch.linalg.cholesky`` returns) against a fresh Cholesky,
against the panel loop on the same factor in row-major layout, and for its inputs being left
untouched."""

from __future__ import annotations

import pytest
import torch

from bo_online.linalg import (
    _BLOCK_COLUMN_MAJOR,
    NotPositiveDefiniteError,
    cholesky_downdate,
    cholesky_update,
)

DT = torch.float64


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _factor(m: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(m, 3, generator=g, dtype=DT)
    A = torch.exp(-0.5 * torch.cdist(X, X).pow(2) / 0.4**2) + 1e-2 * torch.eye(m, dtype=DT)
    return torch.linalg.cholesky(A)


B = _BLOCK_COLUMN_MAJOR


@pytest.mark.parametrize("m", [B - 1, B, B + 1, 2 * B, 3 * B + 7])
@pytest.mark.parametrize("q", [1, 3])
def test_column_major_update_and_downdate_match_fresh_and_row_major(m, q):
    L = _factor(m, seed=m + q)
    assert L.mT.is_contiguous()  # LAPACK's layout: the column-major path
    U = 0.3 * torch.randn(m, q, generator=torch.Generator().manual_seed(q), dtype=DT)
    L0, U0 = L.clone(), U.clone()
    up = cholesky_update(L, U)
    assert torch.equal(L, L0) and torch.equal(U, U0)  # inputs untouched (U^T is a view for q=1)
    fresh = torch.linalg.cholesky(L @ L.mT + U @ U.mT)
    assert _rel(up, fresh) < 1e-12
    assert torch.equal(up, torch.tril(up))  # exactly zero above the diagonal
    row_major = cholesky_update(L.contiguous(), U)  # the panel loop
    assert not L.contiguous().mT.is_contiguous()
    assert _rel(up, row_major) < 1e-13
    down = cholesky_downdate(up, U)
    assert torch.equal(U, U0)
    assert _rel(down, L) < 1e-11


def test_column_major_chain_at_m_1000_matches_fresh_cholesky():
    m, q = 1000, 3
    g = torch.Generator().manual_seed(3)
    L = _factor(m, seed=4)
    A = L @ L.mT
    for _ in range(6):
        U = 0.1 * torch.randn(m, q, generator=g, dtype=DT)
        L = cholesky_update(L, U)
        A = A + U @ U.mT
        assert L.mT.is_contiguous()  # stays on the column-major path
    assert _rel(L, torch.linalg.cholesky(A)) < 1e-9


def test_column_major_downdate_losing_definiteness_raises():
    L = _factor(3 * B + 5, seed=9)
    A = L @ L.mT
    evals, evecs = torch.linalg.eigh(A)
    v = evecs[:, :1] * (1.5 * evals[0].sqrt())
    before = L.clone()
    with pytest.raises(NotPositiveDefiniteError):
        cholesky_downdate(L, v)
    assert torch.equal(L, before)
