r"""WISKI's default kernels and grid sizes.

The default kernel is BoTorch's RBF-ARD with its dimension-scaled lengthscale prior, with the
lengthscale bounded below by one grid spacing (the SKI kernel cannot follow shorter ones); the
additive model uses one such kernel, scaled, per component grid.
"""

from __future__ import annotations

from typing import Sequence

from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.priors import GammaPrior

from bo_online.models.wiski.additive import BlockGridKernel

__all__ = ["default_grid_size", "check_user_kernel"]

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
    """Default points per dimension: 30 for k <= 2, 10 for k = 3. The outer ring of points
    carries no weight (the grid pads the box), so the active grid has ``(g - 2)^k`` points:
    m = 784 in 2-D, 512 in 3-D."""
    if k <= 2:
        return 30
    if k == 3:
        return 10
    raise ValueError(f"WISKI grids are for k <= 3 dimensions, got {k}.")


def check_user_kernel(covar_module: Kernel, sizes: Sequence[int] | None) -> None:
    r"""Refuse a user's ``covar_module`` that does not fit WISKI's grids, with a ``ValueError``
    saying what to pass.

    Args:
        covar_module: the kernel given to the constructor.
        sizes: the numbers of points of the additive model's component grids (``J``), or None
            for one grid.

    The additive model takes a :class:`BlockGridKernel` with one kernel per component grid.
    Another kernel was taken and evaluated on the stacked grid points as if they were one cloud
    in k-D (covariances between the components' grids: not the additive model, silently), and
    the first fit, or the exact regime's first posterior, failed with an ``AttributeError``."""
    if sizes is None:
        if isinstance(covar_module, BlockGridKernel):
            raise ValueError(
                "A BlockGridKernel is the additive model's kernel (additive=... or "
                "projection='pairs' / 'all-pairs', with or without '+tanh'); with one grid pass a "
                "kernel on its k features, or leave covar_module out for the default."
            )
        return
    sizes = [int(m) for m in sizes]
    if isinstance(covar_module, BlockGridKernel) and covar_module.sizes == sizes:
        return
    got = type(covar_module).__name__
    if isinstance(covar_module, BlockGridKernel):
        got += f" on grids of {covar_module.sizes} points"
    raise ValueError(
        f"The additive model needs covar_module to be a BlockGridKernel with one kernel per "
        f"component grid ({len(sizes)} grids of {sizes} points), got {got}. Pass "
        f"BlockGridKernel([ScaleKernel(MaternKernel(nu=2.5)) for _ in range({len(sizes)})], "
        f"sizes={sizes}) (from bo_online.models.wiski.additive), or leave covar_module out for "
        "the default."
    )
