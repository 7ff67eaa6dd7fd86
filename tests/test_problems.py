r"""Problems: test functions by name (optimum, dims, noise), user callables, pools from real
data."""

from __future__ import annotations

import csv
import math
import warnings

import numpy as np
import pytest
import torch

from bo_online import datasets
from bo_online.errors import ObjectiveError
from bo_online.problems import (
    SYNTHETIC_PROBLEMS,
    CallableProblem,
    PoolProblem,
    StreamProblem,
    SyntheticProblem,
    from_unit,
    magnetometer_problem,
    make_problem,
    problem_names,
    synthetic_problem,
    to_unit,
    uci_problem,
)

REQUIRED = [
    "branin",
    "hartmann3",
    "hartmann6",
    "ackley",
    "levy",
    "rastrigin",
    "griewank",
    "michalewicz",
    "styblinskitang",
    "rosenbrock",
]


def _data_or_skip():
    root = datasets.resolve_data_dir()
    if not (root / "magnetometer" / "1-loc.csv").is_file():
        pytest.skip(f"real data not found under {root}")
    return root


@pytest.mark.parametrize("name", REQUIRED)
def test_known_optimum_is_attained_at_the_known_minimiser(name):
    dim = {"michalewicz": 2}.get(name)
    p = synthetic_problem(name, dim=dim)
    assert p.optimal_value is not None and not p.maximize
    # independent: the published minimiser (BoTorch's table) attains the published optimum
    x_star = torch.tensor(p._fn._optimizers[0], dtype=torch.float64).reshape(1, -1)
    assert float(p.evaluate_true(x_star)) == pytest.approx(p.optimal_value, abs=1e-4)
    assert p.regret(float(p.evaluate_true(x_star))) == pytest.approx(0.0, abs=1e-4)
    # anywhere else the value is no better than the optimum and the regret is >= 0
    X = from_unit(
        torch.rand(64, p.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0)),
        p.bounds,
    )
    values = p.evaluate_true(X)
    assert bool((values >= p.optimal_value - 1e-6).all())
    assert p.regret(float(values.min())) >= 0


def test_formulas_by_hand():
    # Branin at (pi, 2.275) and Rastrigin/Levy at simple points, computed independently
    b = synthetic_problem("branin")
    x1, x2 = math.pi, 2.275
    a, bb, c, r, s, t = 1, 5.1 / (4 * math.pi**2), 5 / math.pi, 6, 10, 1 / (8 * math.pi)
    by_hand = a * (x2 - bb * x1**2 + c * x1 - r) ** 2 + s * (1 - t) * math.cos(x1) + s
    assert float(b.evaluate_true(torch.tensor([[x1, x2]], dtype=torch.float64))) == pytest.approx(
        by_hand
    )
    ras = synthetic_problem("rastrigin", dim=3)
    x = torch.tensor([[1.0, -0.5, 2.0]], dtype=torch.float64)
    by_hand = 30 + sum(v**2 - 10 * math.cos(2 * math.pi * v) for v in (1.0, -0.5, 2.0))
    assert float(ras.evaluate_true(x)) == pytest.approx(by_hand)


def test_dims_names_and_noise_are_validated():
    assert set(REQUIRED) <= set(problem_names())
    assert synthetic_problem("Hartmann", dim=3).name == "hartmann3"
    assert synthetic_problem("styblinski_tang", dim=4).dim == 4
    assert synthetic_problem("levy", dim=7).bounds.shape == (2, 7)
    with pytest.raises(ValueError, match="Unknown problem 'nope'"):
        synthetic_problem("nope")
    with pytest.raises(ValueError, match=r"dim in \[3, 4, 6\]"):
        synthetic_problem("hartmann", dim=5)
    with pytest.raises(ValueError, match="dim in \\[2\\]"):
        synthetic_problem("branin", dim=3)
    with pytest.raises(ValueError, match="dim >= 2"):
        synthetic_problem("rosenbrock", dim=1)
    with pytest.raises(ValueError, match="noise"):
        synthetic_problem("levy", noise_std=-1.0)
    # an optimum BoTorch does not know is None (no regret), not an error
    assert synthetic_problem("hartmann", dim=4).optimal_value is None
    assert synthetic_problem("hartmann", dim=4).regret(0.0) is None


