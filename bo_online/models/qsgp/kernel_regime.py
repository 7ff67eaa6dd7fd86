r"""QSGP as the exact GP of its kernel while it holds few points (the "kernel regime").

An RFF basis of ``m`` features approximates its kernel with an error in the posterior mean of a
few per cent of the outcomes' spread, and an acquisition optimiser finds the spurious maxima that
error makes: on Styblinski-Tang 8-D with 512 features, QSGP's UCB maximum on an initial design
was 4-14 above an exact GP's on the same data and hyperparameters, and its BO proposals were
worse than uniform random points. While the model holds at most ``exact_max_n`` points (default
``m``) the exact GP of the kernel costs no more than the weight-space posterior (O(N^2) per test
point and per conditioned point against O(m^2); O(N^3) per evidence against O(N m^2)), so QSGP
predicts with it. With the held rows ``H`` (the fitted rows, then those conditioned on since),
``K_HH + N_H = L L^T`` and ``z = L^-1 (y_H - c)`` (docs/math.md §4, "Kernel regime"):

    mean(x) = c + v_x^T z,    cov(x, x') = k(x, x') - v_x^T v_x',    v_x = L^-1 k_H(x).

New rows border ``L`` (O(N^2 p)); a conditioned (fantasy) model borders its parent's factor
without copying it. ``q(w)`` is fitted all the while (the fits set it as before), so when the data
outgrow ``exact_max_n`` the model carries on in weight space, at a cost flat in n.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from linear_operator.operators import DenseLinearOperator, LinearOperator, MatmulLinearOperator
from torch import Tensor

from bo_online.linalg import broadcast_shapes, cholesky_solve, psd_cholesky, solve_lower
from bo_online.models.qsgp.bases import RFFBasis

__all__ = ["BorderedCholesky", "QSGPKernelRegimeMixin"]


class BorderedCholesky:
    r"""A lower Cholesky factor kept as a base block and a chain of borders: the factor of
    ``[[A, C^T], [C, D]]`` is ``[[F, 0], [B, L22]]`` with ``F`` the factor of ``A`` (itself
    bordered or not), ``B = C F^-T`` and ``L22 = chol(D - B B^T)``. The base ``L``
    (``... x N x N``) is shared with the model it came from, not copied, and so is every border
    a conditioned model inherits: a fantasy of a fantasy adds its own border only.

    Args:
        L: the base block, ``... x N x N``.
        borders: ``(B_i, L22_i)`` in order, ``B_i``: ``... x p_i x (N + p_1 + ... + p_{i-1})``,
            ``L22_i``: ``... x p_i x p_i``.
    """

    def __init__(self, L: Tensor, borders: tuple[tuple[Tensor, Tensor], ...] = ()) -> None:
        self.L, self.borders = L, tuple(borders)

    def block_roots(self, K: list[Tensor]) -> list[Tensor]:
        r"""``F^-1 K`` by row blocks: ``K`` is ``[K_0, K_1, ...]``, the rows of the base
        (``... x N x k``) and of each border (``... x p_i x k``), each with its own batch shape,
        which the roots keep (the base's root is not expanded to a border's batch)."""
        roots = [solve_lower(self.L, K[0])]
        for (B, L22), K_i in zip(self.borders, K[1:]):
            done = roots[0] if len(roots) == 1 else _cat_rows_all(roots)
            roots.append(solve_lower(L22, K_i - B @ done))
        return roots

    def whiten(self, K: Tensor) -> Tensor:
        r"""``F^-1 K`` for the whole factor ``F`` (``K``: ``... x (N + sum p_i) x k``)."""
        sizes = [self.L.shape[-1], *(L22.shape[-1] for _, L22 in self.borders)]
        roots = self.block_roots(list(K.split(sizes, dim=-2)))
        return roots[0] if len(roots) == 1 else _cat_rows_all(roots)

    def dense(self) -> Tensor:
        r"""The whole factor as one ``... x (N + sum p_i) x (N + sum p_i)`` tensor."""
        F = self.L
        for B, L22 in self.borders:
            n, p = F.shape[-1], L22.shape[-1]
            batch = broadcast_shapes(F.shape[:-2], B.shape[:-2], L22.shape[:-2])
            top = torch.cat([F.expand(*batch, n, n), F.new_zeros(*batch, n, p)], dim=-1)
            bottom = torch.cat([B.expand(*batch, p, n), L22.expand(*batch, p, p)], dim=-1)
            F = torch.cat([top, bottom], dim=-2)
        return F

    def bordered(self, C: Tensor, D: Tensor) -> BorderedCholesky:
        r"""The factor with ``p`` more rows: ``C`` (``... x p x (N + sum p_i)``) their
        covariance with the rows already factored, ``D`` (``... x p x p``) their own (noise
        included). O((N + sum p_i)^2 p); nothing of this factor is copied."""
        B = self.whiten(C.transpose(-1, -2)).transpose(-1, -2)
        L22 = psd_cholesky(D - B @ B.transpose(-1, -2))
        return BorderedCholesky(self.L, (*self.borders, (B, L22)))


def _cat_rows_all(blocks: list[Tensor]) -> Tensor:
    r"""The ``blocks`` stacked along the row dim, their batch dims broadcast."""
    batch = broadcast_shapes(*(b.shape[:-2] for b in blocks))
    return torch.cat([b.expand(*batch, *b.shape[-2:]) for b in blocks], dim=-2)


def _cat_last(a: Tensor, b: Tensor) -> Tensor:
    r"""``[a, b]`` along the last dim, the leading dims broadcast."""
    lead = broadcast_shapes(a.shape[:-1], b.shape[:-1])
    return torch.cat([a.expand(*lead, a.shape[-1]), b.expand(*lead, b.shape[-1])], dim=-1)


@dataclass
class KernelState:
    r"""The exact GP on the held rows: their inputs (transformed; ``inputs``, ``batch x N x d``,
    those of the factor's base block, then ``border_inputs``, ``batch x p_i x d``, those of each
    border), the factor of ``K_HH + N_H`` and ``z = F^-1 (y_H - c)`` (``sample x batch x
    (N + sum p_i)``), with the key (hyperparameters and held data) they were built for."""

    key: list[Tensor | None]
    inputs: Tensor
    factor: BorderedCholesky
    z: Tensor
    border_inputs: tuple[Tensor, ...] = ()

    def all_inputs(self) -> Tensor:
        r"""Every held row's inputs, ``batch x (N + sum p_i) x d``."""
        if not self.border_inputs:
            return self.inputs
        return _cat_rows_all([self.inputs, *self.border_inputs])


