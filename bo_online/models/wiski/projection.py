r"""Learned input projections for WISKI on more than three input dimensions.

A WISKI grid has ``prod(grid_size)`` points, so it is practical for k <= 3 grid dimensions only.
Higher-dimensional inputs go through a learned feature map into ``(-1, 1)^k`` (Stanton, Maddox,
Delbridge, Wilson, "Kernel Interpolation for Scalable Online Gaussian Processes", 2021,
arXiv:2103.01454, Sec. 4.3 and App. C.1): a linear map, a batch normalisation and ``tanh``. The
projection's parameters are not ordinary hyperparameters: WISKI's statistics are built from the
projected inputs, so a changed projection invalidates them. They are therefore learned in a
separate, explicit step (:meth:`bo_online.models.WISKI.fit_projection`) on raw inputs the user
keeps, which also rebuilds the statistics from the new features.

A randomly initialised map is a poor start: from random directions the joint fit lands in local
optima that are worse than a constant predictor on held-out points of 4-8-D functions. The map is
therefore initialised from data (:meth:`TanhProjection.init_from_data`): its rows are the leading
eigenvectors of the average outer product of the gradients of an exact GP's posterior mean (an
"active subspace", Constantine, Dow, Wang, "Active subspace methods in theory and practice",
2014, arXiv:1304.2070), fitted with BoTorch on (a subsample of) the data.

GPyTorch/BoTorch provide no such bounded projection module, hence this small one.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["TanhProjection", "make_projection", "set_projection_normalization"]


class TanhProjection(nn.Module):
    r"""``x -> tanh(BatchNorm(A x + b))``, mapping ``... x d`` inputs to ``... x k`` features.

    Args:
        in_dim: input dimension d.
        out_dim: feature dimension k (1, 2 or 3 for a WISKI grid).
        seed: optional seed for the initial random linear map (reproducible models).
        init: ``"data"`` (default): the first model built on, or fitted to, at least
            ``d + 2`` points replaces the random map by :meth:`init_from_data`; ``"random"``:
            keep the random map (the paper's setting).

    In evaluation mode (always, except inside ``WISKI.fit_projection``) the batch norm uses its
    running statistics, so the map is a fixed deterministic function of each input. A WISKI
    built on an already initialised/normalised projection uses it unchanged (so a model rebuilt
    on more data with the same projection has exactly the same features).
    """

    def __init__(
        self, in_dim: int, out_dim: int = 2, seed: int | None = None, init: str = "data"
    ) -> None:
        super().__init__()
        if not 1 <= out_dim <= 3:
            raise ValueError(f"out_dim must be 1, 2 or 3 (a WISKI grid), got {out_dim}.")
        if init not in ("data", "random"):
            raise ValueError(f"init must be 'data' or 'random', got {init!r}.")
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        self.linear = nn.Linear(in_dim, out_dim)
        if seed is not None:
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                bound = 1.0 / in_dim**0.5
                self.linear.weight.copy_((torch.rand(out_dim, in_dim, generator=g) * 2 - 1) * bound)
                self.linear.bias.zero_()
        self.norm = nn.BatchNorm1d(out_dim, affine=False, momentum=None)
        self.needs_data_init = init == "data"
        self.normalized = False  # batch-norm statistics not yet set from data
        self.eval()

    def forward(self, X: Tensor) -> Tensor:
        r"""``X``: ``... x d`` -> ``... x k`` in ``(-1, 1)^k``."""
        if X.shape[-1] != self.in_dim:
            raise ValueError(f"X must have {self.in_dim} columns, got shape {tuple(X.shape)}.")
        flat = self.linear(X.reshape(-1, self.in_dim))
        return torch.tanh(self.norm(flat)).reshape(*X.shape[:-1], self.out_dim)

    def set_normalization(self, X: Tensor) -> None:
        r"""Set the batch norm's statistics to the mean/variance of ``A X + b`` over ``X``."""
        with torch.no_grad():
            flat = self.linear(X.reshape(-1, self.in_dim))
            self.norm.running_mean.copy_(flat.mean(0))
            self.norm.running_var.copy_(flat.var(0, unbiased=False).clamp_min(1e-12))
        self.normalized = True

    def set_normalisation(self, X: Tensor) -> None:
        """Deprecated spelling of :meth:`set_normalization`."""
        warnings.warn(
            "TanhProjection.set_normalisation is deprecated; use set_normalization.",
            DeprecationWarning,
            stacklevel=2,
        )
        self.set_normalization(X)

    @property
    def normalised(self) -> bool:
        """Deprecated spelling of :attr:`normalized`."""
        warnings.warn(
            "TanhProjection.normalised is deprecated; use normalized.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.normalized

    @normalised.setter
    def normalised(self, value: bool) -> None:
        warnings.warn(
            "TanhProjection.normalised is deprecated; use normalized.",
            DeprecationWarning,
            stacklevel=2,
        )
        self.normalized = bool(value)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A projection pickled before the rename holds its flag as "normalised".
        if "normalised" in state:
            state["normalized"] = state.pop("normalised")
        super().__setstate__(state)

    def init_from_data(self, X: Tensor, y: Tensor, max_points: int = 400) -> None:
        r"""Set ``A`` to the leading k gradient directions of an exact GP fitted to the data.

        ``X``: ``n x d`` inputs (the unit cube), ``y``: ``n`` or ``n x 1`` outcomes. An ARD
        ``SingleTaskGP`` (BoTorch defaults) is fitted on at most ``max_points`` of them (a fixed
        subsample: O(max_points^3) once); the rows of ``A`` are the top eigenvectors of
        ``mean_i grad mu(x_i) grad mu(x_i)^T``, ``b = 0``; the batch norm is set on ``X``.
        """
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP
        from botorch.models.transforms import Standardize
        from gpytorch.mlls import ExactMarginalLogLikelihood

        X_all = X = X.detach().reshape(-1, self.in_dim)
        y = y.detach().reshape(-1, 1).to(X)
        if X.shape[0] > max_points:  # deterministic subsample, independent of the global RNG
            g = torch.Generator().manual_seed(0)
            keep = torch.randperm(X.shape[0], generator=g)[:max_points].to(X.device)
            X, y = X[keep], y[keep]
        Xd, yd = X.double(), y.double()
        weight = None
        try:
            gp = SingleTaskGP(Xd, yd, outcome_transform=Standardize(m=1))
            fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
            Xg = Xd.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(gp.posterior(Xg).mean.sum(), Xg)
            C = grad.T @ grad / grad.shape[0]
            _, V = torch.linalg.eigh(C)  # ascending eigenvalues
            weight = V[:, -self.out_dim :].flip(-1).T
        except Exception:  # a degenerate fit (e.g. constant y): keep the current map
            weight = None
        if weight is not None and torch.isfinite(weight).all():
            with torch.no_grad():
                self.linear.weight.copy_(weight.to(self.linear.weight))
                self.linear.bias.zero_()
        self.needs_data_init = False
        self.set_normalization(X_all)


def make_projection(spec: object, in_dim: int) -> nn.Module | None:
    r"""Resolve WISKI's ``projection`` argument: a module (returned as is), ``None`` or
    ``"none"`` (no projection), or a string ``"tanh"`` / ``"tanh:K"`` (a data-initialised
    ``TanhProjection(d, K)``, K = 2 for ``"tanh"``)."""
    if isinstance(spec, nn.Module):
        return spec
    if spec is None:
        return None
    if isinstance(spec, str):
        name, _, k = spec.strip().lower().partition(":")
        if name == "none" and not k:
            return None
        if name == "tanh":
            try:
                out_dim = int(k) if k else 2
            except ValueError:
                out_dim = -1
            if not 1 <= out_dim <= 3:
                raise ValueError(
                    f"projection={spec!r}: the feature count after 'tanh:' must be 1, 2 or 3, "
                    "e.g. projection='tanh:2'."
                )
            return TanhProjection(in_dim, out_dim)
    raise ValueError(
        f"projection must be a module, 'tanh', 'tanh:K' (K = 1, 2 or 3), 'none' or (WISKI) "
        f"'pairs' / 'pairs+tanh'; got {spec!r}."
    )


def set_projection_normalization(
    projection: nn.Module, X: Tensor, only_if_unset: bool = False
) -> None:
    r"""Set ``projection``'s normalisation statistics from ``X`` (``n x d``) through its
    ``set_normalization`` (or, for a user's module written against the old spelling,
    ``set_normalisation``); modules with neither are left alone. With ``only_if_unset``, a
    projection whose flag (``normalized``, or ``normalised``) is already true is left alone."""
    if hasattr(projection, "set_normalization"):
        setter, flag = projection.set_normalization, "normalized"
    elif hasattr(projection, "set_normalisation"):
        setter, flag = projection.set_normalisation, "normalised"
    else:
        return
    if only_if_unset and getattr(projection, flag, False):
        return
    setter(X)
