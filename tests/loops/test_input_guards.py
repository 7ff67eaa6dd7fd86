"""What a user's own objective, data and options can do wrong, and what the loops do about it:
refuse before anything is evaluated or written, or treat the values as plain data."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from bo_online.errors import ObjectiveError
from bo_online.loops import (
    ActiveLearningLoop,
    BayesOptLoop,
    StreamingLoop,
    history,
    load_loop,
    without_timing,
)
from bo_online.models.registry import get_model_class
from bo_online.problems import CallableProblem, PoolProblem, StreamProblem, stream_arrays

BOUNDS = [[0.0, -5.0], [1.0, 5.0]]
SMALL_OPT = {"num_restarts": 2, "raw_samples": 16, "maxiter": 20}


def _quadratic(X: torch.Tensor) -> torch.Tensor:
    return ((X - torch.tensor([0.3, 1.0], dtype=X.dtype)) ** 2).sum(-1)


def _with_graph(X: torch.Tensor) -> torch.Tensor:
    """The quadratic, computed through a parameter that requires grad (as a torch model would)."""
    w = torch.ones(X.shape[-1], dtype=X.dtype, requires_grad=True)
    return ((X * w - torch.tensor([0.3, 1.0], dtype=X.dtype)) ** 2).sum(-1)


def _zeroes_its_input(X: torch.Tensor) -> torch.Tensor:
    y = _quadratic(X.clone())
    X.mul_(0.0)
    return y


def _returns_none(X: torch.Tensor) -> None:
    return None


def _exits(X: torch.Tensor) -> None:
    sys.exit(3)


def _loop(fn, tmp_path=None, **kwargs) -> BayesOptLoop:
    problem = CallableProblem(fn, bounds=BOUNDS, name="quad")
    out = None if tmp_path is None else tmp_path / "run"
    opts = {"model": "exact", "n_init": 4, "seed": 3, "optimizer_options": SMALL_OPT}
    return BayesOptLoop(problem, out_dir=out, quiet=True, **{**opts, **kwargs})


def test_raw_samples_below_restarts_is_refused_before_any_evaluation(tmp_path):
    calls = []

    def counted(X):
        calls.append(X.shape[0])
        return _quadratic(X)

    with pytest.raises(ValueError, match=r"raw_samples \(2\) must be at least num_restarts \(3\)"):
        _loop(counted, tmp_path, optimizer_options={"num_restarts": 3, "raw_samples": 2})
    with pytest.raises(ValueError, match="batch_limit must be an integer >= 1"):
        _loop(counted, tmp_path, optimizer_options={**SMALL_OPT, "batch_limit": 0})
    assert calls == [] and not (tmp_path / "run").exists()


def test_objective_values_that_carry_an_autograd_graph_are_used_as_data():
    plain, graph = _loop(_quadratic), _loop(_with_graph)
    plain.run(2)
    graph.run(2)  # failed in the first fit's backward pass ("backward through the graph twice")
    assert not graph.y.requires_grad
    torch.testing.assert_close(graph.X, plain.X, rtol=0, atol=1e-12)
    torch.testing.assert_close(graph.y, plain.y, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["exact", "tsvgp", "decoupled", "qsgp", "wiski"])
def test_models_fit_training_data_that_requires_grad_as_if_it_did_not(name):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(12, 2, generator=g, dtype=torch.float64)
    Y = torch.sin(6 * X).sum(-1, keepdim=True)
    cls = get_model_class(name)
    reference = cls(X, Y)
    reference.fit(max_iter=20)
    model = cls(X.clone().requires_grad_(), Y.clone().requires_grad_())
    model.fit(max_iter=20)  # the same fit, not an autograd error
    Xt = torch.rand(5, 2, generator=g, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(
            model.posterior(Xt).mean, reference.posterior(Xt).mean, rtol=1e-9, atol=1e-9
        )


def test_an_objective_that_writes_into_its_input_does_not_change_the_loops_points():
    plain, writer = _loop(_quadratic), _loop(_zeroes_its_input)
    plain.run(2)
    writer.run(2)
    torch.testing.assert_close(writer.X, plain.X, rtol=0, atol=1e-12)
    assert bool((writer.X.abs().sum(-1) > 0).all())


def test_initial_data_is_copied_and_detached():
    X = torch.tensor([[0.1, 0.0], [0.5, 2.0], [0.9, -3.0]], dtype=torch.float64)
    y = _quadratic(X).requires_grad_()
    loop = _loop(None, initial_data=(X, y), n_init=0)
    X.mul_(0.0)  # the user's tensor changes afterwards: the loop keeps what it was given
    loop.initialize()
    assert not loop.y.requires_grad and bool((loop.X.abs().sum(-1) > 0).all())


def test_problem_settings_and_an_objective_that_returns_none_are_reported():
    with pytest.raises(ValueError, match="noise_std must be a finite number"):
        CallableProblem(_quadratic, bounds=BOUNDS, noise_std=math.nan)
    with pytest.raises(ValueError, match="optimal_value must be finite"):
        CallableProblem(_quadratic, bounds=BOUNDS, optimal_value=math.inf)
    exits = CallableProblem(_exits, bounds=BOUNDS, name="exits")
    with pytest.raises(ObjectiveError, match=r"'exits' called sys.exit\(3\)"):
        exits.evaluate_true(torch.zeros(2, 2, dtype=torch.float64))
    problem = CallableProblem(_returns_none, bounds=BOUNDS, name="none")
    with pytest.raises(ObjectiveError, match="'none' returned None instead of one value per point"):
        problem.evaluate_true(torch.zeros(2, 2, dtype=torch.float64))
    # a string was reported as "Objective raised TypeError", as if the objective had raised
    text = CallableProblem(_returns_text, bounds=BOUNDS, name="text")
    with pytest.raises(ObjectiveError, match=r"'text' returned str 'ok', which is not numbers"):
        text.evaluate_true(torch.zeros(2, 2, dtype=torch.float64))


def _returns_text(X):
    return "ok"


def _stream(n: int = 40, n_test: int = 5) -> StreamProblem:
    g = torch.Generator().manual_seed(1)
    X = torch.rand(n + n_test, 2, generator=g, dtype=torch.float64)
    y = torch.sin(5 * X).sum(-1)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    return StreamProblem("toy", X[:n], y[:n], X[n:], y[n:], bounds)


def test_empty_or_negatively_cut_streams_are_refused():
    p = _stream()
    with pytest.raises(ValueError, match="X_test is empty"):
        StreamProblem("toy", p.X_stream, p.y_stream, p.X_test[:0], p.y_test[:0], p.bounds)
    arrays = (p.X_stream.numpy(), p.y_stream.numpy(), p.X_test.numpy(), p.y_test.numpy())
    for key in ("max_stream", "max_test"):
        for value in (0, -3):
            with pytest.raises(ValueError, match=f"{key} must be >= 1"):
                stream_arrays(*arrays, **{key: value})


def test_a_stream_run_past_its_rows_is_refused_before_it_runs_and_on_resume(tmp_path):
    out = tmp_path / "stream"
    kwargs = {"model": "exact", "n_init": 10, "eval_every": 5, "out_dir": out, "quiet": True}
    with pytest.raises(ValueError, match="steps=31 exceeds the 30 steps the data hold"):
        StreamingLoop(_stream(), **kwargs).run(31)
    assert not out.exists()
    StreamingLoop(_stream(), **kwargs).run(3)
    records = (out / "records.jsonl").read_text()
    resumed = load_loop(out, problem=_stream(), quiet=True)
    with pytest.raises(ValueError, match="exceeds the 30 steps"):
        resumed.run(100_000)  # ran every remaining row before failing at the end
    assert (out / "records.jsonl").read_text() == records
    assert json.loads(records.splitlines()[-1])["step"] == 3


def test_an_active_learning_run_larger_than_its_pool_is_refused_before_any_label(tmp_path):
    s = _stream(n=36)
    pool = PoolProblem("pool", s.X_stream, s.y_stream, s.X_test, s.y_test, s.bounds)
    out = tmp_path / "active"
    loop = ActiveLearningLoop(
        pool, model="exact", n_init=5, q=10, acq="random", out_dir=out, quiet=True
    )
    assert loop.max_steps() == 3  # 31 unlabelled points, 10 per step
    with pytest.raises(ValueError, match="steps=4 exceeds the 3 steps the data hold"):
        loop.run(4)
    assert not out.exists() and not loop.initialized
    # no steps given: say how many are needed (and allowed), not "got None"
    with pytest.raises(ValueError, match=r"run\(\) needs the number of steps.*at most 3\)"):
        loop.run()
    assert not out.exists() and not loop.initialized
    with pytest.raises(ValueError, match=r"BayesOptLoop.run\(\) needs the number of steps"):
        _loop(_quadratic).run()


def test_a_pool_without_test_rows_is_refused_when_built():
    """A PoolProblem built in Python with an empty test set was taken, and its run failed once
    the initial design was labelled and fitted, with torch's 'torch.cat(): expected a non-empty
    list of Tensors' (scoring the test set); a stream's problem refuses it when built."""
    s = _stream(n=36)
    with pytest.raises(ValueError, match="pool: X_test is empty; a pool problem needs at least"):
        PoolProblem("pool", s.X_stream, s.y_stream, s.X_test[:0], s.y_test[:0], s.bounds)
    with pytest.raises(ValueError, match="pool: X_pool is empty"):
        PoolProblem("pool", s.X_stream[:0], s.y_stream[:0], s.X_test, s.y_test, s.bounds)


def test_a_stream_with_fewer_rows_than_one_step_is_refused():
    with pytest.raises(ValueError, match="q=40 points per step, but the stream has 30 rows"):
        StreamingLoop(_stream(), model="exact", n_init=10, q=40, quiet=True)


def test_a_cli_objective_that_returns_none_is_reported_not_retried_point_by_point(recwarn):
    from bo_online.objectives import _Vectorised

    problem = CallableProblem(_Vectorised(_returns_none), bounds=BOUNDS, name="none")
    with pytest.raises(ObjectiveError, match="'none' returned None instead of one value"):
        problem.evaluate_true(torch.rand(4, 2, dtype=torch.float64))
    assert not [w for w in recwarn if "one point at a time" in str(w.message)]


@pytest.mark.parametrize("bad", [None, math.inf, "20", True, 2.5])
def test_optimizer_settings_that_are_not_positive_integers_are_value_errors(bad):
    from bo_online.acquisition import optimizer_kwargs

    with pytest.raises(ValueError, match="maxiter must be an integer >= 1"):
        optimizer_kwargs({"maxiter": bad})
    assert optimizer_kwargs({"maxiter": 20.0})["options"]["maxiter"] == 20


def test_the_active_loops_step_limit_follows_the_points_tell_labelled(tmp_path):
    s = _stream(n=20)
    pool = PoolProblem("pool", s.X_stream, s.y_stream, s.X_test, s.y_test, s.bounds)
    loop = ActiveLearningLoop(pool, model="exact", n_init=5, q=5, acq="random", quiet=True)
    assert loop.max_steps() == 3
    loop.initialize()
    for i in range(3):  # the user labels one point per step
        free = int((~loop.used).nonzero()[0])
        loop.tell(torch.tensor([free]))
    assert loop.max_steps() == 5  # 3 steps done, 12 unlabelled points: two more of 5
    loop.run(5)
    assert loop.step_count == 5 and int((~loop.used).sum()) == 2


def test_telling_no_points_is_refused_and_counts_no_step():
    loop = _loop(_quadratic)
    loop.initialize()
    with pytest.raises(ValueError, match="tell\\(\\) got no points"):
        loop.tell(torch.zeros(0, 2, dtype=torch.float64), torch.zeros(0, dtype=torch.float64))
    assert loop.step_count == 0
    s = _stream(n=20)
    pool = PoolProblem("pool", s.X_stream, s.y_stream, s.X_test, s.y_test, s.bounds)
    active = ActiveLearningLoop(pool, model="exact", n_init=5, q=5, acq="random", quiet=True)
    active.initialize()
    with pytest.raises(ValueError, match="no pool indices"):
        active.tell(torch.zeros(0, dtype=torch.long))
    assert active.step_count == 0


def _complex_numpy(X):
    return X.sum(-1).numpy() + 1e-3j


def _complex_tensor(X):
    return torch.complex(X.sum(-1), X[:, 0])


def _complex_list(X):
    return [complex(v, 1.0) for v in X.sum(-1).tolist()]


@pytest.mark.parametrize("fn", [_complex_numpy, _complex_tensor, _complex_list])
def test_an_objective_that_returns_complex_values_is_reported_not_cut_to_its_real_part(fn, recwarn):
    """``torch.as_tensor(complex, dtype=float64)`` drops the imaginary part with a warning; the
    loop then optimised the real part silently. Also through the CLI's wrapper, which must not
    take it for a per-point function."""
    from bo_online.objectives import _Vectorised

    for wrapped in (fn, _Vectorised(fn)):
        problem = CallableProblem(wrapped, bounds=BOUNDS, name="cplx")
        with pytest.raises(ObjectiveError, match="'cplx' returned complex values; it must"):
            problem.evaluate_true(torch.rand(4, 2, dtype=torch.float64))
    assert not [w for w in recwarn if "one point at a time" in str(w.message)]
    assert not [w for w in recwarn if "imaginary" in str(w.message)]


def test_values_that_are_not_numbers_are_refused_naming_the_argument(tmp_path):
    """``tell(X, ["a", "b"])`` failed with torch's bare ``too many dimensions 'str'``, and a
    failed measurement left as None with ``TypeError: must be real number, not NoneType``,
    neither naming the argument. Both are a ValueError that names it and says what to do; the
    loop is unchanged and takes the values once they are numbers."""
    X = torch.tensor([[0.1, 0.0], [0.5, 2.0], [0.9, -3.0]], dtype=torch.float64)
    y = _quadratic(X)
    with pytest.raises(ValueError, match=r"initial_data y must hold real numbers only"):
        _loop(None, initial_data=(X, [1.0, None, 2.0]), n_init=0)
    loop = _loop(None, tmp_path, initial_data=(X, y), n_init=0)
    loop.initialize()
    x = loop.ask()
    before = (loop.X.clone(), loop.y.clone(), loop.step_count)
    for bad, why in (
        (["a"] * x.shape[0], "too many dimensions 'str'"),
        ([None] * x.shape[0], "must be real number, not NoneType"),
    ):
        with pytest.raises(ValueError, match=r"tell\(\) y must hold real numbers only") as e:
            loop.tell(x, bad)
        assert why in str(e.value) and "leave out points that have no value" in str(e.value)
    with pytest.raises(ValueError, match=r"tell\(\) X must hold real numbers only"):
        loop.tell([["0.5", "1"]], [1.0])
    assert torch.equal(loop.X, before[0]) and torch.equal(loop.y, before[1])
    assert loop.step_count == before[2]
    record = loop.tell(x, [float(v) for v in _quadratic(x)])
    assert record["n"] == X.shape[0] + x.shape[0]


def test_complex_data_from_the_user_is_refused_not_cut_to_its_real_part(tmp_path, recwarn):
    X = torch.tensor([[0.1, 0.0], [0.5, 2.0], [0.9, -3.0]], dtype=torch.float64)
    y = _quadratic(X)
    with pytest.raises(ValueError, match="initial_data y holds complex values"):
        _loop(None, initial_data=(X, y.numpy() + 1j), n_init=0)
    with pytest.raises(ValueError, match="initial_data X holds complex values"):
        _loop(None, initial_data=(X.to(torch.complex128), y), n_init=0)
    loop = _loop(None, tmp_path, initial_data=(X, y), n_init=0)
    loop.initialize()
    x = loop.ask()
    before = (loop.X.clone(), loop.y.clone(), loop.step_count)
    with pytest.raises(ValueError, match=r"tell\(\) y holds complex values"):
        loop.tell(x, [complex(1.0, 2.0)] * x.shape[0])
    with pytest.raises(ValueError, match=r"tell\(\) y_true holds complex values"):
        loop.tell(x, _quadratic(x), y_true=_quadratic(x).numpy() * 1j)
    assert torch.equal(loop.X, before[0]) and torch.equal(loop.y, before[1])
    assert loop.step_count == before[2]
    s = _stream()
    with pytest.raises(ValueError, match="pool: y_pool holds complex values"):
        PoolProblem("pool", s.X_stream, s.y_stream.numpy() + 0j, s.X_test, s.y_test, s.bounds)
    assert not [w for w in recwarn if "imaginary" in str(w.message)]


def test_a_wiski_classification_stream_above_three_inputs_gets_wiski_loop_defaults():
    """The regression WISKI's structure for 4-6 inputs (all pairs) was not given to the class
    models of a classification stream: it failed with the message naming that default."""
    from bo_online.models import WISKI

    g = torch.Generator().manual_seed(2)
    X = torch.rand(70, 4, generator=g, dtype=torch.float64)
    labels = (X[:, 0] + X[:, 1] * X[:, 2] > 0.8).double()
    bounds = torch.tensor([[0.0] * 4, [1.0] * 4], dtype=torch.float64)
    problem = StreamProblem(
        "cls4", X[:60], labels[:60], X[60:], labels[60:], bounds, task="classification"
    )
    loop = StreamingLoop(problem, model="wiski", n_init=20, eval_every=5, quiet=True)
    records = loop.run(10)
    assert records[-1]["step"] == 10
    regression = WISKI(X, labels.unsqueeze(-1), **WISKI.loop_default_options(4))
    for class_model in loop.model.models:
        assert class_model.num_grid_points == regression.num_grid_points  # all 6 pairs


def _pool_with_repeated_readings():
    from bo_online.problems import PoolProblem

    g = torch.Generator().manual_seed(0)
    base = torch.rand(6, 2, generator=g, dtype=torch.float64)
    X = base.repeat_interleave(20, 0)  # 6 places, 20 readings at each
    y = torch.sin(4 * X[:, 0]) + X[:, 1] + 0.1 * torch.randn(120, generator=g, dtype=torch.float64)
    Xt = torch.rand(50, 2, generator=g, dtype=torch.float64)
    yt = torch.sin(4 * Xt[:, 0]) + Xt[:, 1]
    box = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    return PoolProblem("repeats", X, y, Xt, yt, box)


def test_pool_selection_with_repeated_inputs_labels_q_distinct_rows():
    """Repeated readings at one place are common in real pools: ``selection="pool"`` mapped
    both copies BoTorch picked to the first one, and ``tell`` refused the repeated row."""
    from bo_online.loops import ActiveLearningLoop

    loop = ActiveLearningLoop(
        _pool_with_repeated_readings(), model="exact", q=6, n_init=4, seed=0, selection="pool"
    )
    for _ in range(3):
        idx = loop.ask()
        assert idx.unique().numel() == 6
        loop.tell(idx)
    assert loop.chosen.unique().numel() == 4 + 18


def test_pool_candidates_fewer_than_q_and_bad_tell_indices_are_refused():
    from bo_online.loops import ActiveLearningLoop

    problem = _pool_with_repeated_readings()
    with pytest.raises(ValueError, match=r"num_pool_candidates \(2\) must be at least q \(4\)"):
        ActiveLearningLoop(problem, q=4, selection="pool", num_pool_candidates=2)
    loop = ActiveLearningLoop(problem, model="exact", q=2, n_init=4, seed=0)
    loop.initialize()
    with pytest.raises(ValueError, match="no pool indices"):
        loop.tell([])  # (an empty list is a float tensor to torch: the empty check comes first)
    free = (~loop.used).nonzero().reshape(-1)
    size = loop.used.shape[0]
    for bad, match in (
        ([int(free[0]), int(free[0]) - size], "outside"),  # one row twice, through -k
        ([size], "outside"),
        (torch.tensor([float(free[0]), float(free[1])]), "integer pool row indices"),
    ):
        before = loop.used.clone()
        with pytest.raises(ValueError, match=match):
            loop.tell(bad)
        assert torch.equal(loop.used, before) and loop.step_count == 0


def _refuse(*args, **kwargs):
    raise ValueError("refused")


def _assert_same_posterior(model, reference) -> None:
    U = torch.rand(10, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(
            model.posterior(U).mean, reference.posterior(U).mean, rtol=0, atol=0
        )


def test_an_update_the_model_refuses_leaves_the_pool_rows_unlabelled(monkeypatch):
    """The active loop marked the told rows labelled before the surrogate took them: when the
    model refused the update (a ValueError that says what to change), the rows stayed marked,
    a second tell of them was refused as "already labelled" and the loop's n counted rows the
    model never held. The rows are now marked only once the model has them."""
    from bo_online.loops import ActiveLearningLoop

    problem = _pool_with_repeated_readings()
    kw = dict(model="exact", acq="random", q=2, n_init=4, seed=0, fit_max_iter=0)
    loop = ActiveLearningLoop(problem, **kw)
    loop.initialize()
    reference = ActiveLearningLoop(problem, **kw)
    reference.initialize()
    rows = (~loop.used).nonzero().reshape(-1)[:2]
    used, chosen = loop.used.clone(), loop.chosen.clone()
    update = loop.model.update

    monkeypatch.setattr(loop.model, "update", _refuse)
    with pytest.raises(ValueError, match="refused"):
        loop.tell(rows)
    assert torch.equal(loop.used, used) and torch.equal(loop.chosen, chosen)
    assert loop.step_count == 0 and loop.model.train_X.shape[0] == 4
    monkeypatch.setattr(loop.model, "update", update)
    record = loop.tell(rows)  # the same rows again, now taken
    expected = reference.tell(rows)
    assert record["n"] == expected["n"] == 6 and loop.model.train_X.shape[0] == 6
    _assert_same_posterior(loop.model, reference.model)


def test_a_stream_update_the_model_refuses_can_be_told_again(monkeypatch):
    """A stream's tell() forgot the asked rows before the surrogate took them: when the model
    refused the update, the loop was unchanged but a second tell() of the same rows was refused
    ("must receive the rows the last ask() returned"). Now the rows stay asked until the model
    has them, and the retried step equals the step of a loop that never failed."""
    from bo_online.loops import StreamingLoop

    kw = dict(model="exact", q=2, n_init=6, seed=0, fit_max_iter=0)
    loop, reference = StreamingLoop(_stream(), **kw), StreamingLoop(_stream(), **kw)
    rows, expected_rows = loop.ask(), reference.ask()
    update = loop.model.update

    monkeypatch.setattr(loop.model, "update", _refuse)
    with pytest.raises(ValueError, match="refused"):
        loop.tell(rows)
    assert loop.position == 6 and loop.step_count == 0 and loop.model.train_X.shape[0] == 6
    monkeypatch.setattr(loop.model, "update", update)
    record, expected = loop.tell(rows), reference.tell(expected_rows)
    assert record["n"] == expected["n"] == 8 and loop.model.train_X.shape[0] == 8
    assert record["prequential_nll"] == expected["prequential_nll"]
    _assert_same_posterior(loop.model, reference.model)


def test_a_magnetometer_track_named_twice_is_refused(tmp_path):
    from bo_online.datasets import load_magnetometer

    with pytest.raises(ValueError, match="more than once"):
        load_magnetometer(tracks=(1, 1), data_dir=tmp_path)  # refused before any file is read


def test_test_nll_of_targets_on_a_tiny_scale_is_the_unit_scale_nll_plus_log_scale():
    """The surrogate standardises its targets, so scaling them by c moves the Gaussian NLL by
    exactly log c. GPyTorch's variance floor (1e-10 in the user's units) used to cut it: at
    c = 1e-9 the reported NLL was -10.6 where it is -21.3."""
    from bo_online.loops.active import predictive_metrics
    from bo_online.models import OnlineExactGP

    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g, dtype=torch.float64)
    y = torch.sin(5 * X[:, 0]) + X[:, 1] + 0.05 * torch.randn(40, generator=g, dtype=torch.float64)
    Xt = torch.rand(30, 2, generator=g, dtype=torch.float64)
    yt = torch.sin(5 * Xt[:, 0]) + Xt[:, 1]
    unit = predictive_metrics(OnlineExactGP(X, y.unsqueeze(-1)).fit(max_iter=50), Xt, yt)
    for scale in (1e-3, 1e-9):
        model = OnlineExactGP(X, scale * y.unsqueeze(-1)).fit(max_iter=50)
        scaled = predictive_metrics(model, Xt, scale * yt)
        assert scaled["nll"] == pytest.approx(unit["nll"] + math.log(scale), abs=1e-5), scale
        assert scaled["rmse"] == pytest.approx(scale * unit["rmse"], rel=1e-5), scale


def test_a_float32_models_metrics_are_scored_against_the_targets_as_given():
    """Targets 1e8 + O(1) collapse to one float32 value (the float32 spacing there is 8): the
    metrics cast the test targets to the model's dtype too and reported RMSE 0 for a model
    that learned nothing. They are scored in float64 against the targets as given."""
    from bo_online.loops.active import predictive_metrics
    from bo_online.models import OnlineExactGP

    g = torch.Generator().manual_seed(0)
    X = torch.rand(30, 2, generator=g, dtype=torch.float64)
    Xt = torch.rand(20, 2, generator=g, dtype=torch.float64)
    yt = 1e8 + torch.sin(5 * Xt[:, 0])
    model = OnlineExactGP(X.float(), (1e8 + torch.sin(5 * X[:, :1])).float())
    metrics = predictive_metrics(model, Xt.float(), yt)
    with torch.no_grad():
        mean = model.posterior(Xt.float().unsqueeze(-2)).mean.reshape(-1).double()
    expected = float((mean - yt).pow(2).mean().sqrt())
    assert expected > 0.1  # the premise: float32 cannot hold these targets' spread
    assert metrics["rmse"] == pytest.approx(expected, rel=1e-9)


def test_acquisition_options_an_acquisition_does_not_read_are_refused(tmp_path):
    """A misspelt ``beta`` (or an option of another acquisition) was silently ignored: the run
    went on with the default. Now refused when the loop (or a sweep spec) is built; a run saved
    before, whose config kept every CLI flag's option, still resumes."""
    from bo_online.sweep import campaigns

    with pytest.raises(ValueError, match=r"'betaa' is not read by qucb; .* beta, beta_schedule"):
        _loop(_quadratic, acq="qucb", acq_options={"betaa": 0.5})
    with pytest.raises(ValueError, match="'num_candidates' is not read by logei"):
        _loop(_quadratic, acq="logei", acq_options={"num_candidates": 64})
    _loop(_quadratic, acq="ts", acq_options={"num_candidates": 64})  # read by ts: accepted
    s = _stream(n=36)
    pool = PoolProblem("pool", s.X_stream, s.y_stream, s.X_test, s.y_test, s.bounds)
    with pytest.raises(ValueError, match="'beta' is not read by qnipv"):
        ActiveLearningLoop(pool, acq="qnipv", acq_options={"beta": 1.0}, quiet=True)
    # the integration points are the loop's num_mc_points, not an acquisition option
    with pytest.raises(ValueError, match="'num_mc_points' is not read by qnipv"):
        ActiveLearningLoop(pool, acq="qnipv", acq_options={"num_mc_points": 100}, quiet=True)
    with pytest.raises(ValueError, match="'betaa' is not read by random; its options: none"):
        ActiveLearningLoop(pool, acq="random", acq_options={"betaa": 1.0}, quiet=True)
    spec = {
        "steps": 1,
        "problems": ["branin"],
        "models": ["exact"],
        "acqs": ["qucb"],
        "seeds": [0],
        "options": {"acq_options": {"betaa": 0.5}},
    }
    with pytest.raises(ValueError, match="'betaa': read by none of the acquisitions qucb"):
        campaigns(spec)
    # [options] is shared: each acquisition of the sweep takes the options it reads
    spec["acqs"] = ["qucb", "ts"]
    spec["options"] = {"acq_options": {"beta": 0.5, "num_candidates": 64}}
    runs = {c.acq: c.options["acq_options"] for c in campaigns(spec)}
    assert runs == {"qucb": {"beta": 0.5}, "ts": {"num_candidates": 64}}

    kw = dict(acq="logei", acq_options={"num_mc_samples": 64})
    reference = _loop(_quadratic, **kw).run(2)
    _loop(_quadratic, tmp_path=tmp_path, **kw).run(1)
    ckpt_path = tmp_path / "run" / history.CHECKPOINT_FILE
    ckpt = history.load_checkpoint(ckpt_path)
    ckpt["config"]["acq_options"].update(beta=2.0, beta_schedule="constant", num_candidates=9)
    history.save_checkpoint(ckpt_path, ckpt)
    problem = CallableProblem(_quadratic, bounds=BOUNDS, name="quad")
    resumed = load_loop(tmp_path / "run", problem=problem).run(2)
    assert [r["best_value"] for r in resumed] == [r["best_value"] for r in reference]


