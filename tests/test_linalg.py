"""Cholesky maintenance routines against fresh dense factorisations."""

import pytest
import torch
from memory_profile import LargestAllocation

from bo_online.linalg import (
    NotPositiveDefiniteError,
    cholesky_append,
    cholesky_downdate,
    cholesky_logdet,
    cholesky_solve,
    cholesky_update,
    logdet_and_inverse_quad,
    matmul_folded,
    psd_cholesky,
    solve_bordered,
    solve_bordered_transpose,
    solve_lower,
    solve_lower_transpose,
)

DT = torch.float64


def _spd(m: int, batch=(), seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(*batch, m, m, generator=g, dtype=DT)
    return A @ A.transpose(-1, -2) + m * torch.eye(m, dtype=DT)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_thousand_chained_rank_one_updates_match_fresh_cholesky():
    g = torch.Generator().manual_seed(1)
    m = 40
    A = _spd(m)
    L = torch.linalg.cholesky(A)
    for _ in range(1000):
        x = 0.3 * torch.randn(m, 1, generator=g, dtype=DT)
        A = A + x @ x.T
        L = cholesky_update(L, x)
    assert _rel(L, torch.linalg.cholesky(A)) < 1e-9


def test_two_hundred_chained_appends_match_fresh_cholesky():
    g = torch.Generator().manual_seed(2)
    X = torch.rand(200, 2, generator=g, dtype=DT)
    K = torch.exp(-0.5 * torch.cdist(X, X).pow(2) / 0.3**2) + 1e-2 * torch.eye(200, dtype=DT)
    L = torch.linalg.cholesky(K[:1, :1])
    for n in range(1, 200):
        L = cholesky_append(L, K[:n, n : n + 1], K[n : n + 1, n : n + 1])
    assert _rel(L, torch.linalg.cholesky(K)) < 1e-9


@pytest.mark.parametrize("batch", [(), (3,), (2, 4)])
@pytest.mark.parametrize("q", [1, 5])
def test_rank_q_update_and_downdate_batched(batch, q):
    A = _spd(17, batch, seed=3)
    U = torch.randn(*batch, 17, q, generator=torch.Generator().manual_seed(4), dtype=DT)
    L = torch.linalg.cholesky(A)
    L_up = cholesky_update(L, U)
    assert _rel(L_up, torch.linalg.cholesky(A + U @ U.transpose(-1, -2))) < 1e-12
    assert _rel(cholesky_downdate(L_up, U), L) < 1e-10


def test_update_broadcasts_shared_factor_over_batch():
    L = torch.linalg.cholesky(_spd(9))
    U = torch.randn(5, 9, 2, dtype=DT)
    out = cholesky_update(L, U)
    assert out.shape == (5, 9, 9)
    for i in range(5):
        ref = torch.linalg.cholesky(L @ L.T + U[i] @ U[i].T)
        assert _rel(out[i], ref) < 1e-12


def test_append_batched_and_from_empty():
    A = _spd(8, (3,), seed=5)
    L0 = torch.zeros(3, 0, 0, dtype=DT)
    L = cholesky_append(L0, A[..., :0, :5], A[..., :5, :5])
    L = cholesky_append(L, A[..., :5, 5:], A[..., 5:, 5:])
    assert _rel(L, torch.linalg.cholesky(A)) < 1e-12


def test_downdate_losing_definiteness_raises_and_leaves_factor():
    A = _spd(6, seed=6)
    L = torch.linalg.cholesky(A)
    before = L.clone()
    # Removing more than the matrix holds along one direction makes it indefinite.
    v = torch.linalg.eigh(A).eigenvectors[:, :1] * (2.0 * torch.linalg.eigvalsh(A)[0].sqrt())
    with pytest.raises(NotPositiveDefiniteError, match="not positive definite"):
        cholesky_downdate(L, v)
    assert torch.equal(L, before)


def test_append_not_spd_raises_and_leaves_factor():
    A = _spd(5, seed=7)
    L = torch.linalg.cholesky(A)
    before = L.clone()
    # Appending a duplicate of column 0 with zero noise makes the bordered matrix singular.
    with pytest.raises(NotPositiveDefiniteError, match="Schur complement"):
        cholesky_append(L, A[:, :1], A[:1, :1] - 1.0)
    assert torch.equal(L, before)


def test_solves_and_logdet():
    A = _spd(12, (2,), seed=8)
    L = torch.linalg.cholesky(A)
    B = torch.randn(2, 12, 3, dtype=DT)
    assert _rel(L @ solve_lower(L, B), B) < 1e-12
    assert _rel(L.transpose(-1, -2) @ solve_lower_transpose(L, B), B) < 1e-12
    assert _rel(cholesky_solve(L, B), torch.linalg.solve(A, B)) < 1e-10
    assert _rel(cholesky_logdet(L), torch.logdet(A)) < 1e-12


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((3, 4, 5), (2, 3, 5, 2)),
        ((4, 5), (2, 3, 5, 1)),
        ((3, 4, 5), (3, 5, 2)),
        ((1, 4, 5), (2, 3, 5, 2)),
    ],
)
def test_matmul_folded_equals_broadcast_matmul(a_shape, b_shape):
    g = torch.Generator().manual_seed(0)
    A = torch.randn(a_shape, generator=g, dtype=DT)
    B = torch.randn(b_shape, generator=g, dtype=DT)
    torch.testing.assert_close(matmul_folded(A, B), A @ B, atol=1e-13, rtol=0)


