r"""WISKI: structured kernel interpolation with O(1)-in-n online updates.

``WISKI`` (Stanton, Maddox, Delbridge and Wilson, "Kernel Interpolation for
Scalable Online Gaussian Processes", AISTATS 2021, arXiv:2103.01454) is a GP
whose kernel is the SKI approximation ``k(x, x') ~ w_x^T K_UU w_x'`` on a fixed regular grid
``U`` of ``m`` points with sparse cubic interpolation weights ``w_x`` (``4^d`` non-zeros). All
data enter only through hyperparameter-free sufficient statistics (docs/math.md §1)::

    G = W^T D^-1 W (m x m),  z = W^T D^-1 y,  s = y^T D^-1 y,  n,  logdet D,
    h = W^T D^-1 1,  t = 1^T D^-1 y,  c = 1^T D^-1 1,

so the model stores no inputs, outputs or weights per observation. With ``R R^T = K_UU + jitter``
and ``A = sigma^2 I + R^T G R = L_A L_A^T`` it gives the exact SKI marginal likelihood (and its
gradient, by autograd through an O(m^3) computation independent of n), the posterior mean
``w_x^T R A^-1 R^T z`` and covariance ``sigma^2 w_x^T R A^-1 R^T w_x'``. New observations update
the statistics and ``L_A`` by a rank-q Cholesky update, O(m^2 q) whatever n is.

Conditioning (``condition_on_observations``/``fantasize``) is lazy: the new model keeps the base
model's factors and a rank-q correction ``F = L_A^-1 U``, ``C C^T = I + F^T F``; the covariance is
shared by all fantasy samples (only the mean coefficients differ), and the variance at ``N`` fixed
points costs O(m^2 q + m q N) per candidate batch (docs/math.md §1) -- here O(4^d (m + N) q):
the correction reads rows of ``R L_A^-T`` and ``R A^-1 R^T``, cached once per base state (O(m^3)),
and, for points asked for repeatedly (qNIPV's ``mc_points``), their rows times those matrices --
which is what makes ``qNegIntegratedPosteriorVariance`` with thousands of ``mc_points`` fast.

Noise: homoscedastic (``D = I``, ``sigma^2`` the likelihood's noise) or fixed heteroscedastic
(``train_Yvar`` given: ``D`` the variances in the user's units, ``sigma^2 = 1 / outcome_std^2``
so that the standardised noise is exactly ``train_Yvar / outcome_std^2``).

Use it for long BO / active-learning runs on d <= 3 inputs, where an exact GP becomes too slow.
Above 3 inputs the loops' default (``projection="pairs+tanh"``) is an additive model: a sum of
SKI components on 2-D grids, one per pair of inputs and one on a learned 2-D projection of all
inputs (:mod:`bo_online.models.additive_grid`). It is still one SKI kernel ``W K W^T`` with a
block-diagonal ``K``, so everything above holds unchanged. Trade-off: interactions between inputs
of different pairs are modelled only along the projection's two directions; the projection is
re-derived from the raw data at each refit (an exact GP on at most 400 points, and a rebuild of
the statistics), which the loops keep. ``projection="pairs"`` drops the projection component
(cheaper refits, exact for additive functions, but no better than a constant on a strongly
coupled stream such as kin40k); ``projection="tanh:K"``
(:class:`bo_online.models.projection.TanhProjection`) is the projection alone (in BO no better
than Sobol on several 4-6-D test functions).

The default kernel's lengthscales are bounded below by one grid spacing (``lengthscale_floor``):
the SKI kernel cannot follow shorter ones, and below it its prior variance oscillates between grid
nodes, so the acquisition function proposes grid nodes. Inputs live in a box (default the unit
cube); the grid covers it plus two cells of padding on every side, and inputs outside the box are
an error.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Sequence

import torch
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from botorch.optim.utils import get_parameters_and_bounds
from gpytorch.distributions import MultivariateNormal
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.priors import GammaPrior
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean
from linear_operator.operators import DenseLinearOperator
from torch import Tensor
from typing_extensions import Self

from bo_online.grid import RegularGrid, interp_gram, interp_matmul, interp_quad, interp_vector
from bo_online.linalg import cholesky_update, psd_cholesky, solve_lower, solve_lower_transpose
from bo_online.models.additive_grid import (
    BlockGridKernel,
    StackedGrid,
    additive_grid_size,
    input_groups,
)
from bo_online.models.base import OnlineModel
from bo_online.models.fitting import minimize_loss
from bo_online.models.projection import make_projection
from bo_online.models.validation import check_observations
from bo_online.models.wiski_covariance import RootDifferenceLinearOperator

__all__ = ["WISKI", "default_grid_size"]

_STAT_NAMES = ("G", "z", "h", "s", "t", "c", "n", "logdet_D", "sum_y", "sum_y2", "sum_D")
_DELTA_NAMES = ("d_idx", "d_val", "d_D", "d_y", "d_F", "d_C", "d_mean_coef", "d_SF")
# Below this many test points per batch the posterior covariance is returned dense.
_DENSE_COVAR_MAX = 64
# After this many posterior requests on one state, build M = R A^-1 R^T (O(m^3)) and read
# covariances from it (see WISKI._use_gram_block).
_GRAM_AFTER_CALLS = 8


#: BoTorch's lower lengthscale bound in its default kernel.
_BOTORCH_MIN_LENGTHSCALE = 2.5e-2


def _default_kernel(k: int, floor: float) -> Kernel:
    r"""BoTorch's RBF-ARD kernel with its dimension-scaled lengthscale prior on ``k`` features,
    with the lengthscale's lower bound raised to ``floor`` (grid coordinates).

    Why a floor: the SKI kernel ``w_x^T K_UU w_x'`` cannot follow a lengthscale shorter than the
    grid spacing ``h``. Below it the interpolated prior variance ``w_x^T K_UU w_x`` peaks at the
    grid nodes and dips between them, so an acquisition function proposes grid nodes and little
    else (measured: WISKI on 3-D Levy with noise, h = 0.2, fitted lengthscales ~0.08, 20 of 20
    BO proposals on grid nodes and a regret worse than Sobol's)."""
    kernel = get_covar_module_with_dim_scaled_prior(ard_num_dims=k)
    if floor > _BOTORCH_MIN_LENGTHSCALE:
        init = max(float(kernel.lengthscale_prior.mode), floor)
        kernel.register_constraint(
            "raw_lengthscale", GreaterThan(floor, transform=None, initial_value=init)
        )
        kernel.lengthscale = init
    return kernel


def _default_additive_kernel(k: int, floors: Sequence[float], sizes: Sequence[int]) -> Kernel:
    r"""One ``ScaleKernel(_default_kernel(k, floor))`` per component grid, block-diagonal. Each
    component's outputscale starts at ``1 / J`` (the standardised outcomes' variance shared out)
    with a ``Gamma(2, J)`` prior (mode ``1 / J``), so that the fit can switch off components the
    data do not support."""
    J = len(sizes)
    parts = []
    for floor in floors:
        part = ScaleKernel(_default_kernel(k, floor), outputscale_prior=GammaPrior(2.0, float(J)))
        part.outputscale = 1.0 / J
        parts.append(part)
    return BlockGridKernel(parts, sizes)


def default_grid_size(k: int) -> int:
    """Default points per dimension: 30 for k <= 2 (m = 900), 10 for k = 3 (m = 1000)."""
    if k <= 2:
        return 30
    if k == 3:
        return 10
    raise ValueError(f"WISKI grids are for k <= 3 dimensions, got {k}.")


class WISKI(OnlineModel):
    r"""Woodbury-inversion SKI GP with constant-time online updates.

    Args:
        train_X: ``n x d`` initial inputs (n >= 1) inside ``bounds``.
        train_Y: ``n x 1`` initial observations.
        train_Yvar: optional ``n x 1`` fixed noise variances (user units); then every later
            ``update`` must pass ``noise``.
        grid_size: points per grid dimension (int or one per dimension); default 30 (k <= 2) or
            10 (k = 3), see :func:`default_grid_size`; for the additive model, per dimension of
            each component grid, default ~400 grid points in total
            (:func:`bo_online.models.additive_grid.additive_grid_size`).
        bounds: ``2 x d`` input box (default the unit cube); inputs outside it are an error.
        covar_module: any stationary GPyTorch kernel on the (projected) k-dim inputs; default
            BoTorch's RBF with dimension-scaled lengthscale prior.
        likelihood: ``GaussianLikelihood`` for the homoscedastic case; default BoTorch's.
        standardize: standardise outcomes with the initial data's mean and std.
        grid_jitter: relative jitter added to the grid kernel (``K + jitter * mean(diag K) I``);
            part of the model (the dense SKI reference uses the same matrix).
        projection: a module mapping ``... x d`` inputs to ``... x k`` features in
            ``[-1, 1]^k`` (k <= 3), or ``"tanh"`` / ``"tanh:K"`` (a data-initialised
            ``TanhProjection(d, K)``, K = 2 for ``"tanh"``), or ``"pairs"`` (the additive model
            over consecutive pairs of inputs, as ``additive="pairs"``), or ``"none"``/``None``;
            one of them is needed when d > 3 (the loops default to ``"pairs"`` there, see
            :meth:`loop_default_options`).
        input_transform: optional BoTorch input transform.
        lengthscale_floor: lower bound on the default kernel's lengthscales (grid coordinates):
            ``"grid"`` (default) one grid spacing (at least BoTorch's 0.025), ``None`` BoTorch's
            0.025, or a number. Not used with a user's ``covar_module``.
        additive: groups of input indices (``G x k``, k <= 3, e.g. ``[[0, 1], [2, 3]]``) or
            ``"pairs"``: model ``f(x) = sum_j f_j(x[g_j])``, one SKI component per group, each
            on its own k-D grid with its own ``ScaleKernel`` (default kernel: see
            :func:`_default_additive_kernel`); a user's ``covar_module`` must then be a
            :class:`bo_online.models.additive_grid.BlockGridKernel`.

    Example:
        >>> model = WISKI(train_X, train_Y)              # 2-D: 30 x 30 grid
        >>> model.fit()                                   # L-BFGS on the exact SKI MLL
        >>> model.update(new_X, new_Y)                    # O(m^2 q), independent of n
        >>> model.fit(method="adam", max_iter=3, lr=0.01, restandardize=False)  # streaming refit
    """

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        grid_size: int | Sequence[int] | None = None,
        bounds: Tensor | None = None,
        covar_module: Kernel | None = None,
        likelihood: GaussianLikelihood | None = None,
        standardize: bool = True,
        grid_jitter: float = 1e-6,
        projection: torch.nn.Module | str | None = None,
        input_transform: Any | None = None,
        lengthscale_floor: float | str | None = "grid",
        additive: str | Sequence[Sequence[int]] | None = None,
    ) -> None:
        if not isinstance(train_X, Tensor) or train_X.dim() != 2:
            raise ValueError(
                f"train_X must be an n x d tensor, got {getattr(train_X, 'shape', type(train_X))}."
            )
        dtype, device = train_X.dtype, train_X.device
        dim = OnlineModel.transformed_dim(train_X, input_transform)  # after the transform
        if bounds is None:
            bounds = torch.stack([torch.zeros(dim), torch.ones(dim)]).to(dtype=dtype, device=device)
        super().__init__(
            dim=dim, bounds=bounds, input_transform=input_transform, dtype=dtype, device=device
        )
        X = self._checked_training_data(train_X, train_Y, train_Yvar)
        train_Yvar = self._floor_train_Yvar(train_Y, train_Yvar)  # noise floor, with a warning
        spec = projection.strip().lower() if isinstance(projection, str) else None
        if spec in ("pairs", "pairs+tanh"):
            if additive is not None:
                raise ValueError(f"Pass either `additive` or projection={spec!r}, not both.")
            # the additive model over pairs of inputs (plus a learned 2-D projection component)
            additive, projection = "pairs", ("tanh:2" if spec == "pairs+tanh" else None)
        projection = make_projection(projection, dim)  # "tanh:K" -> TanhProjection(d, K)
        self.input_groups: list[list[int]] | None = None
        if additive is not None:
            self.input_groups = input_groups(additive, dim)
            k, grid_bounds = len(self.input_groups[0]), None
            if projection is not None:  # one more component: the projection's k features
                if int(getattr(projection, "out_dim", -1)) != k:
                    raise ValueError(
                        f"With `additive` groups of {k} inputs the projection must give {k} "
                        f"features, got out_dim={getattr(projection, 'out_dim', None)}."
                    )
                self._attach_projection(projection, X, train_Y)
        elif projection is None:
            if dim > 3:
                raise ValueError(
                    f"WISKI interpolates on a grid of prod(grid_size) points, so it handles at most "
                    f"3 input dimensions natively; got d = {dim}. Pass projection='pairs+tanh' (a "
                    "sum of 2-D grids over pairs of inputs and one on a learned projection; the "
                    "loops and the CLI do this by default), 'pairs' (without the projection) or "
                    "projection='tanh' (or 'tanh:3', or "
                    "bo_online.models.projection.TanhProjection(d, out_dim=2)) to learn k <= 3 "
                    "features."
                )
            k, grid_bounds = dim, self.input_bounds
        else:
            k = int(getattr(projection, "out_dim"))
            if not 1 <= k <= 3:
                raise ValueError(f"projection.out_dim must be 1, 2 or 3, got {k}.")
            grid_bounds = torch.tensor([[-1.0] * k, [1.0] * k], dtype=dtype, device=device)
            self._attach_projection(projection, X, train_Y)
        self.num_features = k
        if grid_size is None:
            groups = self.input_groups
            J = 0 if groups is None else len(groups) + int(hasattr(self, "projection"))
            grid_size = default_grid_size(k) if groups is None else additive_grid_size(J, k)
        sizes = [int(grid_size)] * k if isinstance(grid_size, int) else [int(g) for g in grid_size]
        if len(sizes) != k:
            raise ValueError(f"grid_size must give {k} sizes (one per feature), got {sizes}.")
        if self.input_groups is None:
            self.grid = RegularGrid(sizes, grid_bounds, dtype=dtype, device=device)
        else:  # one k-D grid per group of inputs, over the input box's faces
            grids = [
                RegularGrid(sizes, self.input_bounds[:, g], dtype=dtype, device=device)
                for g in self.input_groups
            ]
            if hasattr(self, "projection"):  # and one over the projection's (-1, 1)^k
                box = torch.tensor([[-1.0] * k, [1.0] * k], dtype=dtype, device=device)
                grids.append(RegularGrid(sizes, box, dtype=dtype, device=device))
            self.grid = StackedGrid(grids)
            self.num_features = self.grid.dim
        self.grid_jitter = float(grid_jitter)
        if standardize and train_Y.shape[0] > 1:
            std = train_Y.std(dim=0)
            self.outcome_mean = train_Y.mean(dim=0).to(X)
            self.outcome_std = torch.where(std > 0, std, torch.ones_like(std)).to(X)
        self.fixed_noise = train_Yvar is not None
        if self.fixed_noise and likelihood is not None:
            raise ValueError("Pass either train_Yvar (fixed noise) or a likelihood, not both.")
        self.lengthscale_floor = self._lengthscale_floor(lengthscale_floor, covar_module)
        if covar_module is None and self.input_groups is not None:
            floors = [
                max(self.lengthscale_floor, float(g.spacing.min()))
                if lengthscale_floor == "grid" else self.lengthscale_floor
                for g in self.grid.grids
            ]  # each component's own grid spacing
            covar_module = _default_additive_kernel(k, floors, self.grid.sizes_per_grid)
        self.covar_module = covar_module or _default_kernel(k, self.lengthscale_floor)
        self.likelihood = likelihood or get_gaussian_likelihood_with_lognormal_prior()
        self.mean_module = ConstantMean()
        self.to(dtype=dtype, device=device)
        m = self.grid.num_points
        self.register_buffer("grid_points", self.grid.points())
        # Sufficient statistics (hyperparameter-free; raw user-unit outcomes, D in "D units").
        zeros = lambda *s: torch.zeros(*s, dtype=dtype, device=device)  # noqa: E731
        for name, shape in (("G", (m, m)), ("z", (m,)), ("h", (m,))):
            self.register_buffer(name, zeros(*shape))
        for name in ("s", "t", "c", "n", "logdet_D", "sum_y", "sum_y2", "sum_D"):
            self.register_buffer(name, zeros(()))
        # Caches tied to the hyperparameters (rebuilt by ensure_caches).
        for name in ("chol_K", "chol_A", "v", "mean_coef"):
            self.register_buffer(name, None)
        # Pending conditioning (set only on models made by condition_on_observations/fantasize).
        for name in _DELTA_NAMES:
            self.register_buffer(name, None)
        self._shared: dict[str, Any] = {}  # lazy caches shared with conditioned models
        self._stats_shared = False
        D = None if train_Yvar is None else train_Yvar.to(X).squeeze(-1)
        idx, val = self.grid.interpolate(self._features(X))
        D = self._check_D(torch.ones_like(val[..., 0]) if D is None else D)
        with torch.no_grad():
            self._accumulate(idx.detach(), val.detach(), D, train_Y.to(X).squeeze(-1))

    def _lengthscale_floor(self, spec: float | str | None, covar_module: Kernel | None) -> float:
        r"""The default kernel's lower lengthscale bound (in grid coordinates): ``"grid"`` -- one
        grid spacing (the smallest over dimensions) or BoTorch's 0.025, whichever is larger;
        ``None`` -- BoTorch's 0.025; a positive number -- that bound."""
        if isinstance(spec, str) and spec == "grid":
            return max(_BOTORCH_MIN_LENGTHSCALE, float(self.grid.spacing.min()))
        if spec is None:
            return _BOTORCH_MIN_LENGTHSCALE
        if isinstance(spec, str) or not float(spec) > 0:
            raise ValueError(
                f"lengthscale_floor must be 'grid', None or a positive number, got {spec!r}."
            )
        if covar_module is not None:
            raise ValueError(
                "lengthscale_floor applies to the default kernel only; set the lengthscale "
                "constraint of your own covar_module instead."
            )
        return float(spec)

    def _attach_projection(self, projection: torch.nn.Module, X: Tensor, Y: Tensor) -> None:
        r"""Keep ``projection`` (moved to the model's dtype/device) and initialise it on the
        initial data: from data where it asks for it (``d + 2`` points at least), else its batch
        norm statistics, unless it is already normalised (a fitted map is kept as it is)."""
        self.projection = projection.to(dtype=X.dtype, device=X.device)
        if getattr(projection, "needs_data_init", False) and X.shape[0] >= self.dim + 2:
            projection.init_from_data(X, Y)  # see projection.py: random maps fail
        elif (
            X.shape[0] > 1
            and hasattr(projection, "set_normalisation")
            and not getattr(projection, "normalised", False)
        ):
            projection.set_normalisation(X)  # batch norm statistics of the initial data

    @classmethod
    def loop_default_options(cls, dim: int) -> dict[str, Any]:
        r"""Constructor options the loops (and so the CLI) use unless the user gives them: above
        3 inputs an additive model over pairs of inputs plus one component on a learned 2-D
        projection (``projection="pairs+tanh"``, see :mod:`bo_online.models.additive_grid`)."""
        return {"projection": "pairs+tanh"} if dim > 3 else {}

    # ------------------------------------------------------------------ small helpers

    @property
    def num_data(self) -> int:
        return int(self.n.item())

    @property
    def num_grid_points(self) -> int:
        return self.grid.num_points

    @property
    def grid_jitter(self) -> float:
        """Relative jitter of the grid kernel; part of the model, so setting it rebuilds caches."""
        return self._grid_jitter

    @grid_jitter.setter
    def grid_jitter(self, value: float) -> None:
        # A plain float, not a tensor in hyperparameters(): invalidate explicitly.
        self._grid_jitter = float(value)
        self.invalidate_caches()

    def hyperparameters(self):
        """Kernel, mean and (homoscedastic) noise parameters, plus the outcome scaling."""
        for name, p in self.named_parameters():
            if name.startswith("projection."):
                continue  # the statistics themselves depend on it: see fit_projection
            if self.fixed_noise and name.startswith("likelihood."):
                continue
            yield p
        yield self.outcome_mean
        yield self.outcome_std

    def _features(self, X: Tensor) -> Tensor:
        """Grid coordinates of (transformed, validated) inputs: identity or the projection."""
        features = []
        if self.input_groups is not None:  # additive: the groups' inputs side by side
            features.append(X[..., [i for g in self.input_groups for i in g]])
        if hasattr(self, "projection"):
            if self.projection.training and not getattr(self, "_fitting_projection", False):
                self.projection.eval()  # a fixed map except while it is being learned
            features.append(self.projection(X))
        if not features:
            return X
        return features[0] if len(features) == 1 else torch.cat(features, -1)

    def _interp(self, X: Tensor) -> tuple[Tensor, Tensor]:
        return self.grid.interpolate(self._features(X))

    def _sigma2(self) -> Tensor:
        r"""``sigma^2`` in standardised units (scalar tensor): noise of point i is sigma^2 D_i."""
        if self.fixed_noise:
            return self.outcome_std.pow(-2).reshape(())
        return self.likelihood.noise.reshape(())

    def _check_D(self, D: Tensor) -> Tensor:
        if bool((D <= 0).any()):
            raise ValueError(
                "WISKI needs strictly positive observation-noise variances (the Woodbury form "
                f"divides by them); got {int((D <= 0).sum())} value(s) <= 0."
            )
        return D

    def _to_D(self, X: Tensor, noise: Tensor | None) -> Tensor:
        r"""Noise of new points in D units (``batch x q``) from standardised variances or None."""
        if noise is None:
            if self.fixed_noise:
                raise ValueError(
                    "This WISKI model has fixed per-point noise: pass `noise` (variances) with "
                    "every new observation."
                )
            return torch.ones(X.shape[:-1], dtype=X.dtype, device=X.device)
        if self.fixed_noise:
            D = noise * self.outcome_std.pow(2)
        else:  # explicit noise on a homoscedastic model: relative to the current noise level
            D = noise / self._sigma2().detach()
        return self._check_D(D)

    def _grid_kernel(self, points: Tensor | None = None) -> Tensor:
        r"""``K_UU + jitter I`` (``m x m``, or on a subset of grid ``points``), differentiable in
        the kernel hyperparameters. ``jitter = grid_jitter * mean(diag K)`` (the same on any
        subset for a stationary kernel)."""
        K = self.covar_module(self.grid_points if points is None else points).to_dense()
        jitter = self.grid_jitter * torch.diagonal(K).mean()
        return K + jitter * torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)

    def _offset(self) -> Tensor:
        r"""``beta = outcome_mean + outcome_std * constant``: residual r = (y - beta) / sd."""
        return (self.outcome_mean + self.outcome_std * self.mean_module.constant).reshape(())

    def _residual_stats(self) -> tuple[Tensor, Tensor]:
        r"""Standardised residual statistics ``z_r = W^T D^-1 r`` and ``s_r = r^T D^-1 r``, O(m)."""
        beta, sd = self._offset(), self.outcome_std.reshape(())
        z_r = (self.z - beta * self.h) / sd
        s_r = (self.s - 2 * beta * self.t + beta**2 * self.c) / sd**2
        return z_r, s_r

    # ------------------------------------------------------------------ statistics

    def _accumulate(self, idx: Tensor, val: Tensor, D: Tensor, y: Tensor) -> dict[str, Tensor]:
        r"""Add points (``q x K`` weights, ``q`` noise in D units, ``q`` user-unit y) to the
        statistics and store them; returns the new statistics."""
        stats = self._stats_added(idx, val, D, y)
        for name, value in stats.items():
            setattr(self, name, value)
        self._stats_shared = False
        return stats

    def _stats_added(self, idx: Tensor, val: Tensor, D: Tensor, y: Tensor) -> dict[str, Tensor]:
        r"""The statistics with points added. All are new tensors except ``G``, which is updated
        in place when this model owns it exclusively (copy-on-write when a conditioned model
        shares it); callers validate every input before calling, so nothing can fail after."""
        m = self.grid.num_points
        Dinv = 1.0 / D
        G = self.G.clone() if (self._stats_shared or self.d_idx is not None) else self.G
        interp_gram(idx, val, Dinv, m, out=G)
        flat_idx, wv = idx.reshape(-1), (val * Dinv.unsqueeze(-1)).reshape(-1)
        z = self.z.index_add(0, flat_idx, (val * (Dinv * y).unsqueeze(-1)).reshape(-1))
        h = self.h.index_add(0, flat_idx, wv)
        return {
            "G": G, "z": z, "h": h,
            "s": self.s + (y * y * Dinv).sum(), "t": self.t + (y * Dinv).sum(),
            "c": self.c + Dinv.sum(), "n": self.n + y.numel(),
            "logdet_D": self.logdet_D + D.log().sum(), "sum_y": self.sum_y + y.sum(),
            "sum_y2": self.sum_y2 + (y * y).sum(), "sum_D": self.sum_D + D.sum(),
        }

    def statistics(self) -> dict[str, Tensor]:
        """The sufficient statistics (a dict of the model's tensors, not copies)."""
        self._materialize()
        return {name: getattr(self, name) for name in _STAT_NAMES}

    # ------------------------------------------------------------------ caches

    def _block_sizes(self, active: Tensor | None = None) -> list[int] | None:
        r"""Sizes of the diagonal blocks of ``K_UU`` (restricted to the ``active`` grid points,
        which are sorted) for the additive model; None for a single grid."""
        if self.input_groups is None:
            return None
        sizes = self.grid.sizes_per_grid
        if active is None:
            return list(sizes)
        comp = torch.repeat_interleave(
            torch.arange(len(sizes), device=active.device),
            torch.tensor(sizes, device=active.device),
        )
        return torch.bincount(comp[active], minlength=len(sizes)).tolist()

    @staticmethod
    def _root_and_gram(
        K: Tensor, G: Tensor, sizes: list[int] | None
    ) -> tuple[Tensor, Tensor]:
        r"""``R`` (``R R^T = K``, lower) and ``R^T G R``. For a block-diagonal ``K`` (the additive
        model, diagonal blocks of ``sizes``) ``R`` is the block-diagonal of the blocks' Cholesky
        factors (which is the Cholesky factor of ``K``) and both products go block by block:
        ``2 m^3 / J`` flops instead of ``2 m^3``."""
        if sizes is None or len(sizes) == 1:
            R = psd_cholesky(K)
            return R, R.mT @ G @ R
        starts = [sum(sizes[:j]) for j in range(len(sizes))]
        roots = [psd_cholesky(K[a:a + b, a:a + b]) for a, b in zip(starts, sizes)]
        GR = torch.cat([G[:, a:a + b] @ Rb for a, b, Rb in zip(starts, sizes, roots)], -1)
        RtGR = torch.cat([Rb.mT @ GR[a:a + b] for a, b, Rb in zip(starts, sizes, roots)], 0)
        return torch.block_diag(*roots), RtGR

    def _rebuild_caches(self) -> None:
        R, A = self._root_and_gram(self._grid_kernel(), self.G, self._block_sizes())
        sigma2 = self._sigma2()
        m = R.shape[-1]
        A = A + sigma2 * torch.eye(m, dtype=A.dtype, device=A.device)
        L_A = psd_cholesky(0.5 * (A + A.mT))
        z_r, _ = self._residual_stats()
        v = solve_lower(L_A, (R.mT @ z_r).unsqueeze(-1)).squeeze(-1)
        # R row-major: every update reads rows of it through a sparse product (grid.interp_matmul),
        # which would copy a column-major (LAPACK-layout) R each time; L_A stays column-major,
        # the layout of the blocked Cholesky update (linalg._panels_column_major).
        self.chol_K, self.chol_A, self.v = R.contiguous(), L_A, v
        self.mean_coef = self._mean_coef(R, L_A, v)
        self._shared = {}
        if self.d_idx is not None:
            self.d_F, self.d_C, self.d_mean_coef, self.d_SF = self._delta_caches(
                self.d_idx, self.d_val, self.d_D, self.d_y
            )

    @staticmethod
    def _mean_coef(R: Tensor, L_A: Tensor, b: Tensor) -> Tensor:
        r"""``R L_A^-T b`` for ``b``: ``... x m`` (one triangular solve with many right sides)."""
        m = b.shape[-1]
        cols = b.reshape(-1, m).mT
        return (R @ solve_lower_transpose(L_A, cols)).mT.reshape(b.shape)

    def _delta_caches(
        self, idx: Tensor, val: Tensor, D: Tensor, y: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        r"""Rank-q correction for pending points: ``F = L_A^-1 U`` (``batch x m x q``),
        ``C C^T = I + F^T F``, the mean coefficients ``R A'^-1 R^T z'`` (``sample x batch x m``)
        and ``S F = M W*^T D*^-1/2`` (``batch x m x q``).
        ``U = R^T W*^T D*^-1/2``; nothing of size m x m per batch is formed."""
        q = idx.shape[-2]
        # Everything per candidate batch reads 4^d rows of two m x m matrices cached once per
        # base state (fantasies come in thousands of batches from one base model):
        #   F^T = D*^-1/2 W* R L_A^-T = D*^-1/2 W* S                      (O(4^d m q))
        #   S F = D*^-1/2 W* S S^T  (transposed), S S^T = R A^-1 R^T = M  (O(4^d m q))
        # instead of a triangular solve with L_A (O(m^2 q)) and a product with S (O(m^2)) per
        # batch and sample.
        wv = val * D.rsqrt().unsqueeze(-1)
        F = interp_matmul(idx, wv, self._factor_root()).mT  # batch x m x q
        SF = interp_matmul(idx, wv, self._factor_gram()).mT  # batch x m x q
        eye = torch.eye(q, dtype=F.dtype, device=F.device)
        FtF = F.mT @ F
        C = torch.linalg.cholesky(eye + FtF)
        r = (y - self._offset()) / self.outcome_std.reshape(())  # sample x batch x q
        a = r * D.rsqrt()  # sample x batch x q
        # u = v + F a; b = u - F (I + F^T F)^-1 F^T u = v + F (a - corr); coefficients S b.
        # F^T v = D*^-1/2 W* S v with S v = R A^-1 R^T z_r = mean_coef: read through the mean
        # coefficients, so that any root S of M works (the root is updated, not rebuilt, by _fold).
        Ftu = interp_vector(idx, wv, self.mean_coef) + (FtF @ a.unsqueeze(-1)).squeeze(-1)
        corr = torch.cholesky_solve(Ftu.unsqueeze(-1), C).squeeze(-1)
        mean_coef = self.mean_coef + (SF @ (a - corr).unsqueeze(-1)).squeeze(-1)
        return F, C, mean_coef, SF

    def _factor_root(self) -> Tensor:
        r"""``S = R L_A^-T`` (``m x m``, ``S S^T = R A^-1 R^T``), O(m^3) once per factor state,
        cached in ``_shared`` (shared with conditioned models, replaced when the factors
        change)."""
        S = self._shared.get("S")
        if S is None:
            S = solve_lower(self.chol_A, self.chol_K.mT).mT.contiguous()  # row-major: rows read
            self._shared["S"] = S
        return S

    def _factor_gram(self) -> Tensor:
        r"""``M = S S^T = R A^-1 R^T`` (``m x m``, symmetric), cached like :meth:`_factor_root`."""
        M = self._shared.get("M")
        if M is None:
            S = self._factor_root()
            M = S @ S.mT
            M = 0.5 * (M + M.mT)
            self._shared["M"] = M
        return M

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

    # ------------------------------------------------------------------ prediction

    def _noise_variance(self, X: Tensor) -> Tensor:
        if self.fixed_noise:  # as BoTorch: the mean training noise at new points
            mean_D = self.sum_D / self.n.clamp_min(1)
            return (mean_D / self.outcome_std.pow(2)).reshape(1).expand(X.shape[:-1])
        return self.likelihood.noise.reshape(1).expand(X.shape[:-1])

    def _default_fantasy_noise(self) -> Tensor | None:
        if self.fixed_noise:
            return (self.sum_D / self.n.clamp_min(1) / self.outcome_std.pow(2)).reshape(1, 1)
        return None

    def _use_gram_block(self, idx: Tensor, val: Tensor) -> bool:
        r"""Whether the covariance at these points is read from the cached ``M = R A^-1 R^T``
        (:func:`bo_online.grid.interp_quad`): a small dense covariance, with a gradient or with
        stencils that touch fewer than ``m`` grid points in all, and a conditioned model
        (whose corrections are built from ``M``), ``M`` already cached, or a gradient asked for
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

    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        idx, val = self._interp(X)
        # Caches carry no hyperparameter gradients (fits use the MLL), so neither does this.
        coef = self.mean_coef if self.d_idx is None else self.d_mean_coef
        mean = self.mean_module.constant.detach().reshape(()) + interp_vector(idx, val, coef)
        if self._use_gram_block(idx, val):
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

    # ------------------------------------------------------------------ conditioning

    def _shallow_copy(self) -> Self:
        new = super()._shallow_copy()
        # The copy reads the same cached S and M (``_shared``): updates of either model must
        # then replace them rather than write into them (see _updated_roots).
        self._shared["aliased"] = True
        return new

    def _condition(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> Self:
        if noise is not None and noise.dim() > X.dim() - 1:
            # Noise carries fantasy sample dims; it is the same for every sample.
            noise = noise.reshape(-1, *noise.shape[-(X.dim() - 1):])[0]
        idx, val = self._interp(X)
        D = self._to_D(X, noise).expand(X.shape[:-1])
        y = Y * self.outcome_std.reshape(()) + self.outcome_mean.reshape(())  # user units
        if self.d_idx is not None:  # chained conditioning: append to the pending points
            idx, val, D, y = _append_pending(
                (self.d_idx, self.d_val, self.d_D, self.d_y), (idx, val, D, y)
            )
        new = self._shallow_copy()
        new._stats_shared = True
        self._stats_shared = True
        new.d_idx, new.d_val, new.d_D, new.d_y = idx, val, D, y
        new.d_F, new.d_C, new.d_mean_coef, new.d_SF = self._delta_caches(idx, val, D, y)
        new._batch_shape = torch.broadcast_shapes(y.shape[:-1], idx.shape[:-2])
        return new

    def _update(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        # Everything is computed before the first assignment, so a failure leaves the model as
        # it was.
        idx, val = self._interp(X)
        D = self._to_D(X, noise).expand(X.shape[:-1])
        y = Y * self.outcome_std.reshape(()) + self.outcome_mean.reshape(())
        self._fold(idx.detach(), val.detach(), D.detach(), y.detach())

    def _fold(self, idx: Tensor, val: Tensor, D: Tensor, y: Tensor) -> None:
        r"""Fold pending conditioned points and ``q`` new ones (non-batched) into the statistics
        and the factor: rank-q Cholesky update of ``L_A`` (refactor if q is large)."""
        if self.d_idx is not None:
            if self.d_y.dim() != 1:
                raise ValueError("A batched (fantasy) WISKI model is read-only.")
            idx = torch.cat([self.d_idx, idx], 0)
            val = torch.cat([self.d_val, val], 0)
            D = torch.cat([self.d_D, D], 0)
            y = torch.cat([self.d_y, y], 0)
        q, m = idx.shape[0], self.grid.num_points
        with torch.no_grad():
            stats = self._stats_added(idx, val, D, y)
            if 3 * q >= m:  # a refactorisation is cheaper than q rank-one updates
                for name, value in stats.items():
                    setattr(self, name, value)
                for name in _DELTA_NAMES:
                    setattr(self, name, None)
                self._stats_shared = False
                self.invalidate_caches()
                self.ensure_caches()
                return
            R = self.chol_K
            Ut = interp_matmul(idx, val * D.rsqrt().unsqueeze(-1), R)  # q x m
            L_A = cholesky_update(self.chol_A, Ut.mT)
            beta, sd = self._offset(), self.outcome_std.reshape(())
            z_r = (stats["z"] - beta * stats["h"]) / sd
            v = solve_lower(L_A, (R.mT @ z_r).unsqueeze(-1)).squeeze(-1)
            mean_coef = self._mean_coef(R, L_A, v)
            shared = _updated_roots(self._shared, idx, val * D.rsqrt().unsqueeze(-1))
        for name, value in stats.items():
            setattr(self, name, value)
        for name in _DELTA_NAMES:
            setattr(self, name, None)
        self._stats_shared = False
        self.chol_A, self.v, self.mean_coef = L_A, v, mean_coef
        self._shared = shared

    def add_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, chunk_size: int = 65536
    ) -> Self:
        r"""Bulk-load many observations: statistics accumulated in chunks (O(n 16^d) for the
        Gram matrix, nothing stored per point), then ONE O(m^3) refactorisation.

        The same result as :meth:`update` (which does a rank-q Cholesky update, O(m^2 q)), but
        cheaper when q is large. Validates everything before changing any state.

        Args:
            X: ``n x d`` inputs; Y: ``n x 1`` (or ``n``) observations, user units.
            noise: ``n x 1`` (or ``n``) noise variances, user units (required with fixed noise).
            chunk_size: points per accumulation chunk (bounds the temporary memory).
        """
        if self.batch_shape != torch.Size():
            raise ValueError("add_observations() is for a single model, not a fantasy/batched one.")
        if isinstance(Y, Tensor) and Y.dim() == 1:
            Y = Y.unsqueeze(-1)
        if isinstance(noise, Tensor) and noise.dim() == 1:
            noise = noise.unsqueeze(-1)
        if isinstance(X, Tensor) and X.dim() != 2:
            raise ValueError(f"add_observations() takes X of shape n x {self.dim}.")
        X = self._transform_and_check(X)
        check_observations(X, Y, noise, dim=self.dim, bounds=self.input_bounds)
        self.ensure_caches()
        noise_s = None if noise is None else (noise.to(X) / self.outcome_std.pow(2)).squeeze(-1)
        D = self._to_D(X, noise_s).expand(X.shape[:-1])
        self._materialize()
        y = Y.to(X).squeeze(-1)
        with torch.no_grad():
            for start in range(0, X.shape[0], chunk_size):
                sl = slice(start, start + chunk_size)
                idx, val = self._interp(X[sl])
                stats = self._stats_added(idx, val, D[sl], y[sl])
                for name, value in stats.items():
                    setattr(self, name, value)
                self._stats_shared = False
        self.invalidate_caches()
        self.ensure_caches()
        return self

    def fit_projection(
        self,
        X: Tensor,
        Y: Tensor,
        Yvar: Tensor | None = None,
        method: Literal["lbfgs", "adam"] = "adam",
        max_iter: int = 100,
        lr: float = 0.01,
        include_priors: bool = True,
        joint: bool = False,
    ) -> Self:
        r"""Learn the input projection jointly with the GP hyperparameters on raw data the user
        kept, then REBUILD the statistics from the new features (arXiv:2103.01454, Sec. 4.3).

        The statistics of a projected model depend on the projection, so they cannot be
        re-featurised without the raw inputs; this replaces them by those of ``(X, Y, Yvar)``
        (pass every observation the model should hold). During optimisation the statistics are
        rebuilt differentiably (O(n 16^k) per step) and the batch norm uses the batch statistics
        of ``X``; afterwards its running statistics are set to those of the final map.

        Args:
            X: ``n x d`` raw inputs; Y: ``n x 1``; Yvar: ``n x 1`` noise (fixed-noise models).
            method: optimiser (see :meth:`fit`).
            max_iter: optimiser iterations (see :meth:`fit`).
            lr: learning rate (see :meth:`fit`).
            joint: ``False`` (default) where the projection has ``init_from_data``: the map is
                re-derived from the data (the leading gradient directions of an exact GP, see
                :mod:`bo_online.models.projection`), the statistics are rebuilt and only the
                kernel hyperparameters are fitted (on 200 Hartmann6 points: held-out RMSE 0.93 of
                the data's sd, 94% coverage of the 95% interval, against 1.09 / 86% after a joint
                L-BFGS fit of map and kernel, which overfits the map). ``True``: the paper's
                joint gradient fit of map and hyperparameters from the current map.
        """
        if not hasattr(self, "projection"):
            raise ValueError("This WISKI model has no projection; use fit().")
        if self.batch_shape != torch.Size():
            raise ValueError("fit_projection() is for a single model.")
        if Y.dim() == 1:
            Y = Y.unsqueeze(-1)
        X = self._transform_and_check(X)
        check_observations(X, Y, Yvar, dim=self.dim, bounds=self.input_bounds)
        if self.fixed_noise != (Yvar is not None):
            raise ValueError("Pass Yvar exactly when the model has fixed noise.")
        D = (
            torch.ones(X.shape[0], dtype=X.dtype, device=X.device)
            if Yvar is None
            else self._check_D(Yvar.to(X).squeeze(-1))
        )
        y = Y.to(X).squeeze(-1)
        if y.numel() > 1:
            std = y.std()
            self.outcome_mean = y.mean().reshape(1)
            self.outcome_std = torch.where(std > 0, std, torch.ones_like(std)).reshape(1)
        zero = self._zero_statistics()
        if not joint and hasattr(self.projection, "init_from_data") and y.numel() >= self.dim + 2:
            self.projection.init_from_data(X, y)  # map from data, then the kernel on it
            self._set_statistics(X, D, y, zero)
            return self.fit(
                method=method, max_iter=max_iter, lr=lr, restandardize=False,
                include_priors=include_priors,
            )
        if getattr(self.projection, "needs_data_init", False) and y.numel() >= self.dim + 2:
            self.projection.init_from_data(X, y)  # see projection.py: random maps fail
        params, bounds = self._trainable_parameters(include_projection=True)
        self._fitting_projection = True
        self.projection.train()

        def loss() -> Tensor:
            idx, val = self._interp(X)
            stats = _stats_with(zero, idx, val, D, y, self.grid.num_points)
            mll = self._mll_from_stats(stats)
            if include_priors:
                mll = mll + self._log_prior()
            return -mll / y.numel()

        try:
            minimize_loss(loss, params, method=method, max_iter=max_iter, lr=lr, bounds=bounds)
        finally:
            self._fitting_projection = False
            self.projection.eval()
        self.projection.set_normalisation(X)
        self._set_statistics(X, D, y, zero)
        self.ensure_caches()
        return self

    def _set_statistics(self, X: Tensor, D: Tensor, y: Tensor, zero: dict[str, Tensor]) -> None:
        r"""Replace the statistics by those of ``(X, D, y)`` (``n x d``, ``n``, ``n``) under the
        current (fixed) projection; pending conditioning and caches are dropped."""
        with torch.no_grad():
            idx, val = self._interp(X)
            stats = _stats_with(zero, idx, val, D, y, self.grid.num_points)
        for name in _DELTA_NAMES:
            setattr(self, name, None)
        for name, value in stats.items():
            setattr(self, name, value)
        self._stats_shared = False
        self.invalidate_caches()

    def projection_step(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, lr: float = 1e-3
    ) -> Tensor:
        r"""One online gradient-ascent step on the projection for new points (arXiv:2103.01454, Eq. 18,
        App. A.4), to be followed by ``update(X, Y, noise)``.

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
        if self.batch_shape != torch.Size():
            raise ValueError("projection_step() is for a single model.")
        if Y.dim() == 1:
            Y = Y.unsqueeze(-1)
        if noise is not None and noise.dim() == 1:
            noise = noise.unsqueeze(-1)
        X = self._transform_and_check(X)
        check_observations(X, Y, noise, dim=self.dim, bounds=self.input_bounds)
        self._materialize()
        self.ensure_caches()
        noise_s = None if noise is None else (noise.to(X) / self.outcome_std.pow(2)).squeeze(-1)
        D = self._to_D(X, noise_s).expand(X.shape[:-1])
        params = [p for p in self.projection.parameters() if p.requires_grad]
        with torch.enable_grad():
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

    def _zero_statistics(self) -> dict[str, Tensor]:
        return {name: torch.zeros_like(getattr(self, name)) for name in _STAT_NAMES}

    def _materialize(self) -> None:
        """Turn a non-batched conditioned model into a plain one (statistics and factor)."""
        if self.d_idx is None:
            return
        if self.batch_shape != torch.Size():
            raise ValueError("A batched (fantasy) WISKI model cannot be refit or updated.")
        self.ensure_caches()
        e = self.d_idx[:0]
        self._fold(e, self.d_val[:0], self.d_D[:0], self.d_y[:0])

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self.batch_shape == torch.Size():
            self._materialize()
        return super().state_dict(*args, **kwargs)

    def _after_load(self) -> None:
        self._shared = {}
        self._stats_shared = False

    # ------------------------------------------------------------------ hyperparameters

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
        # The kernel is evaluated on the whole grid and then restricted, so the entries are
        # bit-for-bit those of the full K (GPyTorch's distances depend on the point set's mean).
        K = self._grid_kernel()
        G = G if full else G[active][:, active]
        R, A = self._root_and_gram(
            K if full else K[active][:, active], G, self._block_sizes(None if full else active)
        )
        sigma2 = self._sigma2()
        m = R.shape[-1]
        A = A + sigma2 * torch.eye(m, dtype=R.dtype, device=R.device)
        L_A = psd_cholesky(0.5 * (A + A.mT))
        beta, sd = self._offset(), self.outcome_std.reshape(())
        z_r = (stats["z"] - beta * stats["h"]) / sd
        s_r = (stats["s"] - 2 * beta * stats["t"] + beta**2 * stats["c"]) / sd**2
        if not full:
            z_r = z_r[active]
        w = solve_lower(L_A, (R.mT @ z_r).unsqueeze(-1)).squeeze(-1)
        n = stats["n"]
        # log det of the standardised noise sigma^2 D: n log sigma^2 + logdet D (D units).
        return -0.5 * (
            (s_r - w.pow(2).sum()) / sigma2
            + (n - m) * sigma2.log()
            + stats["logdet_D"]
            + 2 * torch.diagonal(L_A).log().sum()
            + n * math.log(2 * math.pi)
        )

    def _log_prior(self) -> Tensor:
        r"""Sum of the hyperparameter priors' log densities (kernel, mean, homoscedastic noise)."""
        total = torch.zeros((), dtype=self.G.dtype, device=self.G.device)
        modules = [self.covar_module, self.mean_module]
        if not self.fixed_noise:
            modules.append(self.likelihood)
        for module in modules:
            if hasattr(module, "named_priors"):
                for _, prior_module, prior, closure, _ in module.named_priors():
                    total = total + prior.log_prob(closure(prior_module)).sum()
        return total

    def fit(
        self,
        method: Literal["lbfgs", "adam"] = "lbfgs",
        max_iter: int = 200,
        lr: float = 0.05,
        restandardize: bool = True,
        include_priors: bool = True,
        timeout_sec: float | None = None,
    ) -> Self:
        r"""Maximise the exact SKI marginal likelihood from the statistics, warm-started.

        Args:
            method: ``"lbfgs"`` (to convergence) or ``"adam"`` (``max_iter`` steps; with a small
                ``max_iter`` this is the paper's streaming mode, e.g. 1-5 steps per batch).
            max_iter: iteration cap.
            lr: Adam learning rate.
            restandardize: first recompute the outcome mean/std from all data seen (exact, O(m)
                through the statistics); the constant mean, noise and outputscale are mapped so
                that the model in the user's units is unchanged before optimising.
            include_priors: add the hyperparameter priors' log densities.
            timeout_sec: optional wall-clock limit.

        Each step costs O(m^3), whatever n is.
        """
        if self.batch_shape != torch.Size():
            raise ValueError("fit() is for a single model, not a fantasy/batched one.")
        self._materialize()
        if restandardize and self.num_data > 1:
            self.restandardize()
        params, bounds = self._trainable_parameters()
        self.train()
        try:
            minimize_loss(
                lambda: -self.marginal_log_likelihood(include_priors=include_priors),
                params,
                method=method,
                max_iter=max_iter,
                lr=lr,
                timeout_sec=timeout_sec,
                bounds=bounds,
            )
        finally:
            self.eval()
        self.ensure_caches()
        return self

    def _trainable_parameters(
        self, include_projection: bool = False
    ) -> tuple[dict[str, Tensor], dict[str, tuple[float | None, float | None]]]:
        r"""Parameters ``fit`` moves (kernel, mean, homoscedastic noise) and their bounds from
        the GPyTorch constraints (BoTorch's defaults use untransformed constraints that only the
        optimiser's bounds enforce)."""
        prefixes = ["covar_module", "mean_module"]
        if not self.fixed_noise:
            prefixes.append("likelihood")
        if include_projection and hasattr(self, "projection"):
            prefixes.append("projection")
        params: dict[str, Tensor] = {}
        bounds: dict[str, tuple[float | None, float | None]] = {}
        for prefix in prefixes:
            p, b = get_parameters_and_bounds(getattr(self, prefix), requires_grad=True)
            params.update({f"{prefix}.{k}": v for k, v in p.items()})
            bounds.update({f"{prefix}.{k}": v for k, v in b.items()})
        return params, bounds

    def restandardize(self) -> None:
        r"""Recompute the outcome mean/std from all data seen (sum y, sum y^2, n), exactly.

        The statistics hold raw outcomes, so only the scaling changes; the caches follow through
        the cache key. The constant mean, the homoscedastic noise and a ``ScaleKernel``'s
        outputscale are mapped so the model in the user's units is unchanged (exactly, unless the
        mapped noise would fall below the likelihood's lower bound, where it is clamped).
        """
        n = self.n
        if float(n) < 2:
            return
        mean = self.sum_y / n
        var = ((self.sum_y2 - n * mean**2) / (n - 1)).clamp_min(0.0)
        std = var.sqrt()
        std = torch.where(std > 0, std, torch.ones_like(std)).reshape(1)
        mean = mean.reshape(1)
        old_mean, old_std = self.outcome_mean.clone(), self.outcome_std.clone()
        ratio = float(old_std / std)
        with torch.no_grad():
            const = self.mean_module.constant
            const.copy_(((old_mean + old_std * const - mean) / std).reshape(const.shape))
            if not self.fixed_noise:
                lik_noise = self.likelihood.noise * ratio**2
                lower = self.likelihood.noise_covar.raw_noise_constraint.lower_bound
                self.likelihood.noise = lik_noise.clamp_min(float(lower) * (1 + 1e-6))
            if isinstance(self.covar_module, ScaleKernel):
                self.covar_module.outputscale = self.covar_module.outputscale * ratio**2
        self.outcome_mean, self.outcome_std = mean.to(old_mean), std.to(old_std)


def _stats_with(
    base: dict[str, Tensor], idx: Tensor, val: Tensor, D: Tensor, y: Tensor, m: int
) -> dict[str, Tensor]:
    r"""``base`` statistics plus points (``n x K`` weights, ``n`` noise, ``n`` outcomes),
    out of place and differentiable in ``val`` (used to learn a projection)."""
    Dinv = 1.0 / D
    G = interp_gram(idx, val, Dinv, m, out=base["G"].clone())
    flat = idx.reshape(-1)
    return {
        "G": G,
        "z": base["z"].index_add(0, flat, (val * (Dinv * y).unsqueeze(-1)).reshape(-1)),
        "h": base["h"].index_add(0, flat, (val * Dinv.unsqueeze(-1)).reshape(-1)),
        "s": base["s"] + (y * y * Dinv).sum(), "t": base["t"] + (y * Dinv).sum(),
        "c": base["c"] + Dinv.sum(), "n": base["n"] + y.numel(),
        "logdet_D": base["logdet_D"] + D.log().sum(), "sum_y": base["sum_y"] + y.sum(),
        "sum_y2": base["sum_y2"] + (y * y).sum(), "sum_D": base["sum_D"] + D.sum(),
    }


def _updated_roots(shared: dict[str, Any], idx: Tensor, wv: Tensor) -> dict[str, Any]:
    r"""The cached root ``S`` and Gram ``M = S S^T = R A^-1 R^T`` (both ``m x m``) after
    ``A' = A + U U^T``, ``U = R^T W^T D^-1/2`` (``idx``/``wv``: ``q x K`` interpolation indices
    and weights already scaled by ``D^-1/2``), by rank-q algebra in O(m^2 q) instead of the
    O(m^3) rebuild; a new dict, and new tensors when the old dict is shared with conditioned
    models or other shallow copies (``"aliased"``), else the old tensors updated in place.

    With ``F = S^T W^T D^-1/2`` (``m x q``, 4^d rows of ``S`` per point) and ``SF = S F =
    M W^T D^-1/2`` (4^d rows of ``M``), Woodbury gives
    ``M' = M - SF (I + F^T F)^-1 SF^T``, and ``S' = S (I + F Gamma F^T)`` is a root of it when
    ``(I + F Gamma F^T)^2 = (I + F F^T)^-1``: in the eigenbasis ``F^T F = E diag(lam) E^T``,
    ``Gamma = E diag(gamma) E^T`` with ``gamma = -1 / (s (1 + s))``, ``s = sqrt(1 + lam)``.
    ``S'`` is then a root of ``M'`` but no longer ``R L_A'^-T``; every use of ``S`` needs only
    ``S S^T = M`` (:meth:`WISKI._delta_caches` reads ``S v`` as the mean coefficients).
    Cached rows of points (``"rows"``) are dropped: they belong to the old state.
    """
    S, M = shared.get("S"), shared.get("M")
    if S is None:
        return {}
    F = interp_matmul(idx, wv, S).mT  # m x q
    FtF = F.mT @ F
    SF = interp_matmul(idx, wv, M).mT if M is not None else S @ F  # m x q
    lam, E = torch.linalg.eigh(FtF)
    root = (1.0 + lam).sqrt()
    Gamma = (E * (-1.0 / (root * (1.0 + root))).unsqueeze(-2)) @ E.mT
    # In place (one pass over each matrix instead of a fresh copy, ~3x faster at m = 1,000)
    # unless another model object reads the same dict (WISKI._shallow_copy marks it).
    in_place = not shared.get("aliased", False)
    if in_place:
        out = {"S": S.addmm_(SF @ Gamma, F.mT)}
    else:
        out = {"S": torch.addmm(S, SF @ Gamma, F.mT)}
    if M is not None:
        C = torch.linalg.cholesky(torch.eye(F.shape[-1], dtype=F.dtype, device=F.device) + FtF)
        H = torch.linalg.solve_triangular(C, SF.mT, upper=False)  # C^-1 SF^T: q x m
        if in_place:
            out["M"] = M.addmm_(H.mT, H, alpha=-1.0)
        else:
            out["M"] = torch.addmm(M, H.mT, H, alpha=-1.0)
    return out


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


def _append_pending(
    old: tuple[Tensor, Tensor, Tensor, Tensor], new: tuple[Tensor, Tensor, Tensor, Tensor]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""Concatenate pending points along q after broadcasting batch shapes."""
    (oi, ov, oD, oy), (ni, nv, nD, ny) = old, new
    xb = torch.broadcast_shapes(oi.shape[:-2], ni.shape[:-2])
    yb = torch.broadcast_shapes(oy.shape[:-1], ny.shape[:-1], xb)
    K = oi.shape[-1]
    idx = torch.cat([oi.expand(*xb, *oi.shape[-2:]), ni.expand(*xb, ni.shape[-2], K)], -2)
    val = torch.cat([ov.expand(*xb, *ov.shape[-2:]), nv.expand(*xb, nv.shape[-2], K)], -2)
    D = torch.cat([oD.expand(*xb, oD.shape[-1]), nD.expand(*xb, nD.shape[-1])], -1)
    y = torch.cat([oy.expand(*yb, oy.shape[-1]), ny.expand(*yb, ny.shape[-1])], -1)
    return idx, val, D, y