def test_separable_optima_for_any_dim_match_a_dense_grid():
    # Michalewicz (m = 10) and Styblinski-Tang are sums of 1-D terms: the minimum is the sum of
    # the 1-D minima, here brute-forced on a grid of 2e6 + 1 points per coordinate
    x = np.linspace(0.0, math.pi, 2_000_001)
    mich = sum(float((-np.sin(x) * np.sin((i + 1) * x**2 / math.pi) ** 20).min()) for i in range(3))
    p = synthetic_problem("michalewicz", dim=3)
    assert p.optimal_value <= mich and p.optimal_value == pytest.approx(mich, abs=1e-9)
    x = np.linspace(-5.0, 5.0, 2_000_001)
    st = 7 * float((0.5 * (x**4 - 16 * x**2 + 5 * x)).min())
    p = synthetic_problem("styblinskitang", dim=7)
    assert p.optimal_value <= st and p.optimal_value == pytest.approx(st, abs=1e-9)


@pytest.mark.parametrize("name", sorted(SYNTHETIC_PROBLEMS))
def test_regret_is_zero_at_every_known_optimiser_and_never_negative(name):
    p = synthetic_problem(name)
    optimizers = getattr(p._fn, "_optimizers", None) or []
    if p.optimal_value is None:
        assert not optimizers or name == "hartmann"
        return
    for x_star in optimizers:
        value = float(p.evaluate_true(torch.tensor([x_star], dtype=torch.float64)))
        regret = p.regret(value)
        # BoTorch's optimisers are rounded to a few digits: the regret there is tiny, never < 0
        assert 0.0 <= regret <= 1e-6 * max(1.0, abs(p.optimal_value)), (x_star, regret)
    X = from_unit(
        torch.rand(256, p.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1)),
        p.bounds,
    )
    assert all(p.regret(float(v)) >= 0 for v in p.evaluate_true(X))


def test_six_hump_camel_optimum_is_exact():
    # BoTorch states -1.0316; the optimum is -1.031628453489877... (so -1.0316 gave regret < 0)
    p = synthetic_problem("sixhumpcamel")
    assert p.optimal_value == pytest.approx(-1.0316284534898774, abs=1e-12)
    assert (
        p.regret(float(p.evaluate_true(torch.tensor([[0.0898, -0.7126]], dtype=torch.float64)))) > 0
    )


def test_evaluate_true_is_noiseless_and_spec_round_trips():
    p = synthetic_problem("levy", dim=3, noise_std=10.0)
    X = from_unit(torch.rand(5, 3, dtype=torch.float64), p.bounds)
    assert torch.equal(p.evaluate_true(X), p.evaluate_true(X))
    q = make_problem(p.spec)
    assert isinstance(q, SyntheticProblem) and q.noise_std == 10.0 and q.dim == 3
    assert torch.equal(q.evaluate_true(X), p.evaluate_true(X))


def test_unit_cube_maps_are_inverse_and_affine():
    bounds = torch.tensor([[-5.0, 0.0, 10.0], [10.0, 15.0, 11.0]], dtype=torch.float64)
    X = torch.tensor([[-5.0, 15.0, 10.5]], dtype=torch.float64)
    U = to_unit(X, bounds)
    assert torch.allclose(U, torch.tensor([[0.0, 1.0, 0.5]], dtype=torch.float64))
    R = torch.rand(10, 3, dtype=torch.float64)
    assert torch.allclose(to_unit(from_unit(R, bounds), bounds), R)


