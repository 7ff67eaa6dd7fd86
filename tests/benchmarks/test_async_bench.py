r"""``benchmarks/bench_async.py``'s verdicts from the loops' results (the cluster and both loops
replaced by stand-ins of known regrets): the paired difference and its standard error by hand,
and no verdict from one seed."""

from __future__ import annotations

import math
import statistics
import sys

import distributed
import pytest
import torch
from script_modules import load_benchmark

import bo_online.loops
import bo_online.loops.async_bo

REGRET = {"async": [0.5, 0.7], "sync": [0.4, 0.5]}  # paired differences 0.1 and 0.2


class _Cluster:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def run(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


def _loop(kind: str):
    class Loop:
        r"""Stands in for the async / sync loop: X grows by the evaluations a run makes."""

        def __init__(self, problem, *args, seed: int = 0, q: int = 1, **kwargs) -> None:
            self.seed, self.q, self.config = seed, q, {"n_init": 5}
            self.X = torch.zeros(5, problem.dim)

        def initialize(self) -> None:
            pass

        def run(self, steps: int) -> list[dict[str, float]]:
            self.X = torch.zeros(self.X.shape[0] + steps * self.q, self.X.shape[1])
            regret = REGRET[kind][self.seed] if self.seed in (0, 1) else 1.0
            return [{"regret": regret}]

    return Loop


@pytest.mark.parametrize("seeds", [2, 1])
def test_regret_verdict_from_the_paired_differences(seeds, monkeypatch, capsys):
    module = load_benchmark("bench_async")
    monkeypatch.setattr(distributed, "LocalCluster", _Cluster)
    monkeypatch.setattr(distributed, "Client", _Cluster)
    monkeypatch.setattr(bo_online.loops, "BayesOptLoop", _loop("sync"))
    monkeypatch.setattr(bo_online.loops.async_bo, "AsyncBayesOptLoop", _loop("async"))
    argv = ["bench_async.py", "--workers", "2", "--budget", "4", "--seeds", str(seeds)]
    monkeypatch.setattr(sys, "argv", argv)
    module.main()
    out = capsys.readouterr().out
    diffs = [a - b for a, b in zip(REGRET["async"][:seeds], REGRET["sync"][:seeds])]
    mean = statistics.fmean(diffs)
    if seeds == 1:  # no standard error: no verdict (it printed FAIL)
        assert f"paired diff {mean:.4g} +- nan (SE)  within 2 SE: N/A (one seed)" in out
        return
    se = statistics.stdev(diffs) / math.sqrt(seeds)  # 0.15 +- 0.05: beyond 2 SE
    assert abs(mean) > 2 * se
    assert f"paired diff {mean:.4g} +- {se:.3g} (SE)  within 2 SE: FAIL" in out
