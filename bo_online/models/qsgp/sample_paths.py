r"""Explicit, deterministic posterior function draws of QSGP for Thompson sampling.

A draw is ``f_s(x) = c + phi(x)^T w_s`` with ``w_s ~ q(w)``, updated pathwise (Matheron's rule)
by the conditioning data held since the last fit, so it is a draw of the exact conditional of
the weight posterior; the same ``x`` always gives the same value. In the kernel regime
(:mod:`~bo_online.models.qsgp.kernel_regime`) a draw is a prior draw in the features updated
pathwise with the exact kernel, ``f_s(x) = c + phi(x)^T w_s + k(x, H) v_s`` with ``w_s`` from the
prior and ``v_s = (K_HH + N_H)^-1 (y_H - c - Phi_H w_s - e_s)``: its mean is the exact GP's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from bo_online.linalg import cholesky_solve
from bo_online.models.validation import check_inputs

if TYPE_CHECKING:
    from bo_online.models.qsgp.model import QSGP

__all__ = ["QSGPSamplePaths", "QSGPSamplePathsMixin", "weight_path_values"]


class QSGPSamplePathsMixin:
    r"""``sample_paths`` (a mixin of :class:`QSGP`)."""

    def sample_paths(
        self, num_samples: int, generator: torch.Generator | None = None
    ) -> QSGPSamplePaths:
        r"""Explicit posterior draws ``f_s(x) = phi(x)^T w_s`` (deterministic callables).

        ``w_s = mu + C eps_s``; with conditioning data held, each draw is updated pathwise
        (Matheron's rule): ``w_s <- w_s + Sigma Phi_c^T (K^_cc + N)^-1 (y_c - Phi_c w_s - e_s)``,
        ``e_s ~ N(0, N)``, which is the exact conditional of the weight posterior. The Prop. 4
        augmentation (a per-point variance, not a function) is not part of the paths.
        """
        if self.batch_shape != torch.Size():
            raise ValueError("sample_paths() is for a single (non-fantasy) model.")
        self.ensure_caches()
        m = self.num_features
        dd = self._dtype_device
        eps = torch.randn(m, num_samples, generator=generator, **dd)
        if self.is_exact_gp_on_data():
            return self._kernel_regime_paths(eps, generator)
        W = self.var_mean.unsqueeze(-1) + self._C_times(eps)  # m x s
        if self.cond_X is not None:
            Xc = self.cond_X
            p = Xc.shape[-2]
            e = torch.randn(p, num_samples, generator=generator, **dd)
            e = e * self.cond_noise.sqrt().unsqueeze(-1)  # observation-noise draws
            Fc_W = self.mean_constant.expand(p, num_samples)  # draws at X_c, with c
            CtPhiT = torch.zeros(m, p, **dd)  # C^T Phi_c^T, by blocks
            k = self.num_dense
            for idx in self._chunks():
                F = self.basis.features(Xc, idx)  # p x b
                Fc_W = Fc_W + F @ W[idx]
                CtPhiT[idx] = (F * self.var_log_diag[idx].exp()).transpose(-1, -2)
            if k:
                low = torch.zeros(p, k, **dd)
                for idx in self._chunks():
                    low = low + self.basis.features(Xc, idx) @ self._lower_cols(
                        idx, idx.new_tensor(range(k)), self.var_cols[idx]
                    )
                CtPhiT[:k] = CtPhiT[:k] + low.transpose(-1, -2)
            # Sigma Phi_c^T (K^_cc + E)^-1 t = C P^-1 A_c^T E^-1 t (push-through identity)
            E = self._cond_point_variance(Xc, self.cond_noise)
            t = (self.cond_y.unsqueeze(-1) - Fc_W - e) / E.unsqueeze(-1)
            W = W + self._C_times(cholesky_solve(self.cond_L, CtPhiT @ t))
        return QSGPSamplePaths(self, W.transpose(-1, -2).contiguous())

    def _kernel_regime_paths(
        self, eps: Tensor, generator: torch.Generator | None
    ) -> QSGPSamplePaths:
        r"""Draws from the exact GP of the kernel: prior draws in the features (``eps``:
        ``m x s`` standard normals) updated pathwise with the exact kernel."""
        W = eps / self._prior_diag_all().sqrt().unsqueeze(-1)  # m x s, w_s ~ N(0, S^-1)
        H = self.train_inputs[0]
        prior = self.mean_constant.expand(H.shape[-2], eps.shape[-1])
        for idx in self._chunks():
            prior = prior + self.basis.features(H, idx) @ W[idx]
        inputs, weights = self._kernel_path_update(prior, generator)
        return QSGPSamplePaths(self, W.transpose(-1, -2).contiguous(), inputs, weights)


class QSGPSamplePaths(nn.Module):
    r"""``s`` explicit posterior function draws of a :class:`QSGP`, ``f_s(x) = phi(x)^T w_s``.

    Calling it on ``X`` (``batch x q x d``, the model's input space) returns ``s x batch x q`` in
    the user's outcome units. Deterministic: the same ``X`` always gives the same values.
    """

    def __init__(
        self,
        model: QSGP,
        weights: Tensor,
        update_inputs: Tensor | None = None,
        update_weights: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("weights", weights)  # s x m
        # the kernel regime's pathwise update: k(x, H) v_s with H N x d, v s x N
        self.register_buffer("update_inputs", update_inputs)
        self.register_buffer("update_weights", update_weights)

    @property
    def num_samples(self) -> int:
        return int(self.weights.shape[0])

    def forward(self, X: Tensor) -> Tensor:
        model = self.model
        if model.training:  # as posterior: a fixed input transform (no bounds learned from X)
            model.eval()
        check_inputs(X, dim=X.shape[-1])
        Xt = model._transform_and_check(X)
        out = weight_path_values(
            model, Xt, self.weights, self.update_inputs, self.update_weights, outer=True
        )
        return out * model.outcome_std + model.outcome_mean


def weight_path_values(
    model: QSGP,
    X: Tensor,
    weights: Tensor,
    update_inputs: Tensor | None,
    update_weights: Tensor | None,
    outer: bool,
) -> Tensor:
    r"""Standardised values ``c + phi(x)^T w_s (+ k(x, H) v_s)`` of weight-space draws.

    Args:
        model: the QSGP whose basis (features, kernel) and mean constant the draws use.
        X: ``batch x q x d`` inputs, already through the model's input transform.
        weights: ``s x m`` (``outer``) or ``sample_shape x m`` basis weights ``w_s``.
        update_inputs: ``N x d`` points ``H`` of the kernel regime's pathwise update, or None.
        update_weights: ``s x N`` / ``sample_shape x N`` weights ``v_s`` of that update, or None.
        outer: True evaluates every draw at every input (``s x batch x q``, memory linear in
            ``s`` and ``batch``); False broadcasts ``sample_shape`` against ``batch`` as
            BoTorch's sample paths do (``broadcast(sample_shape, batch) x q``).

    Returns:
        The draws' values in the model's standardised outcome units.
    """

    def apply(A: Tensor, w: Tensor) -> Tensor:  # A: batch x q x k, w: (s|sample_shape) x k
        if outer:
            return torch.einsum("...qk,sk->s...q", A, w)
        return (A @ w.unsqueeze(-1)).squeeze(-1)

    out = model.mean_constant
    for idx in model._chunks():
        out = out + apply(model.basis.features(X, idx), weights[..., idx])
    if update_inputs is not None:
        out = out + apply(model.basis.kernel(X, update_inputs).to_dense(), update_weights)
    return out
