r"""WISKI as the exact GP of its kernel while it holds few points (the "exact regime").

At small n the SKI kernel ``w_x^T K_UU w_x'`` is a needless approximation: its grid cannot follow
lengthscales shorter than a grid spacing, its interpolated prior variance dips between grid nodes,
and its fit works on ``m`` grid points (m = 784 in 2-D, 600-1,500 for the additive models of 4-6
inputs) where an exact GP on ``n <= 100`` points is cheaper. In the BO suite at q = 3 over 32
seeds WISKI's mean final regret was 2.25x BoTorch's on Branin and 1.61x on Ackley 5-D, and a
finer grid (which costs 5-10x the step) closed most of the Ackley gap (docs/results.md). So, with
``exact_max_n > 0``, while the model holds at most ``exact_max_n`` points it keeps them (inputs,
outcomes, noise) and predicts, conditions and fits with the exact GP of the kernel that SKI
interpolates: ``covar_module`` on the inputs for one grid, the sum of the components' kernels on
their groups of inputs for the additive model. The sufficient statistics (and SKI's factors) are
kept up to date all along, so when the data outgrow ``exact_max_n`` the held rows are dropped and
the model carries on as WISKI, at a cost flat in n, without a rebuild. The algebra (a bordered
Cholesky factor of ``K_HH + N_H``) is :mod:`bo_online.models.exact_regime`'s (docs/math.md §4,
"Kernel regime"; docs/surrogates/wiski.md).

With ``regime_kernel="ard"`` the regime's kernel is instead BoTorch's ``SingleTaskGP`` kernel (one
lengthscale per input, dimension-scaled priors) on the inputs scaled to the unit cube, with its
own hyperparameters; the constant mean and the noise stay the model's. That is the loops' default
above 6 inputs, where SKI's structure (consecutive pairs and a learned 2-D projection) carries far
fewer interactions than BoTorch's kernel: with the exact GP of the additive kernel WISKI's mean
regret was 2-2.6x BoTorch's on Rosenbrock 8-D and Levy 10-D (docs/results.md). The SKI part is
then not fitted in the regime (a learned projection is not even derived), so leaving the regime
needs a fit of it, which the loops make (``OnlineLoop._left_exact_regime``).

A learned projection without ``regime_kernel="ard"`` has no regime (its map is fitted on SKI's
statistics), nor has the classifier (fixed per-class noise, built with ``exact_max_n=0``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator, LinearOperator
from torch import Tensor

from bo_online.linalg import broadcast_shapes, cholesky_logdet, psd_cholesky, solve_lower
from bo_online.models.exact_regime import (
    BorderedCholesky,
    KernelFn,
    KernelState,
    _dense,
    bordered_kernel_state,
    cat_last,
    cat_rows,
    kernel_moments,
    kernel_state,
    key_matches,
    key_of,
)
from bo_online.models.fitting import sum_log_priors

__all__ = ["WISKIExactRegimeMixin"]

#: The held rows' buffers (transformed inputs ``N x d``, user-unit outcomes ``N``, noise in D
#: units ``N``) and the saved factor of the exact GP on them (``N x N``, ``N``).
EXACT_ROW_NAMES = ("exact_X", "exact_y", "exact_D")
EXACT_FACTOR_NAMES = ("exact_L", "exact_z")

# Above this many test points the exact posterior's covariance is kept lazy (as roots).
_DENSE_COVAR_MAX = 64
# Largest a x b x J x k block of input differences the additive kernel forms at once (per batch
# element; 32 MB in float64): larger requests are evaluated a block of rows at a time.
_STACKED_BLOCK_NUMEL = 2**22


def _stacked_rbf(FA: Tensor, FB: Tensor, lengthscales: Tensor, outputscales: Tensor) -> Tensor:
    r"""``sum_j s_j exp(-|(a_j - b_j) / l_j|^2 / 2)`` (``... x a x b``) between the stacked
    group inputs ``FA`` (``... x a x J k``) and ``FB`` (``... x b x J k``), ``lengthscales``
    ``J x k``, ``outputscales`` ``J``: the additive model's kernel with every component a
    ``ScaleKernel(RBFKernel)`` (the loops' default), written out for all ``J`` at once (``J``
    GPyTorch kernel calls per posterior were 95% of an acquisition optimisation, Ackley 5-D, 10
    components). Rows of ``FA`` go in blocks of ``_STACKED_BLOCK_NUMEL`` differences: at once,
    the ``a x b x J x k`` differences and their squares took about 75 ``a x b`` matrices at
    6 inputs (Thompson sampling over 4,000 candidates: 9.6 GB)."""
    J, k = lengthscales.shape
    A = FA.unflatten(-1, (J, k)) / lengthscales  # ... x a x J x k
    B = FB.unflatten(-1, (J, k)) / lengthscales

    def rows(Ai: Tensor) -> Tensor:
        diff = Ai.unsqueeze(-3) - B.unsqueeze(-4)  # ... x a_i x b x J x k
        # a sum of k squared slices and a product with s: a third quicker (with the gradient)
        # than reducing the last dimensions of the broadcast tensors
        d2 = sum(diff[..., i].square() for i in range(k))  # ... x a_i x b x J
        return torch.exp(-0.5 * d2) @ outputscales

    size = max(1, _STACKED_BLOCK_NUMEL // max(1, B.shape[-3] * J * k))
    if A.shape[-3] <= size:
        return rows(A)
    return torch.cat([rows(Ai) for Ai in A.split(size, dim=-3)], dim=-2)


class StackedRBFPrior(LinearOperator):
    r"""``k(X, X)`` (``... x q x q``) of :func:`_stacked_rbf` at the stacked group inputs ``F``
    (``... x q x J k``), formed only when asked for densely: its diagonal, all ``.variance``
    needs, costs O(q J k). The hyperparameters are arguments of the operator, so gradients reach
    them through every LinearOperator path."""

    def __init__(self, F: Tensor, lengthscales: Tensor, outputscales: Tensor) -> None:
        super().__init__(F, lengthscales, outputscales)
        self.F, self.lengthscales, self.outputscales = F, lengthscales, outputscales

    def _size(self) -> torch.Size:
        return torch.Size((*self.F.shape[:-1], self.F.shape[-2]))

    def _transpose_nonbatch(self) -> LinearOperator:
        return self

    def _expand_batch(self, batch_shape: torch.Size) -> LinearOperator:
        F = self.F.expand(*batch_shape, *self.F.shape[-2:])
        return StackedRBFPrior(F, self.lengthscales, self.outputscales)

    def _matmul(self, rhs: Tensor) -> Tensor:
        return self.to_dense() @ rhs

    def _diagonal(self) -> Tensor:
        Fi = self.F.unsqueeze(-2)  # each point against itself: ... x q x 1 x 1
        return _stacked_rbf(Fi, Fi, self.lengthscales, self.outputscales)[..., 0, 0]

    def to_dense(self) -> Tensor:
        return _stacked_rbf(self.F, self.F, self.lengthscales, self.outputscales)


class WISKIExactRegimeMixin:
    r"""The exact-GP regime of :class:`~bo_online.models.wiski.WISKI` (a mixin placed before
    its SKI mixins, whose methods it defers to outside the regime)."""

    #: the exact GP's caches (not buffers: rebuilt from the held rows when needed)
    _exact_cache: KernelState | None = None

    # ------------------------------------------------------------------ the regime

    def _exact_regime_allowed(self) -> bool:
        r"""Whether this model may hold its rows: ``exact_max_n > 0``, and no learned projection
        unless the regime has its own kernel (``regime_kernel="ard"``)."""
        if int(getattr(self, "exact_max_n", 0)) <= 0:
            return False
        return self._has_regime_kernel() or not hasattr(self, "projection")

    def _has_regime_kernel(self) -> bool:
        r"""Whether the regime uses its own kernel (``regime_kernel="ard"``), not SKI's."""
        return getattr(self, "regime_kernel", "ski") == "ard"

    def _fits_regime_kernel(self) -> bool:
        r"""Whether ``fit`` moves the regime's own kernel (and not SKI's): in the regime, with
        ``regime_kernel="ard"``."""
        return self._has_regime_kernel() and self._holds_exact_rows()

    def _holds_exact_rows(self) -> bool:
        return self._buffers.get("exact_X") is not None

    def is_exact_gp_on_data(self) -> bool:
        r"""Whether this model predicts with, and fits, the exact GP of its kernel on the data it
        holds (at most ``exact_max_n`` points). A BO loop then refits it as BoTorch refits its
        exact GP (rebuilt and fitted from the defaults; ``OnlineLoop._rebuild_due``)."""
        return self._holds_exact_rows()

    def _hold_rows(self, X: Tensor | None, y: Tensor | None, D: Tensor | None) -> None:
        r"""Hold these rows (``N x d`` transformed inputs, ``N`` user-unit outcomes, ``N`` noise
        in D units) if the regime allows ``N`` of them, else drop any held rows (the model has
        left the regime for good: its statistics carry on)."""
        keep = X is not None and self._exact_regime_allowed() and X.shape[-2] <= self.exact_max_n
        for name, value in zip(EXACT_ROW_NAMES, (X, y, D)):
            setattr(self, name, value.detach() if keep else None)
        for name in EXACT_FACTOR_NAMES:
            setattr(self, name, None)
        self.__dict__["_exact_cache"] = None

    def _rows_with(self, X: Tensor, y: Tensor, D: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""The held rows (pending conditioned ones included) followed by ``X`` (``q x d``),
        ``y`` (``q``, user units), ``D`` (``q``, D units); one batch, for an in-place update."""
        H, yH, DH = self._held_exact_rows()
        return torch.cat([H, X], -2), torch.cat([yH, y], -1), torch.cat([DH, D], -1)

    def _held_exact_rows(self) -> tuple[Tensor, Tensor, Tensor]:
        r"""Inputs (``batch x N x d``), user-unit outcomes (``sample x batch x N``) and D-unit
        noise (``batch x N``) of every held row: the model's, then a conditioned model's
        pending ones."""
        X, y, D = self.exact_X, self.exact_y, self.exact_D
        if self.d_X is None:
            return X, y, D
        return cat_rows([X, self.d_X]), cat_last(y, self.d_y), cat_last(D, self.d_D)

    # ------------------------------------------------------------------ the kernel

    def _exact_kernel(self, A: Tensor, B: Tensor | None = None) -> Tensor:
        r"""The kernel SKI interpolates, between transformed inputs ``A`` (``... x a x d``) and
        ``B`` (``... x b x d``; ``A`` itself if None), dense: ``covar_module`` on one grid's
        inputs, or the sum over the additive model's components of their kernels on their
        groups of inputs."""
        return _dense(self._exact_kernel_fn()(A, B))

    def _exact_kernel_fn(self) -> KernelFn:
        r""":meth:`_exact_kernel` with the additive model's stacked component parameters
        gathered once, for the several kernel calls of one posterior (test-train and
        test-test). ``k(A, B)`` is dense; ``k(A)`` is a lazy operator whose diagonal costs O(a)
        (the posterior's prior covariance at many points: ``.variance`` forms no ``a x a``
        matrix, which took about 75 of them at 6 inputs)."""
        if self._has_regime_kernel():
            lower, upper = self.input_bounds[0], self.input_bounds[1]

            def unit(A: Tensor) -> Tensor:  # BoTorch's kernel and priors are for the unit cube
                return (A - lower.to(A)) / (upper - lower).to(A)

            def ard_kernel(A: Tensor, B: Tensor | None = None) -> Tensor | LinearOperator:
                UA = unit(A)
                if B is None:
                    return self.regime_covar_module(UA, UA)
                return self.regime_covar_module(UA, unit(B)).to_dense()

            return ard_kernel
        stacked = None if self.input_groups is None else self._stacked_rbf_parameters()

        def kernel(A: Tensor, B: Tensor | None = None) -> Tensor | LinearOperator:
            FA = self._features(A)
            FB = FA if B is None else self._features(B)
            if self.input_groups is None:
                K = self.covar_module(FA, FB)
                return K if B is None else _dense(K)
            if stacked is not None:
                if B is None:
                    return StackedRBFPrior(FA, *stacked)
                return _stacked_rbf(FA, FB, *stacked)
            kernels = self.covar_module.kernels
            k = FA.shape[-1] // len(kernels)
            out = None
            for j, component in enumerate(kernels):
                cols = slice(j * k, (j + 1) * k)
                part = component(FA[..., cols], FB[..., cols])
                part = part if B is None else _dense(part)
                out = part if out is None else out + part
            return out

        return kernel

    def _exact_residuals(self, y: Tensor) -> Tensor:
        r"""Standardised residuals ``(y - beta) / sd`` of user-unit outcomes (``beta``: the
        constant mean in user units)."""
        return (y - self._offset()) / self.outcome_std.reshape(())

    def _exact_noise(self, D: Tensor) -> Tensor:
        r"""Standardised noise variances ``sigma^2 D`` of D-unit noise."""
        return self._sigma2() * D

    # ------------------------------------------------------------------ caches

    def _exact_key_tensors(self) -> list[Tensor | None]:
        r"""What the exact GP's caches depend on: the hyperparameters, the outcome scaling and the
        held rows (compared by value, so a deep copy or a loaded state keeps its caches)."""
        return [
            *(p.detach() for p in self.parameters()),
            self.outcome_mean,
            self.outcome_std,
            *(self._buffers.get(name) for name in EXACT_ROW_NAMES),
            self.d_X,
            self.d_y,
            self.d_D,
        ]

    def _exact_key(self) -> list[Tensor | None]:
        return key_of(self._exact_key_tensors())

    def _exact_key_matches(self, key: list[Tensor | None]) -> bool:
        return key_matches(self._exact_key_tensors(), key)

    def _exact_state(self) -> KernelState:
        r"""The exact GP's caches, rebuilt (O(N^3)) when the hyperparameters or the held rows
        changed in a way no bordering followed."""
        state = self._exact_cache
        if state is not None and self._exact_key_matches(state.key):
            return state
        H, y, D = self._held_exact_rows()
        with torch.no_grad():
            state = kernel_state(
                self._exact_kernel, H, self._exact_residuals(y), self._exact_noise(D)
            )
        self._set_exact_state(state)
        return state

    def _set_exact_state(self, state: KernelState) -> None:
        state.key = self._exact_key()
        self.__dict__["_exact_cache"] = state

    # ------------------------------------------------------------------ posterior and evidence

    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        if not self._holds_exact_rows():
            return super()._latent_posterior(X)
        q = X.shape[-2]
        with torch.no_grad():
            c = self.mean_module.constant.detach().reshape(())
        mean, cov = kernel_moments(
            self._exact_kernel_fn(), self._exact_state(), X, c, lazy=q > _DENSE_COVAR_MAX
        )
        if not isinstance(cov, LinearOperator):
            cov = DenseLinearOperator(0.5 * (cov + cov.transpose(-1, -2)))
        batch = broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
        return MultivariateNormal(mean.expand(*batch, q), cov.expand(*batch, q, q))

    def exact_log_marginal(self) -> Tensor:
        r"""``log N(r | 0, K_HH + sigma^2 D)`` of the held rows' standardised residuals,
        differentiable in the hyperparameters (kernel, constant mean, noise), O(N^3): the exact
        GP's evidence, which the fit maximises in the regime."""
        X, y, D = self.exact_X, self.exact_y, self.exact_D
        r = self._exact_residuals(y)
        K = self._exact_kernel(X) + torch.diag_embed(self._exact_noise(D))
        L = psd_cholesky(K)
        w = solve_lower(L, r.unsqueeze(-1))
        n = r.shape[-1]
        return -0.5 * (w.pow(2).sum() + cholesky_logdet(L) + n * math.log(2 * math.pi))

    def marginal_log_likelihood(self, include_priors: bool = True) -> Tensor:
        r"""In the regime the exact GP's log marginal likelihood (plus log priors) divided by n,
        which ``fit`` then maximises; otherwise SKI's, from the statistics."""
        self._materialize()
        if not self._holds_exact_rows():
            return super().marginal_log_likelihood(include_priors=include_priors)
        mll = self.exact_log_marginal()
        if include_priors:
            fits_own = self._fits_regime_kernel()
            mll = mll + (self._regime_log_prior() if fits_own else self._log_prior())
        return mll / self.exact_y.shape[-1]

    def log_prior(self) -> Tensor:
        r"""The log prior of what ``fit`` moves: in the regime with its own kernel, that
        kernel's, the mean's and the noise's (:meth:`_regime_log_prior`); otherwise SKI's."""
        if self._fits_regime_kernel():
            return self._regime_log_prior()
        return super().log_prior()

    def _regime_log_prior(self) -> Tensor:
        r"""The log prior of what ``fit`` moves with the regime's own kernel
        (:meth:`_fits_regime_kernel`): that kernel's, the constant mean's and the noise's."""
        modules = [self.regime_covar_module, self.mean_module]
        if not self.fixed_noise:
            modules.append(self.likelihood)
        return sum_log_priors(modules, self.exact_y)

    # ------------------------------------------------------------------ new rows

    def _condition(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> Any:
        new = super()._condition(X, Y, noise)
        if not self._holds_exact_rows():
            return new
        q = X.shape[-2]
        new.d_X = X if self.d_X is None else cat_rows([self.d_X, X])
        y, D = new.d_y[..., -q:], new.d_D[..., -q:]
        state = bordered_kernel_state(
            self._exact_kernel,
            self._exact_state(),
            X,
            self._exact_residuals(y),
            self._exact_noise(D),
        )
        new._set_exact_state(state)
        return new

    def _update(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        if not self._holds_exact_rows() or self.batch_shape != torch.Size():
            return super()._update(X, Y, noise)  # (a batched fantasy: its read-only error)
        y = Y * self.outcome_std.reshape(()) + self.outcome_mean.reshape(())
        D = self._to_D(X, noise).expand(X.shape[:-1])
        rows = self._rows_with(X.detach(), y.detach(), D.detach())
        state = None
        if self.d_X is None and self._exact_cache is not None:
            if self._exact_key_matches(self._exact_cache.key):  # border it: O(N^2 q)
                state = bordered_kernel_state(
                    self._exact_kernel,
                    self._exact_cache,
                    X.detach(),
                    self._exact_residuals(y.detach()),
                    self._exact_noise(D.detach()),
                )
        super()._update(X, Y, noise)
        self._hold_rows(*rows)
        if state is not None and self._holds_exact_rows():
            # one dense factor again (a chain of borders would grow with every update)
            state = KernelState([], rows[0], BorderedCholesky(state.factor.dense()), state.z)
            self._set_exact_state(state)

    def _materialize(self) -> None:
        if self.d_idx is None or not self._holds_exact_rows():
            return super()._materialize()
        if self.batch_shape != torch.Size():
            raise ValueError("A batched (fantasy) WISKI model cannot be refit or updated.")
        # A change of representation, not of the model: it stays the exact GP on all its rows
        # whatever their number (a conditioned model may hold more than exact_max_n; the next
        # update or add_observations decides, as for the model it was built on). Dropping them
        # here made ``state_dict`` turn a conditioned model past exact_max_n into SKI.
        state = self._exact_cache
        if state is not None and not self._exact_key_matches(state.key):
            state = None
        rows = self._held_exact_rows()
        super()._materialize()
        for name, value in zip(EXACT_ROW_NAMES, rows):
            setattr(self, name, value.detach())
        for name in EXACT_FACTOR_NAMES:
            setattr(self, name, None)
        self.__dict__["_exact_cache"] = None
        if state is not None:  # its factor, as one dense block (as after an update)
            dense = BorderedCholesky(state.factor.dense())
            self._set_exact_state(KernelState([], rows[0], dense, state.z))

    def add_observations(self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kw: Any):
        held = self._holds_exact_rows()
        if held:
            self._materialize()
            n_before = self.exact_y.shape[-1]
        out = super().add_observations(X, Y, noise, **kw)
        if held:
            Xc, Yc, noise_c = self._checked_observations(X, Y, noise, "add_observations()")
            noise_s = self._standardized_noise(noise_c, Xc, Yc.shape)
            D = self._to_D(Xc, noise_s).expand(Xc.shape[:-1])
            if n_before + Xc.shape[0] <= self.exact_max_n:
                self._hold_rows(*self._rows_with(Xc, Yc.to(Xc).squeeze(-1), D))
            else:
                self._hold_rows(None, None, None)
        return out

    def _set_statistics(self, X: Tensor, D: Tensor, y: Tensor, zero: dict[str, Tensor]) -> None:
        super()._set_statistics(X, D, y, zero)
        self._hold_rows(X, y, D)

    # ------------------------------------------------------------------ saved state

    def _exact_state_to_buffers(self) -> None:
        r"""The exact GP's factor and ``z`` as the buffers ``exact_L`` / ``exact_z`` (a loaded
        state then predicts bit for bit, without refactorising), or None outside the regime."""
        if self._holds_exact_rows() and self.d_X is None:
            state = self._exact_state()
            self.exact_L, self.exact_z = state.factor.dense(), state.z
        else:
            self.exact_L = self.exact_z = None

    def _exact_state_from_buffers(self) -> None:
        r"""Adopt a loaded ``exact_L`` / ``exact_z`` as the caches when they fit the loaded rows
        (otherwise the caches are rebuilt at the next use)."""
        self.__dict__["_exact_cache"] = None
        L, z = self._buffers.get("exact_L"), self._buffers.get("exact_z")
        # used once: a later partial load (strict=False, new hyperparameters) must not adopt
        # this factor again
        self.exact_L = self.exact_z = None
        if L is None or z is None or not self._holds_exact_rows() or self.d_X is not None:
            return
        H = self.exact_X
        if L.shape[-1] != H.shape[-2] or z.shape[-1] != H.shape[-2]:
            return
        self._set_exact_state(KernelState([], H, BorderedCholesky(L), z))

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        r"""As :meth:`OnlineModel.load_state_dict`; where that drops the SKI caches (a partial
        state, or one saved in a coarser dtype, whose factor holds that dtype's rounding), the
        exact GP's loaded factor is dropped too and rebuilt from the loaded rows at the next
        use (it was adopted: a float32 state made a float64 model predict 1e-6 off)."""
        regime = getattr(self, "regime_kernel", "ski"), self._modules.get("regime_covar_module")
        try:
            result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        except Exception:  # as it was (see _load_from_state_dict)
            self.regime_kernel = regime[0]
            if regime[1] is not None:
                self.regime_covar_module = regime[1]
            raise
        if self._cache_key is None:
            self.__dict__["_exact_cache"] = None
        return result

    def _load_from_state_dict(self, state_dict, prefix, *args: Any, **kwargs: Any) -> None:
        # A saved model's state (it holds the statistics) without held rows is one past its
        # regime: the rows this model holds are not of those statistics. ``strict=True`` clears
        # them anyway; with ``strict=False`` they stayed and the loaded model predicted as the
        # exact GP on this model's earlier rows.
        if prefix + "n" in state_dict and prefix + "exact_X" not in state_dict:
            for name in (*EXACT_ROW_NAMES, *EXACT_FACTOR_NAMES):
                self._buffers[name] = None
        # A saved model's state without a regime kernel of its own is that of a model with
        # ``regime_kernel="ski"``, e.g. one saved before ``"ard"`` became the loops' default
        # above 6 inputs: the loaded model goes on as that one (a learned map then has no
        # regime), and its own unused kernel goes (a resumed run of such a model failed with
        # the regime kernel's keys missing). The children are loaded after this, so it is not.
        own = prefix + "regime_covar_module."
        if (
            prefix + "n" in state_dict
            and "regime_covar_module" in self._modules
            and not any(key.startswith(own) for key in state_dict)
        ):
            del self._modules["regime_covar_module"]
            self.regime_kernel = "ski"
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self.batch_shape == torch.Size():
            self._materialize()
            self._exact_state_to_buffers()
        try:
            return super().state_dict(*args, **kwargs)
        finally:  # in the saved state only (a partial load later must not find them here)
            self.exact_L = self.exact_z = None
