r"""Additive SKI on several small grids: the structure WISKI uses above three inputs.

A WISKI grid has ``prod(grid_size)`` points, so one grid covers at most three inputs. Above that,
WISKI models the function as a sum of GPs on groups of two inputs (an additive GP, Duvenaud,
Nickisch, Rasmussen, "Additive Gaussian processes", 2011, arXiv:1112.4394; in BO, Kandasamy,
Schneider, Poczos, "High dimensional Bayesian optimisation and bandits via additive models",
2015, arXiv:1503.01673), each interpolated on its own 2-D grid::

    k(x, x') = sum_j w_j(x_{g_j})^T K_j w_j(x'_{g_j}) = w(x)^T blockdiag(K_1, ..., K_J) w(x'),

with ``w(x) = [w_1; ...; w_J]`` the concatenated sparse interpolation weights. This is again an
SKI kernel ``W K_UU W^T`` on the union of the grids, so WISKI's statistics, marginal likelihood,
Woodbury caches and O(1)-in-n updates apply unchanged (docs/math.md §1), with ``m = sum_j m_j``
grid points and ``J 4^2`` non-zeros per row.

* :class:`StackedGrid` -- the union of the component grids, with the interface of
  :class:`bo_online.models.wiski.grid.RegularGrid` (``interpolate``, ``dense_weights``,
  ``points``, ...).
* :class:`BlockGridKernel` -- ``blockdiag(K_1, ..., K_J)`` on the stacked grid points.
* :func:`input_groups` -- the default groups: consecutive pairs of inputs.

GPyTorch's ``AdditiveStructureKernel`` sums kernels over all inputs for exact GPs; it has no grid
form, hence these small classes.
"""

from __future__ import annotations

import copy
import math
from typing import Callable, Sequence

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from bo_online.models.wiski.grid import RegularGrid

__all__ = ["StackedGrid", "BlockGridKernel", "input_groups", "additive_grid_size"]

#: Total grid points the default additive WISKI aims at (the cost of a fit step is O(m^3)).
ADDITIVE_GRID_BUDGET = 400


def input_groups(spec: str | Sequence[Sequence[int]], dim: int) -> list[list[int]]:
    r"""Resolve WISKI's ``additive`` argument to groups of input indices.

    ``"pairs"``: consecutive pairs ``(0, 1), (2, 3), ...``; for odd ``d`` the last input is paired
    with input 0. ``"all-pairs"``: every pair ``(i, j)``, ``i < j`` (``d (d - 1) / 2`` groups: a
    second-order additive model, which holds every quadratic, so every function near a smooth
    optimum). A sequence of groups is checked (each of 1-3 distinct valid indices, all groups
    the same size, every input used at least once)."""
    if isinstance(spec, str):
        name = spec.strip().lower()
        if name not in ("pairs", "all-pairs"):
            raise ValueError(
                f"additive must be 'pairs', 'all-pairs' or a list of input groups, got {spec!r}."
            )
        if dim < 2:
            raise ValueError(f"additive={name!r} needs at least 2 inputs.")
        if name == "all-pairs":
            return [[i, j] for i in range(dim) for j in range(i + 1, dim)]
        groups = [[i, i + 1] for i in range(0, dim - 1, 2)]
        if dim % 2:
            groups.append([dim - 1, 0])
        return groups
    try:
        groups = [[int(i) for i in g] for g in spec]
    except (TypeError, ValueError) as e:
        raise ValueError(f"additive groups must be lists of input indices, got {spec!r}.") from e
    sizes = {len(g) for g in groups}
    if not groups or len(sizes) != 1 or not 1 <= sizes.pop() <= 3:
        raise ValueError(f"additive groups must all have the same size 1, 2 or 3, got {groups}.")
    used = {i for g in groups for i in g}
    if any(len(set(g)) != len(g) for g in groups) or not used <= set(range(dim)):
        raise ValueError(f"additive groups must hold distinct indices in 0..{dim - 1}: {groups}.")
    if used != set(range(dim)):
        raise ValueError(f"additive groups must use every input 0..{dim - 1}, got {groups}.")
    return groups


def additive_grid_size(num_groups: int, k: int) -> int:
    r"""Points per dimension (padding included) of each of ``num_groups`` k-D component grids so
    that the total grid stays near :data:`ADDITIVE_GRID_BUDGET` points (at least 8 per dim)."""
    inner = int(math.floor((ADDITIVE_GRID_BUDGET / num_groups) ** (1.0 / k)))
    return max(8, inner + 2)