def test_callable_problem():
    p = CallableProblem(
        lambda X: X.sum(-1), bounds=[[0, 0], [1, 2]], maximize=True, optimal_value=3.0, name="sum"
    )
    assert p.dim == 2 and p.spec is None
    assert torch.equal(
        p.evaluate_true(torch.tensor([[1.0, 2.0]])), torch.tensor([3.0], dtype=torch.float64)
    )
    assert p.regret(2.5) == pytest.approx(0.5)
    # A value better than the stated optimum: the optimum is wrong. Regret stays >= 0 (it is
    # 0 there) and the user is told once, not on every step.
    with warnings.catch_warnings():  # round-off beyond the optimum: no warning
        warnings.simplefilter("error")
        assert p.regret(3.0 + 1e-13) == 0.0
    with pytest.warns(RuntimeWarning, match=r"better than the stated optimal_value 3.0"):
        assert p.regret(3.5) == 0.0
    with warnings.catch_warnings():  # said once
        warnings.simplefilter("error")
        assert p.regret(3.6) == 0.0
    with pytest.raises(ValueError, match="lower < upper"):
        CallableProblem(lambda X: X.sum(-1), bounds=[[0, 1], [1, 1]])
    with pytest.raises(ValueError, match="finite"):
        CallableProblem(lambda X: X.sum(-1), bounds=[[0, -5], [float("inf"), 5]])
    bad = CallableProblem(lambda X: torch.zeros(3), bounds=[[0], [1]])
    with pytest.raises(ObjectiveError, match="returned 3 values for 2 points"):
        bad.evaluate_true(torch.zeros(2, 1))


def test_magnetometer_pool_and_held_out_test_set():
    root = _data_or_skip()
    p = magnetometer_problem(seed=0)
    assert p.X_test.shape == (10_000, 2) and p.X_pool.shape == (76_027 - 10_000, 2)
    # no row in both: compare (x, y, value) triples
    pool = {tuple(r) for r in torch.cat([p.X_pool, p.y_pool[:, None]], 1).tolist()}
    test = [tuple(r) for r in torch.cat([p.X_test, p.y_test[:, None]], 1).tolist()]
    assert (
        sum(t in pool for t in test) <= 5
    )  # only exact duplicate rows of the raw data could repeat
    assert bool(((p.X_pool >= p.bounds[0]) & (p.X_pool <= p.bounds[1])).all())
    # values are the norm of the three field components, from the raw file read by hand
    with open(root / "magnetometer" / "1-mag.csv") as f:
        first = [float(v) for v in next(csv.reader(f))]
    with open(root / "magnetometer" / "1-loc.csv") as f:
        loc = [float(v) for v in next(csv.reader(f))]
    both = torch.cat([p.X_pool, p.X_test])
    values = torch.cat([p.y_pool, p.y_test])
    hit = ((both - torch.tensor(loc, dtype=torch.float64)).abs().sum(-1) == 0).nonzero()
    assert hit.numel() >= 1
    assert float(values[hit[0, 0]]) == pytest.approx(math.sqrt(sum(v * v for v in first)))
    # seeded: same seed same split, another seed another split
    assert torch.equal(
        magnetometer_problem(seed=0, tracks=(1,), test_size=100).X_test,
        magnetometer_problem(seed=0, tracks=(1,), test_size=100).X_test,
    )
    assert not torch.equal(
        magnetometer_problem(seed=1, tracks=(1,), test_size=100).X_test,
        magnetometer_problem(seed=0, tracks=(1,), test_size=100).X_test,
    )
    with pytest.raises(ValueError, match="test_size"):
        magnetometer_problem(test_size=0)


def test_uci_stream_uses_the_fixed_split():
    _data_or_skip()
    p = uci_problem("yacht", split=2, seed=0)
    d = datasets.load_uci("yacht", split=2)
    assert p.X_stream.shape[0] == int((~d.test_mask).sum()) and p.X_test.shape[0] == int(
        d.test_mask.sum()
    )
    # the stream is a permutation of the training rows
    rows = sorted(map(tuple, torch.tensor(d.train[0]).tolist()))
    assert sorted(map(tuple, p.X_stream.tolist())) == rows
    assert p.dim == 6 and make_problem(p.spec).X_stream.shape == p.X_stream.shape
    with pytest.raises(ValueError, match="Unknown UCI"):
        uci_problem("nope")


