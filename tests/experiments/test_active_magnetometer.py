r"""``experiments/active_magnetometer.py``'s summary from the loop's records (the loop replaced by
records of known times and errors): medians and checks recomputed by hand."""

from __future__ import annotations

import json
import statistics
import sys
from types import SimpleNamespace

import torch
from script_modules import load_experiment


class _Loop:
    r"""Stands in for ``ActiveLearningLoop``: ``run`` returns fixed records, as the loop would."""

    acquisition = [0.4, 0.1, 0.3, 0.2]  # seconds per step; median 0.25 (the upper middle 0.3)

    def __init__(self, problem, **kwargs) -> None:
        self.records = [
            {"step": 0, "n": 10, "rmse": 2.0, "mean_var": 1.0, "time_acquisition": 0.0}
        ] + [
            {"step": k, "n": 10 + 6 * k, "rmse": 2.0 - 0.1 * k, "mean_var": 1.0}
            | {"time_acquisition": t}
            for k, t in enumerate(self.acquisition, start=1)
        ]
        for r in self.records:
            r.update(time_fit=0.01, time_update=0.001, time_step=r["time_acquisition"] + 0.011)

    def run(self, steps, callback=None):
        for r in self.records:
            callback(r)
        return self.records


def test_summary_median_of_an_even_number_of_steps(tmp_path, monkeypatch, capsys):
    module = load_experiment("active_magnetometer")
    problem = SimpleNamespace(X_pool=torch.zeros(100, 2), X_test=torch.zeros(50, 2))
    monkeypatch.setattr(module, "magnetometer_problem", lambda **kwargs: problem)
    monkeypatch.setattr(module, "ActiveLearningLoop", _Loop)
    out = tmp_path / "active.json"
    monkeypatch.setattr(sys, "argv", ["active_magnetometer.py", "--steps", "4", "--out", str(out)])
    assert module.main() == 0
    summary = json.loads(out.read_text())
    assert summary["median_time_acquisition"] == statistics.median(_Loop.acquisition)
    assert summary["rmse"] == [2.0, 1.9, 1.8, 1.7, 1.6]
    assert summary["time_step"] == [t + 0.011 for t in _Loop.acquisition]
    assert summary["checks"] == {"completed": True, "rmse_falls": True}
    assert "median acquisition 0.250 s/step" in capsys.readouterr().out
