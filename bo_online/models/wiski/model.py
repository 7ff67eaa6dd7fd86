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
Above 3 inputs the loops' default is an additive model (:mod:`bo_online.models.wiski.additive`),
still one SKI kernel ``W K W^T`` with a block-diagonal ``K``, so everything above holds unchanged:
for 4-6 inputs a sum of SKI components on 2-D grids over every pair of inputs
(``projection="all-pairs"``, with ``prior_variance="exact"``), fully online; above 6 inputs
(``projection="pairs+tanh"``) one component per consecutive pair and one on a learned 2-D
projection of all inputs, re-derived from the raw data at each refit (an exact GP on at most 400
points, and a rebuild of the statistics), which the loops keep. ``projection="pairs"`` drops the
projection component
(cheaper refits, exact for additive functions, but no better than a constant on a strongly
coupled stream such as kin40k). In the loops, up to 256 points the model is the exact GP of its
kernel (``exact_max_n``), above 6 inputs of BoTorch's own kernel (``regime_kernel="ard"``), and
the structure above is derived and fitted when it leaves that regime; ``projection="tanh:K"``
(:class:`bo_online.models.wiski.projection.TanhProjection`) is the projection alone (in BO no better
than Sobol on several 4-6-D test functions).

The default kernel's lengthscales are bounded below by one grid spacing (``lengthscale_floor``):
the SKI kernel cannot follow shorter ones, and below it its prior variance oscillates between grid
nodes, so the acquisition function proposes grid nodes. Inputs live in a box (default the unit
cube); the grid covers it plus two cells of padding on every side, and inputs outside the box are
an error.
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean
from torch import Tensor
from typing_extensions import Self

from bo_online.models.base import OnlineModel
from bo_online.models.validation import (
    detached,
    require_modules,
    warn_unless_unit_scaled,
    whole_number,
)
from bo_online.models.wiski.additive import StackedGrid, additive_grid_size, input_groups
from bo_online.models.wiski.caches import WISKICacheMixin
from bo_online.models.wiski.conditioning import WISKIConditioningMixin
from bo_online.models.wiski.exact_regime import (
    EXACT_FACTOR_NAMES,
    EXACT_ROW_NAMES,
    WISKIExactRegimeMixin,
)
from bo_online.models.wiski.fitting import WISKIFitMixin
from bo_online.models.wiski.grid import RegularGrid
from bo_online.models.wiski.kernels import (
    _BOTORCH_MIN_LENGTHSCALE,
    _default_additive_kernel,
    _default_kernel,
    check_user_kernel,
    default_grid_size,
)
from bo_online.models.wiski.kronecker import kron_dense, kronecker_factors
from bo_online.models.wiski.posterior import WISKIPosteriorMixin
from bo_online.models.wiski.projection import make_projection, set_projection_normalization
from bo_online.models.wiski.statistics import _DELTA_NAMES, WISKIStatisticsMixin

__all__ = ["WISKI", "default_grid_size"]


def _grid_sizes(grid_size: Any, k: int) -> list[int]:
    r"""``grid_size`` (one whole number, or one per feature) as ``k`` or more ints.

    A string was read character by character (``"big"``: "invalid literal for int() with base
    10: 'b'", ``"30"``: sizes 3 and 0), and a NumPy integer or a float such as 12.0 was
    refused with "object is not iterable"; the message now says what to pass. A tensor or
    NumPy array is read as the number (0-d) or the sizes (1-d) it holds."""
    what = f"grid_size must be a whole number or a sequence of {k} (one per feature)"
    if isinstance(grid_size, (Tensor, np.ndarray)):  # 0-d: a number; 1-d: its elements
        if grid_size.ndim > 1:
            raise ValueError(f"{what}, got an array of shape {tuple(grid_size.shape)}.")
        grid_size = grid_size.tolist()
    if isinstance(grid_size, numbers.Real) and not isinstance(grid_size, bool):
        scalar = isinstance(grid_size, numbers.Integral) or float(grid_size).is_integer()
        if not scalar:
            raise ValueError(f"{what}, got {grid_size!r}.")
        return [int(grid_size)] * k
    if isinstance(grid_size, (str, bytes, bool)) or not isinstance(grid_size, Sequence):
        raise ValueError(f"{what}, got {grid_size!r}.")
    sizes = []
    for g in grid_size:
        g = g.item() if isinstance(g, Tensor) and g.dim() == 0 else g
        whole = isinstance(g, numbers.Integral) or (
            isinstance(g, numbers.Real) and float(g).is_integer()
        )
        if isinstance(g, bool) or not whole:
            raise ValueError(f"{what}, got {grid_size!r}.")
        sizes.append(int(g))
    return sizes