@pytest.mark.parametrize(
    "acq, options, message",
    [
        ("qucb", {"beta": -1.0}, "beta must be a finite number >= 0, got -1.0"),
        ("qucb", {"beta": float("nan")}, "beta must be a finite number >= 0"),
        ("qucb", {"beta": "2"}, "beta must be a finite number >= 0, got '2'"),
        ("qucb", {"beta_schedule": "kandasamyy"}, "beta_schedule must be one of constant"),
        ("qucb", {"beta_schedule": "srinivas", "delta": 5}, r"delta .* in \(0, 1\), got 5"),
        ("qucb", {"num_mc_samples": 0}, "num_mc_samples must be an integer >= 1, got 0"),
        ("logei", {"num_mc_samples": 2.5}, "num_mc_samples must be an integer >= 1, got 2.5"),
        ("ts", {"num_candidates": 0}, "num_candidates must be an integer >= 1, got 0"),
        ("qlognei", {"max_baseline": 0}, "max_baseline must be an integer >= 1, got 0"),
        ("qlognei", {"prune_baseline": "no"}, "prune_baseline must be true or false, got 'no'"),
    ],
)
def test_acquisition_option_values_it_cannot_use_are_refused_before_any_evaluation(
    tmp_path, acq, options, message
):
    """A value an acquisition cannot use (``beta = -1``, ``num_candidates = 0``, an unknown
    ``beta_schedule``) was taken, the initial design evaluated and written, and the run failed
    at its first acquisition ("math domain error", a tensor of negative size), in a sweep on
    the cluster, its campaign's directory then holding the bad setting, which the sweep refused
    to change; 2.5 MC samples ran as 2 and ``prune_baseline = "no"`` as True. Refused now when
    the loop (or the sweep's campaigns) is built, before anything is evaluated or written."""
    from bo_online.sweep import campaigns

    calls = []
    with pytest.raises(ValueError, match=message):
        _loop(lambda X: calls.append(X) or _quadratic(X), tmp_path, acq=acq, acq_options=options)
    assert not calls and not (tmp_path / "run").exists()
    spec = {
        "steps": 1,
        "problems": ["branin"],
        "models": ["exact"],
        "acqs": [acq],
        "seeds": [0],
        "options": {"acq_options": options},
    }
    with pytest.raises(ValueError, match=message):
        campaigns(spec)


