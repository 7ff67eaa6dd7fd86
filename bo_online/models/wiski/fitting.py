r"""WISKI's hyperparameter fit: the exact SKI marginal likelihood from the statistics.

:meth:`WISKIFitMixin.fit` maximises ``log p(y | theta)`` computed from the sufficient statistics
alone (O(m^3) per step, whatever n is; docs/math.md §1), warm-started, after an exact
restandardisation of the outcomes. A model with a learned input projection learns it separately
(:meth:`WISKIFitMixin.fit_projection` on raw data the user kept, which rebuilds the statistics,
or :meth:`WISKIFitMixin.projection_step` online), following Stanton, Maddox, Delbridge and
Wilson, "Kernel Interpolation for Scalable Online Gaussian Processes", AISTATS 2021,
arXiv:2103.01454, Sec. 4.3.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Iterator

import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import RBFKernel, ScaleKernel
from torch import Tensor
from typing_extensions import Self

from bo_online.linalg import logdet_and_inverse_quad, solve_lower
from bo_online.models.fitting import (
    OptimizerSettings,
    minimize_loss,
    nonzero_std,
    remap_constant_mean,
    resolve_settings,
    standardization,
    sum_log_priors,
    trainable_parameters_and_bounds,
    training_mode,
)
from bo_online.models.wiski.grid import interp_matmul
from bo_online.models.wiski.kronecker import (
    kron_congruence,
    kron_dense,
    kron_matmul,
    kron_roots,
)
from bo_online.models.wiski.low_rank import (
    LowRankStatistics,
    TensorRef,
    low_rank_log_likelihood,
    low_rank_statistics,
)
from bo_online.models.wiski.projection import set_projection_normalization
from bo_online.models.wiski.statistics import _STAT_NAMES, _stats_with

__all__ = ["WISKIFitSettings", "WISKIProjectionFitSettings", "WISKIFitMixin"]


@dataclasses.dataclass(frozen=True)
class WISKIFitSettings(OptimizerSettings):
    r"""Settings of :meth:`WISKI.fit <WISKIFitMixin.fit>` (L-BFGS-B by default, as
    ``fit_gpytorch_mll``; ``method="adam"`` with a small ``max_iter``, e.g. 1-5 steps per batch,
    is the paper's streaming mode).

    Attributes:
        restandardize: first recompute the outcome mean/std from all data seen (exact, O(m)
            through the statistics); the constant mean, noise and outputscale are mapped so
            that the model in the user's units is unchanged before optimising.
        include_priors: add the hyperparameter priors' log densities to the objective.
    """

    restandardize: bool = True
    include_priors: bool = True


@dataclasses.dataclass(frozen=True)
class WISKIProjectionFitSettings(OptimizerSettings):
    r"""Settings of :meth:`WISKI.fit_projection <WISKIFitMixin.fit_projection>` (Adam, 100
    steps at learning rate 0.01 by default).

    Attributes:
        include_priors: add the hyperparameter priors' log densities to the objective.
        joint: ``False`` (default) where the projection has ``init_from_data``: the map is
            re-derived from the data (the leading gradient directions of an exact GP, see
            :mod:`bo_online.models.wiski.projection`), the statistics are rebuilt and only the
            kernel hyperparameters are fitted (on 200 Hartmann6 points: held-out RMSE 0.93 of
            the data's sd, 94% coverage of the 95% interval, against 1.09 / 86% after a joint
            L-BFGS fit of map and kernel, which overfits the map). ``True``: the paper's joint
            gradient fit of map and hyperparameters from the current map.
    """

    method: str = "adam"
    max_iter: int = 100
    lr: float = 0.01
    include_priors: bool = True
    joint: bool = False


def _component_priors(kernel: Any) -> tuple[Any, Any] | None:
    r"""The (lengthscale, outputscale) priors of a ``ScaleKernel(RBFKernel)`` component when they
    are its only priors and both are set; else None.

    Read from the two modules' own prior tables rather than GPyTorch's recursive
    ``named_priors`` walk (called for every component at every evaluation of a fit): the only
    other children allowed are the parameter constraints, which hold no priors."""
    base = kernel.base_kernel
    if set(kernel._priors) != {"outputscale_prior"} or set(base._priors) != {"lengthscale_prior"}:
        return None
    for module, priors in (
        (kernel, {"base_kernel", "outputscale_prior"}),
        (base, {"lengthscale_prior"}),
    ):
        if any(
            name not in priors and not isinstance(child, Interval)
            for name, child in module._modules.items()
        ):
            return None
    return base._priors["lengthscale_prior"][0], kernel._priors["outputscale_prior"][0]


def _module_tensors(module: Any) -> dict[str, Tensor] | None:
    r"""A module's own parameters and buffers by name, or None when it has children (then its
    ``state_dict`` is the comparison to make)."""
    if module._modules:
        return None
    return {**module._parameters, **module._buffers}


def _same_priors(a: tuple[Any, Any] | None, b: tuple[Any, Any] | None) -> bool:
    r"""Whether two components' priors are of the same types with equal parameters."""
    if a is None or b is None:
        return False
    for p, q in zip(a, b):
        if p is q:
            continue
        if type(p) is not type(q):
            return False
        sp, sq = _module_tensors(p), _module_tensors(q)
        if sp is None or sq is None:
            sp, sq = p.state_dict(), q.state_dict()
        if sp.keys() != sq.keys() or any(not torch.equal(sp[k], sq[k]) for k in sp):
            return False
    return True