def test_bordered_solves_with_sample_dims_equal_dense_and_do_not_copy_the_rows():
    r"""A fantasy model's factor ``[[L, 0], [S^T, L22]]``: ``L`` (``n x n``) shared, the rows
    ``S^T`` (``b x q x n``) and ``L22`` per candidate set, solved against right-hand sides with
    leading fantasy-sample dims (``s x b x (n + q) x k``, the exact GP's weights of each fantasy).
    Equal to dense triangular solves with the full factor, and ``S^T`` is not copied once per
    sample (``torch.matmul`` broadcasting did: ``s x b x q x n``, 188 MB for 8 fantasies at
    b = 512, q = 3, n = 2,000)."""
    g = torch.Generator().manual_seed(4)
    s, b, n, q, k = 16, 8, 40, 3, 1
    L = torch.linalg.cholesky(_spd(n, seed=1))
    S_t = torch.randn(b, q, n, generator=g, dtype=DT)
    L22 = torch.linalg.cholesky(_spd(q, (b,), seed=2))
    B = torch.randn(s, b, n + q, k, generator=g, dtype=DT)
    full = torch.zeros(b, n + q, n + q, dtype=DT)
    full[:, :n, :n], full[:, n:, :n], full[:, n:, n:] = L, S_t, L22
    dense = torch.linalg.solve_triangular(full, B, upper=False)
    dense_t = torch.linalg.solve_triangular(full.transpose(-1, -2), B, upper=True)
    with LargestAllocation() as largest:
        X = solve_bordered(L, S_t, L22, B)
        Xt = solve_bordered_transpose(L, S_t, L22, B)
    torch.testing.assert_close(X, dense, atol=1e-12, rtol=0)
    torch.testing.assert_close(Xt, dense_t, atol=1e-12, rtol=0)
    assert largest.numel < s * b * q * n, (largest.numel, s * b * q * n)


def test_psd_cholesky_adds_jitter_for_singular_matrix():
    x = torch.linspace(0, 1, 30, dtype=DT)
    K = torch.exp(-0.5 * (x[:, None] - x[None, :]).pow(2) / 2.0**2)  # numerically singular
    L = psd_cholesky(K)
    assert torch.isfinite(L).all()
    assert _rel(L @ L.T, K) < 1e-6
    with pytest.raises(NotPositiveDefiniteError):
        psd_cholesky(-torch.eye(3, dtype=DT))


def test_update_under_autograd_matches_and_differentiates():
    A = _spd(7, seed=9)
    L = torch.linalg.cholesky(A).requires_grad_(True)
    U = torch.randn(7, 2, dtype=DT, requires_grad=True)
    out = cholesky_update(L, U)
    assert _rel(out.detach(), torch.linalg.cholesky(A + U.detach() @ U.detach().T)) < 1e-12
    out.sum().backward()
    assert torch.isfinite(U.grad).all() and U.grad.abs().sum() > 0


# ---------------------------------------------------------------------------- Woodbury factor


def _spd_matrix(m, seed):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(m, m, generator=g, dtype=torch.float64)
    return A @ A.T / m + torch.eye(m, dtype=torch.float64)