def test_thompson_sampling_with_fewer_candidates_than_the_batch_is_refused(tmp_path):
    """Thompson sampling draws the q points of a batch among its ``num_candidates`` without
    replacement: fewer candidates than q failed at the first step, after the initial design
    had been evaluated, with torch's "selected index k out of range". Refused when the loop is
    built; q candidates give q distinct points."""
    calls = []
    with pytest.raises(ValueError, match="q = 3 points .* num_candidates = 2 candidates"):
        _loop(
            lambda X: calls.append(X) or _quadratic(X),
            tmp_path,
            acq="ts",
            q=3,
            acq_options={"num_candidates": 2},
        )
    assert not calls and not (tmp_path / "run").exists()
    loop = _loop(_quadratic, acq="ts", q=3, acq_options={"num_candidates": 3})
    X = loop.ask()
    assert X.shape == (3, 2) and torch.pdist(X).min() > 0


def test_acquisition_option_values_in_range_are_taken():
    """The edges of the value checks: ``beta = 0`` (the posterior mean), a callable schedule,
    NumPy's numbers and a whole float count are the values the acquisition then uses."""
    import numpy as np

    from bo_online.acquisition import build_acquisition, check_acq_options

    for acq, options in [
        ("qucb", {"beta": 0, "beta_schedule": lambda t, d: 0.25, "num_mc_samples": 64.0}),
        ("qucb", {"beta": np.float32(0.5), "beta_schedule": "srinivas", "delta": 0.05}),
        ("qlognei", {"prune_baseline": np.bool_(False), "max_baseline": np.int64(3)}),
        ("ts", {"num_candidates": 64}),
    ]:
        check_acq_options(acq, options)
    model = _loop(_quadratic)
    model.initialize()
    ucb = build_acquisition(
        "qucb", model.model, q=1, step=3, dim=2, options={"beta_schedule": lambda t, d: 0.25}
    )
    assert ucb.beta_prime == pytest.approx(math.sqrt(0.25 * math.pi / 2))
    ucb = build_acquisition(
        "qucb", model.model, q=1, step=3, dim=2, options={"beta": np.float32(0.5)}
    )
    assert ucb.beta_prime == pytest.approx(math.sqrt(0.5 * math.pi / 2))


