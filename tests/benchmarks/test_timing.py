"""The shared timing helper of the benchmark scripts (bo_online.benchmarking)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch

from bo_online.benchmarking import Timing, time_interleaved, write_results


def _alternately_slow(delay: float):
    r"""A callable whose even-numbered calls (2nd, 4th, ...) sleep ``delay`` seconds, like a
    kernel that pays for fresh memory on every other call."""
    calls = {"n": 0}

    def fn() -> None:
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            time.sleep(delay)

    return fn, calls


def test_inner_takes_the_fastest_of_consecutive_calls():
    delay = 0.03
    fn, calls = _alternately_slow(delay)
    single = time_interleaved({"f": fn}, reps=3, warmup=1)["f"]
    # warm-up is call 1; the samples are calls 2, 3, 4: slow, fast, slow
    assert calls["n"] == 4
    assert single.median >= delay and single.min < delay / 3

    fn, calls = _alternately_slow(delay)
    best = time_interleaved({"f": fn}, reps=3, warmup=1, inner=2)["f"]
    # every sample holds one fast call, so no sample is slow
    assert calls["n"] == 1 + 3 * 2
    assert best.max < delay / 3 and best.reps == 3


def test_reps_and_inner_must_be_positive():
    with pytest.raises(ValueError, match="reps and inner"):
        time_interleaved({"f": lambda: None}, reps=1, inner=0)
    with pytest.raises(ValueError, match="reps and inner"):
        time_interleaved({"f": lambda: None}, reps=0)


def test_write_results_writes_valid_json_with_null_for_nan_atomically(tmp_path, monkeypatch):
    """A NaN (or inf) in a benchmark's results was written as bare NaN / Infinity, which is
    not JSON (strict parsers, jq, JavaScript refuse the file); and the file was written in
    place, so a failed write destroyed the previous results."""
    path = tmp_path / "out" / "bench.json"
    payload = {
        "ratio": float("nan"),
        "worst": [1.0, float("inf"), np.float32("nan")],
        "t": Timing(0.5, 0.25, math.nan, 5),
        "dtype": torch.float64,
        "n": np.int64(3),
    }
    write_results(path, payload)
    text = path.read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert data["ratio"] is None and data["worst"] == [1.0, None, None]
    assert data["t"] == {"median": 0.5, "min": 0.25, "max": None, "reps": 5}
    assert data["dtype"] == "torch.float64" and data["n"] == 3 and "environment" in data

    def broken(*args, **kwargs):  # a write that fails half way (full disk)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", broken)
    with pytest.raises(OSError):
        write_results(path, {"ratio": 1.0})
    assert path.read_text() == text and [p.name for p in path.parent.iterdir()] == ["bench.json"]
