r"""Batched Cholesky maintenance for online models.

Every online surrogate keeps a lower Cholesky factor of some SPD matrix and must change it by
a few rows or a low-rank term per step without refactorising. These routines do that on any
leading batch shape, dtype and device, and are written functionally (they return new tensors,
never modify their inputs), so they are safe under autograd and a failure leaves the caller's
factor untouched.

Neither PyTorch nor GPyTorch/linear_operator provides a rank-k Cholesky update or a bordered
append, hence this module.

Rank-1 update/downdate (``L L^T +/- x x^T``), in vectorised O(m^2) form: with ``p = L^{-1} x``,
``L L^T +/- x x^T = L (I +/- p p^T) L^T`` and the Cholesky factor ``M`` of ``I +/- p p^T`` is
semiseparable::

    s_0 = 1,  s_k = 1 +/- sum_{j<=k} p_j^2
    M_kk = sqrt(s_k / s_{k-1}),   M_ik = +/- p_i p_k / sqrt(s_k s_{k-1})   (i > k)

so ``L' = L M`` costs one triangular solve, one reverse cumulative sum over columns and a few
elementwise passes, with no Python loop over the m columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from bo_online.linalg_compiled import compiled_low_rank, compiled_low_rank_available

__all__ = [
    "NotPositiveDefiniteError",
    "cholesky_update",
    "cholesky_downdate",
    "cholesky_append",
    "cholesky_append_rows",
    "schur_cholesky",
    "solve_bordered",
    "solve_bordered_transpose",
    "solve_lower",
    "solve_lower_transpose",
    "matmul_folded",
    "cholesky_solve",
    "cholesky_logdet",
    "logdet_and_inverse_quad",
    "psd_cholesky",
    "LowRankUpdatedCholesky",
]


def broadcast_shapes(*shapes: torch.Size) -> torch.Size:
    r"""``torch.broadcast_shapes`` for the few short shapes of a cache update, in plain Python
    (torch's version goes through its reference implementation, ~20x slower for small inputs)."""
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, start=ndim - len(shape)):
            if size != 1:
                if out[i] not in (1, size):
                    raise RuntimeError(f"Shapes {[tuple(s) for s in shapes]} do not broadcast.")
                out[i] = size
    return torch.Size(out)


class NotPositiveDefiniteError(ValueError):
    """Raised when a Cholesky update, downdate or append would leave the matrix not SPD."""


def solve_lower(L: Tensor, B: Tensor) -> Tensor:
    r"""Solve ``L X = B`` for lower-triangular ``L``.

    Args:
        L: ``... x n x n`` lower-triangular factor.
        B: ``... x n x k`` right-hand sides (batch dims broadcast).

    Returns:
        ``... x n x k`` solution.
    """
    return _solve_triangular_folded(L, B, transpose=False)


def _solve_triangular_folded(L: Tensor, B: Tensor, transpose: bool) -> Tensor:
    r"""``L^{-1} B`` (or ``L^{-T} B``), with the batch dims that ``B`` has beyond ``L``'s folded
    into columns.

    ``torch.linalg.solve_triangular`` broadcasts by materialising ``L`` once per batch element of
    ``B``: a posterior at ``b x 1 x d`` on an ``n x n`` factor would copy it b times (b n^2
    memory). Moving ``B``'s extra leading dims into the right-hand-side columns solves the same
    system with one ``n x (b k)`` right-hand side instead; memory is linear in b.
    """
    Lt = L.transpose(-1, -2) if transpose else L
    return _fold_extra_batch(lambda F: torch.linalg.solve_triangular(Lt, F, upper=transpose), L, B)


def matmul_folded(A: Tensor, B: Tensor) -> Tensor:
    r"""``A @ B`` with the batch dims that ``B`` has beyond ``A``'s folded into columns.

    ``torch.matmul`` broadcasts a batched ``A`` against ``B`` by materialising ``A`` once per
    extra batch element of ``B`` (a fantasy model's ``b x m x m`` factor against ``sample x b x
    m x k`` right-hand sides copies it ``sample`` times); folding computes the same product with
    memory linear in ``B``.

    Args:
        A: ``... x p x n``.
        B: ``... x n x k`` (batch dims broadcast).

    Returns:
        ``... x p x k``.
    """
    return _fold_extra_batch(lambda F: A @ F, A, B)