def test_low_rank_updated_cholesky_equals_dense_solves():
    from bo_online.linalg import LowRankUpdatedCholesky

    m = 30
    g = torch.Generator().manual_seed(1)
    B = _spd_matrix(m, 0)
    L = torch.linalg.cholesky(B)
    U1 = torch.randn(3, m, 2, generator=g, dtype=torch.float64)  # batch of 3, rank 2
    U2 = torch.randn(m, 3, generator=g, dtype=torch.float64)  # unbatched, rank 3, added after
    F = LowRankUpdatedCholesky(L).add(U1).add(U2)
    assert F.L is L and F.W.shape == (3, m, 5) and F.batch_shape == torch.Size([3])
    U = torch.cat([U1, U2.expand(3, m, 3)], -1)
    dense = B + U @ U.transpose(-1, -2)  # 3 x m x m
    b = torch.randn(4, 3, m, generator=g, dtype=torch.float64)  # 4 extra (sample) dims
    expected = torch.linalg.solve(dense, b.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(F.solve(b), expected, atol=1e-11, rtol=0)
    A = torch.randn(m, 7, generator=g, dtype=torch.float64)
    quad = A.T @ torch.linalg.solve(dense, A)
    P, H = F.whiten(A)
    assert torch.allclose(P.transpose(-1, -2) @ P - H.transpose(-1, -2) @ H, quad, atol=1e-11)
    assert torch.allclose(F.inv_quad_diag(A), quad.diagonal(dim1=-2, dim2=-1), atol=1e-11)
    assert torch.allclose(F.cholesky(), torch.linalg.cholesky(dense), atol=1e-11)
    small = LowRankUpdatedCholesky(L, U1)  # rank 2: rank-one updates of the factor
    assert torch.allclose(
        small.cholesky(), torch.linalg.cholesky(B + U1 @ U1.transpose(-1, -2)), atol=1e-11
    )
    # without a low-rank term everything reduces to the plain factor
    plain = LowRankUpdatedCholesky(L)
    assert plain.cholesky() is L and plain.whiten(A)[1] is None
    assert torch.allclose(plain.solve(b[:, 0]), torch.linalg.solve(B, b[:, 0].T).T, atol=1e-11)


def test_low_rank_updated_cholesky_updates_the_factor_below_a_third_of_m(monkeypatch):
    r"""A pending term of rank ``r < m / 3`` (here 8 of 64) becomes the new factor by a rank-r
    update, O(m^2 r): no ``m x m`` factorisation. With ``r >= 4`` it used to be refactorised
    (O(m^3); a t-SVGP update of 4 or more points). At ``3 r >= m`` the refactorisation stays."""
    import bo_online.linalg as linalg

    m, g = 64, torch.Generator().manual_seed(3)
    B = _spd_matrix(m, 4)
    L = torch.linalg.cholesky(B)
    U = torch.randn(m, 8, generator=g, dtype=torch.float64)
    big = torch.randn(m, 22, generator=g, dtype=torch.float64)
    factored = []
    original = linalg.psd_cholesky

    def spy(A, *args, **kwargs):
        factored.append(A.shape[-1])
        return original(A, *args, **kwargs)

    monkeypatch.setattr(linalg, "psd_cholesky", spy)
    F = linalg.LowRankUpdatedCholesky(L, U)
    factored.clear()  # (the r x r Gram factor of the Woodbury form)
    out = F.cholesky()
    assert m not in factored
    assert torch.allclose(out, torch.linalg.cholesky(B + U @ U.T), atol=1e-12, rtol=0)
    out = linalg.LowRankUpdatedCholesky(L, big).cholesky()  # 3 r >= m: one refactorisation
    assert m in factored
    assert torch.allclose(out, torch.linalg.cholesky(B + big @ big.T), atol=1e-12, rtol=0)


def test_broadcast_shapes_matches_torch():
    from bo_online.linalg import broadcast_shapes

    cases = [((3, 1), (4,)), ((), (2, 3)), ((5, 1, 3), (1, 4, 3)), ((2,), (2,)), ((0,), (1,))]
    for shapes in cases:
        assert broadcast_shapes(*map(torch.Size, shapes)) == torch.broadcast_shapes(*shapes)
    with pytest.raises(RuntimeError, match="do not broadcast"):
        broadcast_shapes(torch.Size([2]), torch.Size([3]))


# ------------------------------------------------------------- blocked rank-q update/downdate
# Factors wider than two column blocks take the blocked path (bo_online.linalg._blocked_low_rank).


def _kernel_spd(m: int, seed: int) -> torch.Tensor:
    """An ill-conditioned SPD matrix of the kind WISKI factors (RBF Gram + small ridge)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(m, 3, generator=g, dtype=DT)
    return torch.exp(-0.5 * torch.cdist(X, X).pow(2) / 0.4**2) + 1e-3 * torch.eye(m, dtype=DT)


def test_blocked_chain_of_600_updates_and_downdates_matches_fresh_cholesky():
    g = torch.Generator().manual_seed(11)
    m, q = 150, 3  # m > 2 blocks of 32, last block partial
    A = _kernel_spd(m, 12)
    L = torch.linalg.cholesky(A)
    pending = []
    for step in range(600):
        if step % 3 == 2:  # remove an earlier update: A stays well away from indefinite
            U = pending.pop(0)
            A = A - U @ U.T
            L = cholesky_downdate(L, U)
        else:
            U = 0.2 * torch.randn(m, q, generator=g, dtype=DT)
            pending.append(U)
            A = A + U @ U.T
            L = cholesky_update(L, U)
    assert _rel(L, torch.linalg.cholesky(A)) < 1e-9
    assert torch.equal(L, torch.tril(L))


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_blocked_update_downdate_batched_and_broadcast(batch):
    m = 100
    A = _spd(m, batch, seed=13)
    U = torch.randn(m, 4, generator=torch.Generator().manual_seed(14), dtype=DT)  # shared U
    L = torch.linalg.cholesky(A)
    L_up = cholesky_update(L, U)
    assert L_up.shape == (*batch, m, m)
    assert _rel(L_up, torch.linalg.cholesky(A + U @ U.T)) < 1e-12
    assert _rel(cholesky_downdate(L_up, U), L) < 1e-10
    # a shared factor broadcast over a batch of update columns
    Ub = torch.randn(3, m, 2, generator=torch.Generator().manual_seed(15), dtype=DT)
    A0 = _spd(m, seed=16)
    out = cholesky_update(torch.linalg.cholesky(A0), Ub)
    assert _rel(out, torch.linalg.cholesky(A0 + Ub @ Ub.mT)) < 1e-12


def test_blocked_downdate_losing_definiteness_raises_and_leaves_factor():
    A = _spd(90, seed=17)
    L = torch.linalg.cholesky(A)
    before = L.clone()
    evals, evecs = torch.linalg.eigh(A)
    v = evecs[:, :1] * (1.5 * evals[0].sqrt())
    with pytest.raises(NotPositiveDefiniteError, match="not positive definite"):
        cholesky_downdate(L, v)
    assert torch.equal(L, before)


def test_blocked_update_under_autograd_matches_finite_differences():
    m = 70
    A = _spd(m, seed=18)
    L0 = torch.linalg.cholesky(A)
    U = 0.3 * torch.randn(m, 2, generator=torch.Generator().manual_seed(19), dtype=DT)
    W = torch.randn(m, m, generator=torch.Generator().manual_seed(20), dtype=DT)

    def f(U_):
        return (cholesky_update(L0, U_) * W).sum()

    # dense reference for the gradient: the same objective through a fresh Cholesky
    def f_ref(U_):
        return (torch.linalg.cholesky(A + U_ @ U_.T) * W).sum()

    Ug = U.clone().requires_grad_(True)
    f(Ug).backward()
    Ur = U.clone().requires_grad_(True)
    f_ref(Ur).backward()
    assert _rel(Ug.grad, Ur.grad) < 1e-9


@pytest.mark.parametrize("batch", [(), (3,)])
def test_logdet_and_inverse_quad_value_and_gradient_equal_dense_autograd(batch):
    g = torch.Generator().manual_seed(5)
    n = 7
    X = torch.randn(*batch, n, n, generator=g, dtype=torch.float64)
    A = (X @ X.mT / n + 0.5 * torch.eye(n, dtype=torch.float64)).requires_grad_()
    b = torch.randn(*batch, n, generator=g, dtype=torch.float64).requires_grad_()
    logdet, quad = logdet_and_inverse_quad(A, b)
    ref_logdet = torch.logdet(A)
    ref_quad = (b * torch.linalg.solve(A, b.unsqueeze(-1)).squeeze(-1)).sum(-1)
    torch.testing.assert_close(logdet, ref_logdet, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(quad, ref_quad, rtol=1e-12, atol=1e-12)
    weights = torch.tensor(0.7, dtype=torch.float64), torch.tensor(-1.3, dtype=torch.float64)
    ours = torch.autograd.grad((weights[0] * logdet + weights[1] * quad).sum(), (A, b))
    ref = torch.autograd.grad((weights[0] * ref_logdet + weights[1] * ref_quad).sum(), (A, b))
    for a, r in zip(ours, ref):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-10)
    # and along a symmetric direction, as the callers use it (gradcheck perturbs A symmetrically)
    sym = lambda M: 0.5 * (M + M.mT)  # noqa: E731
    assert torch.autograd.gradcheck(
        lambda M, v: logdet_and_inverse_quad(sym(M), v), (A.detach().requires_grad_(), b)
    )
