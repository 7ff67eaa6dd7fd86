r"""Loaders for the real data sets bo_online uses in tests, examples and experiments.

The data are never part of the repository. They are read from a data directory, chosen in this
order:

1. the ``data_dir`` argument of each loader (the CLI's ``--data-dir``);
2. the environment variable ``BO_ONLINE_DATA_DIR``;
3. ``../shared/data`` relative to the project root (the directory holding ``pyproject.toml``),
   i.e. a sibling ``shared/data`` of the checkout.

A missing file raises :class:`DataNotFoundError` (a ``FileNotFoundError``) whose message names the
file, the directory searched and how to point the loader elsewhere.

Layout expected under the data directory (see the data directory's README):

* ``uci/<name>/data.csv.gz`` (inputs then target, no header) and ``uci/<name>/test_mask.csv.gz``
  (10 columns, one per fixed 90/10 split, 1 marks a test row);
* ``magnetometer/<k>-loc.csv`` (x, y in metres) and ``magnetometer/<k>-mag.csv`` (three field
  components, micro-tesla), k = 1..9, row-aligned;
* ``banana/banana_{train,test}_{x,y}.txt`` (comma separated, labels -1/1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "DATA_DIR_ENV",
    "DataNotFoundError",
    "UCI_DATASETS",
    "Dataset",
    "resolve_data_dir",
    "load_uci",
    "load_magnetometer",
    "load_banana",
]

DATA_DIR_ENV = "BO_ONLINE_DATA_DIR"

#: UCI regression sets shipped under ``uci/`` (name -> (rows, inputs)).
UCI_DATASETS: dict[str, tuple[int, int]] = {
    "skillcraft": (3338, 19),
    "elevators": (16599, 18),
    "protein": (45730, 9),
    "kin40k": (40000, 8),
    "bike": (17379, 17),
    "pol": (15000, 26),
    "airfoil": (1503, 5),
    "concrete": (1030, 8),
    "energy": (768, 8),
    "yacht": (308, 6),
    "housing": (506, 13),
}

MAGNETOMETER_TRACKS = tuple(range(1, 10))


class DataNotFoundError(FileNotFoundError):
    """A data file is missing; the message says which, where we looked and how to fix it."""


@dataclass
class Dataset:
    r"""An in-memory data set (numpy, float64).

    Attributes:
        X: ``n x d`` inputs.
        y: ``n`` targets.
        test_mask: optional ``n`` boolean mask of the fixed test rows.
        name: the data set's name.
    """

    X: np.ndarray
    y: np.ndarray
    name: str
    test_mask: np.ndarray | None = None

    @property
    def train(self) -> tuple[np.ndarray, np.ndarray]:
        mask = np.zeros(len(self.y), bool) if self.test_mask is None else self.test_mask
        return self.X[~mask], self.y[~mask]

    @property
    def test(self) -> tuple[np.ndarray, np.ndarray]:
        if self.test_mask is None:
            raise ValueError(f"Data set {self.name!r} has no fixed test split.")
        return self.X[self.test_mask], self.y[self.test_mask]


def _project_root() -> Path:
    """The directory holding ``pyproject.toml`` above this file (the checkout's root)."""
    here = Path(__file__).resolve().parent
    for parent in (here, *here.parents):
        if (parent / "pyproject.toml").is_file():
            return parent
    return here.parent


def resolve_data_dir(path: str | os.PathLike | None = None) -> Path:
    r"""Resolve the data directory: ``path``, else ``$BO_ONLINE_DATA_DIR``, else
    ``<project root>/../shared/data``. The directory is not required to exist here; loaders
    report a missing file with :class:`DataNotFoundError`."""
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return (_project_root() / ".." / "shared" / "data").resolve()


def _how_it_was_chosen(path: str | os.PathLike | None) -> str:
    if path is not None:
        return "given as data_dir / --data-dir"
    if os.environ.get(DATA_DIR_ENV):
        return f"from ${DATA_DIR_ENV}"
    return "the default ../shared/data next to the project root"


def _require(root: Path, relative: str, given: str | os.PathLike | None) -> Path:
    file = root / relative
    if not file.is_file():
        raise DataNotFoundError(
            f"Data file {relative!r} not found in data directory {str(root)!r} "
            f"({_how_it_was_chosen(given)}); point to the directory holding it with --data-dir "
            f"or the environment variable {DATA_DIR_ENV}."
        )
    return file


def _read_csv(file: Path) -> np.ndarray:
    data = np.loadtxt(file, delimiter=",", dtype=np.float64, ndmin=2)
    if not np.isfinite(data).all():
        raise ValueError(f"Data file {str(file)!r} contains NaN/inf values.")
    return data


def load_uci(name: str, split: int = 0, data_dir: str | os.PathLike | None = None) -> Dataset:
    r"""A UCI regression set with its fixed 90/10 split.

    Args:
        name: one of :data:`UCI_DATASETS` (e.g. ``"protein"``).
        split: which of the 10 fixed splits marks the test rows (0..9).
        data_dir: data directory (see :func:`resolve_data_dir`).

    Returns:
        :class:`Dataset` with ``X`` (``n x d``), ``y`` (``n``) and ``test_mask``.
    """
    key = name.lower()
    if key not in UCI_DATASETS:
        raise ValueError(
            f"Unknown UCI data set {name!r}; choose one of {', '.join(sorted(UCI_DATASETS))}."
        )
    if not 0 <= split <= 9:
        raise ValueError(f"split must be in 0..9 (10 fixed splits), got {split}.")
    root = resolve_data_dir(data_dir)
    data = _read_csv(_require(root, f"uci/{key}/data.csv.gz", data_dir))
    mask = _read_csv(_require(root, f"uci/{key}/test_mask.csv.gz", data_dir))
    if mask.shape[0] != data.shape[0]:
        raise ValueError(
            f"uci/{key}: data has {data.shape[0]} rows but test_mask has {mask.shape[0]}."
        )
    rows, inputs = UCI_DATASETS[key]
    if data.shape != (rows, inputs + 1) or mask.shape[1] != 10:
        # A renamed or different file must not run under this set's name.
        raise ValueError(
            f"uci/{key}/data.csv.gz in {str(root)!r} holds {data.shape[0]} rows x "
            f"{data.shape[1] - 1} inputs (test mask: {mask.shape[1]} splits), but {key!r} has "
            f"{rows} rows x {inputs} inputs (10 splits): this is not the {key} set; run your own "
            f"data with bo-online stream --data FILE."
        )
    return Dataset(X=data[:, :-1], y=data[:, -1], name=key, test_mask=mask[:, split].astype(bool))


def load_magnetometer(
    tracks: tuple[int, ...] = MAGNETOMETER_TRACKS, data_dir: str | os.PathLike | None = None
) -> Dataset:
    r"""The magnetometer field: positions (x, y) in metres and the field magnitude (norm of the
    three components, micro-tesla), all requested tracks concatenated in order.

    Returns:
        :class:`Dataset` with ``X`` (``n x 2``) and ``y`` (``n``); 76,027 rows for all nine tracks.
    """
    root = resolve_data_dir(data_dir)
    xs, ys = [], []
    repeated = sorted({k for k in tracks if list(tracks).count(k) > 1})
    if repeated:
        raise ValueError(
            f"Magnetometer track(s) {repeated} requested more than once: each track is loaded "
            "once (a repeated track would put the same rows in the pool and the test set)."
        )
    for k in tracks:
        if k not in MAGNETOMETER_TRACKS:
            raise ValueError(f"Magnetometer tracks are numbered 1..9, got {k}.")
        missing = [
            name
            for name in (f"magnetometer/{k}-loc.csv", f"magnetometer/{k}-mag.csv")
            if not (root / name).is_file()
        ]
        if missing and (root / "magnetometer").is_dir():
            present = [
                j
                for j in MAGNETOMETER_TRACKS
                if (root / f"magnetometer/{j}-loc.csv").is_file()
                and (root / f"magnetometer/{j}-mag.csv").is_file()
            ]
            raise DataNotFoundError(
                f"Magnetometer track {k} is not in {str(root / 'magnetometer')!r} (missing "
                f"{', '.join(missing)}); tracks present: {present or 'none'}. Use only those "
                f"(--tracks {','.join(map(str, present)) or 'K'}), or your own recording as a pool "
                f"(bo-online active --pool FILE.csv)."
            )
        loc = _read_csv(_require(root, f"magnetometer/{k}-loc.csv", data_dir))
        mag = _read_csv(_require(root, f"magnetometer/{k}-mag.csv", data_dir))
        if loc.shape[0] != mag.shape[0] or loc.shape[1] != 2 or mag.shape[1] != 3:
            raise ValueError(
                f"magnetometer track {k}: expected row-aligned n x 2 positions and n x 3 "
                f"components, got {loc.shape} and {mag.shape}."
            )
        xs.append(loc)
        ys.append(np.linalg.norm(mag, axis=1))
    return Dataset(X=np.concatenate(xs), y=np.concatenate(ys), name="magnetometer")


def load_banana(data_dir: str | os.PathLike | None = None) -> Dataset:
    r"""The 2-D banana classification set with its fixed train/test split; labels in {-1, 1}."""
    root = resolve_data_dir(data_dir)
    parts = {}
    for split in ("train", "test"):
        X = _read_csv(_require(root, f"banana/banana_{split}_x.txt", data_dir))
        y = _read_csv(_require(root, f"banana/banana_{split}_y.txt", data_dir)).reshape(-1)
        parts[split] = (X, y)
    X = np.concatenate([parts["train"][0], parts["test"][0]])
    y = np.concatenate([parts["train"][1], parts["test"][1]])
    mask = np.r_[np.zeros(len(parts["train"][1]), bool), np.ones(len(parts["test"][1]), bool)]
    return Dataset(X=X, y=y, name="banana", test_mask=mask)
