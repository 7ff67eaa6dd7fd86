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
    r"""The lower Cholesky factor of ``[[A, C^T], [C, D]]`` kept as ``[[L, 0], [B, L22]]``:
    ``L = chol(A)`` (``... x N x N``, shared with the model it came from, not copied),
    ``B = C L^-T`` (``... x p x N``) and ``L22 = chol(D - B B^T)`` (``... x p x p``); without a
    border just ``L``."""

    def __init__(self, L: Tensor, B: Tensor | None = None, L22: Tensor | None = None) -> None:
        self.L, self.B, self.L22 = L, B, L22

    def whiten(self, K: Tensor) -> Tensor:
        r"""``F^-1 K`` for the whole factor ``F`` (``K``: ``... x (N + p) x k``)."""
        N = self.L.shape[-1]
        V1 = solve_lower(self.L, K[..., :N, :])
        if self.B is None:
            return V1
        V2 = solve_lower(self.L22, K[..., N:, :] - self.B @ V1)
        return _cat_rows(V1, V2)

    def dense(self) -> Tensor:
        r"""The whole factor as one ``... x (N + p) x (N + p)`` tensor."""
        if self.B is None:
            return self.L
        L, B, L22 = self.L, self.B, self.L22
        N, p = L.shape[-1], L22.shape[-1]
        batch = broadcast_shapes(L.shape[:-2], B.shape[:-2], L22.shape[:-2])
        top = torch.cat([L.expand(*batch, N, N), L.new_zeros(*batch, N, p)], dim=-1)
        bottom = torch.cat([B.expand(*batch, p, N), L22.expand(*batch, p, p)], dim=-1)
        return torch.cat([top, bottom], dim=-2)

    def bordered(self, C: Tensor, D: Tensor) -> BorderedCholesky:
        r"""The factor with ``p`` more rows: ``C`` (``... x p x (N + p_0)``) their covariance
        with the rows already factored, ``D`` (``... x p x p``) their own (noise included). A
        border on a border folds the first into one factor (a chain of conditionings)."""
        L = self.dense()
        B = solve_lower(L, C.transpose(-1, -2)).transpose(-1, -2)
        return BorderedCholesky(L, B, psd_cholesky(D - B @ B.transpose(-1, -2)))


def _cat_rows(top: Tensor, bottom: Tensor) -> Tensor:
    r"""``[top; bottom]`` along the row dim, the batch dims broadcast."""
    batch = broadcast_shapes(top.shape[:-2], bottom.shape[:-2])
    return torch.cat(
        [top.expand(*batch, *top.shape[-2:]), bottom.expand(*batch, *bottom.shape[-2:])], dim=-2
    )


def _cat_last(a: Tensor, b: Tensor) -> Tensor:
    r"""``[a, b]`` along the last dim, the leading dims broadcast."""
    lead = broadcast_shapes(a.shape[:-1], b.shape[:-1])
    return torch.cat([a.expand(*lead, a.shape[-1]), b.expand(*lead, b.shape[-1])], dim=-1)


@dataclass
class KernelState:
    r"""The exact GP on the held rows: their inputs (transformed; ``inputs``, ``batch x N x d``,
    those of the factor's ``L``, then ``border_inputs``, ``batch x p x d``, those of its border,
    if any), the factor of ``K_HH + N_H`` and ``z = L^-1 (y_H - c)`` (``sample x batch x
    (N + p)``), with the key (hyperparameters and held data) they were built for."""

    key: list[Tensor | None]
    inputs: Tensor
    factor: BorderedCholesky
    z: Tensor
    border_inputs: Tensor | None = None

    def all_inputs(self) -> Tensor:
        r"""Every held row's inputs, ``batch x (N + p) x d``."""
        if self.border_inputs is None:
            return self.inputs
        return _cat_rows(self.inputs, self.border_inputs)


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
            _cat_rows(X, self.cond_X),
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
        O(N^2 p); the factor borders this model's (or, after a border already, folds it)."""
        state = self._kernel_state()
        inputs = state.all_inputs()
        C = self.basis.kernel(X, inputs).to_dense()  # batch x p x N
        D = self.basis.kernel(X).to_dense() + torch.diag_embed(noise)
        factor = state.factor.bordered(C, D)
        z_old = state.z
        Bz = (factor.B @ z_old.unsqueeze(-1)).squeeze(-1)
        z_new = solve_lower(factor.L22, (Y - self.mean_constant - Bz).unsqueeze(-1)).squeeze(-1)
        return KernelState([], inputs, factor, _cat_last(z_old, z_new), X)

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
        factor, N = state.factor, state.factor.L.shape[-1]
        # v_x = F^-1 k_H(x) in two blocks: V1 = L^-1 k(inputs, X) over the factor's L (shared
        # by a fantasy model's batch) and V2 = L22^-1 (k(border, X) - B V1) over its border
        V1 = solve_lower(factor.L, self.basis.kernel(state.inputs, X).to_dense())
        mean = c + (state.z[..., :N].unsqueeze(-2) @ V1).squeeze(-2)
        roots = [V1]
        if factor.B is not None:
            K2 = self.basis.kernel(state.border_inputs, X).to_dense()
            V2 = solve_lower(factor.L22, K2 - factor.B @ V1)
            mean = mean + (state.z[..., N:].unsqueeze(-2) @ V2).squeeze(-2)
            roots.append(V2)
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
            # shared block once, each element's border term lazily, so .variance forms no
            # batch x q x q tensor.
            shared = DenseLinearOperator(0.5 * (shared + shared.transpose(-1, -2)))
            return mean, shared.expand(*batch, q, q) + _negated_gram(roots[1], batch)
        return mean, shared - roots[1].transpose(-1, -2) @ roots[1]

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
