"""The shared timing helper of the benchmark scripts (bo_online.benchmarking)."""

from __future__ import annotations

import time

import pytest

from bo_online.benchmarking import time_interleaved


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
