r"""WISKI: Woodbury-inversion structured kernel interpolation, a GP with O(1)-in-n updates.

Stanton, Maddox, Delbridge and Wilson, "Kernel Interpolation for Scalable Online Gaussian
Processes", AISTATS 2021, arXiv:2103.01454. The kernel is the SKI approximation
``k(x, x') ~ w_x^T K_UU w_x'`` on a fixed regular grid with sparse cubic interpolation weights
(Wilson and Nickisch, "Kernel Interpolation for Scalable Structured Gaussian Processes
(KISS-GP)", 2015, arXiv:1503.01057); all data enter only through hyperparameter-free sufficient
statistics, so updates, the marginal likelihood and its gradient cost O(m^2 q) or O(m^3) for m
grid points, whatever the number n of observations.

Use it for long BO / active-learning / streaming runs on d <= 3 inputs, where an exact GP becomes
too slow; above 3 inputs the loops' default is an additive model over every pair of inputs (4-6
inputs, ``projection="all-pairs"``, ``prior_variance="exact"``) or over consecutive pairs plus a
learned 2-D projection (more inputs, ``projection="pairs+tanh"``). In the loops WISKI is the
exact GP of its kernel up to 256 points (``exact_max_n``), above 6 inputs of BoTorch's kernel
(``regime_kernel="ard"``; :mod:`~bo_online.models.wiski.exact_regime`).

Modules, one job each:

* :mod:`~bo_online.models.wiski.model` -- :class:`WISKI`: constructor, input features, noise
  units; composes the mixins below.
* :mod:`~bo_online.models.wiski.statistics` -- the sufficient statistics and adding points.
* :mod:`~bo_online.models.wiski.caches` -- cached factors of ``K_UU`` and
  ``A = sigma^2 I + R^T G R`` and their rank-q updates.
* :mod:`~bo_online.models.wiski.posterior` -- the latent posterior read from the caches.
* :mod:`~bo_online.models.wiski.conditioning` -- fantasies (lazy rank-q corrections) and
  in-place updates.
* :mod:`~bo_online.models.wiski.fitting` -- :class:`WISKIFitSettings`,
  :class:`WISKIProjectionFitSettings`, the marginal likelihood, ``fit``, ``fit_projection``.
* :mod:`~bo_online.models.wiski.grid` -- the regular grid and sparse cubic interpolation weights.
* :mod:`~bo_online.models.wiski.kernels` -- default kernels and grid sizes.
* :mod:`~bo_online.models.wiski.additive` -- stacked grids and block kernels (additive WISKI).
* :mod:`~bo_online.models.wiski.projection` -- learned input projections (:class:`TanhProjection`).
* :mod:`~bo_online.models.wiski.covariance` -- the lazy ``P P^T - Q Q^T`` posterior covariance.
* :mod:`~bo_online.models.wiski.classification` -- Dirichlet-based classification on WISKI.
"""

from bo_online.models.wiski.additive import (
    BlockGridKernel,
    StackedGrid,
    additive_grid_size,
    input_groups,
)
from bo_online.models.wiski.classification import WISKIDirichletClassifier, dirichlet_targets
from bo_online.models.wiski.covariance import RootDifferenceLinearOperator
from bo_online.models.wiski.fitting import WISKIFitSettings, WISKIProjectionFitSettings
from bo_online.models.wiski.grid import RegularGrid
from bo_online.models.wiski.kernels import default_grid_size
from bo_online.models.wiski.model import WISKI
from bo_online.models.wiski.projection import TanhProjection, make_projection

__all__ = [
    "WISKI",
    "WISKIFitSettings",
    "WISKIProjectionFitSettings",
    "WISKIDirichletClassifier",
    "dirichlet_targets",
    "TanhProjection",
    "make_projection",
    "RegularGrid",
    "StackedGrid",
    "BlockGridKernel",
    "RootDifferenceLinearOperator",
    "additive_grid_size",
    "input_groups",
    "default_grid_size",
]
