r"""``benchmarks/bench_bo_step.py`` at a tiny size: a method over the time budget is timed once and
not run at larger n, and an unavailable device is refused before anything runs."""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import pytest
import torch
from script_modules import load_benchmark

TINY = ["--reps", "1", "--restarts", "2", "--raw-samples", "16", "--maxiter", "5"]


def _bench():
    return load_benchmark("bench_bo_step")


def test_over_budget_methods_stop_at_larger_n(tmp_path, monkeypatch, capsys):
    out = tmp_path / "step.json"
    argv = ["bench_bo_step.py", "--ns", "20", "40", "--budget-s", "0", "--out", str(out), *TINY]
    monkeypatch.setattr(sys, "argv", argv)
    _bench().main()
    res = json.loads(out.read_text())
    # Every single call takes more than 0 s: each method is timed once at n = 20, then dropped.
    assert {(r["n"], r["method"]) for r in res["rows"]} == {
        (20, m) for m in ("wiski", "exact", "singletaskgp")
    }
    assert set(res["skipped"]) == {"wiski", "exact", "singletaskgp"}
    assert res["device"] == "cpu"
    printed = capsys.readouterr().out
    assert "skipped at larger n" in printed and "n = 40" in printed


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cuda_without_a_device_is_refused(tmp_path, monkeypatch, capsys):
    out = tmp_path / "step.json"
    monkeypatch.setattr(sys, "argv", ["bench_bo_step.py", "--device", "cuda", "--out", str(out)])
    with pytest.raises(SystemExit) as e:
        _bench().main()
    assert e.value.code == 2 and "CUDA is not available" in capsys.readouterr().err
    assert not out.exists()


def test_an_even_number_of_repetitions_reports_the_mean_of_the_middle_two(monkeypatch):
    r"""The median of 4 repetitions is the mean of the middle two (it was the upper one)."""
    bench = _bench()
    times = {"fit": [9.0, 4.0, 1.0, 3.0, 2.0], "acquisition": [9.0, 0.5, 0.25, 0.75, 1.5]}
    times["update"] = [9.0, 8.0, 6.0, 7.0, 5.0]
    calls = {p: iter(v) for p, v in times.items()}  # the first of each: the untimed warm-up

    monkeypatch.setattr(bench, "_build", lambda *args: None)
    monkeypatch.setattr(
        bench, "_parts", lambda *args: {p: (lambda p=p: next(calls[p])) for p in bench.PARTS}
    )
    args = argparse.Namespace(
        ns=[20], methods=["exact"], reps=4, budget_s=1e9, device="cpu", fit_max_iter=1
    )
    (row,) = bench.run(args)["rows"]
    for p, v in times.items():
        assert row[p].median == statistics.median(v[1:])
        assert (row[p].min, row[p].max, row[p].reps) == (min(v[1:]), max(v[1:]), 4)