def _negated_gram(V: Tensor, batch: torch.Size) -> LinearOperator:
    r"""``-V^T V`` (``batch x q x q``) as a lazy operator of its roots (``V``: ``... x r x q``)."""
    Vt = V.transpose(-1, -2).expand(*batch, V.shape[-1], V.shape[-2])
    return MatmulLinearOperator(Vt, V.expand(*batch, *V.shape[-2:])) * -1.0


class QSGPKernelRegimeMixin:
    r"""The exact-GP posterior of QSGP's kernel while it holds at most ``exact_max_n`` points (a
    mixin of :class:`QSGP`)."""

    #: the kernel regime's caches (not buffers: rebuilt from the held data when needed)
    _kernel_cache: KernelState | None = None

    def is_exact_gp_on_data(self) -> bool:
        r"""Whether this model predicts with the exact GP of its kernel on the data it holds: an
        RFF basis (whose kernel is known), a Gaussian likelihood and at most ``exact_max_n``
        points held. A BO loop then refits it as BoTorch refits its exact GP (rebuilt and fitted
        from the defaults; ``OnlineLoop._rebuild_due``), and its closed-form fits (the default
        for a Gaussian likelihood) maximise the kernel's evidence; ``fit(method="sgd")`` still
        maximises the weight-space ELBO."""
        return (
            self.likelihood_name == "gaussian"
            and isinstance(self.basis, RFFBasis)
            and self.num_data <= self.exact_max_n
        )

    # ------------------------------------------------------------------ caches

    def _kernel_key_tensors(self) -> list[Tensor | None]:
        r"""What the kernel regime's caches depend on: the hyperparameters, the constant mean and
        the held data (O(N d) values; compared by value, so a deep copy or a loaded state with
        the same values keeps its caches)."""
        return [
            *(p.detach() for p in self.parameters()),
            self.mean_constant.detach(),
            self.train_X,
            self.train_y,
            self.train_noise,
            self.cond_X,
            self.cond_y,
            self.cond_noise,
        ]

    def _kernel_key(self) -> list[Tensor | None]:
        return [None if t is None else t.detach().clone() for t in self._kernel_key_tensors()]

    def _kernel_key_matches(self, key: list[Tensor | None]) -> bool:
        current = self._kernel_key_tensors()
        if len(current) != len(key):
            return False
        for x, y in zip(current, key):
            if (x is None) != (y is None):
                return False
            if x is None:
                continue
            if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
                return False
            if not torch.equal(x, y):
                return False
        return True

    def _held_rows(self) -> tuple[Tensor, Tensor, Tensor]:
        r"""The held rows: inputs (``batch x N x d``), standardised targets
        (``sample x batch x N``) and noise variances (``batch x N``), fitted rows first."""
        X, y, noise = self.train_X, self.train_y, self._row_noise()
        if self.cond_X is None:
            return X, y, noise
        return (
            _cat_rows_all([X, self.cond_X]),
            _cat_last(y, self.cond_y),
            _cat_last(noise, self.cond_noise),
        )

    def _kernel_state(self) -> KernelState:
        r"""The kernel regime's caches, rebuilt (O(N^3)) when the hyperparameters or the held
        data changed in a way no bordering followed."""
        state = self._kernel_cache
        if state is not None and self._kernel_key_matches(state.key):
            return state
        with torch.no_grad():
            H, y, noise = self._held_rows()
            K = self.basis.kernel(H).to_dense() + torch.diag_embed(noise)
            factor = BorderedCholesky(psd_cholesky(K))
            z = factor.whiten((y - self.mean_constant).unsqueeze(-1)).squeeze(-1)
        state = KernelState(self._kernel_key(), H, factor, z)
        self.__dict__["_kernel_cache"] = state
        return state

    def _kernel_state_to_buffers(self) -> None:
        r"""The kernel regime's factor and ``z`` as the buffers ``kernel_L`` / ``kernel_z`` (for
        ``state_dict``: a loaded state then predicts bit for bit without refactorising), or
        None outside the regime."""
        if self.is_exact_gp_on_data():
            state = self._kernel_state()
            self.kernel_L, self.kernel_z = state.factor.dense(), state.z
        else:
            self.kernel_L = self.kernel_z = None

    def _kernel_state_from_buffers(self) -> None:
        r"""Adopt a loaded ``kernel_L`` / ``kernel_z`` as the caches when they fit the loaded
        data (otherwise the caches are rebuilt at the next use)."""
        self.__dict__["_kernel_cache"] = None
        L, z = self.kernel_L, self.kernel_z
        if L is None or z is None or not self.is_exact_gp_on_data():
            return
        H = self._held_rows()[0]
        if L.shape[-1] != H.shape[-2] or z.shape[-1] != H.shape[-2]:
            return
        self._set_kernel_state(KernelState([], H, BorderedCholesky(L), z))

    def _bordered_kernel_state(self, X: Tensor, Y: Tensor, noise: Tensor) -> KernelState:
        r"""The state after ``p`` new rows (its key still to be set): ``X`` (``batch x p x d``,
        transformed), ``Y`` (``sample x batch x p``, standardised), ``noise`` (``batch x p``).
        O(N^2 p); the new factor is this model's with one more border (nothing copied)."""
        state = self._kernel_state()
        inputs = state.all_inputs()
        C = self.basis.kernel(X, inputs).to_dense()  # batch x p x N
        D = self.basis.kernel(X).to_dense() + torch.diag_embed(noise)
        factor = state.factor.bordered(C, D)
        B, L22 = factor.borders[-1]
        z_old = state.z
        Bz = (B @ z_old.unsqueeze(-1)).squeeze(-1)
        z_new = solve_lower(L22, (Y - self.mean_constant - Bz).unsqueeze(-1)).squeeze(-1)
        return KernelState(
            [], state.inputs, factor, _cat_last(z_old, z_new), (*state.border_inputs, X)
        )

    def _set_kernel_state(self, state: KernelState) -> None:
        r"""Keep ``state`` as this model's caches (after its held data are set)."""
        state.key = self._kernel_key()
        self.__dict__["_kernel_cache"] = state

    # ------------------------------------------------------------------ the posterior

    def _kernel_moments(self, X: Tensor, lazy: bool) -> tuple[Tensor, Tensor | LinearOperator]:
        r"""Latent mean (``sample x batch x q``) and covariance (``batch x q x q``; a lazy
        ``k(X, X) - V^T V`` when ``lazy`` or when ``X`` is shared by the model's batch) of the
        exact GP at ``X`` (``batch x q x d``, transformed), standardised units."""
        state, c = self._kernel_state(), self.mean_constant
        # v_x = F^-1 k_H(x) by blocks: V1 = L^-1 k(inputs, X) over the factor's base (shared by
        # a fantasy model's batch), then V_i = L22_i^-1 (k(border_i, X) - B_i [V1; ...]) over
        # each border, each with its own batch shape
        K = [self.basis.kernel(rows, X).to_dense() for rows in (state.inputs, *state.border_inputs)]
        roots = state.factor.block_roots(K)
        mean, start = c, 0
        for V in roots:
            z = state.z[..., start : start + V.shape[-2]]
            mean = mean + (z.unsqueeze(-2) @ V).squeeze(-2)
            start += V.shape[-2]
        V1 = roots[0]
        q = X.shape[-2]
        batch = broadcast_shapes(X.shape[:-2], *(V.shape[:-2] for V in roots))
        if lazy:  # many points: no q x q tensor at all
            cov = self.basis.kernel(X).expand(*batch, q, q)
            for V in roots:
                cov = cov + _negated_gram(V, batch)
            return mean, cov
        shared = self.basis.kernel(X).to_dense() - V1.transpose(-1, -2) @ V1
        if len(roots) == 1:
            return mean, shared
        if V1.shape[:-2].numel() < batch.numel():
            # Points shared by the batch of a fantasy model (qNIPV's integration points): the
            # shared block once, each element's border terms lazily, so .variance forms no
            # batch x q x q tensor.
            cov = DenseLinearOperator(0.5 * (shared + shared.transpose(-1, -2))).expand(
                *batch, q, q
            )
            for V in roots[1:]:
                cov = cov + _negated_gram(V, batch)
            return mean, cov
        for V in roots[1:]:
            shared = shared - V.transpose(-1, -2) @ V
        return mean, shared

    def _kernel_path_update(
        self, prior_values: Tensor, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        r"""Pathwise conditioning (Matheron's rule) of ``s`` prior draws on the held rows:
        ``prior_values`` (``N x s``) are the draws at the held inputs; returns the inputs
        (``N x d``) and the weights ``(K_HH + N_H)^-1 (y_H - f_s(H) - e_s)`` (``s x N``), so a
        posterior draw is ``f_s(x) + k(x, H) v_s``."""
        state = self._kernel_state()
        _, y, noise = self._held_rows()
        e = torch.randn(prior_values.shape, generator=generator, **self._dtype_device)
        residual = y.unsqueeze(-1) - prior_values - e * noise.sqrt().unsqueeze(-1)
        weights = cholesky_solve(state.factor.dense(), residual)
        return state.all_inputs(), weights.transpose(-1, -2).contiguous()
