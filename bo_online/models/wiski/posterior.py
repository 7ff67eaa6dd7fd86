r"""WISKI's posterior: the latent mean and covariance read from the cached factors.

The mean is ``w_x^T R A^-1 R^T z_r`` (4^d reads of the cached coefficients per point); the
covariance ``sigma^2 w_x^T R A^-1 R^T w_x'`` comes either from rows of ``S = R L_A^-T`` (a lazy
``P P^T - Q Q^T`` for many points, :mod:`bo_online.models.wiski.covariance`) or, for a few points
requested often (an acquisition optimiser), from the cached ``M = R A^-1 R^T``. A conditioned
(fantasy) model subtracts its rank-q correction ``Q = sigma W S F C^-T`` from both.
"""

from __future__ import annotations

import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator, DiagLinearOperator
from torch import Tensor

from bo_online.linalg import psd_cholesky, solve_lower
from bo_online.models.wiski.covariance import RootDifferenceLinearOperator
from bo_online.models.wiski.grid import interp_matmul, interp_quad, interp_vector
from bo_online.models.wiski.low_rank import TensorRef

__all__ = ["WISKIPosteriorMixin"]

# Below this many test points per batch the posterior covariance is returned dense.
_DENSE_COVAR_MAX = 64
# After this many posterior requests on one state, build M = R A^-1 R^T (O(m^3)) and read
# covariances from it (see WISKI._use_gram_block).
_GRAM_AFTER_CALLS = 8


