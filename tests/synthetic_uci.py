"""Synthetic stand-ins for the shipped UCI sets, in their on-disk format, for tests that must not
depend on the real data being present."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np


def write_uci_like(root: Path, name: str, n: int, d: int, seed: int = 0) -> Path:
    r"""Write ``root/uci/<name>/data.csv.gz`` (``n`` rows of ``d`` inputs in [-1, 1] and a smooth
    noisy target) and ``test_mask.csv.gz`` (10 splits, every 6th row a test row), so that the
    data set loader reads ``name`` from ``root``. Returns ``root``."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, d))
    y = np.sin(2 * X[:, 0]) + X[:, 1] + 0.1 * rng.standard_normal(n)
    folder = root / "uci" / name
    folder.mkdir(parents=True)
    with gzip.open(folder / "data.csv.gz", "wt") as f:
        f.write("\n".join(",".join(f"{v:.10g}" for v in r) for r in np.column_stack([X, y])))
    mask = np.zeros((n, 10), int)
    mask[np.arange(n) % 6 == 0, :] = 1
    with gzip.open(folder / "test_mask.csv.gz", "wt") as f:
        f.write("\n".join(",".join(map(str, r)) for r in mask))
    return root
