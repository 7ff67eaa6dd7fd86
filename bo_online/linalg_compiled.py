r"""Rank-q Cholesky update and downdate as one compiled pass over the factor.

The torch routines in :mod:`bo_online.linalg` build the new factor from matrix products, one
Python-level step per column panel: at m = 1,000 and q = 3 that is 6-15 times a copy of the
factor (measured on two machines), and most of it is dense panel products and per-panel
overhead rather than memory traffic. The classical algorithm instead applies, column by
column, q plane rotations (hyperbolic ones for a downdate) that fold the update columns into
the factor: about ``3 q m^2`` flops with no temporaries, so it runs near the speed of a copy
once compiled. Neither PyTorch, SciPy nor linear_operator provides it, so it is written here
and compiled with Numba (lazily, on first use; the compiled code is cached on disk).

For column ``k`` of ``L`` and update column ``u`` (already rotated by columns ``< k``), with
``sign = +1`` (update) or ``-1`` (downdate)::

    r = sqrt(L_kk^2 + sign u_k^2),   c = r / L_kk,   s = u_k / L_kk
    L'_kk = r
    L'_ik = (L_ik + sign s u_i) / c,   u_i <- c u_i - s L'_ik          (i > k)

and the q columns are applied in turn to the same column of ``L`` before moving on (equal to q
full sweeps one after the other, since sweep j at column k needs only column k after sweep
j - 1 and its own rotated column). A downdate fails when ``L_kk^2 - u_k^2 <= 0``: the result
would not be positive definite.

The kernel works on ``L^T``: a row of ``L^T`` is a column of ``L``, contiguous for the
column-major factors LAPACK (``torch.linalg.cholesky``) returns, and the inner loops run over
contiguous rows, which the compiler vectorises.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["compiled_low_rank_available", "compiled_low_rank"]

#: Set this environment variable to 1 to use the torch routines only (for comparisons).
DISABLE_ENV = "BO_ONLINE_NO_COMPILED_CHOLESKY"

_kernel: Callable | None = None
_tried = False


def _build_kernel() -> Callable | None:
    try:
        import numba
        import numpy as np
    except Exception:  # ImportError, or OSError from a broken llvmlite: the torch routines remain
        return None

    # Unsigned indices: Numba's wrap-around handling of signed indices keeps LLVM from
    # vectorising the row loops (measured: no packed FMAs with signed indices).
    def rotate_rows(Lt, Vt, out, sign):  # pragma: no cover - compiled
        nb, m, q = Lt.shape[0], Lt.shape[1], Vt.shape[1]
        one = np.uint64(1)
        for b in range(nb):
            for k in range(m):
                d = Lt[b, k, k]
                src = Lt[b, k]
                row = out[b, k]
                i = np.uint64(0)
                while i < np.uint64(k):
                    row[i] = 0.0
                    i += one
                i = np.uint64(k + 1)
                while i < np.uint64(m):  # copy column k below the diagonal; rotated in place
                    row[i] = src[i]
                    i += one
                for j in range(q):
                    v = Vt[b, j, k]
                    r2 = d * d + sign * v * v
                    if not r2 > 0.0:  # also catches NaN
                        return b * m + k + 1
                    r = np.sqrt(r2)
                    c, s, inv_c = r / d, v / d, d / r
                    signed_s = sign * s
                    col = Vt[b, j]
                    i = np.uint64(k + 1)
                    while i < np.uint64(m):
                        x = (row[i] + signed_s * col[i]) * inv_c
                        col[i] = c * col[i] - s * x
                        row[i] = x
                        i += one
                    d = r
                row[k] = d
        return 0

    options = dict(fastmath=False, boundscheck=False, error_model="numpy")
    try:
        return numba.njit(cache=True, **options)(rotate_rows)
    except Exception:
        # No writable cache directory (neither __pycache__ beside this module nor the user's
        # cache: Numba raises RuntimeError "no locator available"): compile in each process.
        try:
            return numba.njit(cache=False, **options)(rotate_rows)
        except Exception:
            return None


def _get_kernel() -> Callable | None:
    global _kernel, _tried
    if not _tried:
        _tried = True
        _kernel = None if os.environ.get(DISABLE_ENV) == "1" else _build_kernel()
    return _kernel


def compiled_low_rank_available(L: Tensor, U: Tensor) -> bool:
    r"""Whether :func:`compiled_low_rank` applies: CPU float32/float64 tensors, no autograd,
    and Numba importable (not disabled through ``BO_ONLINE_NO_COMPILED_CHOLESKY=1``)."""
    if L.device.type != "cpu" or U.device.type != "cpu":
        return False
    if L.dtype not in (torch.float32, torch.float64) or U.dtype != L.dtype:
        return False
    if torch.is_grad_enabled() and (L.requires_grad or U.requires_grad):
        return False
    if L.numel() == 0 or U.shape[-1] == 0:
        return False
    return _get_kernel() is not None


def compiled_low_rank(L: Tensor, U: Tensor, sign: float) -> tuple[Tensor, int] | None:
    r"""Factor of ``L L^T + sign * U U^T`` by rotations, one compiled pass.

    Args:
        L: ``batch x m x m`` lower factor (any strides; column-major is fastest).
        U: ``batch x m x q`` update columns, broadcast to ``L``'s batch shape already.
        sign: ``1.0`` (update) or ``-1.0`` (downdate).

    Returns:
        ``(L', failed)``: the new ``batch x m x m`` factor, column-major in its last two dims,
        and 0, or a positive number when a pivot was not positive (a downdate losing
        definiteness, or a NaN), in which case ``L'`` is incomplete. ``None`` where the kernel
        could not be compiled on this machine (it is then not tried again and the caller
        falls back to torch). The inputs are not modified.
    """
    global _kernel
    kernel = _get_kernel()
    if kernel is None:
        return None
    batch, m, q = L.shape[:-2], L.shape[-1], U.shape[-1]
    Lt = L.reshape(-1, m, m).mT  # a view where L's batch dims fold (expanded L: strides 0)
    Vt = U.reshape(-1, m, q).mT.clone(memory_format=torch.contiguous_format)  # rotated in place
    out_t = torch.empty(Lt.shape[0], m, m, dtype=L.dtype)
    try:
        failed = int(kernel(Lt.numpy(), Vt.numpy(), out_t.numpy(), float(sign)))
    except Exception as err:  # compilation failed here: keep the torch routines
        warnings.warn(
            f"The compiled Cholesky update could not be built ({type(err).__name__}: {err}); "
            "using the slower torch routines.",
            RuntimeWarning,
            stacklevel=3,
        )
        _kernel = None
        return None
    return out_t.mT.reshape(*batch, m, m), failed