class StackedGrid:
    r"""The union of component grids ``U_1, ..., U_J`` over consecutive slices of the features.

    Args:
        grids: the component :class:`bo_online.models.wiski.grid.RegularGrid`\ s, all of the
            same dimension k.

    Features are ``... x (J k)``: component j reads columns ``j k .. (j + 1) k - 1``. Grid point
    indices of component j are offset by ``m_1 + ... + m_{j-1}``.
    """

    def __init__(self, grids: Sequence[RegularGrid]) -> None:
        if not grids or len({g.dim for g in grids}) != 1:
            raise ValueError("StackedGrid needs component grids of one common dimension.")
        self.grids = list(grids)
        self.component_dim = grids[0].dim
        self.dim = self.component_dim * len(grids)
        self.sizes_per_grid = [g.num_points for g in grids]
        self.offsets = [sum(self.sizes_per_grid[:j]) for j in range(len(grids))]
        self.spacing = torch.cat([g.spacing for g in grids])
        first = grids[0]
        # Components on one and the same grid (the usual case: every component on the unit box)
        # are interpolated in one call on the features reshaped to ``... x n x J x k``.
        self._identical = all(
            g.sizes == first.sizes
            and torch.equal(g.bounds, first.bounds.to(g.bounds))
            and g.bounds.dtype == first.bounds.dtype
            for g in grids[1:]
        )

    def converted(self, fn: Callable[[Tensor], Tensor]) -> StackedGrid:
        r"""A copy whose component grids' tensors went through ``fn`` (see
        :meth:`bo_online.models.wiski.grid.RegularGrid.converted`)."""
        new = copy.copy(self)
        new.grids = [grid.converted(fn) for grid in self.grids]
        new.spacing = fn(self.spacing)
        return new

    @property
    def num_points(self) -> int:
        return sum(self.sizes_per_grid)

    def points(self) -> Tensor:
        r"""``m x k``: the component grids' interior points, stacked (component 0 first)."""
        return torch.cat([g.points() for g in self.grids], 0)

    def interpolate(self, F: Tensor) -> tuple[Tensor, Tensor]:
        r"""``F``: ``... x n x (J k)`` features -> ``(indices, values)``, ``... x n x (J 4^k)``."""
        if F.shape[-1] != self.dim:
            raise ValueError(f"Features must have {self.dim} columns, got {tuple(F.shape)}.")
        k = self.component_dim
        if self.__dict__.get("_identical", False):  # (grids saved before it: the loop)
            try:  # ... x n x J x 4^k
                i, v = self.grids[0].interpolate(F.reshape(*F.shape[:-1], len(self.grids), k))
            except ValueError:
                pass  # an input outside the box: the loop below raises, naming its column
            else:
                # identical grids have equal sizes: component j's offset is j m_1 (no host copy)
                J, m1 = len(self.grids), self.sizes_per_grid[0]
                offsets = torch.arange(0, J * m1, m1, device=i.device).unsqueeze(-1)
                return (i + offsets).flatten(-2), v.flatten(-2)
        idx, val = [], []
        for j, (grid, offset) in enumerate(zip(self.grids, self.offsets)):
            i, v = grid.interpolate(F[..., j * k : (j + 1) * k])
            idx.append(i + offset)
            val.append(v)
        return torch.cat(idx, -1), torch.cat(val, -1)

    def dense_weights(self, F: Tensor) -> Tensor:
        r"""Dense ``n x m`` interpolation matrix; FOR TESTS ONLY (small n)."""
        idx, val = self.interpolate(F)
        W = torch.zeros(*F.shape[:-1], self.num_points, dtype=F.dtype, device=F.device)
        return W.scatter_add(-1, idx, val)


class BlockGridKernel(Kernel):
    r"""``blockdiag(k_1(U_1, U_1), ..., k_J(U_J, U_J))`` on the points of a :class:`StackedGrid`.

    Args:
        kernels: one stationary kernel per component (on k-D inputs).
        sizes: the components' numbers of grid points ``m_j``.

    Only defined on the stacked grid points themselves (rows split by ``sizes``): the additive
    model never evaluates the kernel anywhere else (predictions go through the grid).
    """

    def __init__(self, kernels: Sequence[Kernel], sizes: Sequence[int]) -> None:
        super().__init__()
        if len(kernels) != len(sizes):
            raise ValueError("BlockGridKernel needs one kernel per grid.")
        self.kernels = torch.nn.ModuleList(kernels)
        self.sizes = [int(s) for s in sizes]

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, **params) -> Tensor:
        if x1.shape[-2] != sum(self.sizes) or x2.shape[-2] != sum(self.sizes):
            raise ValueError(
                f"BlockGridKernel is defined on its {sum(self.sizes)} stacked grid points only."
            )
        blocks = [
            k(a, b, diag=diag).to_dense() if diag else k(a, b).to_dense()
            for k, a, b in zip(self.kernels, x1.split(self.sizes, -2), x2.split(self.sizes, -2))
        ]
        return torch.cat(blocks, -1) if diag else torch.block_diag(*blocks)