def _fold_extra_batch(op: Callable[[Tensor], Tensor], A: Tensor, B: Tensor) -> Tensor:
    r"""``op(B)`` for an ``op`` acting on the columns of ``B`` (``... x n x k`` -> ``... x p x
    k``, batched like ``A``), with ``B``'s batch dims beyond ``A``'s moved into the columns so
    that ``op`` never broadcasts ``A`` over them."""
    extra = B.dim() - A.dim()
    if extra <= 0 or B.shape[extra:-2] != A.shape[:-2]:
        return op(B)
    lead, rest = B.shape[:extra], B.shape[extra:]  # rest = A-batch x n x k
    # E x Ab x n x k -> Ab x n x k x E -> Ab x n x (k E)
    perm = list(range(extra, B.dim())) + list(range(extra))
    folded = B.permute(*perm).reshape(*rest[:-1], rest[-1] * math.prod(lead))
    X = op(folded)
    X = X.reshape(*X.shape[:-1], rest[-1], *lead)
    inverse = list(range(len(rest), len(rest) + extra)) + list(range(len(rest)))
    return X.permute(*inverse)


def solve_lower_transpose(L: Tensor, B: Tensor) -> Tensor:
    r"""Solve ``L^T X = B`` for lower-triangular ``L`` (``... x n x n``, ``B``: ``... x n x k``)."""
    return _solve_triangular_folded(L, B, transpose=True)


def cholesky_solve(L: Tensor, B: Tensor) -> Tensor:
    r"""Solve ``(L L^T) X = B`` given the lower factor ``L`` (``... x n x n``, ``B``:
    ``... x n x k``)."""
    return solve_lower_transpose(L, solve_lower(L, B))


def cholesky_logdet(L: Tensor) -> Tensor:
    r"""``log det(L L^T)`` for a lower factor ``L`` of shape ``... x n x n``; returns shape
    ``...``."""
    return 2.0 * torch.diagonal(L, dim1=-2, dim2=-1).log().sum(-1)


