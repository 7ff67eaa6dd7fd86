r"""WISKI's sufficient statistics: what the model stores instead of its data.

All data enter only through hyperparameter-free statistics (docs/math.md §1)::

    G = W^T D^-1 W (m x m),  z = W^T D^-1 y,  s = y^T D^-1 y,  n,  logdet D,
    h = W^T D^-1 1,  t = 1^T D^-1 y,  c = 1^T D^-1 1,

plus ``sum y``, ``sum y^2`` and ``sum D`` for the outcome scaling and the fixed-noise default.
``y`` here is the outcome less a fixed origin (``WISKI.y_origin``, user units), so that the sums
keep the digits of the outcomes' variation however far their level is from zero;
:meth:`WISKIStatisticsMixin.statistics` gives them of the raw outcomes.
Adding q points costs O(q 16^d) (scatter-adds of their sparse interpolation weights).
"""

from __future__ import annotations

import torch
from torch import Tensor

from bo_online.models.wiski.grid import interp_gram

__all__ = ["WISKIStatisticsMixin"]

#: Names of the sufficient-statistics buffers.
_STAT_NAMES = ("G", "z", "h", "s", "t", "c", "n", "logdet_D", "sum_y", "sum_y2", "sum_D")
#: Names of the buffers of pending conditioning (models made by ``condition_on_observations``).
# (d_X: a conditioned model's pending inputs, held in the exact regime only)
_DELTA_NAMES = ("d_idx", "d_val", "d_D", "d_y", "d_F", "d_C", "d_mean_coef", "d_SF", "d_X")


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
        "s": base["s"] + (y * y * Dinv).sum(),
        "t": base["t"] + (y * Dinv).sum(),
        "c": base["c"] + Dinv.sum(),
        "n": base["n"] + y.numel(),
        "logdet_D": base["logdet_D"] + D.log().sum(),
        "sum_y": base["sum_y"] + y.sum(),
        "sum_y2": base["sum_y2"] + (y * y).sum(),
        "sum_D": base["sum_D"] + D.sum(),
    }


def _add_stats_(
    stats: dict[str, Tensor], idx: Tensor, val: Tensor, D: Tensor, y: Tensor, m: int
) -> None:
    r"""Add points (``q x K`` weights, ``q`` noise, ``q`` outcomes) to ``stats`` IN PLACE (no
    autograd): the sums of :func:`_stats_with` without a new ``m x m`` matrix per call."""
    Dinv = 1.0 / D
    interp_gram(idx, val, Dinv, m, out=stats["G"])
    flat = idx.reshape(-1)
    stats["z"].index_add_(0, flat, (val * (Dinv * y).unsqueeze(-1)).reshape(-1))
    stats["h"].index_add_(0, flat, (val * Dinv.unsqueeze(-1)).reshape(-1))
    for name, value in (
        ("s", (y * y * Dinv).sum()),
        ("t", (y * Dinv).sum()),
        ("c", Dinv.sum()),
        ("n", y.numel()),
        ("logdet_D", D.log().sum()),
        ("sum_y", y.sum()),
        ("sum_y2", (y * y).sum()),
        ("sum_D", D.sum()),
    ):
        stats[name] = stats[name] + value


