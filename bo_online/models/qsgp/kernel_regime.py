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

import torch
from linear_operator.operators import LinearOperator
from torch import Tensor

from bo_online.linalg import cholesky_solve
from bo_online.models.exact_regime import (
    BorderedCholesky,
    KernelState,
    bordered_kernel_state,
    cat_last,
    cat_rows,
    kernel_moments,
    kernel_state,
    key_matches,
    key_of,
)
from bo_online.models.qsgp.bases import RFFBasis

__all__ = ["QSGPKernelRegimeMixin"]


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
        return key_of(self._kernel_key_tensors())

    def _kernel_key_matches(self, key: list[Tensor | None]) -> bool:
        return key_matches(self._kernel_key_tensors(), key)

    def _held_rows(self) -> tuple[Tensor, Tensor, Tensor]:
        r"""The held rows: inputs (``batch x N x d``), standardised targets
        (``sample x batch x N``) and noise variances (``batch x N``), fitted rows first."""
        X, y, noise = self.train_X, self.train_y, self._row_noise()
        if self.cond_X is None:
            return X, y, noise
        return (
            cat_rows([X, self.cond_X]),
            cat_last(y, self.cond_y),
            cat_last(noise, self.cond_noise),
        )

    def _kernel_state(self) -> KernelState:
        r"""The kernel regime's caches, rebuilt (O(N^3)) when the hyperparameters or the held
        data changed in a way no bordering followed."""
        state = self._kernel_cache
        if state is not None and self._kernel_key_matches(state.key):
            return state
        H, y, noise = self._held_rows()
        state = kernel_state(self.basis.kernel, H, y - self.mean_constant, noise)
        state.key = self._kernel_key()
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
        return bordered_kernel_state(self.basis.kernel, state, X, Y - self.mean_constant, noise)

    def _set_kernel_state(self, state: KernelState) -> None:
        r"""Keep ``state`` as this model's caches (after its held data are set)."""
        state.key = self._kernel_key()
        self.__dict__["_kernel_cache"] = state

    # ------------------------------------------------------------------ the posterior

    def _kernel_moments(self, X: Tensor, lazy: bool) -> tuple[Tensor, Tensor | LinearOperator]:
        r"""Latent mean (``sample x batch x q``) and covariance (``batch x q x q``; a lazy
        ``k(X, X) - V^T V`` when ``lazy`` or when ``X`` is shared by the model's batch) of the
        exact GP at ``X`` (``batch x q x d``, transformed), standardised units."""
        state = self._kernel_state()
        return kernel_moments(self.basis.kernel, state, X, self.mean_constant, lazy)

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