def test_targets_given_n_by_1_and_a_box_given_as_a_list_are_the_same_problem():
    """A stream or pool with y given N x 1 (accepted by the problem's checks) broadcast the
    loop's prequential errors to q x q: other pred_rmse/NLL than the same data with y given N,
    and records holding [[y]]. A box given as a list was accepted and then failed in the loop.
    Both are now normalised when the problem is built."""
    s = _stream(n=40, n_test=8)
    column = StreamProblem(
        "s",
        s.X_stream,
        s.y_stream.unsqueeze(-1),
        s.X_test,
        s.y_test.unsqueeze(-1),
        s.bounds.tolist(),
    )
    assert column.y_stream.shape == s.y_stream.shape and torch.is_tensor(column.bounds)
    kw = dict(model="exact", n_init=10, q=5, eval_every=2, seed=0, quiet=True)
    want, got = StreamingLoop(s, **kw).run(4), StreamingLoop(column, **kw).run(4)
    assert [r.get("pred_rmse") for r in got] == [r.get("pred_rmse") for r in want]
    assert got[-1]["y"] == want[-1]["y"] and got[-1]["test_nll"] == want[-1]["test_nll"]
    pool = PoolProblem(
        "p", s.X_stream, s.y_stream.unsqueeze(-1), s.X_test, s.y_test, s.bounds.tolist()
    )
    assert pool.y_pool.shape == (40,) and pool.bounds.dtype == torch.float64


