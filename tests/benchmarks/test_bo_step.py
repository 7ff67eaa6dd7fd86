r"""``benchmarks/bench_bo_step.py`` at a tiny size: a method over the time budget is timed once and
not run at larger n, and an unavailable device is refused before anything runs."""

from __future__ import annotations

import json
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
