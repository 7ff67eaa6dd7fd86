r"""Index samplers, unbiased ELBO estimators and control variates of QSGP.

Notation (Evans & Nair, "Quadruply Stochastic Gaussian Processes", 2018, arXiv:1812.03010, Eq. 2;
docs/math.md §4): ``f = Phi w``, ``w ~ N(0, S^-1)``, ``q(w) = N(mu, C C^T)``, per-row noise
precisions ``w_l = 1 / sigma_l^2`` (``sigma^2`` for all rows in the paper; a per-row vector here so
fixed heteroscedastic noise works the same way). The negative
ELBO is ``(L_mu + L_Sigma + L_const) / 2`` with

    L_mu    = -2 y^T W Phi mu + mu^T Phi^T W Phi mu + mu^T S mu
    L_Sigma = sum_r [ c_r^T (Phi^T W Phi + S) c_r - 2 log c_rr ]
    L_const = -log|S| - m + sum_l log(2 pi sigma_l^2) + y^T W y.

``C`` is a *chevron*: its first ``k`` columns are dense below the diagonal, the rest diagonal
(``k = 0`` mean-field, ``k = m`` full). Column ``r`` is written ``c_r = e_r c_rr + l_r`` with
``l_r`` strictly below the diagonal.

Four index samplers (all uniform, with replacement): rows ``l`` (``n~`` of ``n``, scale ``n/n~``),
two independent basis samples ``i``, ``j`` (``m~`` of ``m``, scales ``m/m~`` and ``m^2/m~^2``) and
the covariance columns ``r`` (diagonal columns: ``m_r`` of the ``m - k``, scale ``(m - k)/m_r``;
dense columns: all ``k`` or ``k~`` of them, scale ``k/k~``).

Estimators (Theorems 1-2, Prop. 2) use the two-index ("triple") form only where the matrix is dense.
For diagonal parts (a diagonal ``S``, the diagonal columns of ``C``, the ``c_rr`` spike of a dense
column) the two-index form is unbiased but almost always zero (``i`` and ``j`` rarely coincide), so
single-index estimators are used instead (docs/math.md §4): e.g.
``sum_i s_ii mu_i^2 ~ (m/m~) sum_{i in I} s_ii mu_i^2`` and
``c_rr^2 ||phi_r||_W^2 ~ c_rr^2 (n/n~) sum_{l in L} w_l phi_lr^2``.

Control variate (Eq. 3, Prop. 3): the Phi-quadratic term ``v^T Phi^T W Phi v`` (``v = mu`` or
``l_r``) gets ``-(n/n_bar) (m^2/m~^2) (Phi_pj v_j)^T W_p (Phi_pi v_i) + (n/n_bar) a^T W_p a`` with a
fixed set ``p`` of ``n_bar`` rows and ``a = Phi_p v`` maintained incrementally; its gradient is
sparsified and rescaled by ``m/|i u j|`` (App. F.1) so the update stays sparse.

Theorem 3 (log-concave likelihoods) with the standard-deviation fix of docs/math.md §4: the
quadrature node multiplies the *standard deviation* ``sqrt(phi Sigma phi^T)`` (the paper's Eq. 5 /
Thm 3 put the variance there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "IndexSample",
    "sample_indices",
    "theorem1_estimate",
    "theorem2_estimate",
    "prop2_estimate",
    "quad_phi_estimate",
    "control_variate",
    "exact_terms",
    "expected_log_lik",
    "theorem3_estimate",
]


@dataclass
class IndexSample:
    r"""One draw of the four index samplers.

    Attributes:
        rows: ``n~`` row indices in ``[0, n)``.
        i, j: ``m~`` basis indices each in ``[0, m)`` (independent).
        r: ``m_r`` diagonal-column indices in ``[k, m)`` (empty when ``k = m``).
        dr: dense-column indices in ``[0, k)`` (all of them, or a uniform sample).
        n, m, k: data size, number of basis functions, number of dense columns.
        dense_exact: whether ``dr`` enumerates all ``k`` dense columns (scale 1).
    """

    rows: Tensor
    i: Tensor
    j: Tensor
    r: Tensor
    dr: Tensor
    n: int
    m: int
    k: int
    dense_exact: bool

    @property
    def row_scale(self) -> float:  # n / n~
        return self.n / self.rows.numel()

    @property
    def col_scale(self) -> float:  # m / m~
        return self.m / self.i.numel()

    @property
    def pair_scale(self) -> float:  # m^2 / m~^2
        return self.col_scale**2

    @property
    def diag_scale(self) -> float:  # (m - k) / m_r
        return (self.m - self.k) / self.r.numel() if self.r.numel() else 0.0

    @property
    def dense_scale(self) -> float:  # k / k~
        return 1.0 if self.dense_exact else self.k / max(self.dr.numel(), 1)


def sample_indices(
    n: int,
    m: int,
    k: int,
    num_rows: int,
    num_cols: int,
    num_diag_cols: int | None = None,
    num_dense_cols: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    replace_cols: bool = True,
) -> IndexSample:
    r"""Draw rows, two basis samples and covariance columns uniformly.

    Rows and covariance columns are drawn with replacement. The basis samples ``i`` and ``j`` are
    drawn with replacement (the paper's sampler) or, with ``replace_cols=False``, each without
    replacement (``m~ <= m`` distinct columns, independently for ``i`` and ``j``). Both are unbiased
    with the same scale factors: every column is in a sample with expected multiplicity ``m~/m``,
    and ``i``, ``j`` are independent, so ``E[(m/m~) sum_{i in I} v_i] = sum_i v_i`` and
    ``E[(m^2/m~^2) sum_{i in I, j in J} v_i u_j] = (sum v)(sum u)``. Without replacement the column
    noise carries the finite-population factor ``1 - m~/m`` and vanishes at ``m~ = m`` (then ``i``
    and ``j`` are permutations of all columns and only the rows and ``r`` are sampled).

    Args:
        n: data size.
        m: basis size.
        k: number of dense columns of ``C``.
        num_rows: ``n~``.
        num_cols: ``m~`` (``<= m`` when ``replace_cols=False``).
        num_diag_cols: ``m_r`` (default ``m~``).
        num_dense_cols: ``k~`` (default all ``k``).
        generator: random-number generator of the draws (default torch's global one).
        device: where the index tensors live.
        replace_cols: draw ``i`` and ``j`` with replacement (default) or without.
    """
    if min(n, m, num_rows, num_cols) < 1 or not 0 <= k <= m:
        raise ValueError(f"Bad sampler sizes n={n}, m={m}, k={k}, n~={num_rows}, m~={num_cols}.")
    if not replace_cols and num_cols > m:
        raise ValueError(f"Without replacement m~ must be <= m, got m~={num_cols} > m={m}.")
    kw = {"generator": generator, "device": device}
    rows = torch.randint(n, (num_rows,), **kw)
    if replace_cols:
        i = torch.randint(m, (num_cols,), **kw)
        j = torch.randint(m, (num_cols,), **kw)
    elif num_cols == m:  # both samples are all columns (their order does not matter)
        i = j = torch.arange(m, device=device)
    else:
        i = torch.randperm(m, **kw)[:num_cols]
        j = torch.randperm(m, **kw)[:num_cols]
    nr = num_cols if num_diag_cols is None else num_diag_cols
    r = (k + torch.randint(m - k, (nr,), **kw)) if m > k else torch.zeros(0, dtype=torch.long)
    exact = num_dense_cols is None or num_dense_cols >= k
    dr = torch.arange(k, device=device) if exact else torch.randint(k, (num_dense_cols,), **kw)
    return IndexSample(rows, i, j, r, dr, n, m, k, exact)


# ----------------------------------------------------------------------------- building blocks


def linear_phi_estimate(s: IndexSample, Fi: Tensor, y: Tensor, w: Tensor, vi: Tensor) -> Tensor:
    r"""Estimate of ``y^T W Phi v``: ``(n/n~)(m/m~) sum_l w_l y_l (Phi_li v_i)``.
    ``vi``: ``m~ x c``."""
    return s.row_scale * s.col_scale * ((w * y).unsqueeze(-1) * (Fi @ vi)).sum(0)


def quad_phi_estimate(
    s: IndexSample, Fi: Tensor, Fj: Tensor, w: Tensor, vi: Tensor, vj: Tensor
) -> Tensor:
    r"""Two-index estimate of ``v^T Phi^T W Phi v`` (Thm 1 / Thm 2 middle term), per column of v.

    Args:
        s: the index sample.
        Fi: ``n~ x m~`` block ``Phi[l, i]``.
        Fj: ``n~ x m~`` block ``Phi[l, j]``.
        w: ``n~`` noise precisions.
        vi: ``m~ x c``, ``v[i]``.
        vj: ``m~ x c``, ``v[j]``.

    Returns:
        ``c`` estimates, ``(n/n~)(m^2/m~^2) sum_l w_l (Phi_lj v_j)(Phi_li v_i)``.
    """
    return s.row_scale * s.pair_scale * (w.unsqueeze(-1) * (Fj @ vj) * (Fi @ vi)).sum(0)


def quad_prior_estimate(
    s: IndexSample, vi: Tensor, vj: Tensor, S_diag_i: Tensor | None, S_ji: Tensor | None
) -> Tensor:
    r"""Estimate of ``v^T S v`` per column: single-index ``(m/m~) sum_i s_ii v_i^2`` for diagonal
    ``S``; two-index ``(m^2/m~^2) v_j^T S_ji v_i`` for dense ``S``."""
    if S_ji is None:
        return s.col_scale * (S_diag_i.unsqueeze(-1) * vi.pow(2)).sum(0)
    return s.pair_scale * (vj * (S_ji @ vi)).sum(0)


def control_variate(
    s: IndexSample,
    n_bar_scale: float,
    Fpi: Tensor,
    Fpj: Tensor,
    wp: Tensor,
    vi: Tensor,
    vj: Tensor,
    a_live: Tensor,
    union_size: int,
) -> Tensor:
    r"""Eq. 3 control variate plus its Prop. 3 expectation, with App. F.1 sparse-gradient scaling.

    Args:
        n_bar_scale: ``n / n_bar``.
        Fpi: ``n_bar x m~`` block (columns i) of the (frozen, App. F.3) features at the support
            rows p.
        Fpj: ``n_bar x m~``, the same at columns j.
        wp: ``n_bar`` noise precisions of the support rows.
        vi: ``m~ x c``, ``v[i]``.
        vj: ``m~ x c``, ``v[j]``.
        a_live: ``n_bar x c``, equal in value to ``a = Phi_p v`` and carrying the gradient
            ``Phi_{p,U}`` with respect to the sampled coordinates U (see ``QSGP``).
        union_size: ``|i u j|`` (the number of coordinates receiving a gradient).

    Returns:
        ``c`` values with expectation zero over (i, j).
    """
    neg = n_bar_scale * s.pair_scale * (wp.unsqueeze(-1) * (Fpj @ vj) * (Fpi @ vi)).sum(0)
    expect = n_bar_scale * (wp.unsqueeze(-1) * a_live.pow(2)).sum(0)
    rho = s.m / union_size  # App. F.1: value unchanged, gradient scaled by m / |i u j|
    return -neg + rho * expect + ((1.0 - rho) * expect).detach()


# ------------------------------------------------------------------------- Theorems 1, 2, Prop. 2


def theorem1_estimate(
    s: IndexSample,
    Fi: Tensor,
    Fj: Tensor,
    y: Tensor,
    w: Tensor,
    mu_i: Tensor,
    mu_j: Tensor,
    S_diag_i: Tensor | None = None,
    S_ji: Tensor | None = None,
    cv: Tensor | None = None,
) -> Tensor:
    r"""Unbiased estimate of ``L_mu`` (Theorem 1; single-index prior term for diagonal S).

    ``Fi``/``Fj``: ``n~ x m~``; ``y``, ``w``: ``n~``; ``mu_i``, ``mu_j``: ``m~``; ``S_diag_i``:
    ``m~`` (diagonal S) or ``S_ji``: ``m~ x m~`` (dense S); ``cv``: optional control-variate value
    (scalar).
    """
    vi, vj = mu_i.unsqueeze(-1), mu_j.unsqueeze(-1)
    out = -2.0 * linear_phi_estimate(s, Fi, y, w, vi)
    out = out + quad_phi_estimate(s, Fi, Fj, w, vi, vj)
    out = out + quad_prior_estimate(s, vi, vj, S_diag_i, S_ji)
    if cv is not None:
        out = out + cv
    return out.squeeze(-1)


def theorem2_estimate(
    s: IndexSample,
    F_r: Tensor,
    w: Tensor,
    log_c_r: Tensor,
    S_diag_r: Tensor,
    Fi: Tensor | None = None,
    Fj: Tensor | None = None,
    F_dr: Tensor | None = None,
    log_c_dr: Tensor | None = None,
    S_diag_dr: Tensor | None = None,
    L_i: Tensor | None = None,
    L_j: Tensor | None = None,
    S_diag_i: Tensor | None = None,
    S_ji: Tensor | None = None,
    S_dr_i: Tensor | None = None,
    cv: Tensor | None = None,
) -> Tensor:
    r"""Unbiased estimate of ``L_Sigma`` (Theorem 2 with single-index diagonal parts).

    Diagonal columns ``r`` (``c_r = e_r c_rr``), single index:
        ``((m-k)/m_r) sum_r [c_rr^2 ((n/n~) sum_l w_l phi_lr^2 + s_rr) - 2 log c_rr]``.
    Dense columns ``r`` (``c_r = e_r c_rr + l_r``), with ``A = Phi^T W Phi + S``:
        ``c_r^T A c_r = c_rr^2 A_rr + 2 c_rr A_{r,:} l_r + l_r^T A l_r``; ``A_rr`` and
        ``A_{r,:} l_r`` by single index, ``l_r^T Phi^T W Phi l_r`` by the two-index Thm 2 estimator
        (+ ``cv``).

    Args:
        F_r: ``n~ x m_r`` features ``Phi[l, r]``.
        log_c_r: ``m_r``.
        S_diag_r: ``m_r``.
        Fi: ``n~ x m~``.
        Fj: ``n~ x m~``.
        F_dr: ``n~ x k~``.
        log_c_dr: ``k~``.
        S_diag_dr: ``k~``.
        L_i: ``m~ x k~`` strictly-lower entries ``l[i, dr]`` (zero on/above the diagonal).
        L_j: ``m~ x k~``, the same for ``l[j, dr]``.
        S_diag_i: ``m~`` diagonal of S at the columns i (diagonal S; else ``None``).
        S_ji: ``m~ x m~`` block ``S[j, i]`` (dense S; else ``None``).
        S_dr_i: ``k~ x m~`` block ``S[dr, i]`` (dense S).
        cv: optional ``k~`` control-variate values for the dense columns' Phi-quadratic terms.
    """
    wl = w.unsqueeze(-1)
    out = torch.zeros((), dtype=w.dtype, device=w.device)
    if F_r.shape[-1] > 0:
        phi2 = s.row_scale * (wl * F_r.pow(2)).sum(0)  # ||phi_r||_W^2 estimates
        c2 = (2.0 * log_c_r).exp()
        out = out + s.diag_scale * (c2 * (phi2 + S_diag_r) - 2.0 * log_c_r).sum()
    if F_dr is not None and F_dr.shape[-1] > 0:
        c = log_c_dr.exp()
        phi2 = s.row_scale * (wl * F_dr.pow(2)).sum(0)
        cross = s.row_scale * s.col_scale * (wl * F_dr * (Fi @ L_i)).sum(0)  # Phi_r^T W Phi l_r
        if S_ji is not None:
            cross = cross + s.col_scale * (S_dr_i * L_i.transpose(-1, -2)).sum(-1)
        quad = quad_phi_estimate(s, Fi, Fj, w, L_i, L_j) + quad_prior_estimate(
            s, L_i, L_j, S_diag_i, S_ji
        )
        if cv is not None:
            quad = quad + cv
        col = c.pow(2) * (phi2 + S_diag_dr) + 2.0 * c * cross + quad - 2.0 * log_c_dr
        out = out + s.dense_scale * col.sum()
    return out


def prop2_estimate(s: IndexSample, y: Tensor, w: Tensor, log_S_diag_i: Tensor | None) -> Tensor:
    r"""Unbiased estimate of ``L_const`` (Prop. 2; needs a diagonal S, else the ``log|S|`` term is
    omitted, which is a constant when the hyperparameters are fixed).

    ``-(m/m~) sum_i log s_ii - m + (n/n~) sum_l [log(2 pi / w_l) + w_l y_l^2]``.
    """
    out = s.row_scale * (torch.log(2.0 * math.pi / w) + w * y.pow(2)).sum() - s.m
    if log_S_diag_i is not None:
        out = out - s.col_scale * log_S_diag_i.sum()
    return out


# ----------------------------------------------------------------------------- exact (dense) terms


def exact_terms(
    Phi: Tensor, y: Tensor, w: Tensor, mu: Tensor, C: Tensor, S: Tensor
) -> dict[str, Tensor]:
    r"""The three terms of Eq. 2 computed densely (``O(n m^2 + m^3)``; tests and small problems).

    Args:
        Phi: ``n x m``; y, w: ``n``; mu: ``m``; C: ``m x m`` lower triangular, positive diagonal;
        S: ``m x m`` SPD prior precision.

    Returns:
        ``{"L_mu", "L_Sigma", "L_const", "elbo"}`` with ``elbo = -(L_mu + L_Sigma + L_const) / 2``.
    """
    f = Phi @ mu
    L_mu = -2.0 * (w * y * f).sum() + (w * f.pow(2)).sum() + mu @ (S @ mu)
    PC = Phi @ C
    L_sigma = (w.unsqueeze(-1) * PC.pow(2)).sum() + (S * (C @ C.T)).sum()
    L_sigma = L_sigma - 2.0 * torch.diagonal(C).log().sum()
    m = S.shape[-1]
    L_const = -torch.linalg.slogdet(S)[1] - m + (torch.log(2 * math.pi / w) + w * y.pow(2)).sum()
    elbo = -0.5 * (L_mu + L_sigma + L_const)
    return {"L_mu": L_mu, "L_Sigma": L_sigma, "L_const": L_const, "elbo": elbo}


# ----------------------------------------------------------------------------- Theorem 3


def expected_log_lik(
    likelihood: str, y: Tensor, mean: Tensor, std: Tensor, scale: Tensor, num_nodes: int = 32
) -> Tensor:
    r"""``E_{f ~ N(mean, std^2)} log p(y | f)`` per point.

    * ``gaussian``: ``scale`` is the noise variance; closed form.
    * ``laplace``: ``scale`` is ``b`` in ``exp(-|y - f|/b)/(2b)``; closed form
      ``E|y - f| = std sqrt(2/pi) exp(-d^2/(2 std^2)) + d (1 - 2 Phi(-d/std))``, ``d = y - mean``.
    * ``logistic``: ``y`` in ``{-1, 1}``, ``log sigmoid(y f)`` by Gauss-Hermite quadrature.
    """
    if likelihood == "gaussian":
        return -0.5 * torch.log(2 * math.pi * scale) - ((y - mean).pow(2) + std.pow(2)) / (
            2 * scale
        )
    if likelihood == "laplace":
        d = y - mean
        sd = std.clamp_min(1e-12)
        normal = torch.distributions.Normal(torch.zeros_like(d), torch.ones_like(d))
        e_abs = sd * math.sqrt(2 / math.pi) * torch.exp(-0.5 * (d / sd).pow(2)) + d * (
            1 - 2 * normal.cdf(-d / sd)
        )
        return -torch.log(2 * scale) - e_abs / scale
    if likelihood == "logistic":
        from gpytorch.utils.quadrature import GaussHermiteQuadrature1D

        quad = GaussHermiteQuadrature1D(num_locs=num_nodes).to(mean)
        dist = torch.distributions.Normal(mean, std.clamp_min(1e-12))
        return quad(lambda f: torch.nn.functional.logsigmoid(y * f), dist)
    raise ValueError(f"Unknown likelihood {likelihood!r}; use 'gaussian', 'laplace' or 'logistic'.")


def theorem3_estimate(
    s: IndexSample,
    likelihood: str,
    Fi: Tensor,
    y: Tensor,
    mu_i: Tensor,
    F_r: Tensor,
    log_c_r: Tensor,
    scale: Tensor,
    F_dr: Tensor | None = None,
    log_c_dr: Tensor | None = None,
    Fj: Tensor | None = None,
    L_i: Tensor | None = None,
    L_j: Tensor | None = None,
) -> Tensor:
    r"""Theorem 3 estimate of ``E_q log p(y | X, w)`` with the std fix (docs/math.md §4).

    Per sampled row: mean ``(m/m~) Phi_li mu_i``; variance ``phi Sigma phi^T`` estimated without
    bias (single index on the diagonal columns; ``c_rr``-spike, cross and two-index terms on the
    dense columns), clamped at zero; then the expected log-likelihood with ``z`` multiplying the
    standard deviation. The result is ``(n/n~) sum_l`` of those. Biased by the curvature of
    ``log g`` (Jensen), vanishing as ``m~ -> m`` without replacement noise.
    """
    mean = s.col_scale * (Fi @ mu_i)
    var = torch.zeros_like(mean)
    if F_r.shape[-1] > 0:
        var = var + s.diag_scale * (F_r.pow(2) * (2.0 * log_c_r).exp()).sum(-1)
    if F_dr is not None and F_dr.shape[-1] > 0:
        c = log_c_dr.exp()
        a = F_dr * c  # phi_r c_rr
        bi, bj = s.col_scale * (Fi @ L_i), s.col_scale * (Fj @ L_j)  # unbiased phi l_r (indep.)
        var = var + s.dense_scale * (a.pow(2) + a * (bi + bj) + bi * bj).sum(-1)
    std = var.clamp_min(0.0).sqrt()
    return s.row_scale * expected_log_lik(likelihood, y, mean, std, scale).sum()


# ----------------------------------------------------------------------------- diagnostics


def control_variate_gradient_variance(
    model, num_rows: int, num_cols: int, cv_rank: int, reps: int, seed: int = 0
) -> tuple[float, float]:
    r"""Element-averaged variance of the gradient (w.r.t. ``mu``) of the Theorem 1 Phi-quadratic
    term, without and with the Eq. 3 / Prop. 3 control variate (App. F.1 gradient scaling).

    The set-up of the paper's Fig. 1 (there: kin40k, ``m = 10^4`` RFF, ``m~ = n~ = 500``, ``mu``
    a prior draw). ``model`` is a :class:`~bo_online.models.qsgp.QSGP`; its current ``mu`` is used.

    Returns:
        ``(variance_without, variance_with)``.
    """
    gen = torch.Generator(device=model.train_X.device).manual_seed(seed)
    n, m = model.train_X.shape[-2], model.num_features
    p, Xp, frozen, a = model.control_variate_state(cv_rank, gen)
    wp = 1.0 / model._row_noise(p).detach()
    G0 = torch.zeros(reps, m, dtype=model.train_X.dtype)
    G1 = torch.zeros_like(G0)
    for t in range(reps):
        s = sample_indices(n, m, 0, num_rows, num_cols, 1, generator=gen)
        U, inv = torch.unique(torch.cat([s.i, s.j]), return_inverse=True)
        inv_i, inv_j = inv[: s.i.numel()], inv[s.i.numel() :]
        mu_U = model.var_mean[U].clone().requires_grad_(True)
        with torch.no_grad():
            F_U = model.basis.features(model.train_X[s.rows], U)
            Fp_U = model.basis.features(Xp, U, frozen)
        wl = 1.0 / model._row_noise(s.rows).detach()
        vi, vj = mu_U[inv_i].unsqueeze(-1), mu_U[inv_j].unsqueeze(-1)
        quad = quad_phi_estimate(s, F_U[:, inv_i], F_U[:, inv_j], wl, vi, vj).sum()
        if p.numel() == 0:  # no control variate
            cv = torch.zeros((), dtype=quad.dtype)
        else:
            a_live = a[:, :1] + Fp_U @ (mu_U - mu_U.detach()).unsqueeze(-1)
            cv = control_variate(
                s, n / p.numel(), Fp_U[:, inv_i], Fp_U[:, inv_j], wp, vi, vj, a_live, U.numel()
            ).sum()
        (g0,) = torch.autograd.grad(quad, mu_U, retain_graph=True)
        (g1,) = torch.autograd.grad(quad + cv, mu_U)
        G0[t, U], G1[t, U] = g0, g1
    return float(G0.var(0).mean()), float(G1.var(0).mean())
