r"""Data loaders: values equal the raw files (read independently), row counts match the data
README, and a missing file says which file, where it looked and how to point elsewhere."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest

from bo_online import datasets
from bo_online.datasets import DataNotFoundError, load_banana, load_magnetometer, load_uci


@pytest.fixture(scope="module")
def root() -> Path:
    root = datasets.resolve_data_dir()
    if not (root / "uci").is_dir():
        pytest.skip(f"real data not found under {root}")
    return root


@pytest.mark.parametrize("name", ["yacht", "housing", "concrete", "energy", "airfoil"])
def test_uci_matches_raw_file_and_table(root, name):
    d = load_uci(name, split=3)
    rows, inputs = datasets.UCI_DATASETS[name]
    assert d.X.shape == (rows, inputs) and d.y.shape == (rows,)
    with gzip.open(root / "uci" / name / "data.csv.gz", "rt") as f:
        raw = np.array([[float(v) for v in r] for r in csv.reader(f)])
    with gzip.open(root / "uci" / name / "test_mask.csv.gz", "rt") as f:
        mask = np.array([[int(float(v)) for v in r] for r in csv.reader(f)])[:, 3] == 1
    np.testing.assert_array_equal(d.X, raw[:, :-1])
    np.testing.assert_array_equal(d.y, raw[:, -1])
    np.testing.assert_array_equal(d.test_mask, mask)
    assert 0.05 < mask.mean() < 0.15  # the fixed 90/10 split
    np.testing.assert_array_equal(d.test[1], raw[mask, -1])


def test_every_uci_set_in_the_table_loads(root):
    for name, (rows, inputs) in datasets.UCI_DATASETS.items():
        if rows > 20000:
            continue  # the large ones are covered by the experiments; keep the test fast
        assert load_uci(name).X.shape == (rows, inputs)


def test_magnetometer_rows_and_magnitude(root):
    d = load_magnetometer()
    assert d.X.shape == (76_027, 2) and d.y.shape == (76_027,)
    with open(root / "magnetometer" / "9-mag.csv") as f:
        last = [list(map(float, r)) for r in csv.reader(f)][-1]
    assert d.y[-1] == pytest.approx(np.sqrt(sum(v * v for v in last)))
    assert load_magnetometer(tracks=(2,)).X.shape[0] < 76_027
    with pytest.raises(ValueError, match="1..9"):
        load_magnetometer(tracks=(10,))


def test_banana(root):
    d = load_banana()
    assert d.X.shape[1] == 2 and set(np.unique(d.y)) == {-1.0, 1.0}
    assert d.train[0].shape == (400, 2)


def test_missing_file_error_names_file_place_and_remedy(tmp_path, monkeypatch):
    monkeypatch.delenv(datasets.DATA_DIR_ENV, raising=False)
    with pytest.raises(DataNotFoundError) as e:
        load_uci("yacht", data_dir=tmp_path)
    msg = str(e.value)
    assert "uci/yacht/data.csv.gz" in msg and str(tmp_path) in msg
    assert "--data-dir" in msg and datasets.DATA_DIR_ENV in msg
    assert isinstance(e.value, FileNotFoundError)
    # the environment variable is honoured and named as the source
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path / "elsewhere"))
    assert datasets.resolve_data_dir() == tmp_path / "elsewhere"
    with pytest.raises(DataNotFoundError, match=f"from \\${datasets.DATA_DIR_ENV}"):
        load_magnetometer()
    # without either, the default is ../shared/data next to the project root
    monkeypatch.delenv(datasets.DATA_DIR_ENV)
    project = Path(datasets.__file__).resolve().parents[1]
    assert datasets.resolve_data_dir() == (project / ".." / "shared" / "data").resolve()


def test_bad_arguments():
    with pytest.raises(ValueError, match="Unknown UCI data set"):
        load_uci("iris")
    with pytest.raises(ValueError, match="split"):
        load_uci("yacht", split=10)
