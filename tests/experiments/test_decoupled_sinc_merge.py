"""experiments/decoupled_sinc_kin40k.py --merge-sinc: the sinc seeds of result files split over
processes, merged into one summary; files that cannot be merged are refused in one line."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from script_modules import load_experiment

MODELS = ("coupled M=10", "decoupled Ma=100,Mb=10", "coupled M=100")


@pytest.fixture(scope="module")
def sinc():
    return load_experiment("decoupled_sinc_kin40k")


def _part(path: Path, seeds: list[int], iters: int = 2000) -> str:
    """A result file of ``--only sinc --seeds ...`` (RMSE of model i, seed s: (i + 1) (s + 1))."""
    rows = {
        str(s): {
            "exact GP": {"rmse": 0.01 * (s + 1)},
            **{
                m: {
                    st: {"rmse": (i + 1) * (s + 1), "elbo_per_point": -1.0}
                    for st in ("paper", "converged", "fixed_hyper")
                }
                for i, m in enumerate(MODELS)
            },
        }
        for s in seeds
    }
    settings = {"sinc": {"seeds": seeds, "iters": iters, "n": 500}, "sinc_models": {}}
    path.write_text(json.dumps({"settings": settings, "env": {}, "sinc": {"per_seed": rows}}))
    return str(path)


def test_merge_sinc_joins_the_seeds_of_every_file(sinc, tmp_path):
    merged = sinc.merge_sinc([_part(tmp_path / "a.json", [0, 1]), _part(tmp_path / "b.json", [2])])
    assert sorted(merged["sinc"]["per_seed"]) == ["0", "1", "2"]
    assert merged["settings"]["sinc"]["seeds"] == [0, 1, 2]
    row = merged["sinc"]["summary"]["coupled M=100 / converged"]
    assert row["per_seed"] == [3, 6, 9]
    assert row["mean"] == pytest.approx(statistics.fmean([3, 6, 9]))
    assert row["std"] == pytest.approx(statistics.stdev([3, 6, 9]))


def _kin40k_only(path: Path) -> str:
    """A result file of ``--only kin40k``: no sinc part."""
    path.write_text(json.dumps({"settings": {}, "env": {}, "kin40k": {}}))
    return str(path)


@pytest.mark.parametrize(
    "second, needle",
    [
        (lambda d: _part(d / "b.json", [2], iters=10), "other sinc settings (iters: 2000 vs 10)"),
        (lambda d: _part(d / "b.json", [1, 2]), "seed 1 is in both"),
        (lambda d: str(d / "missing.json"), "cannot read"),
        (lambda d: _kin40k_only(d / "k.json"), "holds no sinc results"),
    ],
    ids=["other-settings", "seed-twice", "missing", "kin40k-only"],
)
def test_merge_sinc_refuses_files_it_cannot_merge(sinc, tmp_path, second, needle):
    """Another setting was merged under the first file's settings, a seed in two files kept
    the last file's results, a missing file or one of kin40k alone raised a traceback."""
    with pytest.raises(SystemExit) as e:
        sinc.merge_sinc([_part(tmp_path / "a.json", [0, 1]), second(tmp_path)])
    assert str(e.value).startswith("decoupled_sinc_kin40k: error:") and needle in str(e.value)