#: Up to this many inputs the loops' default is the additive model over every pair of inputs.
ALL_PAIRS_MAX_DIM = 6

#: The loops' ``exact_max_n``: up to this many points WISKI is the exact GP of its kernel.
LOOP_EXACT_MAX_N = 256


class WISKI(
    WISKIExactRegimeMixin,
    WISKIFitMixin,
    WISKIConditioningMixin,
    WISKIPosteriorMixin,
    WISKICacheMixin,
    WISKIStatisticsMixin,
    OnlineModel,
):
    r"""Woodbury-inversion SKI GP with constant-time online updates.

    Args:
        train_X: ``n x d`` initial inputs (n >= 1) inside ``bounds``.
        train_Y: ``n x 1`` initial observations.
        train_Yvar: optional ``n x 1`` fixed noise variances (user units); then every later
            ``update`` must pass ``noise``.
        grid_size: points per grid dimension (int or one per dimension); default 30 (k <= 2) or
            10 (k = 3), see :func:`default_grid_size`; for the additive model, per dimension of
            each component grid, default ~400 grid points in total
            (:func:`bo_online.models.wiski.additive.additive_grid_size`).
        bounds: ``2 x d`` input box (default the unit cube); inputs outside it are an error.
        covar_module: any stationary GPyTorch kernel on the (projected) k-dim inputs; default
            BoTorch's RBF with dimension-scaled lengthscale prior.
        likelihood: ``GaussianLikelihood`` for the homoscedastic case; default BoTorch's.
        standardize: standardise outcomes with the initial data's mean and std.
        grid_jitter: relative jitter of the grid kernel, part of the model (the dense SKI
            reference uses the same matrix): on each dimension's factor for a kernel that
            factors over dimensions on one grid (the default RBF kernel: ``kron_j (K_j +
            jitter * k_j(0) I)``, so the smallest eigenvalue is about ``jitter^k k(0)``),
            else ``K + jitter * mean(diag K) I`` (see :meth:`_grid_kernel`).
        projection: a module mapping ``... x d`` inputs to ``... x k`` features in
            ``[-1, 1]^k`` (k <= 3), or ``"tanh"`` / ``"tanh:K"`` (a data-initialised
            ``TanhProjection(d, K)``, K = 2 for ``"tanh"``), or ``"pairs"`` / ``"all-pairs"``
            (the additive model over consecutive / every pair of inputs, as ``additive=``),
            either with ``"+tanh"`` (one more component on a learned 2-D projection), or
            ``"none"``/``None``; one of them is needed when d > 3 (see
            :meth:`loop_default_options` for the loops' choice).
        input_transform: optional BoTorch input transform.
        outcome_transform: ``None`` or ``Standardize(m=1)`` (the same: outcomes are
            standardised internally); any other outcome transform is refused.
        lengthscale_floor: lower bound on the default kernel's lengthscales (grid coordinates):
            ``"grid"`` (default) one grid spacing (at least BoTorch's 0.025), ``None`` BoTorch's
            0.025, or a number. Not used with a user's ``covar_module``.
        additive: groups of input indices (``G x k``, k <= 3, e.g. ``[[0, 1], [2, 3]]``),
            ``"pairs"`` or ``"all-pairs"``: model ``f(x) = sum_j f_j(x[g_j])``, one SKI
            component per group, each on its own k-D grid with its own ``ScaleKernel`` (default
            kernel: see :func:`_default_additive_kernel`); a user's ``covar_module`` must then be a
            :class:`bo_online.models.wiski.additive.BlockGridKernel`.
        prior_variance: ``"interpolated"`` (default) -- the SKI posterior as it is, whose prior
            variance ``w_x^T K_UU w_x`` dips between grid nodes; ``"exact"`` -- the posterior
            covariance at test points gets the diagonal ``k(x, x) - w_x^T K_UU w_x`` added (the
            "deterministic training conditional" predictive, docs/math.md §1), so far from the
            data the variance is the kernel's own everywhere and an acquisition function is
            not drawn to grid nodes. Training and the marginal likelihood are unchanged.
        exact_max_n: while the model holds at most this many points it keeps them and is the
            exact GP of the kernel SKI interpolates (predictions, conditioning and the fit's
            marginal likelihood; :mod:`bo_online.models.wiski.exact_regime`); past it the rows
            are dropped and the model goes on as WISKI from its statistics, at a cost flat in
            n. Default 0 (SKI from the first point, the paper's model); the loops use
            :meth:`loop_default_options`' value. With a learned projection only with
            ``regime_kernel="ard"``.
        regime_kernel: the exact regime's kernel: ``"ski"`` (default) the kernel SKI
            interpolates, so the model carries on unchanged when it leaves the regime; or
            ``"ard"``: BoTorch's ``SingleTaskGP`` kernel (an RBF kernel with one lengthscale
            per input and dimension-scaled priors, on the inputs scaled to the unit cube), a
            kernel as rich as BoTorch's where the SKI structure is additive (the loops'
            default above 6 inputs). Its hyperparameters are separate from SKI's, and a learned
            projection is derived from the data only when the model leaves the regime, so past
            ``exact_max_n`` the SKI part must be fitted (``fit_projection(X, Y)`` with a
            projection, else ``fit()``), which the loops do when the model leaves the regime.

    Example:
        >>> model = WISKI(train_X, train_Y)              # 2-D: 30 x 30 grid
        >>> model.fit()                                   # L-BFGS on the exact SKI MLL
        >>> model.update(new_X, new_Y)                    # O(m^2 q), independent of n
        >>> model.fit(method="adam", max_iter=3, lr=0.01, restandardize=False)  # streaming refit
    """

    #: ``condition_on_observations`` adds the new rows through Woodbury caches of a conditioned
    #: model; its statistics (what ``num_data`` counts and ``fit`` reads) stay the parent's, and
    #: ``update`` folds rows into them
    conditioned_rows_held = False

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
        outcome_transform: Any | None = None,
        lengthscale_floor: float | str | None = "grid",
        additive: str | Sequence[Sequence[int]] | None = None,
        prior_variance: str = "interpolated",
        exact_max_n: int = 0,
        regime_kernel: str = "ski",
    ) -> None:
        if not isinstance(train_X, Tensor) or train_X.dim() != 2:
            raise ValueError(
                f"train_X must be an n x d tensor, got {getattr(train_X, 'shape', type(train_X))}."
            )
        dtype, device = train_X.dtype, train_X.device
        dim = OnlineModel.transformed_dim(train_X, input_transform)  # after the transform
        if bounds is None:
            bounds = torch.stack([torch.zeros(dim), torch.ones(dim)]).to(dtype=dtype, device=device)
        super().__init__(dim, bounds, input_transform, dtype, device, outcome_transform)
        train_X, train_Y, train_Yvar = detached(train_X, train_Y, train_Yvar)
        X = self._checked_training_data(train_X, train_Y, train_Yvar)
        train_Yvar = self._floor_train_Yvar(train_Y, train_Yvar)  # noise floor, with a warning
        self.exact_max_n = whole_number("exact_max_n", exact_max_n, 0)
        if isinstance(regime_kernel, str):  # as projection's names: "ARD" is "ard"
            regime_kernel = regime_kernel.strip().lower()
        if regime_kernel not in ("ski", "ard"):
            raise ValueError(
                "regime_kernel must be 'ski' (the exact regime's kernel is the one SKI "
                "interpolates) or 'ard' (BoTorch's kernel on all inputs), got "
                f"{regime_kernel!r}."
            )
        self.regime_kernel = regime_kernel
        spec = projection.strip().lower() if isinstance(projection, str) else None
        if spec in ("pairs", "pairs+tanh", "all-pairs", "all-pairs+tanh"):
            if additive is not None:
                raise ValueError(f"Pass either `additive` or projection={spec!r}, not both.")
            # the additive model over pairs of inputs (plus a learned 2-D projection component)
            additive, _, tanh = spec.partition("+")
            projection = "tanh:2" if tanh else None
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
                    "WISKI interpolates on a grid of prod(grid_size) points, so it handles at most "
                    f"3 input dimensions natively; got d = {dim}. Pass projection='all-pairs' (a "
                    "sum of 2-D grids over every pair of inputs; the loops' and the CLI's default "
                    "for 4-6 inputs), 'pairs+tanh' (consecutive pairs and one grid on a learned "
                    "projection; their default above 6), 'pairs' (without the projection) or "
                    "projection='tanh' (or 'tanh:3', or "
                    "bo_online.models.wiski.projection.TanhProjection(d, out_dim=2)) to learn "
                    "k <= 3 features."
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
        sizes = _grid_sizes(grid_size, k)
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
        # A negative jitter was taken and failed at the first fit ("not positive definite"),
        # after the model had been built (in Ax: after the Sobol trials); "x" failed in float().
        if (
            isinstance(grid_jitter, bool)
            or not isinstance(grid_jitter, numbers.Real)
            or not (np.isfinite(float(grid_jitter)) and grid_jitter >= 0)
        ):
            raise ValueError(
                "grid_jitter must be a finite number >= 0 (the grid kernel's relative jitter; "
                f"default 1e-6), got {grid_jitter!r}."
            )
        self.grid_jitter = float(grid_jitter)
        if prior_variance not in ("interpolated", "exact"):
            raise ValueError(
                f"prior_variance must be 'interpolated' or 'exact', got {prior_variance!r}."
            )
        self.prior_variance = prior_variance
        if standardize:  # one point too: centred on it, as BoTorch's Standardize
            self._set_outcome_scaling(train_Y, X)
        self.fixed_noise = train_Yvar is not None
        if self.fixed_noise and likelihood is not None:
            raise ValueError("Pass either train_Yvar (fixed noise) or a likelihood, not both.")
        require_modules(covar_module, likelihood)  # not names from --model-option
        self.lengthscale_floor = self._lengthscale_floor(lengthscale_floor, covar_module)
        if covar_module is None and (self.input_groups is not None or projection is None):
            # the default kernel acts on grids over the input box (not a projection's (-1, 1)^k)
            warn_unless_unit_scaled(X, type(self).__name__)
        if covar_module is not None:
            check_user_kernel(
                covar_module, None if self.input_groups is None else self.grid.sizes_per_grid
            )
        if covar_module is None and self.input_groups is not None:
            floors = [
                max(self.lengthscale_floor, float(g.spacing.min()))
                if lengthscale_floor == "grid"
                else self.lengthscale_floor
                for g in self.grid.grids
            ]  # each component's own grid spacing
            covar_module = _default_additive_kernel(k, floors, self.grid.sizes_per_grid)
        self.covar_module = covar_module or _default_kernel(k, self.lengthscale_floor)
        self.likelihood = likelihood or get_gaussian_likelihood_with_lognormal_prior()
        self.mean_module = ConstantMean()
        if regime_kernel == "ard":  # the exact regime's own kernel (exact_regime.py)
            self.regime_covar_module = get_covar_module_with_dim_scaled_prior(ard_num_dims=dim)
        self.to(dtype=dtype, device=device)
        m = self.grid.num_points
        self.register_buffer("grid_points", self.grid.points())
        # Sufficient statistics (hyperparameter-free; user-unit outcomes less y_origin, below;
        # D in "D units").
        zeros = lambda *s: torch.zeros(*s, dtype=dtype, device=device)  # noqa: E731
        for name, shape in (("G", (m, m)), ("z", (m,)), ("h", (m,))):
            self.register_buffer(name, zeros(*shape))
        for name in ("s", "t", "c", "n", "logdet_D", "sum_y", "sum_y2", "sum_D"):
            self.register_buffer(name, zeros(()))
        # The outcome statistics are of y - y_origin (user units; fixed: the initial mean). Of
        # raw y, the residual z - beta h cancelled |beta| / sd of the digits: in float32 with
        # outcomes around 1e4 the marginal likelihood was noise and the mean drifted with n.
        self.register_buffer("y_origin", self.outcome_mean.detach().clone().reshape(()))
        # 1: the grid jitter goes on each Kronecker factor where the kernel has them; 0: a
        # scalar jitter always (the scheme of states saved before the per-factor one, which a
        # loaded model keeps so that a resumed run goes on with the model it started with).
        self.register_buffer("jitter_per_factor", torch.ones((), dtype=dtype, device=device))
        # Caches tied to the hyperparameters (rebuilt by ensure_caches).
        for name in ("chol_K", "chol_A", "v", "mean_coef"):
            self.register_buffer(name, None)
        # Pending conditioning (set only on models made by condition_on_observations/fantasize).
        for name in _DELTA_NAMES:
            self.register_buffer(name, None)
        # The exact regime's held rows and saved factor (None outside it).
        for name in (*EXACT_ROW_NAMES, *EXACT_FACTOR_NAMES):
            self.register_buffer(name, None)
        self._shared: dict[str, Any] = {}  # lazy caches shared with conditioned models
        self._stats_shared = False
        D = None if train_Yvar is None else train_Yvar.to(X).squeeze(-1)
        idx, val = self.grid.interpolate(self._features(X))
        D = self._check_D(torch.ones_like(val[..., 0]) if D is None else D)
        with torch.no_grad():
            self._accumulate(idx.detach(), val.detach(), D, train_Y.to(X).squeeze(-1))
        self._hold_rows(X, train_Y.to(X).squeeze(-1), D)

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
        # With BoTorch's kernel in the exact regime the map is not used while the model holds
        # its rows; deriving it (an exact GP fit) at every rebuild in the regime would double a
        # BO step, so it is derived when the model leaves the regime (fit_projection).
        deferred = self._has_regime_kernel() and X.shape[0] <= self.exact_max_n
        if (
            getattr(projection, "needs_data_init", False)
            and X.shape[0] >= self.dim + 2
            and not deferred
        ):
            projection.init_from_data(X, Y)  # see projection.py: random maps fail
        elif X.shape[0] > 1:
            # batch norm statistics of the initial data (if it has any and they are not set)
            set_projection_normalization(projection, X, only_if_unset=True)

    @classmethod
    def loop_default_options(
        cls, dim: int, user_options: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        r"""Constructor options the loops (and so the CLI and Ax) use unless the user gives them.

        * ``d <= 3``: one grid (none needed).
        * ``4 <= d <= ALL_PAIRS_MAX_DIM`` (6): the additive model over every pair of inputs
          (``projection="all-pairs"``, ``d (d - 1) / 2`` components on 2-D grids of
          ``grid_size=12``, ``m`` = 600 / 1,000 / 1,500 grid points in all for d = 4 / 5 / 6)
          with ``prior_variance="exact"``: fully online (no learned map, no rebuild at
          refits). In the BO suite (q = 1, 16 seeds) within 1.25x of BoTorch's mean regret on
          the 4-6-D functions, where 10-point grids were 1.89x on Hartmann6, at up to 1.2x their
          step time (docs/surrogates/wiski.md).
        * larger ``d``: pairs grow quadratically, so consecutive pairs plus one component on a
          learned 2-D projection (``projection="pairs+tanh"``, see
          :mod:`bo_online.models.wiski.additive`), and in the exact regime BoTorch's kernel
          (``regime_kernel="ard"``): the exact GP of the additive kernel was 2-2.6x BoTorch's
          mean regret on Rosenbrock 8-D and Levy 10-D (docs/results.md).

        Whatever the structure, ``exact_max_n=LOOP_EXACT_MAX_N`` (256): the exact GP of the
        kernel while the model holds at most that many points (:mod:`.exact_regime`), WISKI
        after. Unless the user passes ``exact_max_n`` (0: SKI from the first point).

        ``user_options`` (the options the user passes) that name a structure themselves
        (``projection`` or ``additive``) get none of the structure's options: ``grid_size`` and
        ``prior_variance`` above belong to the all-pairs structure, so e.g.
        ``projection="tanh:2"`` or ``additive=[[0, 2], [1, 3]]`` run as ``WISKI(X, Y,
        projection=...)`` / ``WISKI(X, Y, additive=...)`` would."""
        user_options = user_options or {}
        regime = {} if "exact_max_n" in user_options else {"exact_max_n": LOOP_EXACT_MAX_N}
        if dim <= 3 or any(k in user_options for k in ("projection", "additive")):
            return regime
        if dim <= ALL_PAIRS_MAX_DIM:
            return {"projection": "all-pairs", "prior_variance": "exact", "grid_size": 12, **regime}
        return {"projection": "pairs+tanh", "regime_kernel": "ard", **regime}

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
        """Kernel, mean and (homoscedastic) noise parameters, plus the outcome scaling: what
        SKI's caches depend on (the exact regime keys its own caches on every parameter)."""
        for name, p in self.named_parameters():
            if name.startswith("projection."):
                continue  # the statistics themselves depend on it: see fit_projection
            if name.startswith("regime_covar_module."):
                continue  # the exact regime's own kernel: SKI's caches do not read it
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
            if getattr(self, "_fitting_projection", False):  # being learned: gradients kept
                features.append(self.projection(X))
            else:
                if self.projection.training:
                    self.projection.eval()  # a fixed map except while it is being learned
                # A fixed map's parameters carry no gradient (the posterior is not
                # differentiated with respect to them); gradients with respect to X still flow.
                # Left live, they made every posterior record the interpolation of all its
                # points under autograd (about 10x the time and memory at 4,000 points).
                fixed = {k: v.detach() for k, v in self.projection.named_parameters()}
                features.append(torch.func.functional_call(self.projection, fixed, (X,)))
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
        r"""Noise of new points in D units (``batch x q``) from standardised variances or None:
        the per-point noise of :meth:`OnlineModel._noise_of_points` (which refuses None on a
        fixed-noise model) divided by ``sigma^2``, so the likelihood's own noise gives D = 1."""
        noise = self._noise_of_points(X, noise)
        if self.fixed_noise:
            D = noise * self.outcome_std.pow(2)
        else:  # relative to the current noise level (no gradient: D is data, not a parameter)
            D = noise.detach() / self._sigma2().detach()
        return self._check_D(D)

    def _kronecker_factors(self) -> list[Tensor] | None:
        r"""The jittered per-dimension factors of the grid kernel (``m_j x m_j`` each, their
        Kronecker product is :meth:`_grid_kernel`) for a single grid and a kernel that factors
        over dimensions (the default RBF kernel), else None; see :mod:`.kronecker`."""
        if self.input_groups is not None or not bool(self.jitter_per_factor):
            return None
        sizes = self.grid.inner_sizes
        P = self.grid_points.reshape(*sizes, len(sizes))
        axes = [
            P[tuple(slice(None) if i == j else 0 for i in range(len(sizes)))][:, j]
            for j in range(len(sizes))
        ]
        return kronecker_factors(self.covar_module, axes, self.grid_jitter)

    def _grid_kernel(self) -> Tensor:
        r"""The jittered grid kernel ``K_UU + jitter`` (``m x m``), differentiable in the kernel
        hyperparameters. For a kernel that factors over
        dimensions on a single grid the jitter is per factor, ``kron_j (K_j + grid_jitter *
        k_j(0) I)`` (which keeps the Kronecker structure, :mod:`.kronecker`); otherwise it is
        ``K_UU + grid_jitter * mean(diag K_UU) I``."""
        factors = self._kronecker_factors()
        if factors is not None:
            return kron_dense(factors)
        K = self.covar_module(self.grid_points).to_dense()
        jitter = self.grid_jitter * torch.diagonal(K).mean()
        return K + jitter * torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)

    def _offset(self) -> Tensor:
        r"""``beta = outcome_mean + outcome_std * constant``: residual r = (y - beta) / sd."""
        return (self.outcome_mean + self.outcome_std * self.mean_module.constant).reshape(())

    def _stats_offset(self) -> Tensor:
        r"""``beta - y_origin``: the offset of the statistics' centred outcomes, so that
        ``z_r = (z - (beta - y_origin) h) / sd``. Formed as ``(outcome_mean - y_origin) +
        outcome_std * constant``, whose first difference is exact while the two are close."""
        mean = (self.outcome_mean - self.y_origin).reshape(())
        return mean + (self.outcome_std * self.mean_module.constant).reshape(())

    # ------------------------------------------------------------------ state

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self.batch_shape == torch.Size():
            self._materialize()
        return super().state_dict(*args, **kwargs)

    def _load_from_state_dict(self, state_dict, prefix, *args: Any, **kwargs: Any) -> None:
        if prefix + "y_origin" not in state_dict and prefix + "G" in state_dict:
            # A state saved before the centred statistics: they are of raw y (origin 0).
            state_dict[prefix + "y_origin"] = torch.zeros(())
        key = prefix + "jitter_per_factor"
        if key not in state_dict and prefix + "G" in state_dict:
            # A state saved before the per-factor jitter: the model keeps the scalar jitter its
            # statistics, caches and hyperparameters were made with. Only a saved model's state
            # (it holds the statistic G): a partial one (strict=False, say a few hyperparameters)
            # leaves the jitter scheme as it is.
            state_dict[key] = torch.zeros(())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _apply(self, fn: Any, recurse: bool = True) -> Self:
        r"""As :meth:`OnlineModel._apply`; where it converts, the grid (plain tensors, not
        buffers: after ``.double()`` a float32 model's grid stayed float32, and after ``.to``
        another device on the old one) is replaced by a copy converted with the same ``fn``."""
        before = self._buffers.get("outcome_mean")
        super()._apply(fn, recurse)
        if self._buffers.get("outcome_mean") is not before and hasattr(self, "grid"):
            self.grid = self.grid.converted(fn)
        return self

    def _after_apply(self) -> None:
        # The lazy caches in ``_shared`` (S, M, K) are plain tensors in a dict: after ``.to``
        # they kept the old dtype (a float32 model made float64 again failed in an einsum).
        self._shared = {}
        self._low_rank_cache = None  # of the statistics before the conversion
        self.__dict__["_exact_cache"] = None  # the exact regime's, of the old dtype / device

    def _after_load(self) -> None:
        self._shared = {}
        self._stats_shared = False
        self._exact_state_from_buffers()
        projection = getattr(self, "projection", None)
        deferred = self._has_regime_kernel() and self._holds_exact_rows()
        if projection is not None and self.num_data >= self.dim + 2 and not deferred:
            # a loaded map is the saved model's, which had it from the data by this n (a model
            # rebuilt on fewer than d + 2 points to load into still asks for it; a resumed
            # loop would otherwise re-derive the map at its next refit). Not in the exact regime
            # of its own kernel, where the saved model's map was not derived yet: marked
            # derived, a resumed loop with refit_from="current" fitted it jointly from its
            # random start when the model left the regime, where the run it resumed derived it.
            projection.needs_data_init = False