class WISKIPosteriorMixin:
    r"""Methods of :class:`~bo_online.models.wiski.WISKI` that compute its posterior."""

    def _grid_root(self, idx: Tensor, val: Tensor) -> tuple[Tensor, Tensor]:
        r"""Rows ``sigma E_x^T = sigma w_x^T R L_A^-T`` (``xb x N x m``) of the base model's
        factor and their squared norms (``xb x N``: the base model's latent variances).

        Uses the cached ``S = R L_A^-T`` (O(4^d m) per point) when it exists, when the request
        is large (``N >= m / 4``) or when a conditioned model asks (fantasies come in bulk: one
        base model is conditioned on many candidate batches, so the O(m^3) of ``S`` is paid once
        per base state and amortised); otherwise a triangular solve (O(m^2) per point). ``S``
        and the rows for a no-grad ``X`` requested again (qNIPV's mc_points, from their second
        request on) are cached in ``_shared``, a dict shared with conditioned models and
        replaced whenever the factors change.
        """
        R, L_A = self.chol_K, self.chol_A
        m = R.shape[-1]
        shared = self._shared
        needs_grad = torch.is_grad_enabled() and val.requires_grad
        K = idx.shape[-1]
        same = lambda key: (  # noqa: E731  (the same points, whatever their batch dims of size 1)
            key[0].numel() == idx.numel()
            and torch.equal(key[0], idx.reshape(-1, K))
            and torch.equal(key[1], val.reshape(-1, K))
        )
        if not needs_grad:  # the same points again (qNIPV's mc_points): reuse their rows
            hit = shared.get("rows")
            if hit is not None and same(hit) and hit[2].shape[:-1] == idx.shape[:-1]:
                return hit[2], hit[3]
            if hit is not None and same(hit) and idx.shape[:-2].numel() == 1:
                return hit[2].reshape(*idx.shape[:-1], -1), hit[3].reshape(idx.shape[:-1])
        total = idx.shape[:-1].numel()
        S = shared.get("S")
        if S is None and (total * 4 >= m or self.d_idx is not None):
            S = self._factor_root()
        if S is not None:
            rows = interp_matmul(idx, val, S)
        else:
            rows = solve_lower(L_A, interp_matmul(idx, val, R).mT).mT
        rows = self._sigma2().detach().sqrt() * rows
        sqnorm = rows.pow(2).sum(-1)
        if not needs_grad:
            # Rows are cached for points requested a second time (the mc_points, asked for by
            # every fantasy model): pool scoring interleaves them with fresh candidate batches,
            # which must neither evict them nor be stored (their keys, 4^d per point, are).
            seen = shared.setdefault("seen", [])
            key = (idx.reshape(-1, K), val.detach().reshape(-1, K))
            if any(same(k) for k in seen):
                shared["rows"] = (*key, rows, sqnorm)
            else:
                seen.insert(0, key)
                del seen[4:]
        return rows, sqnorm

    def _rows_times_F(self, idx: Tensor, val: Tensor, P: Tensor) -> Tensor:
        r"""``P F`` (``batch x N x q``) for the rows ``P = sigma W_x S`` of :meth:`_grid_root`.

        For cached rows (qNIPV's mc_points) ``T = P S^T = sigma W_x M`` (``N x m``) is cached
        too, and ``P F = T W*^T D*^-1/2`` reads 4^d columns of ``T`` per pending point:
        O(4^d N q) per candidate batch instead of the O(m N q) product.
        """
        hit = self._shared.get("rows")
        grad = torch.is_grad_enabled() and (P.requires_grad or self.d_val.requires_grad)
        if grad or hit is None or P.shape[:-2].numel() != 1 or hit[2].data_ptr() != P.data_ptr():
            return _shared_matmul(P, self.d_F)
        if len(hit) == 4:
            T = self._sigma2().detach().sqrt() * interp_matmul(hit[0], hit[1], self._factor_gram())
            hit = self._shared["rows"] = (*hit, T)
        T = hit[4]  # N x m
        wv = self.d_val * self.d_D.rsqrt().unsqueeze(-1)
        out = interp_matmul(self.d_idx, wv, T.mT).mT  # batch x N x q
        lead = torch.Size([1] * max(0, P.dim() - out.dim()))
        return out.reshape(*lead, *out.shape)

    def _noise_variance(self, X: Tensor) -> Tensor:
        if self.fixed_noise:  # as BoTorch: the mean training noise at new points
            mean = self._mean_fixed_noise()  # batch x 1
            return mean.expand(*torch.broadcast_shapes(X.shape[:-2], mean.shape[:-1]), X.shape[-2])
        return self.likelihood.noise.reshape(1).expand(X.shape[:-1])

    def _default_fantasy_noise(self) -> Tensor | None:
        if self.fixed_noise:
            return self._mean_fixed_noise().unsqueeze(-1)  # batch x 1 x 1
        return None

    def _mean_fixed_noise(self) -> Tensor:
        r"""The mean per-point noise (standardised) of a fixed-noise model over all the points
        it holds, a conditioned model's pending points (``d_D``, user units) included, as a
        model updated with them (and BoTorch's conditioned models) has it: ``batch x 1``."""
        total, count = self.sum_D, self.n
        if self.d_D is not None:
            total, count = total + self.d_D.sum(-1), count + self.d_D.shape[-1]
        mean_D = total / torch.as_tensor(count).clamp_min(1)
        return (mean_D / self.outcome_std.pow(2).reshape(())).unsqueeze(-1)

    def _use_gram_block(self, idx: Tensor, val: Tensor) -> bool:
        r"""Whether the covariance at these points is read from the cached ``M = R A^-1 R^T``
        (:func:`bo_online.models.wiski.grid.interp_quad`): a small dense covariance, with a
        gradient or with stencils that touch fewer than ``m`` grid points in all, and a
        conditioned model (whose corrections are built from ``M``), ``M`` already cached, or a
        gradient asked for
        or more than ``_GRAM_AFTER_CALLS`` requests on this state (an acquisition optimiser calls
        hundreds of times per base state, its raw samples first and without a gradient, so the
        O(m^3) of ``M`` is paid once; a few no-grad calls keep the O(m^2 N) triangular solve)."""
        N, K = idx.shape[-2:]
        if N > _DENSE_COVAR_MAX:
            return False
        needs_grad = torch.is_grad_enabled() and val.requires_grad
        if not needs_grad and N * K > self.grid.num_points:
            return False  # many points, no gradient: rows W S and their Gram are as cheap
        if self.d_idx is not None:  # a conditioned model: M is built with its corrections
            return self.d_SF is not None
        calls = self._shared["calls"] = self._shared.get("calls", 0) + 1
        return needs_grad or calls > _GRAM_AFTER_CALLS or self._shared.get("M") is not None

    def _prior_gram(self) -> Tensor:
        r"""``K_UU + jitter I`` (``m x m``) at the current hyperparameters, without a gradient;
        cached in ``_shared`` like the factors."""
        K = self._shared.get("K")
        if K is None:
            with torch.no_grad():
                K = self._shared["K"] = self._grid_kernel()
        return K

    def _prior_variance_gap(self, idx: Tensor, val: Tensor) -> Tensor:
        r"""``k(x, x) - w_x^T K_UU w_x`` (``... x N``, floored at 0), differentiable in ``val``.

        ``K_UU`` is block-diagonal over the components of an additive model, and a point's
        stencil lists its components' ``4^k`` entries one component after the other, so only
        the ``J (4^k)^2`` within-component pairs are gathered. The kernel is stationary, so
        ``k(x, x)`` of component j is the diagonal of its block at any node."""
        K = self._prior_gram()
        J = len(self.grid.grids) if self.input_groups is not None else 1
        offsets = self.grid.offsets if J > 1 else [0]
        kss = torch.diagonal(K)[offsets].sum()
        S = idx.shape[-1] // J
        i = idx.reshape(*idx.shape[:-1], J, S)
        v = val.expand(idx.shape).reshape(*idx.shape[:-1], J, S)
        Kg = K[i.unsqueeze(-1), i.unsqueeze(-2)]  # ... x N x J x S x S
        quad = torch.einsum("...ja,...jab,...jb->...", v, Kg, v)
        return (kss - quad).clamp_min(0.0)

    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        idx, val = self._interp(X)
        gram = self._use_gram_block(idx, val)
        # Where M = R A^-1 R^T would be read (requests with a gradient, or many on one state),
        # or S = R L_A^-T built (a bulk request), an additive model with few observations reads
        # a rank-n form of M instead (O(m^2 n) once per state against O(m^3)).
        bulk = (
            idx.shape[-2] <= _DENSE_COVAR_MAX
            and self._shared.get("S") is None
            and 4 * idx.shape[:-1].numel() >= self.grid.num_points
        )
        U = self._low_rank_root() if gram or bulk else None
        if U is not None:
            mean = self.mean_module.constant.detach().reshape(()) + interp_vector(
                idx, val, self.mean_coef
            )
            covar = self._low_rank_covariance(idx, val, U, self.prior_variance == "exact")
            batch = torch.broadcast_shapes(mean.shape[:-1], covar.shape[:-2])
            N = covar.shape[-1]
            mean, covar = mean.expand(*batch, N), covar.expand(*batch, N, N)
            return MultivariateNormal(mean, DenseLinearOperator(covar))
        mvn = self._ski_latent_posterior(idx, val, gram)
        if self.prior_variance != "exact":
            return mvn
        gap = self._prior_variance_gap(idx, val)
        covar = mvn.lazy_covariance_matrix
        gap = gap.expand(*covar.shape[:-1])
        if isinstance(covar, DenseLinearOperator):
            return MultivariateNormal(
                mvn.mean, DenseLinearOperator(covar.to_dense() + torch.diag_embed(gap))
            )
        return MultivariateNormal(mvn.mean, covar + DiagLinearOperator(gap))

    def _ski_latent_posterior(
        self, idx: Tensor, val: Tensor, gram: bool | None = None
    ) -> MultivariateNormal:
        r"""The SKI posterior at points with stencils ``idx``/``val`` (``... x N x K``); ``gram``:
        :meth:`_use_gram_block`'s answer for them where the caller already asked."""
        # Caches carry no hyperparameter gradients (fits use the MLL), so neither does this.
        coef = self.mean_coef if self.d_idx is None else self.d_mean_coef
        mean = self.mean_module.constant.detach().reshape(()) + interp_vector(idx, val, coef)
        if self._use_gram_block(idx, val) if gram is None else gram:
            # sigma^2 (W M W^T - H^T H) from the cached M = R A^-1 R^T (grid.interp_quad): one
            # sparse product W M and a gather, with an O(N^2 K) backward, instead of the N x m
            # rows sigma W R L_A^-T, their Gram matrix and their autograd. For a conditioned
            # model H^T = W (S F) C^-T reads 4^d rows of the m x q matrix S F per point.
            sigma2 = self._sigma2().detach()
            covar = sigma2 * interp_quad(idx, val, self._factor_gram())
            if self.d_idx is not None:
                Q = _right_solve(self.d_C, _interp_rows(idx, val, self.d_SF))  # H^T: bb x N x q
                covar = covar - sigma2 * (Q @ Q.mT)
            batch = torch.broadcast_shapes(mean.shape[:-1], covar.shape[:-2])
            N = covar.shape[-1]
            mean, covar = mean.expand(*batch, N), covar.expand(*batch, N, N)
            return MultivariateNormal(mean, DenseLinearOperator(covar))
        P, p_diag = self._grid_root(idx, val)  # sigma E^T: xb x N x m, its row norms
        if self.d_idx is None:
            Q = P.new_zeros(*P.shape[:-1], 0)
        else:
            C = self.d_C  # batch x q x q
            Q = _right_solve(C, self._rows_times_F(idx, val, P))  # sigma H^T = P F C^-T
        batch = torch.broadcast_shapes(mean.shape[:-1], P.shape[:-2], Q.shape[:-2])
        mean = mean.expand(*batch, mean.shape[-1])
        N = P.shape[-2]
        if N <= _DENSE_COVAR_MAX:
            covar = (P @ P.mT - Q @ Q.mT).expand(*batch, N, N)
            # As an operator: a plain tensor makes torch factorise it eagerly, which fails for
            # nearly coincident points; BoTorch's samplers add jitter when they need a root.
            return MultivariateNormal(mean, DenseLinearOperator(covar))
        covar = RootDifferenceLinearOperator(P, Q, batch_shape=tuple(batch), P_diag=p_diag)
        return MultivariateNormal(mean, covar)

    def _low_rank_root(self) -> Tensor | None:
        r"""``U`` (``m x r``) with ``sigma^2 R A^-1 R^T = K_UU - U U^T`` for an additive model
        holding fewer observations than half its active grid points, else None.

        With the rank-``r`` factor ``G = L L^T`` of the fit (:mod:`.low_rank`, ``r <= n``) and
        ``R R^T = K_UU``, Woodbury's identity gives ``sigma^2 R (sigma^2 I + R^T L L^T R)^-1 R^T
        = K_UU - K_UU L C^-1 L^T K_UU`` with ``C = sigma^2 I_r + L^T K_UU L = L_C L_C^T``, so
        ``U = K_UU L L_C^-T``: O(m^2 r) once per data and hyperparameter state, cached in
        ``_shared`` beside the factor it came from. A covariance then reads ``K_UU`` within
        each component (block-diagonal) and ``r`` columns of ``U``, instead of rows of length
        ``m`` of ``M = R A^-1 R^T`` (whose O(m^3) build it also skips). Base models only: a
        conditioned model's corrections are built from ``M``. Float64 only: the difference
        ``K_UU - U U^T`` loses more of a small variance in single precision than ``M`` does
        (measured 2.9% against 0.6% of a variance of 1e-6 in float32)."""
        if self.input_groups is None or self.d_idx is not None or self.G.dim() != 2:
            return None
        G = self.G
        if G.requires_grad or G.dtype != torch.float64:
            return None
        hit = self._shared.get("low_rank_root")
        # the statistics themselves (weakly), not their addresses, which a new tensor may reuse
        key = (G._version, self.z._version, self.h._version)
        if hit is not None and hit[0]() is G and hit[1] == key:
            return hit[2]
        active = torch.nonzero(torch.diagonal(G) > 0).squeeze(-1)
        stats = {name: getattr(self, name) for name in ("G", "z", "h", "n")}
        low = self._low_rank(stats, active, active.numel() == G.shape[-1])
        U = None
        if low is not None:
            with torch.no_grad():
                m, r = G.shape[-1], low.rank
                L = low.L  # on the active grid points: zero rows for the others
                if active.numel() < m:
                    L = L.new_zeros(m, r).index_copy_(0, active, L)
                KL = self._prior_gram() @ L  # m x r
                C = L.mT @ KL + self._sigma2().detach() * torch.eye(
                    r, dtype=L.dtype, device=L.device
                )
                U = solve_lower(psd_cholesky(0.5 * (C + C.mT)), KL.mT).mT.contiguous()
        self._shared["low_rank_root"] = (TensorRef(G), key, U)
        return U

    def _low_rank_covariance(
        self, idx: Tensor, val: Tensor, U: Tensor, exact_prior_variance: bool = False
    ) -> Tensor:
        r"""``sigma^2 W M W^T = W K_UU W^T - (W U)(W U)^T`` (``... x N x N``) for the stencils
        ``idx``/``val`` (``... x N x K``) from :meth:`_low_rank_root`'s ``U``; differentiable
        in ``val``. ``W`` is scattered densely (``N x m`` per batch element, in batch chunks of
        about 2^22 entries), and ``W K_UU`` is formed block by block (``K_UU`` is
        block-diagonal over the components, whose grids all have the same size). With
        ``exact_prior_variance`` the diagonal of ``W K_UU W^T`` is raised to the kernel's
        ``k(x, x)`` where it is below (the ``prior_variance="exact"`` correction of
        :meth:`_prior_variance_gap`, here without its gather)."""
        K = self._prior_gram()
        sizes, offsets = self.grid.sizes_per_grid, self.grid.offsets
        J, m1 = len(sizes), sizes[0]  # every component grid has the same sizes
        blocks = self._shared.get("K_blocks")
        if blocks is None:  # J x m1 x m1: the diagonal blocks
            blocks = torch.stack([K[o : o + m1, o : o + m1] for o in offsets])
            self._shared["K_blocks"] = blocks
        kss = torch.diagonal(K)[offsets].sum()  # k(x, x): each component's is constant
        batch, (N, nk), m = idx.shape[:-2], idx.shape[-2:], K.shape[-1]
        flat_idx = idx.reshape(-1, N, nk)
        flat_val = val.expand(idx.shape).reshape(-1, N, nk)
        per = max(1, 2**22 // max(1, N * m))
        out = []
        for start in range(0, flat_idx.shape[0], per):
            i, v = flat_idx[start : start + per], flat_val[start : start + per]
            b = i.shape[0]
            W = v.new_zeros(b, N, m).scatter_add(-1, i, v)  # b x N x m
            # W K_UU, the components as the batch of one product
            KW = torch.bmm(W.reshape(b * N, J, m1).transpose(0, 1), blocks)  # J x bN x m1
            KW = KW.transpose(0, 1).reshape(b, N, m)
            prior = KW @ W.mT
            if exact_prior_variance:
                diagonal = torch.diagonal(prior, dim1=-2, dim2=-1)
                prior = prior + torch.diag_embed((kss - diagonal).clamp_min(0.0))
            WU = W @ U
            out.append(prior - WU @ WU.mT)
        return torch.cat(out, 0).reshape(*batch, N, N)


def _interp_rows(idx: Tensor, val: Tensor, A: Tensor) -> Tensor:
    r"""``W A`` for batched grid matrices: ``idx``/``val``: ``xb x N x K``, ``A``: ``ab x m x c``
    (``c`` small); returns ``broadcast(xb, ab) x N x c``, differentiable in ``val``."""
    N, K = idx.shape[-2:]
    m, c = A.shape[-2:]
    if A.shape[:-2].numel() == 1:
        out = interp_matmul(idx, val, A.reshape(m, c))
        return out.reshape(*([1] * max(0, A.dim() - 2 - (idx.dim() - 2))), *out.shape)
    bb = torch.broadcast_shapes(idx.shape[:-2], A.shape[:-2])
    rows = idx.expand(*bb, N, K).reshape(*bb, N * K, 1).expand(*bb, N * K, c)
    gathered = torch.gather(A.expand(*bb, m, c), -2, rows).view(*bb, N, K, c)
    return (gathered * val.expand(*bb, N, K).unsqueeze(-1)).sum(-2)


def _right_solve(C: Tensor, B: Tensor) -> Tensor:
    r"""``B C^-T`` for lower ``C`` (``batch x q x q``), ``B``: ``batch x N x q``."""
    return torch.linalg.solve_triangular(C, B.mT, upper=False).mT


def _shared_matmul(P: Tensor, F: Tensor) -> Tensor:
    r"""``P F`` with ``P``: ``pb x N x m`` and ``F``: ``fb x m x q``, without copying ``P`` to
    ``F``'s batch when ``P`` has a single batch element (one GEMM instead)."""
    if P.shape[:-2].numel() == 1:
        N, m = P.shape[-2:]
        q = F.shape[-1]
        P2 = P.reshape(N, m)
        out = (P2 @ F.mT.reshape(-1, m).mT).reshape(N, *F.shape[:-2], q)
        out = out.movedim(0, -2)  # fb x N x q
        lead = torch.Size([1] * max(0, P.dim() - F.dim()))
        return out.reshape(*lead, *out.shape)
    return P @ F