def _same_constraint(a: Any, b: Any) -> bool:
    r"""Whether two parameter constraints map raw values alike: the same type, transform and
    bounds (so one call of either on stacked raw values is each applied to its own)."""
    if a is b:
        return True
    if type(a) is not type(b) or getattr(a, "_transform", None) != getattr(b, "_transform", None):
        return False
    bounds_a, bounds_b = a._buffers, b._buffers  # lower_bound, upper_bound
    return bounds_a.keys() == bounds_b.keys() and all(
        torch.equal(bounds_a[name], bounds_b[name]) for name in bounds_a
    )


def _restrict(M: Tensor, index: Tensor) -> Tensor:
    r"""``M[index][:, index]`` (``k x k`` of an ``m x m`` matrix) in one gather."""
    return M[index.unsqueeze(-1), index]


class WISKIFitMixin:
    r"""Methods of :class:`~bo_online.models.wiski.WISKI` that fit its hyperparameters (and its
    input projection)."""

    fit_settings_class = WISKIFitSettings
    fit_projection_settings_class = WISKIProjectionFitSettings

    def marginal_log_likelihood(self, include_priors: bool = True) -> Tensor:
        r"""Exact SKI log marginal likelihood of the standardised outcomes divided by n (plus log
        priors / n), from the statistics alone (docs/math.md §1); differentiable in every
        hyperparameter. O(m^3), independent of n."""
        self._materialize()
        stats = {name: getattr(self, name) for name in _STAT_NAMES}
        mll = self._mll_from_stats(stats)
        if include_priors:
            mll = mll + self._log_prior()
        return mll / self.n

    def _mll_from_stats(self, stats: dict[str, Tensor]) -> Tensor:
        r"""``log p(y_std)`` (not divided by n) from statistics ``stats`` (which may themselves be
        differentiable, as in :meth:`fit_projection`)."""
        G = stats["G"]
        # Only the grid points that some observation weights (diag G > 0) enter the likelihood:
        # y ~ N(0, W_P K_PP W_P^T + sigma^2 D). Restricting to them is exact and makes early BO
        # steps (few points, r << m) cheap.
        active = torch.nonzero(torch.diagonal(G).detach() > 0).squeeze(-1)
        full = active.numel() == G.shape[-1]
        sigma2 = self._sigma2()
        beta, sd = self._stats_offset(), self.outcome_std.reshape(())
        s_r = (stats["s"] - 2 * beta * stats["t"] + beta**2 * stats["c"]) / sd**2
        factors = self._kronecker_factors()
        low = self._low_rank(stats, active, full, kronecker=factors is not None)
        if low is not None:  # fewer observations than grid points: r x r algebra (low_rank.py)
            e_r = (low.e_z - beta * low.e_h) / sd
            L_ext = torch.cat([low.L, e_r.unsqueeze(-1)], -1)
            return low_rank_log_likelihood(
                low,
                self._factor_kernel_product(L_ext, active, factors),
                sigma2,
                beta,
                sd,
                s_r,
                stats["n"],
                stats["logdet_D"],
            )
        z_r = (stats["z"] - beta * stats["h"]) / sd
        if factors is not None and 2 * active.numel() > G.shape[-1]:
            # The whole grid by Kronecker algebra (kronecker.py): grid points that no observation
            # weighs add log sigma^2 each to log det A and are offset by (n - m) log sigma^2
            # below, so this equals the restricted computation, and is the cheaper one while
            # most grid points are active (m^3 / 3 for A's factor against about 3 m_P^3).
            roots = kron_roots(factors)
            A = kron_congruence(roots, G)
            Rtz = kron_matmul([R.mT for R in roots], z_r.unsqueeze(-1))
        else:
            # The kernel is evaluated on the whole grid and then restricted, so the entries are
            # bit-for-bit those of the full K (GPyTorch's distances depend on the point set's
            # mean).
            K = self._grid_kernel() if factors is None else kron_dense(factors)
            R, A = self._root_and_gram(
                K if full else _restrict(K, active),
                G if full else _restrict(G, active),
                self._block_sizes(None if full else active),
            )
            Rtz = R.mT @ (z_r if full else z_r[active]).unsqueeze(-1)
        m = A.shape[-1]
        A = A + sigma2 * torch.eye(m, dtype=A.dtype, device=A.device)
        # log det A and |L_A^-1 R^T z_r|^2 = z_r^T R A^-1 R^T z_r
        logdet_A, fit_term = logdet_and_inverse_quad(0.5 * (A + A.mT), Rtz.squeeze(-1))
        n = stats["n"]
        # log det of the standardised noise sigma^2 D: n log sigma^2 + logdet D (D units).
        return -0.5 * (
            (s_r - fit_term) / sigma2
            + (n - m) * sigma2.log()
            + stats["logdet_D"]
            + logdet_A
            + n * math.log(2 * math.pi)
        )

    def _low_rank(
        self, stats: dict[str, Tensor], active: Tensor, full: bool, kronecker: bool = False
    ) -> LowRankStatistics | None:
        r"""The factored statistics of :mod:`bo_online.models.wiski.low_rank` while the
        observations number at most half the ``active`` grid points (``G`` restricted to them),
        or, with a Kronecker kernel (``kronecker``), three quarters of them, else None. Computed
        once per data state (``G`` is hyperparameter-free) and cached, so a cache hit does not
        even restrict ``G``.

        Why the two limits: with a dense kernel an evaluation costs ``O(r m^2 + r^3)`` against
        ``O(m^3)`` for the ``m x m`` form; with a Kronecker kernel ``O(m r (m_1 + ... + m_k) +
        m r^2 + r^3)`` against the ``m x m`` Cholesky factor of ``A`` and its gradient, and
        measured per evaluation 25 against 45 ms at r = 300, m = 512 and 67 against 122 ms at
        r = 600, m = 777 (one thread). The factor itself costs a few evaluations once per data
        state (0.38 s at r = 600), which a fit of tens of evaluations repays."""
        G = stats["G"]
        n, m = float(stats["n"]), active.numel()
        if G.requires_grad or n > (0.75 * m if kronecker else m / 2):
            return None
        # Keyed on the statistics tensor itself (weakly) and its version counters: a key on its
        # address could match a new G that the allocator put where a freed one was.
        key = (stats["G"]._version, stats["z"]._version, stats["h"]._version, n, m)
        cached = self.__dict__.get("_low_rank_cache")
        if cached is None or cached[0]() is not G or cached[1] != key:
            z, h = (stats[k] if full else stats[k][active] for k in ("z", "h"))
            cached = self.__dict__["_low_rank_cache"] = (
                TensorRef(G),
                key,
                low_rank_statistics(G if full else _restrict(G, active), z, h, max_rank=int(n)),
            )
        return cached[2]

    def _factor_kernel_product(
        self, L: Tensor, active: Tensor, factors: list[Tensor] | None = None
    ) -> Tensor:
        r"""``L^T (K_UU + jitter I) L`` (``r x r``) for ``L``: ``m_active x r``, differentiable in
        the kernel. For the additive model block by block (``sum_j L_j^T K_j L_j`` over each
        component's active points: ``sum_j m_j^2`` kernel entries instead of ``m^2``), with the
        jitter of :meth:`_grid_kernel` (``grid_jitter`` times the mean of the full diagonal;
        every component kernel is stationary, so its diagonal is constant). With the kernel's
        Kronecker ``factors`` (:meth:`_kronecker_factors`) ``K_UU L`` is formed factor by
        factor."""
        if self.input_groups is None:
            if factors is not None:  # K L by Kronecker algebra on L padded to the whole grid
                L_full = L.new_zeros(self.grid.num_points, L.shape[-1]).index_copy(0, active, L)
                return L.mT @ kron_matmul(factors, L_full)[active]
            K = self._grid_kernel()
            K = _restrict(K, active) if active.numel() < K.shape[-1] else K
            return L.mT @ K @ L
        stacked = self._stacked_rbf_blocks()
        if stacked is not None:
            # Zero rows of L at the inactive grid points contribute nothing, so L padded to the
            # whole stacked grid gives sum_j L_j^T K_j L_j as one batched product.
            K, outputscales = stacked  # J x m_j x m_j, J
            J, mj = K.shape[0], K.shape[-1]
            L_full = L.new_zeros(J * mj, L.shape[-1]).index_copy(0, active, L).view(J, mj, -1)
            jitter = self.grid_jitter * outputscales.mean()  # equal sizes, diagonals os_j
            return jitter * (L.mT @ L) + (L_full.mT @ K @ L_full).sum(0)
        # The active points are sorted, and each component's grid points are consecutive, so
        # each component's rows of L and of the points are one contiguous slice.
        active_sizes = self._block_sizes(active)
        rows = zip(L.split(active_sizes), self.grid_points[active].split(active_sizes))
        blocks, diags = [], []
        for kernel, (Lj, Pj) in zip(self.covar_module.kernels, rows):
            if Lj.shape[0]:
                Kj = kernel(Pj).to_dense()
                blocks.append((Lj, Kj))
                diags.append(Kj[0, 0])
            else:  # no observation weighs this component: its kernel diagonal only
                diags.append(kernel(self.grid_points[:1], diag=True).reshape(()))
        sizes = self.grid.sizes_per_grid
        jitter = self.grid_jitter * sum(d * s for d, s in zip(diags, sizes)) / sum(sizes)
        M = jitter * (L.mT @ L)
        for Lj, Kj in blocks:
            M = M + Lj.mT @ Kj @ Lj
        return M

    def _stacked_rbf_blocks(self) -> tuple[Tensor, Tensor] | None:
        r"""The component kernels of an additive model as one ``J x m_j x m_j`` tensor on the whole
        of each component's grid, and their outputscales (``J``), where every component is a
        ``ScaleKernel(RBFKernel)`` on one and the same grid (the loops' all-pairs default);
        else None. Differentiable in the lengthscales and outputscales.

        Written out (``s_j exp(-|(p - p') / l_j|^2 / 2)``) instead of ``J`` GPyTorch kernel
        calls, whose per-call overhead (forward and backward) was most of a marginal-likelihood
        evaluation at these sizes: 15 components of 100 points at 6 inputs. Equal to GPyTorch's
        ``RBFKernel`` to round-off (it forms distances through inner products)."""
        grid = self.grid
        if not grid.__dict__.get("_identical", False):
            return None
        stacked = self._stacked_rbf_parameters()
        if stacked is None:
            return None
        mj = grid.sizes_per_grid[0]
        P = self.grid_points[:mj]  # m_j x k: every component's grid
        diff2 = (P.unsqueeze(-2) - P.unsqueeze(-3)).pow(2)  # m_j x m_j x k
        inv_ls2 = stacked[0].pow(-2)  # J x k
        outputscales = stacked[1]  # J
        K = outputscales.view(-1, 1, 1) * torch.exp(
            -0.5 * torch.einsum("abk,jk->jab", diff2, inv_ls2)
        )
        return K, outputscales

    def _stacked_rbf_parameters(self) -> tuple[Tensor, Tensor] | None:
        r"""The lengthscales (``J x k``) and outputscales (``J``) of an additive model
        whose every component is a plain ``ScaleKernel(RBFKernel)`` on its group's ``k`` inputs
        (the loops' default), differentiable; else None."""
        if self.input_groups is None:
            return None
        k = len(self.input_groups[0])
        # Called at every posterior and every evaluation of a fit, so the components are read
        # through the modules' own tables rather than ``nn.Module.__getattr__`` and GPyTorch's
        # recursive ``batch_shape`` (no batch dimensions is read off the raw parameters'
        # shapes), and the constraints map the stacked raw values once when they agree (the
        # default): with per-component property calls this was a third of a 6-input step.
        raw_ls, raw_os, ls_constraints, os_constraints = [], [], [], []
        for kernel in self.covar_module.kernels:
            base = kernel._modules.get("base_kernel")
            if (
                type(kernel) is not ScaleKernel
                or type(base) is not RBFKernel
                or kernel._buffers.get("active_dims") is not None
                or base._buffers.get("active_dims") is not None
            ):
                return None
            # (a raw value held as a buffer, or a constraint removed: GPyTorch's own path)
            ls, os_ = (
                base._parameters.get("raw_lengthscale"),
                kernel._parameters.get("raw_outputscale"),
            )
            ls_c = base._modules.get("raw_lengthscale_constraint")
            os_c = kernel._modules.get("raw_outputscale_constraint")
            if ls is None or os_ is None or ls_c is None or os_c is None:
                return None
            if os_.shape != torch.Size() or ls.shape != torch.Size([1, k]):
                return None
            raw_ls.append(ls)
            raw_os.append(os_)
            ls_constraints.append(ls_c)
            os_constraints.append(os_c)
        ls_c, os_c = ls_constraints[0], os_constraints[0]
        if all(_same_constraint(c, ls_c) for c in ls_constraints) and all(
            _same_constraint(c, os_c) for c in os_constraints
        ):
            return ls_c.transform(torch.cat(raw_ls, 0)), os_c.transform(torch.stack(raw_os))
        lengthscales = torch.cat([c.transform(r) for c, r in zip(ls_constraints, raw_ls)], 0)
        outputscales = torch.stack([c.transform(r) for c, r in zip(os_constraints, raw_os)])
        return lengthscales, outputscales

    def log_prior(self) -> Tensor:
        r"""Sum of the hyperparameter priors' log densities (kernel, mean, and the likelihood's
        noise unless the noise is fixed per point), a scalar tensor."""
        return self._ski_log_prior()

    def _ski_log_prior(self) -> Tensor:
        r"""The log prior of SKI's hyperparameters (what SKI's evidence adds)."""
        modules = [self.covar_module, self.mean_module]
        if not self.fixed_noise:
            modules.append(self.likelihood)
        stacked = self._stacked_component_log_prior()
        if stacked is not None:  # the components' priors at once, then the others'
            return stacked + sum_log_priors(modules[1:], self.G)
        return sum_log_priors(modules, self.G)

    def _stacked_component_log_prior(self) -> Tensor | None:
        r"""The log prior of an additive model's components whose kernels are all
        ``ScaleKernel(RBFKernel)`` (:meth:`_stacked_rbf_parameters`) with the same two priors
        (a lengthscale prior and an outputscale prior of equal type and parameters, the loops'
        default), evaluated once on the stacked lengthscales (``J x 1 x k``) and outputscales
        (``J``); else None. Equal to the per-module sum (elementwise densities); the
        per-module walk over 15 components was a third of a 6-input fit (2.8 of 7.7 s)."""
        stacked = self._stacked_rbf_parameters()
        if stacked is None:
            return None
        kernels = list(self.covar_module.kernels)
        first = _component_priors(kernels[0])
        if first is None or any(not _same_priors(first, _component_priors(k)) for k in kernels):
            return None
        lengthscales, outputscales = stacked
        ls_prior, os_prior = first
        return (
            ls_prior.log_prob(lengthscales.unsqueeze(-2)).sum()
            + os_prior.log_prob(outputscales).sum()
        )

    def _log_prior(self) -> Tensor:
        return self._ski_log_prior()

    def fit(self, settings: WISKIFitSettings | None = None, **overrides: Any) -> Self:
        r"""Maximise the exact SKI marginal likelihood from the statistics, warm-started.

        Args:
            settings: a :class:`WISKIFitSettings` (defaults if omitted): ``method``
                (``"lbfgs"`` to convergence, or ``"adam"`` for ``max_iter`` steps: with a small
                ``max_iter`` the paper's streaming mode, e.g. 1-5 steps per batch),
                ``max_iter``, ``lr``, ``timeout_sec``, ``restandardize``, ``include_priors``.
            **overrides: its fields by name, replacing those of ``settings``; an unknown name
                raises ``ValueError`` before any hyperparameter moves.

        Each step costs O(m^3), whatever n is.
        """
        settings = resolve_settings(WISKIFitSettings, settings, overrides)
        if self.batch_shape != torch.Size():
            raise ValueError("fit() is for a single model, not a fantasy/batched one.")
        self._materialize()
        if settings.restandardize and self.num_data > 1:
            self.restandardize()
        params, bounds = self._trainable_parameters()
        with training_mode(self):
            minimize_loss(
                lambda: -self.marginal_log_likelihood(include_priors=settings.include_priors),
                params,
                bounds=bounds,
                settings=settings,
            )
        self.ensure_caches()
        return self

    def _trainable_parameters(
        self, include_projection: bool = False
    ) -> tuple[dict[str, Tensor], dict[str, tuple[float | None, float | None]]]:
        r"""Parameters ``fit`` moves (kernel, mean, homoscedastic noise) and their bounds from
        the GPyTorch constraints (BoTorch's defaults use untransformed constraints that only the
        optimiser's bounds enforce). The kernel is the exact regime's own one where it is in use
        (``regime_kernel="ard"``, :mod:`bo_online.models.wiski.exact_regime`), else SKI's."""
        own = self._fits_regime_kernel() and not include_projection  # (the joint fit is SKI's)
        kernel = "regime_covar_module" if own else "covar_module"
        prefixes = [kernel, "mean_module"]
        if not self.fixed_noise:
            prefixes.append("likelihood")
        if include_projection and hasattr(self, "projection"):
            prefixes.append("projection")
        params, bounds = trainable_parameters_and_bounds(
            self, name_filter=lambda name: name.split(".", 1)[0] in prefixes
        )
        # Grouped by module in the order above (the optimiser's vector layout of before).
        order = sorted(params, key=lambda name: prefixes.index(name.split(".", 1)[0]))
        return {k: params[k] for k in order}, {k: bounds[k] for k in order if k in bounds}

    def restandardize(self) -> None:
        r"""Recompute the outcome mean/std from all data seen (sum y, sum y^2, n), exactly.

        The statistics hold user-unit outcomes about a fixed origin (``y_origin``), so only the
        scaling changes (and the caches are rebuilt at the next use). The constant mean, the
        homoscedastic noise and a ``ScaleKernel``'s outputscale are mapped so the model in the
        user's units is unchanged (exactly, unless the mapped noise would fall below the
        likelihood's lower bound, where it is clamped).
        """
        n = self.n
        if float(n) < 2:
            return
        mean = self.sum_y / n  # of the centred outcomes
        var = ((self.sum_y2 - n * mean**2) / (n - 1)).clamp_min(0.0)
        std = nonzero_std(var.sqrt()).reshape(1).to(self.outcome_std)
        self._change_outcome_scaling((self.y_origin + mean).reshape(1).to(self.outcome_mean), std)

    def _rescale_to_outcome_scaling(self, old_mean: Tensor, old_std: Tensor, ratio: Tensor) -> None:
        r"""The constant mean (kept in the user's units), the homoscedastic noise and a
        ``ScaleKernel``'s outputscale to the new outcome scaling (see :meth:`restandardize`); the
        statistics hold user-unit outcomes about ``y_origin`` and need nothing."""
        factor = float(ratio)  # one output: a scalar factor
        with torch.no_grad():
            remap_constant_mean(
                self.mean_module, old_mean, old_std, self.outcome_mean, self.outcome_std
            )
            if not self.fixed_noise:
                lik_noise = self.likelihood.noise * factor**2
                lower = self.likelihood.noise_covar.raw_noise_constraint.lower_bound
                self.likelihood.noise = lik_noise.clamp_min(float(lower) * (1 + 1e-6))
            if isinstance(self.covar_module, ScaleKernel):
                self.covar_module.outputscale = self.covar_module.outputscale * factor**2

    def fit_projection(
        self,
        X: Tensor,
        Y: Tensor,
        Yvar: Tensor | None = None,
        settings: WISKIProjectionFitSettings | None = None,
        **overrides: Any,
    ) -> Self:
        r"""Learn the input projection jointly with the GP hyperparameters on raw data the user
        kept, then REBUILD the statistics from the new features (arXiv:2103.01454, Sec. 4.3).

        The statistics of a projected model depend on the projection, so they cannot be
        re-featurised without the raw inputs; this replaces them by those of ``(X, Y, Yvar)``
        (pass every observation the model should hold). During optimisation the statistics are
        rebuilt differentiably (O(n 16^k) per step) and the batch norm uses the batch statistics
        of ``X``; afterwards its running statistics are set to those of the final map. The
        statistics are rebuilt from the final map in row blocks (``statistics_block_rows``), so
        outside the joint fit a refit's peak memory does not grow with n beyond ``X`` itself;
        the joint fit (``joint=True``) still holds all rows' weights under autograd, since its
        batch norm couples every row through the batch's mean and variance.

        Args:
            X: ``n x d`` raw inputs; Y: ``n x 1``; Yvar: ``n x 1`` noise (fixed-noise models).
            settings: a :class:`WISKIProjectionFitSettings` (defaults if omitted): ``method``,
                ``max_iter``, ``lr``, ``timeout_sec`` (see :meth:`fit`), ``include_priors`` and
                ``joint`` (whether the map is fitted jointly by gradient or re-derived from
                the data, see :class:`WISKIProjectionFitSettings`).
            **overrides: its fields by name, replacing those of ``settings``.
        """
        settings = resolve_settings(WISKIProjectionFitSettings, settings, overrides)
        if not hasattr(self, "projection"):
            raise ValueError("This WISKI model has no projection; use fit().")
        X, Y, Yvar = self._checked_observations(X, Y, Yvar, "fit_projection()")
        if self.fixed_noise != (Yvar is not None):
            raise ValueError("Pass Yvar exactly when the model has fixed noise.")
        D = (
            torch.ones(X.shape[0], dtype=X.dtype, device=X.device)
            if Yvar is None
            else self._check_D(Yvar.to(X).squeeze(-1))
        )
        y = Y.to(X).squeeze(-1)
        if y.numel() > 1:
            self.outcome_mean, self.outcome_std = standardization(y)
        zero = self._zero_statistics()
        if (
            not settings.joint
            and hasattr(self.projection, "init_from_data")
            and y.numel() >= self.dim + 2
        ):
            self.projection.init_from_data(X, y)  # map from data, then the kernel on it
            self._set_statistics(X, D, y, zero)
            return self.fit(
                method=settings.method,
                max_iter=settings.max_iter,
                lr=settings.lr,
                timeout_sec=settings.timeout_sec,
                restandardize=False,
                include_priors=settings.include_priors,
            )
        if getattr(self.projection, "needs_data_init", False) and y.numel() >= self.dim + 2:
            self.projection.init_from_data(X, y)  # see projection.py: random maps fail
        params, bounds = self._trainable_parameters(include_projection=True)
        self._fitting_projection = True
        self.projection.train()

        def loss() -> Tensor:
            idx, val = self._interp(X)
            stats = _stats_with(zero, idx, val, D, self._centred(y), self.grid.num_points)
            mll = self._mll_from_stats(stats)
            if settings.include_priors:
                mll = mll + self._log_prior()
            return -mll / y.numel()

        try:
            minimize_loss(loss, params, bounds=bounds, settings=settings)
        finally:
            self._fitting_projection = False
            self.projection.eval()
        set_projection_normalization(self.projection, X)
        self._set_statistics(X, D, y, zero)
        self.ensure_caches()
        return self

    @contextlib.contextmanager
    def projection_gradients(self) -> Iterator[None]:
        r"""Within the block the projection's parameters carry gradients through the
        interpolation (outside it the map is fixed and they do not: see ``_features``)."""
        previous = getattr(self, "_fitting_projection", False)
        self._fitting_projection = True
        try:
            yield
        finally:
            self._fitting_projection = previous

    def projection_step(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, lr: float = 1e-3
    ) -> Tensor:
        r"""One online gradient-ascent step on the projection for new points (arXiv:2103.01454,
        Eq. 18, App. A.4), to be followed by ``update(X, Y, noise)``.

        Only the new points' interpolation weights depend on the projection; the statistics of
        the old points stay fixed (the paper's approximation). The objective is the part of the
        log marginal likelihood that depends on those weights, in the Woodbury/Sherman-Morrison
        form on the cached factor: with ``P = L_A^-1 R^T W*^T D*^-1/2`` and
        ``c = L_A^-1 R^T z' = v + P D*^-1/2 r*``, ``C C^T = I + P^T P``::

            obj = (||c||^2 - ||C^-1 P^T c||^2) / (2 sigma^2) - sum log diag C

        O(m^2 q) (no refactorisation). Returns the objective before the step.

        Args:
            X: ``q x d`` raw inputs; Y: ``q x 1`` user units; noise: ``q x 1`` (fixed noise).
            lr: step size for plain gradient ascent on the projection parameters.
        """
        if not hasattr(self, "projection"):
            raise ValueError("This WISKI model has no projection.")
        X, Y, noise = self._checked_observations(X, Y, noise, "projection_step()")
        self._materialize()
        self.ensure_caches()
        noise_s = self._standardized_noise(noise, X, Y.shape)
        D = self._to_D(X, noise_s).expand(X.shape[:-1])
        params = [p for p in self.projection.parameters() if p.requires_grad]
        self.projection.eval()  # the map as the posterior uses it, with its gradients live
        with self.projection_gradients(), torch.enable_grad():
            obj = self._projection_objective(X, Y.to(X).squeeze(-1), D)
            grads = torch.autograd.grad(obj, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(lr * g)
        return obj.detach()

    def _projection_objective(self, X: Tensor, y: Tensor, D: Tensor) -> Tensor:
        r"""The projection-dependent part of log p(y) for new points (see projection_step)."""
        R, L_A = self.chol_K, self.chol_A
        idx, val = self._interp(X)
        Ut = interp_matmul(idx, val * D.rsqrt().unsqueeze(-1), R)  # q x m
        P = solve_lower(L_A, Ut.mT)  # m x q
        r = (y - self._offset()) / self.outcome_std.reshape(())
        c = self.v + P @ (r * D.rsqrt())
        eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device)
        C = torch.linalg.cholesky(eye + P.mT @ P)
        corr = torch.linalg.solve_triangular(C, (P.mT @ c).unsqueeze(-1), upper=False)
        quad = c.pow(2).sum() - corr.pow(2).sum()
        return 0.5 * quad / self._sigma2() - torch.diagonal(C).log().sum()