def test_a_qnipv_run_saved_with_num_mc_points_as_an_acquisition_option_resumes_as_it_ran(
    tmp_path,
):
    """Before unread acquisition options were refused, ``acq_options={"num_mc_points": k}``
    set the Sobol integration points of a qNIPV run (``integrate_over="sobol"``); such a
    checkpoint resumes with k points, as its run drew them."""
    s = _stream(n=60, n_test=10)
    pool = PoolProblem("pool", s.X_stream, s.y_stream, s.X_test, s.y_test, s.bounds)
    kw = dict(
        model="exact",
        acq="qnipv",
        integrate_over="sobol",
        n_init=6,
        q=2,
        seed=1,
        quiet=True,
        optimizer_options=SMALL_OPT,
    )
    reference = ActiveLearningLoop(pool, num_mc_points=32, **kw).run(3)
    out = tmp_path / "run"
    ActiveLearningLoop(pool, num_mc_points=32, out_dir=out, **kw).run(1)
    path = out / history.CHECKPOINT_FILE
    ckpt = history.load_checkpoint(path)  # as the older code stored it
    ckpt["config"]["num_mc_points"] = 256
    ckpt["config"]["acq_options"] = {"num_mc_points": 32}
    history.save_checkpoint(path, ckpt)
    resumed = load_loop(out, problem=pool).run(3)
    assert without_timing(resumed) == without_timing(reference)


