r"""Learned input projections for WISKI on more than three input dimensions.

A WISKI grid has ``prod(grid_size)`` points, so it is practical for k <= 3 grid dimensions only.
Higher-dimensional inputs go through a learned feature map into ``(-1, 1)^k`` (Stanton et al., "Kernel Interpolation for Scalable Online Gaussian
Processes", 2021, arXiv:2103.01454, Sec. 4.3 and C.1): a linear map, a batch normalisation and ``tanh``. The projection's parameters
are not ordinary hyperparameters: WISKI's statistics are built from the projected inputs, so a
changed projection invalidates them. They are therefore learned in a separate, explicit step
(:meth:`bo_online.models.WISKI.fit_projection`) on raw inputs the user keeps, which also rebuilds
the statistics from the new features.

GPyTorch/BoTorch provide no such bounded projection module, hence this small one.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["TanhProjection"]


class TanhProjection(nn.Module):
    r"""``x -> tanh(BatchNorm(A x + b))``, mapping ``... x d`` inputs to ``... x k`` features.

    Args:
        in_dim: input dimension d.
        out_dim: feature dimension k (1, 2 or 3 for a WISKI grid).
        seed: optional seed for the initial linear map (reproducible models).

    In evaluation mode (always, except inside ``WISKI.fit_projection``) the batch norm uses its
    running statistics, so the map is a fixed deterministic function of each input.
    """

    def __init__(self, in_dim: int, out_dim: int = 2, seed: int | None = None) -> None:
        super().__init__()
        if not 1 <= out_dim <= 3:
            raise ValueError(f"out_dim must be 1, 2 or 3 (a WISKI grid), got {out_dim}.")
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        self.linear = nn.Linear(in_dim, out_dim)
        if seed is not None:
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                bound = 1.0 / in_dim**0.5
                self.linear.weight.copy_((torch.rand(out_dim, in_dim, generator=g) * 2 - 1) * bound)
                self.linear.bias.zero_()
        self.norm = nn.BatchNorm1d(out_dim, affine=False, momentum=None)
        self.eval()

    def forward(self, X: Tensor) -> Tensor:
        r"""``X``: ``... x d`` -> ``... x k`` in ``(-1, 1)^k``."""
        if X.shape[-1] != self.in_dim:
            raise ValueError(f"X must have {self.in_dim} columns, got shape {tuple(X.shape)}.")
        flat = self.linear(X.reshape(-1, self.in_dim))
        return torch.tanh(self.norm(flat)).reshape(*X.shape[:-1], self.out_dim)

    def set_normalisation(self, X: Tensor) -> None:
        r"""Set the batch norm's statistics to the mean/variance of ``A X + b`` over ``X``."""
        with torch.no_grad():
            flat = self.linear(X.reshape(-1, self.in_dim))
            self.norm.running_mean.copy_(flat.mean(0))
            self.norm.running_var.copy_(flat.var(0, unbiased=False).clamp_min(1e-12))
