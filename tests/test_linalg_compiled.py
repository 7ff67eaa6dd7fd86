"""The compiled rank-q Cholesky update (``bo_online.linalg_compiled``) against a fresh Cholesky
of the updated matrix, against the torch blocked routine it replaces on the CPU, over long
chains, in float32, with batches, and for failures leaving the inputs untouched."""

from __future__ import annotations

import pytest
import torch

from bo_online import linalg_compiled
from bo_online.linalg import (
    _BLOCK_COLUMN_MAJOR,
    NotPositiveDefiniteError,
    _blocked_low_rank,
    cholesky_downdate,
    cholesky_update,
)

DT = torch.float64

pytestmark = pytest.mark.skipif(
    linalg_compiled._get_kernel() is None, reason="Numba is not importable here"
)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _spd(m: int, seed: int, dtype: torch.dtype = DT) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(m, 3, generator=g, dtype=DT)
    A = torch.exp(-0.5 * torch.cdist(X, X).pow(2) / 0.4**2) + 1e-2 * torch.eye(m, dtype=DT)
    return A.to(dtype)


@pytest.mark.parametrize("m", [1, 7, 130])
@pytest.mark.parametrize("q", [1, 3])
@pytest.mark.parametrize("column_major", [True, False])
def test_update_and_downdate_equal_a_fresh_cholesky(m, q, column_major):
    A = _spd(m, seed=m + q)
    L = torch.linalg.cholesky(A)
    if not column_major:
        L = L.contiguous()
    U = 0.3 * torch.randn(m, q, generator=torch.Generator().manual_seed(q), dtype=DT)
    L0, U0 = L.clone(), U.clone()
    out, failed = linalg_compiled.compiled_low_rank(L, U, 1.0)
    assert failed == 0
    assert torch.equal(L, L0) and torch.equal(U, U0)  # inputs untouched
    assert _rel(out, torch.linalg.cholesky(A + U @ U.mT)) < 1e-12
    assert torch.equal(out, torch.tril(out))  # exactly zero above the diagonal
    down, failed = linalg_compiled.compiled_low_rank(out, U, -1.0)
    assert failed == 0
    assert _rel(down, L) < 1e-10


def test_the_public_routines_take_the_compiled_path_and_agree_with_the_torch_blocked_one():
    m, q = 3 * _BLOCK_COLUMN_MAJOR + 7, 3
    L = torch.linalg.cholesky(_spd(m, seed=1))
    U = 0.3 * torch.randn(m, q, generator=torch.Generator().manual_seed(2), dtype=DT)
    assert linalg_compiled.compiled_low_rank_available(L, U)
    up = cholesky_update(L, U)
    assert _rel(up, _blocked_low_rank(L, U, 1.0, _BLOCK_COLUMN_MAJOR)) < 1e-12
    assert (
        _rel(cholesky_downdate(up, U), _blocked_low_rank(up, U, -1.0, _BLOCK_COLUMN_MAJOR)) < 1e-11
    )


def test_a_long_chain_of_updates_stays_equal_to_a_fresh_cholesky():
    m = 300
    g = torch.Generator().manual_seed(5)
    A = _spd(m, seed=6)
    L = torch.linalg.cholesky(A)
    for _ in range(200):
        q = int(torch.randint(1, 7, (1,), generator=g))
        U = 0.1 * torch.randn(m, q, generator=g, dtype=DT)
        L = cholesky_update(L, U)
        A = A + U @ U.mT
    assert L.mT.is_contiguous()  # the output keeps the fast (column-major) layout
    assert _rel(L, torch.linalg.cholesky(A)) < 1e-9


def test_float32_matches_the_float64_result_to_single_precision():
    m, q = 200, 3
    A = _spd(m, seed=8)
    U = 0.3 * torch.randn(m, q, generator=torch.Generator().manual_seed(9), dtype=DT)
    L32 = torch.linalg.cholesky(A).float()
    out = cholesky_update(L32, U.float())
    assert out.dtype == torch.float32
    assert _rel(out.double(), torch.linalg.cholesky(A + U @ U.mT)) < 1e-5