def test_points_on_the_boundary_given_in_float32_are_accepted_and_clamped_to_the_box():
    # 1e-3 in float32 is 1.0000000475e-3: past the box by float32 rounding, not by 1e-9 of it
    bounds = torch.tensor([[0.0, -5.0], [1e-3, 5.0]], dtype=torch.float64)
    X0 = torch.tensor([[0.0, 0.0], [5e-4, 1.0], [1e-4, -2.0], [1e-3, 4.0]])  # float32
    y0 = torch.tensor([1.0, 2.0, 0.5, 3.0])
    problem = CallableProblem(None, bounds=bounds, name="thin")
    loop = BayesOptLoop(problem, initial_data=(X0, y0), n_init=0, acq="logei", quiet=True)
    loop.initialize()
    loop.tell(torch.tensor([[1e-3, 0.3]]), torch.tensor([0.1]))  # a float32 copy of ask()'s
    assert loop.X.dtype == torch.float64 and bool((loop.X[:, 0] <= 1e-3).all())
    assert loop.X[-1, 0] == 1e-3 and loop.y.shape == (5,)
    with pytest.raises(ValueError, match="outside the problem's bounds"):  # truly outside
        loop.tell(torch.tensor([[1.001e-3, 0.3]]), torch.tensor([0.1]))
    with pytest.raises(ValueError, match="outside the problem's bounds"):  # float64: 1e-9 only
        loop.tell(torch.tensor([[1e-3 * (1 + 1e-7), 0.3]], dtype=torch.float64), [0.1])
    assert loop.X.shape == (5, 2) and loop.step_count == 1