class _LogdetAndInverseQuad(torch.autograd.Function):
    r"""``(log det A, b^T A^-1 b)`` with the gradient in closed form (see
    :func:`logdet_and_inverse_quad`)."""

    @staticmethod
    def forward(ctx, A: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        L = psd_cholesky(A)
        c = torch.cholesky_solve(b.unsqueeze(-1), L).squeeze(-1)
        ctx.save_for_backward(L, c)
        return cholesky_logdet(L), (b * c).sum(-1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_logdet: Tensor, g_quad: Tensor):  # type: ignore[override]
        L, c = ctx.saved_tensors
        # d log det A = tr(A^-1 dA);  d (b^T A^-1 b) = 2 c^T db - c^T dA c,  c = A^-1 b
        g_logdet, g_quad = g_logdet[..., None, None], g_quad[..., None]
        grad_A = g_logdet * torch.cholesky_inverse(L) - g_quad.unsqueeze(-1) * (
            c.unsqueeze(-1) * c.unsqueeze(-2)
        )
        return grad_A, 2.0 * g_quad * c


def logdet_and_inverse_quad(A: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    r"""``log det A`` and ``b^T A^-1 b`` for a symmetric positive definite ``A`` (``... x n x n``)
    and ``b`` (``... x n``), through one Cholesky factor (:func:`psd_cholesky`, so with its jitter
    where ``A`` needs it); each of shape ``...``.

    Why by hand: the gradient ``(g_logdet A^-1 - g_quad c c^T, 2 g_quad c)`` with ``c = A^-1 b``
    costs one ``cholesky_inverse`` (``n^3`` flops), where autograd through the Cholesky factor
    and a triangular solve costs about twice that and several ``n x n`` temporaries: measured 2x
    faster at n = 512 (one thread). The result is differentiable once (no second derivatives).
    """
    return _LogdetAndInverseQuad.apply(A, b)


def psd_cholesky(A: Tensor, max_tries: int = 4, jitter: float | None = None) -> Tensor:
    r"""Cholesky factor of a (numerically) SPD ``... x n x n`` matrix, adding jitter if needed.

    Tries the plain factorisation first; on failure adds ``jitter * mean(diag A)`` to the diagonal,
    growing it tenfold per try (default jitter 1e-10 for float64, 1e-6 for float32).

    Raises:
        NotPositiveDefiniteError: if no jitter up to the last try makes ``A`` factorisable.
    """
    return psd_cholesky_and_jitter(A, max_tries, jitter)[0]


def psd_cholesky_and_jitter(
    A: Tensor, max_tries: int = 4, jitter: float | None = None
) -> tuple[Tensor, Tensor]:
    r""":func:`psd_cholesky` and the jitter it added to the diagonal: ``(L, shift)``, ``shift``
    of shape ``... x 1`` (zeros where the plain factorisation succeeded), for callers that judge
    whether the jitter changed their model (a shift comparable with a noise term does)."""
    L, info = torch.linalg.cholesky_ex(A)
    if not bool(info.any()):
        return L, A.new_zeros(A.shape[:-2] + (1,))
    base = jitter if jitter is not None else (1e-10 if A.dtype == torch.float64 else 1e-6)
    scale = torch.diagonal(A, dim1=-2, dim2=-1).abs().mean(-1, keepdim=True).clamp_min(1e-300)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    for k in range(max_tries):
        shift = (base * 10**k) * scale
        L, info = torch.linalg.cholesky_ex(A + shift.unsqueeze(-1) * eye)
        if not bool(info.any()):
            return L, shift
    raise NotPositiveDefiniteError(
        f"Matrix of shape {tuple(A.shape)} is not positive definite even with relative jitter "
        f"{base * 10 ** (max_tries - 1):.1e}; check the kernel hyperparameters and the noise level."
    )


def _rank_one(L: Tensor, x: Tensor, sign: float) -> Tensor:
    r"""Factor of ``L L^T + sign * x x^T``; ``L``: ``... x m x m``, ``x``: ``... x m``."""
    p = solve_lower(L, x.unsqueeze(-1)).squeeze(-1)  # ... x m
    s = 1.0 + sign * torch.cumsum(p * p, dim=-1)  # s_k, k = 1..m
    if sign < 0 and bool((s <= 0).any()):
        raise NotPositiveDefiniteError(
            "Cholesky downdate would make the matrix not positive definite "
            f"(smallest pivot ratio {float(s.min()):.3e}); the factor was left unchanged."
        )
    s_prev = torch.cat([torch.ones_like(s[..., :1]), s[..., :-1]], dim=-1)
    diag_scale = torch.sqrt(s / s_prev).unsqueeze(-2)  # M_kk, as a row
    gamma = (sign * p / torch.sqrt(s * s_prev)).unsqueeze(-2)  # M_ik = p_i gamma_k, i > k
    # tail[r, k] = sum_{i > k} L[r, i] p_i.  Since L is lower triangular, sum_i L[r, i] p_i = x_r,
    # so tail[r, k] = x_r - cumsum_k(L[r, :] p) for k < r and 0 otherwise: one forward cumsum.
    if torch.is_grad_enabled() and (L.requires_grad or x.requires_grad):
        tail = torch.tril(x.unsqueeze(-1) - torch.cumsum(L * p.unsqueeze(-2), dim=-1), -1)
        return L * diag_scale + tail * gamma
    # Same arithmetic on a single work buffer (this is the per-step hot path of every model).
    work = L * p.unsqueeze(-2)
    work.cumsum_(-1)
    work.neg_().add_(x.unsqueeze(-1)).tril_(-1).mul_(gamma)
    return work.addcmul_(L, diag_scale)


def _check_low_rank(L: Tensor, U: Tensor) -> None:
    if L.shape[-1] != L.shape[-2]:
        raise ValueError(f"L must be square in its last two dims, got shape {tuple(L.shape)}.")
    if U.shape[-2] != L.shape[-1]:
        raise ValueError(
            f"U must have shape ... x {L.shape[-1]} x q to match L, got {tuple(U.shape)}."
        )


#: Column-block width of the blocked rank-q update (an m x 16 panel of doubles stays in cache).
_BLOCK = 16
#: The same for a column-major factor (:func:`_panels_column_major`): wider panels, fewer BLAS
#: calls; at m = 1,000, q = 3 the time is flat from 25 to 50 columns (measured, one thread).
_BLOCK_COLUMN_MAJOR = 40


def _blocked_low_rank(L: Tensor, U: Tensor, sign: float, block: int = _BLOCK) -> Tensor:
    r"""Factor of ``L L^T + sign * U U^T`` by column blocks (``L``: ``batch x m x m``, ``U``:
    ``batch x m x q``, both already broadcast), with one short Python loop over the
    column panels.

    As for rank one (module docstring), ``L' = L M`` with ``P = L^-1 U`` and ``M`` the lower factor
    of ``I + s P P^T``.  ``M`` is generated by ``P``: below its diagonal blocks it is ``P G^T``.
    For column block ``k`` (rows ``j_k .. j_k + b``), Woodbury on the Schur complement of the
    leading ``j_k`` rows gives ``I + P_rest Sigma_k P_rest^T`` with
    ``Sigma_k = s (I_q + s C_k)^-1``, ``C_k = P[:j_k]^T P[:j_k]`` (a cumulative ``q x q`` Gram), so
    every block is independent of the others::

        M_kk = chol(I + P_k Sigma_k P_k^T),   G_k^T = Sigma_k P_k^T M_kk^-T
        L'[:, k] = L[:, k] M_kk + (L[:, after k] P[after k]) G_k^T

    and, since ``L P = U``, ``L[:, after k] P[after k] = U - S_k`` with ``S_k`` the cumulative
    ``L[:, up to k] P[up to k]``.  The small per-block factors are batched over all blocks; the
    panel products go block by block, each panel read while it is in cache, so the factor is read
    about twice (the solve for ``P`` and the panels) and written once, whatever q is -- against
    about six passes per column for q rank-one sweeps. A column-major ``L`` (LAPACK's layout, and
    the layout this returns for it) takes :func:`_panels_column_major`, which writes every panel
    product in place; any other layout, a batch or autograd :func:`_panels_loop`.
    """
    m, q = L.shape[-1], U.shape[-1]
    batch = L.shape[:-2]
    nb, b = divmod(m, block)[0], block
    main = nb * b
    P = solve_lower(L, U)  # batch x m x q
    eye_q = torch.eye(q, dtype=L.dtype, device=L.device)
    Pb = P[..., :main, :].reshape(*batch, nb, b, q)
    gram = Pb.mT @ Pb  # batch x nb x q x q
    C_incl = gram.cumsum(-3)
    C = C_incl - gram  # Gram of the rows before each block
    if main < m:  # a last, narrower block
        Pt = P[..., main:, :].unsqueeze(-3)
        C_t = C_incl[..., -1:, :, :] if nb else torch.zeros_like(eye_q).expand(*batch, 1, q, q)
    Lc, info_c = torch.linalg.cholesky_ex(eye_q + sign * C)
    infos = [info_c]

    def block_factors(Pk: Tensor, Lck: Tensor) -> tuple[Tensor, Tensor]:
        # V = P_k Lc^-T, so P_k Sigma_k P_k^T = s V V^T; then M_kk and
        # G_k^T = s Lc^-T (M_kk^-1 V)^T.
        V = torch.linalg.solve_triangular(Lck, Pk.mT, upper=False).mT
        eye_b = torch.eye(Pk.shape[-2], dtype=L.dtype, device=L.device)
        Mkk, info = torch.linalg.cholesky_ex(eye_b + sign * (V @ V.mT))
        infos.append(info)
        Y = torch.linalg.solve_triangular(Mkk, V, upper=False)
        Gt = torch.linalg.solve_triangular(Lck.mT, Y.mT, upper=True)
        return Mkk, Gt if sign > 0 else -Gt

    fast = _column_major_path(L, U)
    if fast:
        out = _panels_column_major(L, U, Pb, Lc, nb, b, block_factors)
    else:
        out = _panels_loop(L, U, Pb, Lc, nb, b, block_factors)
    if main < m:
        Lc_t, info_t = torch.linalg.cholesky_ex(eye_q + sign * C_t)
        infos.append(info_t)
        Mt, _ = block_factors(Pt, Lc_t)
        if fast:  # the tail's rows of L'^T, contiguous
            out.mT[main:, :main].zero_()
            torch.mm(Mt.squeeze(-3).mT, L.mT[main:, main:], out=out.mT[main:, main:])
        else:
            out[..., main:] = L[..., main:] @ Mt.squeeze(-3)
    # No tril: products of lower-triangular blocks are exactly zero above the diagonal.
    if bool(torch.cat([i.reshape(-1) for i in infos]).any()):
        raise NotPositiveDefiniteError(
            "Cholesky downdate would make the matrix not positive definite; the factor was left "
            "unchanged."
        )
    return out


def _panels_loop(L, U, Pb, Lc, nb: int, b: int, block_factors) -> Tensor:
    r"""The column panels of :func:`_blocked_low_rank` one at a time (any memory layout)."""
    m = L.shape[-1]
    out = torch.zeros_like(L)  # one memset for the upper triangle, not one fill per panel
    if nb:
        Mkk, Gt = block_factors(Pb, Lc)  # batch x nb x b x b, batch x nb x q x b
        S = torch.zeros_like(U)  # rows j1.. of L[:, up to block] P[up to block]
        for k in range(nb):
            j0, j1 = k * b, (k + 1) * b
            X = L[..., j0:, j0:j1]
            out[..., j0:j1, j0:j1] = X[..., :b, :] @ Mkk[..., k, :, :]
            if j1 == m:
                break
            S = S[..., b:, :] + X[..., b:, :] @ Pb[..., k, :, :]
            Z = U[..., j1:, :] - S
            out[..., j1:, j0:j1] = X[..., b:, :] @ Mkk[..., k, :, :] + Z @ Gt[..., k, :, :]
    return out


def _panels_column_major(L, U, Pb, Lc, nb: int, b: int, block_factors) -> Tensor:
    r"""The column panels of :func:`_blocked_low_rank` for a column-major ``L`` (as LAPACK, i.e.
    ``torch.linalg.cholesky``, returns it), in the transposed world.

    ``L^T`` is then row-major, so panel k of ``L`` transposed (rows ``j0 .. j1`` of ``L^T``) is a
    contiguous ``b x m`` block, and the new factor is built as ``L'^T`` row block by row block,
    every product written by BLAS straight into its place (no temporaries, no copies)::

        L'^T[k, j0:]  = M_kk^T L^T[k, j0:]            (zero left of j0)
        Z^T[:, j1:]  -= P_k^T L^T[k, j1:]             (Z = U - L[:, up to k] P[up to k])
        L'^T[k, j1:] += G_k Z^T[:, j1:]

    so ``Z`` is kept, not ``S``. Three BLAS calls and one fill per panel; the factor is read
    once here (plus once by the solve for ``P``) and written once. Returns the column-major
    ``L'`` whose columns from ``nb * b`` on are left for the caller's last, narrower block.
    """
    m = L.shape[-1]
    out_t = torch.empty(m, m, dtype=L.dtype, device=L.device)  # rows of L'^T
    if nb:
        Mkk, Gt = block_factors(Pb, Lc)  # nb x b x b, nb x q x b
        MkkT, G, PbT = Mkk.mT.contiguous(), Gt.mT.contiguous(), Pb.mT.contiguous()
        Lt = L.mT
        Zt = U.mT.clone(memory_format=torch.contiguous_format)  # (U - S_k)^T, q x m, updated
        for k in range(nb):
            j0, j1 = k * b, (k + 1) * b
            panel = Lt[j0:j1, j0:]
            out_t[j0:j1, :j0].zero_()
            torch.mm(MkkT[k], panel, out=out_t[j0:j1, j0:])
            if j1 < m:
                Zt[:, j1:].addmm_(PbT[k], panel[:, b:], alpha=-1.0)
                out_t[j0:j1, j1:].addmm_(G[k], Zt[:, j1:])
    return out_t.mT


def _sweeps(L: Tensor, U: Tensor, sign: float) -> Tensor:
    r"""``q`` sequential rank-one passes (the reference the blocked form is benchmarked against)."""
    out = L
    for j in range(U.shape[-1]):
        out = _rank_one(out, U[..., j], sign)
    return out


def _low_rank(L: Tensor, U: Tensor, sign: float) -> Tensor:
    _check_low_rank(L, U)
    batch = broadcast_shapes(L.shape[:-2], U.shape[:-2])
    L = L.expand(*batch, *L.shape[-2:])
    U = U.expand(*batch, *U.shape[-2:])
    compiled = compiled_low_rank(L, U, sign) if compiled_low_rank_available(L, U) else None
    if compiled is not None:  # one pass of rotations (bo_online.linalg_compiled)
        out, failed = compiled
        if failed:
            raise NotPositiveDefiniteError(
                "Cholesky downdate would make the matrix not positive definite; the factor was "
                "left unchanged."
                if sign < 0
                else "Cholesky update met a non-finite value (NaN or inf in the factor or the "
                "update columns); the factor was left unchanged."
            )
        return out
    # Below two blocks the Python loop's overhead outweighs the memory traffic saved.
    if L.shape[-1] <= 2 * _BLOCK:
        return _sweeps(L, U, sign)
    block = _BLOCK_COLUMN_MAJOR if _column_major_path(L, U) else _BLOCK
    return _blocked_low_rank(L, U, sign, block)


def _column_major_path(L: Tensor, U: Tensor) -> bool:
    r"""Whether :func:`_panels_column_major` applies: one column-major factor, no autograd
    (it writes products into a preallocated output, which autograd cannot follow)."""
    grad = torch.is_grad_enabled() and (L.requires_grad or U.requires_grad)
    return not grad and L.dim() == 2 and L.mT.is_contiguous()


def cholesky_update(L: Tensor, U: Tensor) -> Tensor:
    r"""Lower factor of ``L L^T + U U^T`` (rank-q update), O(m^2 q).

    On the CPU (float32/float64, no autograd) one compiled pass of plane rotations
    (:mod:`bo_online.linalg_compiled`); otherwise, small factors use q vectorised rank-one sweeps
    and larger ones the blocked form (:func:`_blocked_low_rank`), which reads and writes the
    factor about once for all q columns.

    Args:
        L: ``... x m x m`` lower Cholesky factor.
        U: ``... x m x q`` update columns (batch dims broadcast against ``L``'s).

    Returns:
        The new ``batch x m x m`` factor; ``L`` is not modified.
    """
    return _low_rank(L, U, 1.0)


def cholesky_downdate(L: Tensor, U: Tensor) -> Tensor:
    r"""Lower factor of ``L L^T - U U^T`` (rank-q downdate), O(m^2 q); same algorithms as
    :func:`cholesky_update`.

    Raises:
        NotPositiveDefiniteError: if the result would not be positive definite; ``L`` is left
            unchanged (nothing is modified in place).
    """
    return _low_rank(L, U, -1.0)


def cholesky_append(L: Tensor, B: Tensor, C: Tensor) -> Tensor:
    r"""Factor of the bordered matrix ``[[A, B], [B^T, C]]`` given ``L L^T = A``, O(n^2 q).

    Args:
        L: ``... x n x n`` lower factor of ``A`` (n may be 0).
        B: ``... x n x q`` new off-diagonal block.
        C: ``... x q x q`` new diagonal block (symmetric).

    Returns:
        ``batch x (n+q) x (n+q)`` lower factor, batch dims broadcast over the three inputs.

    Raises:
        NotPositiveDefiniteError: if the Schur complement ``C - S^T S`` (``S = L^{-1} B``) is not
            positive definite, i.e. the bordered matrix is not SPD.
    """
    S_t, L22 = cholesky_append_rows(L, B, C)
    n, q = L.shape[-1], L22.shape[-1]
    batch = S_t.shape[:-2]
    # One allocation, blocks copied in (two torch.cat calls would copy the n x n block twice).
    out = L.new_zeros(*batch, n + q, n + q)
    out[..., :n, :n] = L
    out[..., n:, :n] = S_t
    out[..., n:, n:] = L22
    return out


def cholesky_append_rows(L: Tensor, B: Tensor, C: Tensor) -> tuple[Tensor, Tensor]:
    r"""The new rows ``[S^T, L22]`` of the bordered factor of :func:`cholesky_append`, without
    copying ``L``: a caller can keep ``L`` shared and solve blockwise (:func:`solve_bordered`).

    Returns:
        ``(S^T, L22)`` of shapes ``batch x q x n`` and ``batch x q x q`` (batch dims broadcast).
    """
    n, q = B.shape[-2], B.shape[-1]
    if L.shape[-1] != n or C.shape[-1] != q or C.shape[-2] != q:
        raise ValueError(
            f"Shapes do not border: L {tuple(L.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)}."
        )
    batch = broadcast_shapes(L.shape[:-2], B.shape[:-2], C.shape[:-2])
    S = (
        solve_lower(L.expand(*batch, n, n), B.expand(*batch, n, q))
        if n > 0
        else B.expand(*batch, n, q)
    )
    return S.transpose(-1, -2), schur_cholesky(C.expand(*batch, q, q), S)


def solve_bordered(L: Tensor, S_t: Tensor, L22: Tensor, B: Tensor) -> Tensor:
    r"""Solve ``[[L, 0], [S^T, L22]] X = B`` blockwise (``B``: ``... x (n+q) x k``), O(n^2 k).

    ``B``'s batch dims beyond those of ``S_t`` / ``L22`` (fantasy samples against a fantasy
    model's per-batch rows) are folded into columns (:func:`matmul_folded`), so ``S_t`` is not
    copied once per sample."""
    n = L.shape[-1]
    X1 = solve_lower(L, B[..., :n, :])
    X2 = solve_lower(L22, B[..., n:, :] - matmul_folded(S_t, X1))
    return torch.cat([X1, X2], dim=-2)


def solve_bordered_transpose(L: Tensor, S_t: Tensor, L22: Tensor, B: Tensor) -> Tensor:
    r"""Solve ``[[L, 0], [S^T, L22]]^T X = B`` blockwise (``B``: ``... x (n+q) x k``; extra
    batch dims folded as in :func:`solve_bordered`)."""
    n = L.shape[-1]
    X2 = solve_lower_transpose(L22, B[..., n:, :])
    X1 = solve_lower_transpose(L, B[..., :n, :] - matmul_folded(S_t.transpose(-1, -2), X2))
    return torch.cat([X1, X2], dim=-2)


def schur_cholesky(C: Tensor, S: Tensor) -> Tensor:
    r"""Lower factor of the Schur complement ``C - S^T S`` (``C``: ``... x q x q``, ``S``:
    ``... x n x q``): the new diagonal block of a bordered Cholesky factor."""
    schur = C - S.transpose(-1, -2) @ S
    L22, info = torch.linalg.cholesky_ex(schur)
    if bool(info.any()):
        raise NotPositiveDefiniteError(
            "Bordered Cholesky append failed: the new block's Schur complement is not positive "
            "definite (duplicate inputs with zero noise?). The factor was left unchanged."
        )
    return L22


class LowRankUpdatedCholesky:
    r"""``B' = L L^T + U U^T`` held as the factor ``L`` plus the low-rank term, never refactorised.

    Conditioning a model on q points adds ``U U^T`` (``U``: ``m x q``) to an SPD ``m x m`` matrix
    whose factor ``L`` is shared with the parent model. Updating the factor costs q sequential
    memory-bound O(m^2) passes (or an O(m^3) refactorisation); the Woodbury form below needs one
    triangular solve with q columns, so a fantasy model costs O(m^2 q) with a small constant.
    With ``W = L^-1 U`` (``m x r``) and ``C = chol(I_r + W^T W)`` (``r x r``)::

        B' = L (I + W W^T) L^T,   (I + W W^T)^-1 = I - W C^-T C^-1 W^T
        B'^-1 b = L^-T (z - W C^-T C^-1 W^T z),   z = L^-1 b
        A^T B'^-1 A = |L^-1 A|^2 - |C^-1 W^T L^-1 A|^2   (column Gram matrices)

    The object is immutable: :meth:`add` returns a new one whose ``L`` is still the shared parent
    factor. Neither PyTorch nor linear_operator keeps a Cholesky factor with a pending low-rank
    term in this form (``LowRankRootAddedDiagLinearOperator`` wants a diagonal), hence this class.

    Args:
        L: ``batch_L x m x m`` lower Cholesky factor.
        U: optional ``batch_U x m x r`` low-rank columns (batch dims broadcast with ``L``'s).
    """

    def __init__(
        self, L: Tensor, U: Tensor | None = None, W: Tensor | None = None, C: Tensor | None = None
    ) -> None:
        self.L = L
        self.U = U
        if U is not None and (W is None or C is None):
            _check_low_rank(L, U)
            W = solve_lower(L, U)
            C = self._gram_factor(W)
        self.W, self.C = W, C

    @staticmethod
    def _gram_factor(W: Tensor) -> Tensor:
        eye = torch.eye(W.shape[-1], dtype=W.dtype, device=W.device)
        return psd_cholesky(eye + W.transpose(-1, -2) @ W)

    @property
    def has_low_rank(self) -> bool:
        return self.U is not None

    @property
    def batch_shape(self) -> torch.Size:
        if self.U is None:
            return self.L.shape[:-2]
        return broadcast_shapes(self.L.shape[:-2], self.W.shape[:-2])

    #: A chain of :meth:`add` calls (a model conditioned, its child conditioned again, ...) folds
    #: the pending term into a new factor once its rank would pass ``FOLD_MIN_RANK`` and this
    #: fraction of m: each add costs O(m r^2 + r^3) in the pending rank r, so an unbounded chain
    #: slowed every step (t-SVGP, m = 128, 200 conditionings on 3 points each: 2.5 -> 19.7 ms
    #: per step). Short chains keep sharing the parent's factor.
    FOLD_RANK_FRACTION: float = 0.25
    FOLD_MIN_RANK: int = 32

    def add(self, U: Tensor) -> "LowRankUpdatedCholesky":
        r"""``B' + U U^T`` (``U``: ``batch x m x q``): O(m^2 q + m r^2 + r^3), ``L`` not touched
        (or, once the pending rank ``r`` of an unbatched pending term would pass
        ``max(FOLD_MIN_RANK, FOLD_RANK_FRACTION * m)``, that term is first folded into a new
        factor, O(m^3), so r stays bounded)."""
        _check_low_rank(self.L, U)
        if (
            self.U is not None
            and self.U.shape[-1] + U.shape[-1]
            > max(self.FOLD_MIN_RANK, self.FOLD_RANK_FRACTION * self.L.shape[-1])
            and self.W.shape[:-2] == self.L.shape[:-2]  # no fantasy batch: one m x m factor
        ):
            return LowRankUpdatedCholesky(self.cholesky()).add(U)
        W_new = solve_lower(self.L, U)
        if self.U is None:
            return LowRankUpdatedCholesky(self.L, U, W_new, self._gram_factor(W_new))
        batch = broadcast_shapes(self.W.shape[:-2], W_new.shape[:-2])

        def cat(a: Tensor, b: Tensor) -> Tensor:
            return torch.cat([a.expand(*batch, *a.shape[-2:]), b.expand(*batch, *b.shape[-2:])], -1)

        W = cat(self.W, W_new)
        return LowRankUpdatedCholesky(self.L, cat(self.U, U), W, self._gram_factor(W))

    def solve(self, b: Tensor) -> Tensor:
        r"""``B'^-1 b`` for ``b``: ``extra x batch x m`` (extra dims, e.g. fantasy samples, are
        solved as extra columns of one triangular solve with ``L`` rather than broadcasting it)."""
        z = _solve_columns(solve_lower, self.L, b)
        if self.U is not None:
            t = (z.unsqueeze(-2) @ self.W).squeeze(-2)  # W^T z: ... x r
            t = _solve_columns(lambda C, B: torch.cholesky_solve(B, C), self.C, t)
            z = z - (t.unsqueeze(-2) @ self.W.transpose(-1, -2)).squeeze(-2)
        return _solve_columns(solve_lower_transpose, self.L, z)

    def whiten(self, A: Tensor) -> tuple[Tensor, Tensor | None]:
        r"""``(L^-1 A, C^-1 W^T L^-1 A)`` for ``A``: ``batch x m x q``, so that
        ``A^T B'^-1 A = P^T P - H^T H`` with ``(P, H)`` returned (``H`` None without a low-rank
        term)."""
        P = solve_lower(self.L, A)
        if self.U is None:
            return P, None
        return P, solve_lower(self.C, self.W.transpose(-1, -2) @ P)

    def inv_quad_diag(self, A: Tensor) -> Tensor:
        r"""Diagonal of ``A^T B'^-1 A`` (``batch x q``)."""
        P, H = self.whiten(A)
        out = P.pow(2).sum(-2)
        return out if H is None else out - H.pow(2).sum(-2)

    def cholesky(self) -> Tensor:
        r"""The Cholesky factor of ``B'`` itself: a rank-``r`` update of ``L``
        (:func:`cholesky_update`, O(m^2 r)) while ``3 r < m``, else one O(m^3) refactorisation
        (the cheaper one there, as for WISKI's factor). With a limit of ``r < 4`` a t-SVGP
        ``update`` of 4 or more points refactorised, O(m^3) where its cost is O(m^2 q): at
        m = 512 and q = 4, 9 ms against 0.4 ms for the rank-q update (one thread)."""
        if self.U is None:
            return self.L
        if 3 * self.U.shape[-1] < self.L.shape[-1]:
            return cholesky_update(self.L, self.U)
        L = self.L
        return psd_cholesky(L @ L.transpose(-1, -2) + self.U @ self.U.transpose(-1, -2))


def _solve_columns(solve, L: Tensor, b: Tensor) -> Tensor:
    r"""``solve(L, b)`` for vectors ``b``: ``extra x batch_L x m``; the extra dims become columns of
    one BLAS-3 solve instead of broadcasting ``L`` over them."""
    lb = L.shape[:-2]
    if b.dim() - 1 <= len(lb) or b.shape[b.dim() - 1 - len(lb) : -1] != lb:
        return solve(L, b.unsqueeze(-1)).squeeze(-1)
    extra = b.shape[: b.dim() - 1 - len(lb)]
    cols = b.reshape(math.prod(extra), *lb, L.shape[-1]).movedim(0, -1)  # batch_L x m x E
    return solve(L, cols).movedim(-1, 0).reshape(*extra, *lb, L.shape[-1])
