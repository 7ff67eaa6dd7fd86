"""A stream whose rows after the initial design are not a multiple of q: the last step takes the
rows left, so every row is predicted and learned (the last 1 to q - 1 were dropped)."""

from __future__ import annotations

import pytest
import torch

from bo_online.loops import StreamingLoop
from bo_online.problems import StreamProblem

DTYPE = torch.float64


def _problem(n: int = 27) -> StreamProblem:
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n + 10, 2, generator=g, dtype=DTYPE)
    y = torch.sin(4 * X[:, 0]) + X[:, 1] ** 2 + 0.05 * torch.randn(n + 10, generator=g, dtype=DTYPE)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DTYPE)
    return StreamProblem("tail", X[:n], y[:n], X[n:], y[n:], bounds)


def test_the_last_step_takes_the_rows_left_and_the_model_holds_them_all():
    problem = _problem(27)
    loop = StreamingLoop(problem, model="exact", n_init=5, q=4, eval_every=2, quiet=True)
    assert loop.default_steps() == 6  # five steps of 4 rows, one of the 2 left
    records = loop.run()
    assert [len(r["rows"]) for r in records[1:]] == [4, 4, 4, 4, 4, 2]
    told = torch.cat([torch.as_tensor(r["rows"]) for r in records[1:]])
    assert told.tolist() == list(range(5, 27))
    assert records[-1]["n"] == 27 and loop.num_predicted == 22
    # the exact GP holds all 27 rows, in stream order, not the first 25
    U, y = loop._training_data()
    assert U.shape[0] == 27
    assert torch.equal(loop.model.train_X, loop.U_stream)
    torch.testing.assert_close(loop.model.train_targets.reshape(-1), y.reshape(-1))


def test_the_streams_last_step_records_the_test_metrics_off_the_eval_grid():
    r"""A stream whose last step (6) is off the ``eval_every`` grid (4) still records the test
    metrics there, of the model that has learnt every row: its test RMSE equals the RMSE of that
    model's predictive mean (mapped back to the targets' units) computed by hand."""
    problem = _problem(27)
    loop = StreamingLoop(problem, model="exact", n_init=5, q=4, eval_every=4, quiet=True)
    records = loop.run()
    assert [r["test_rmse"] is not None for r in records] == [s in (0, 4, 6) for s in range(7)]
    with torch.no_grad():
        mean = loop.model.posterior(loop.U_test).mean.reshape(-1)
    mean = mean * loop.target_scale + loop.target_shift
    rmse = float((mean - problem.y_test).pow(2).mean().sqrt())
    assert records[-1]["n"] == 27
    assert records[-1]["test_rmse"] == pytest.approx(rmse, rel=1e-6)