def test_float32_rounding_never_accepts_points_far_outside_a_box_far_from_zero():
    # On 1e6 + [0, 1] a few float32 steps (0.0625 each) are ~0.95 of the box: 1e6 + 1.875 was
    # accepted and recorded at 1e6 + 1. The rounding tolerance is capped at 1e-3 of the width.
    for offset, inside in ((1e6, 1.0), (1e4 + 0.4, 1.0)):  # fl32(1e4 + 1.4) is 4e-4 beyond
        bounds = torch.tensor([[offset, 0.0], [offset + 1, 1.0]], dtype=torch.float64)
        X0 = bounds[0] + torch.tensor([[0.1, 0.1], [0.5, 0.5], [0.9, 0.9]], dtype=torch.float64)
        problem = CallableProblem(None, bounds=bounds, name="offset")
        loop = BayesOptLoop(problem, initial_data=(X0, torch.tensor([1.0, 2, 3])), n_init=0)
        loop.initialize()
        with pytest.raises(ValueError, match="outside the problem's bounds"):
            loop.tell(torch.tensor([[offset + 1.875, 0.5]]), torch.tensor([0.1]))
        loop.tell(torch.tensor([[offset + inside, 0.5]]), torch.tensor([0.1]))  # float32
        assert loop.X[-1, 0] == offset + 1 and loop.X.shape == (4, 2)