class WISKIStatisticsMixin:
    r"""Methods of :class:`~bo_online.models.wiski.WISKI` that read and write the statistics."""

    def _residual_stats(self) -> tuple[Tensor, Tensor]:
        r"""Standardised residual statistics ``z_r = W^T D^-1 r`` and ``s_r = r^T D^-1 r``, O(m)."""
        beta, sd = self._stats_offset(), self.outcome_std.reshape(())
        z_r = (self.z - beta * self.h) / sd
        s_r = (self.s - 2 * beta * self.t + beta**2 * self.c) / sd**2
        return z_r, s_r

    def _accumulate(self, idx: Tensor, val: Tensor, D: Tensor, y: Tensor) -> dict[str, Tensor]:
        r"""Add points (``q x K`` weights, ``q`` noise in D units, ``q`` user-unit y) to the
        statistics and store them; returns the new statistics."""
        stats = self._stats_added(idx, val, D, y)
        for name, value in stats.items():
            setattr(self, name, value)
        self._stats_shared = False
        return stats

    def _centred(self, y: Tensor) -> Tensor:
        r"""User-unit outcomes (``... x n``) as the statistics hold them: ``y - y_origin``."""
        return y - self.y_origin

    def _stats_added(self, idx: Tensor, val: Tensor, D: Tensor, y: Tensor) -> dict[str, Tensor]:
        r"""The statistics with points added (``y``: ``q`` user-unit outcomes). All are new
        tensors except ``G``, which is updated in place when this model owns it exclusively
        (copy-on-write when a conditioned model shares it); callers validate every input before
        calling, so nothing can fail after."""
        m = self.grid.num_points
        y = self._centred(y)
        Dinv = 1.0 / D
        G = self.G.clone() if (self._stats_shared or self.d_idx is not None) else self.G
        interp_gram(idx, val, Dinv, m, out=G)
        flat_idx, wv = idx.reshape(-1), (val * Dinv.unsqueeze(-1)).reshape(-1)
        z = self.z.index_add(0, flat_idx, (val * (Dinv * y).unsqueeze(-1)).reshape(-1))
        h = self.h.index_add(0, flat_idx, wv)
        return {
            "G": G,
            "z": z,
            "h": h,
            "s": self.s + (y * y * Dinv).sum(),
            "t": self.t + (y * Dinv).sum(),
            "c": self.c + Dinv.sum(),
            "n": self.n + y.numel(),
            "logdet_D": self.logdet_D + D.log().sum(),
            "sum_y": self.sum_y + y.sum(),
            "sum_y2": self.sum_y2 + (y * y).sum(),
            "sum_D": self.sum_D + D.sum(),
        }

    def statistics(self) -> dict[str, Tensor]:
        r"""The sufficient statistics of the raw outcomes (docs/math.md §1): the held ones, which
        are of ``y - y_origin``, shifted back (new tensors for ``z``, ``s``, ``t``, ``sum_y`` and
        ``sum_y2``, the model's own for the others)."""
        self._materialize()
        stats = {name: getattr(self, name) for name in _STAT_NAMES}
        o = self.y_origin
        stats["z"] = stats["z"] + o * stats["h"]
        stats["s"] = stats["s"] + 2 * o * stats["t"] + o**2 * stats["c"]
        stats["t"] = stats["t"] + o * stats["c"]
        stats["sum_y2"] = stats["sum_y2"] + 2 * o * stats["sum_y"] + o**2 * stats["n"]
        stats["sum_y"] = stats["sum_y"] + o * stats["n"]
        return stats

    def _zero_statistics(self) -> dict[str, Tensor]:
        return {name: torch.zeros_like(getattr(self, name)) for name in _STAT_NAMES}

    #: Rows per block when the statistics are rebuilt from stored data (:meth:`_set_statistics`):
    #: the interpolation weights of one block (``rows x K``) are the only row-sized temporaries,
    #: so a refit's peak memory does not grow with n.
    statistics_block_rows: int = 2048

    def _set_statistics(self, X: Tensor, D: Tensor, y: Tensor, zero: dict[str, Tensor]) -> None:
        r"""Replace the statistics by those of ``(X, D, y)`` (``n x d``, ``n``, ``n``) under the
        current (fixed) projection; pending conditioning and caches are dropped.

        The rows are added in blocks of :attr:`statistics_block_rows` into statistics updated in
        place (the sums are the same as all rows at once up to rounding)."""
        rows = max(1, int(self.statistics_block_rows))
        with torch.no_grad():
            stats = {name: value.clone() for name, value in zero.items()}
            for start in range(0, X.shape[0], rows):
                sl = slice(start, start + rows)
                idx, val = self._interp(X[sl])
                _add_stats_(stats, idx, val, D[sl], self._centred(y[sl]), self.grid.num_points)
        for name in _DELTA_NAMES:
            setattr(self, name, None)
        for name, value in stats.items():
            setattr(self, name, value)
        self._stats_shared = False
        self.invalidate_caches()
