r"""The agreement script: a loop's batch against BoTorch's reference step on the loop's data."""

from __future__ import annotations

import torch
from script_modules import load_benchmark


def test_a_step_is_classified_by_batch_then_by_botorchs_value():
    bench = load_benchmark("bench_bo_agreement")
    row = {"distance": 1e-5, "acq_loop": 0.0, "acq_botorch": 5.0}
    assert bench.classify(row, 1e-3) == "same batch"
    row["distance"] = 0.5
    assert bench.classify(row, 1e-3) == "lower"
    row["acq_loop"] = 5.0002  # within 1e-4 of |5|
    assert bench.classify(row, 1e-3) == "same value"
    row["acq_loop"] = 5.01
    assert bench.classify(row, 1e-3) == "higher"
    rows = [{"distance": 0.5, "acq_loop": 0.0, "acq_botorch": 1.0}] * 5  # lower five times
    assert not bench.summarise(rows, 1e-3)["passed"]  # 5 - 0 > 2 sqrt(5)
    rows += [{"distance": 0.5, "acq_loop": 2.0, "acq_botorch": 1.0}] * 2
    assert bench.summarise(rows, 1e-3)["passed"]  # 5 - 2 <= 2 sqrt(7)


def test_set_distance_ignores_the_order_of_a_batch():
    bench = load_benchmark("bench_bo_agreement")
    A = torch.tensor([[0.1, 0.2], [0.7, 0.9], [0.4, 0.4]], dtype=torch.float64)
    assert bench.set_distance(A, A.flip(0)) == 0.0
    B = A.flip(0).clone()
    B[0, 1] += 0.03  # the row matched to A's last one moves by 0.03 in one coordinate
    assert abs(bench.set_distance(A, B) - 0.03) < 1e-15


def test_the_exact_gp_loop_proposes_botorchs_batches_on_its_data(tmp_path, capsys):
    """The exact GP loop at its defaults on Branin (q = 1, LogEI): at each step its batch is
    BoTorch's reference step on the same data (SingleTaskGP refit from its defaults, the same
    acquisition and random stream), to the optimiser's tolerance, with the same value."""
    bench = load_benchmark("bench_bo_agreement")
    argv = ["--function", "branin", "--method", "exact", "--q", "1", "--seeds", "0"]
    summary = bench.main([*argv, "--steps", "2", "--out", str(tmp_path)])
    assert summary["passed"] and summary["same_batch"] == 2 and summary["steps"] == 2
    assert "2 steps: the same batch as BoTorch's (to 0.001) on 2" in capsys.readouterr().out
    import json

    rows = json.loads((tmp_path / "branin_q1_exact.json").read_text())["steps"]
    for row in rows:
        assert row["distance"] < 1e-4
        assert abs(row["acq_loop"] - row["acq_botorch"]) <= 1e-6 * abs(row["acq_botorch"]) + 1e-9