def test_values_told_by_the_user_survive_a_resume(tmp_path):
    # A tell() the user calls brings values the loop cannot evaluate again: a resume used to
    # drop every record after the last (time-paced) checkpoint, deleting them from the file.
    problem = CallableProblem(None, bounds=BOUNDS, name="lab")
    X0 = torch.tensor([[0.1, 0.0], [0.5, 2.0], [0.9, -3.0]], dtype=torch.float64)
    out = tmp_path / "run"
    opts = {"n_init": 0, "acq": "logei", "optimizer_options": SMALL_OPT, "fit_max_iter": 5}
    loop = BayesOptLoop(problem, initial_data=(X0, _quadratic(X0)), out_dir=out, **opts)
    for _ in range(2):
        X = loop.ask()
        loop.tell(X, _quadratic(X))  # "measured in the lab"
    loop.tell(torch.tensor([0.3, 1.0]), torch.tensor([0.0]))  # a point of the user's own
    resumed = load_loop(out, problem=problem)
    assert resumed.step_count == 3 and len(history.read_records(out)) == 4
    torch.testing.assert_close(resumed.X, loop.X, rtol=0, atol=0)
    assert resumed.records[-1]["best_value"] == 0.0
    resumed._lock.release()

    X, y = torch.rand(40, 2, dtype=torch.float64), torch.rand(40, dtype=torch.float64)
    pool = PoolProblem("mine", X[:30], y[:30], X[30:], y[30:], torch.tensor([[0.0, 0], [1, 1]]))
    active = ActiveLearningLoop(pool, n_init=4, q=2, out_dir=tmp_path / "pool", fit_max_iter=5)
    active.initialize()
    free = (~active.used).nonzero().reshape(-1)
    active.tell(free[:3])  # rows the user chose, not ask()'s
    back = load_loop(tmp_path / "pool", problem=pool)
    assert back.step_count == 1 and back.chosen.tolist() == active.chosen.tolist()
    assert len(history.read_records(tmp_path / "pool")) == 2
    back._lock.release()


def test_an_objective_failing_mid_run_leaves_a_checkpoint_of_its_last_whole_step(tmp_path):
    """An objective that raised mid-run left the checkpoint of the initial design (the only
    one written by elapsed time in a short run): a resume evaluated every step since then
    again, each a costly evaluation (or a lab's). The run now checkpoints its last whole step,
    and the resumed run ends where an uninterrupted one does."""
    calls = {"n": 0}

    def flaky(X: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 4:  # the initial design is one call, then steps 1-2, then step 3
            raise RuntimeError("the instrument went offline")
        return _quadratic(X)

    loop = _loop(flaky, tmp_path, checkpoint_seconds=1e9)
    with pytest.raises(ObjectiveError, match="the instrument went offline"):
        loop.run(5)
    assert loop.step_count == 2
    problem = CallableProblem(_quadratic, bounds=BOUNDS, name="quad")
    resumed = load_loop(tmp_path / "run", problem=problem, quiet=True)
    assert resumed.step_count == 2  # not 0: steps 1 and 2 are not evaluated again
    resumed.run(5)
    whole = _loop(_quadratic, None)
    whole.run(5)
    assert without_timing(resumed.records) == without_timing(whole.records)