def _sets(n=8, m=4, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X, Xt = torch.rand(n, d, generator=g, dtype=torch.float64), torch.rand(m, d, generator=g)
    return X, X.sum(-1), Xt.double(), Xt.double().sum(-1)


@pytest.mark.parametrize("kind", ["stream", "pool"])
def test_pools_and_streams_from_tensors_are_checked_before_any_loop(kind):
    box = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)

    def make(X, y, Xt, yt, bounds=box):
        if kind == "stream":
            return StreamProblem("mine", X, y, Xt, yt, bounds)
        return PoolProblem("mine", X, y, Xt, yt, bounds)

    X, y, Xt, yt = _sets()
    assert make(X, y, Xt, yt).dim == 2
    make(X, y.unsqueeze(-1), Xt, yt)  # N x 1 targets are one value per row
    first = "X_stream" if kind == "stream" else "X_pool"
    first_y = "y_stream" if kind == "stream" else "y_pool"
    y_nan = y.clone()
    y_nan[5] = float("nan")
    X_inf = X.clone()
    X_inf[2, 1] = float("inf")
    cases = (
        ((X, y_nan, Xt, yt), rf"mine: {first_y} has NaN/inf in row 5 \(1 row"),
        ((X_inf, y, Xt, yt), rf"mine: {first} has NaN/inf in row 2"),
        ((X, y[:7], Xt, yt), rf"{first_y} must hold one value per row of {first} \(8\)"),
        ((X * 2, y, Xt, yt), rf"{first} row \d .* outside the bounds"),
        ((X[:, :1], y, Xt, yt), rf"{first} must be N x 2, got shape \(8, 1\)"),
        ((X, y, Xt, yt[:3]), r"y_test must hold one value per row of X_test \(4\)"),
        ((X, y, Xt, yt, box[:, :1]), r"X_stream must be N x 1|X_pool must be N x 1"),
        ((X, y, Xt, yt, box.flip(0)), r"finite lower < upper"),
        ((X, y, Xt, yt, box.T.reshape(1, 4)), r"bounds must be 2 x d"),
    )
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            make(*args)


@pytest.mark.parametrize("kind", ["stream", "pool"])
def test_integer_input_tensors_are_mapped_to_the_unit_cube_over_the_box_given(kind):
    r"""Integer-valued inputs given as an integer tensor (``torch.randint``) are scaled by the
    box as given: the loops cast the box to the inputs' dtype, so a box of half steps
    (-0.5 .. 9.5) was truncated to 0 .. 9 and a run mapped its inputs otherwise than the same run
    on float inputs."""
    from bo_online.loops import ActiveLearningLoop, StreamingLoop

    g = torch.Generator().manual_seed(0)
    X = torch.randint(0, 10, (40, 2), generator=g)
    y = X.double().sum(-1)
    box = torch.tensor([[-0.5, -0.5], [9.5, 9.5]], dtype=torch.float64)
    if kind == "pool":
        loop = ActiveLearningLoop(PoolProblem("mine", X[:30], y[:30], X[30:], y[30:], box))
        U = loop.U_pool
    else:
        loop = StreamingLoop(StreamProblem("mine", X[:30], y[:30], X[30:], y[30:], box), n_init=5)
        U = loop.U_stream
    assert torch.equal(U, (X[:30].double() + 0.5) / 10)