def test_a_batch_with_a_shared_factor_equals_each_update_on_its_own():
    m, q, b = 60, 2, 4
    A = _spd(m, seed=10)
    L = torch.linalg.cholesky(A)
    U = 0.3 * torch.randn(b, m, q, generator=torch.Generator().manual_seed(11), dtype=DT)
    out = cholesky_update(L, U)  # L broadcast (stride 0) against U's batch
    assert out.shape == (b, m, m)
    for i in range(b):
        assert _rel(out[i], torch.linalg.cholesky(A + U[i] @ U[i].mT)) < 1e-12


def test_a_downdate_that_loses_definiteness_raises_and_leaves_the_factor():
    m = 90
    A = _spd(m, seed=12)
    L = torch.linalg.cholesky(A)
    evals, evecs = torch.linalg.eigh(A)
    v = evecs[:, :1] * (1.5 * evals[0].sqrt())
    before = L.clone()
    with pytest.raises(NotPositiveDefiniteError, match="not positive definite"):
        cholesky_downdate(L, v)
    assert torch.equal(L, before)


def test_a_nan_in_the_update_columns_raises():
    L = torch.linalg.cholesky(_spd(20, seed=13))
    U = torch.ones(20, 1, dtype=DT)
    U[4, 0] = float("nan")
    with pytest.raises(NotPositiveDefiniteError, match="non-finite"):
        cholesky_update(L, U)


def test_autograd_takes_the_torch_routine_and_gives_gradients():
    m = 12
    L = torch.linalg.cholesky(_spd(m, seed=14))
    U = (
        0.3 * torch.randn(m, 2, generator=torch.Generator().manual_seed(15), dtype=DT)
    ).requires_grad_()
    assert not linalg_compiled.compiled_low_rank_available(L, U)
    cholesky_update(L, U).diagonal().log().sum().backward()
    assert U.grad is not None and bool(torch.isfinite(U.grad).all())


def _fresh_build(monkeypatch):
    """Forget the process's kernel so that the next call builds it again."""
    monkeypatch.setattr(linalg_compiled, "_tried", False)
    monkeypatch.setattr(linalg_compiled, "_kernel", None)


def test_no_writable_cache_directory_still_compiles_the_kernel(monkeypatch):
    # Numba finds no cache directory when neither __pycache__ beside the module nor the user's
    # cache directory is writable (a read-only install, a worker whose HOME is read-only):
    # njit(cache=True) then raises RuntimeError at decoration. That must not reach the caller.
    import numba.core.caching

    def unwritable(self):
        raise PermissionError(13, "Permission denied", self.get_cache_path())

    monkeypatch.setattr(numba.core.caching._CacheLocator, "ensure_cache_path", unwritable)
    _fresh_build(monkeypatch)
    m = 9
    A = _spd(m, seed=16)
    L = torch.linalg.cholesky(A)
    U = 0.3 * torch.randn(m, 2, generator=torch.Generator().manual_seed(17), dtype=DT)
    out = cholesky_update(L, U)
    assert linalg_compiled._kernel is not None  # compiled, only not cached
    assert _rel(out, torch.linalg.cholesky(A + U @ U.mT)) < 1e-12


def test_a_numba_that_fails_to_load_leaves_the_torch_routines(monkeypatch):
    # A broken llvmlite raises OSError ("Could not find/load shared object file") on import,
    # not ImportError.
    import sys

    class Broken:
        def find_spec(self, name, path=None, target=None):
            if name == "numba":
                raise OSError("Could not find/load shared object file 'libllvmlite.so'")
            return None

    monkeypatch.delitem(sys.modules, "numba")
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    _fresh_build(monkeypatch)
    m = 9
    A = _spd(m, seed=18)
    L = torch.linalg.cholesky(A)
    U = 0.3 * torch.randn(m, 2, generator=torch.Generator().manual_seed(19), dtype=DT)
    assert not linalg_compiled.compiled_low_rank_available(L, U)
    assert _rel(cholesky_update(L, U), torch.linalg.cholesky(A + U @ U.mT)) < 1e-12