@pytest.mark.parametrize("kind", ["regression", "classification", "pool"])
def test_pools_and_streams_from_numpy_arrays_run_as_from_tensors(kind):
    r"""Problems given NumPy arrays (or lists) pass the checks, so the loops must take them: they
    failed in the first step with torch's TypeError (``.to`` of a NumPy array). A run on them
    gives the records of the same run on tensors."""
    from bo_online.loops import ActiveLearningLoop, StreamingLoop

    g = torch.Generator().manual_seed(0)
    X = torch.rand(60, 2, generator=g, dtype=torch.float64)
    y = torch.sin(6 * X[:, 0]) + X[:, 1]
    if kind == "classification":
        y = (y > 1.0).double()
    box = [[0.0, 0.0], [1.0, 1.0]]

    def run(X, y):
        if kind == "pool":
            pool = PoolProblem("mine", X[:50], y[:50], X[50:], y[50:], box)
            loop = ActiveLearningLoop(pool, acq="random", model="tsvgp", n_init=10, q=2, seed=0)
            return loop.run(steps=3)
        stream = StreamProblem("mine", X[:50], y[:50], X[50:], y[50:], box, task=kind)
        loop = StreamingLoop(stream, model="tsvgp", n_init=20, q=5, eval_every=2, seed=0)
        return loop.run(steps=3)

    def outcomes(records):
        return [{k: v for k, v in r.items() if not k.startswith(("time", "wall"))} for r in records]

    expected = outcomes(run(X, y))
    assert outcomes(run(X.numpy(), y.numpy())) == expected
    assert outcomes(run(X.tolist(), y.numpy()[:, None])) == expected  # lists, N x 1 targets


@pytest.mark.parametrize(
    ("labels", "found"),
    [([-1.0, 1.0], "found -1, 1;"), ([1.0, 2.0], "found 1, 2;"), ([0.0, 0.5], "found 0, 0.5;")],
)
def test_classification_stream_with_other_labels_says_what_it_found_and_how_to_map(labels, found):
    r"""Labels other than 0 / 1 (banana's own -1 / 1, classes 1 / 2) given from Python were
    refused with only "needs labels in {0, 1} in y_stream": the message now names the values
    found and how to map them to 0 / 1."""
    X = torch.rand(20, 4, dtype=torch.float64)
    y = torch.tensor(labels, dtype=torch.float64).repeat(10)
    box = torch.stack([torch.zeros(4), torch.ones(4)]).double()
    with pytest.raises(ValueError) as err:
        StreamProblem("mine", X[:15], y[:15], X[15:], y[15:], box, task="classification")
    msg = str(err.value)
    assert "needs labels in {0, 1} in y_stream" in msg and found in msg
    assert "(y > 0).double()" in msg and "stream_from_file" in msg
    # the mapped labels are taken
    mapped = (y == labels[1]).double()
    StreamProblem("mine", X[:15], mapped[:15], X[15:], mapped[15:], box, task="classification")


def test_callable_problem_bounds_given_as_pairs_per_input_say_to_transpose():
    r"""``--bounds`` and ``objective_problem`` take one ``[lo, hi]`` pair per input, a
    ``CallableProblem`` the ``2 x d`` box of BoTorch (lower row, upper row); the pairs passed to
    it were refused with "bounds must be 2 x d ..." and the pairs echoed back, leaving the user
    to work out that the box was transposed. The error now says so, with the box it means."""
    from bo_online.problems import CallableProblem

    for pairs in ([[0, 1], [-5, 5], [2, 3]], [[0, 1], [-5, 5]]):
        with pytest.raises(ValueError, match="bounds must be 2 x d") as e:
            CallableProblem(None, bounds=pairs)
        box = torch.tensor(pairs, dtype=torch.float64).T.tolist()
        assert "one [lo, hi] pair per input" in str(e.value)
        assert f"transposed: {box}" in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="bounds must be 2 x d") as e:  # no box either way
        CallableProblem(None, bounds=[[0, 1], [1, 0], [2, 3]])
    assert "transposed" not in str(e.value)
    problem = CallableProblem(None, bounds=[[0, -5], [1, 5]])  # a good box as it was
    assert problem.bounds.tolist() == [[0, -5], [1, 5]]
