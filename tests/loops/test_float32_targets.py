r"""Loops run in float32 on targets with a large offset (1e8 + O(1)): the float32 spacing at 1e8
is 8, so targets cast to float32 before they were standardised arrived as one constant and the
surrogate learned nothing (test RMSE = the targets' sd, no warning). The loops now centre and
scale the targets in float64 and cast the standardised values; predictions are mapped back in
float64. Each test compares the float32 run with the same run in float64."""

from __future__ import annotations

import pytest
import torch

from bo_online.loops import (
    ActiveLearningLoop,
    BayesOptLoop,
    StreamingLoop,
    load_loop,
    without_timing,
)
from bo_online.loops.history import CHECKPOINT_FILE, load_checkpoint
from bo_online.problems import CallableProblem, PoolProblem, StreamProblem

OFFSET = 1e8
UNIT = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)


def _offset_data(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``n`` points of the unit square and targets 1e8 + a smooth O(1) signal (sd about 1)."""
    X = torch.rand(n, 2, generator=g, dtype=torch.float64)
    noise = 0.05 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, OFFSET + torch.sin(6 * X[:, 0]) + torch.cos(4 * X[:, 1]) + noise


def _stream() -> StreamProblem:
    g = torch.Generator().manual_seed(0)
    (Xs, ys), (Xt, yt) = _offset_data(80, g), _offset_data(60, g)
    return StreamProblem("offset", Xs, ys, Xt, yt, UNIT)


def _pool() -> PoolProblem:
    g = torch.Generator().manual_seed(1)
    (Xp, yp), (Xt, yt) = _offset_data(120, g), _offset_data(60, g)
    return PoolProblem("offset", Xp, yp, Xt, yt, UNIT)


def _bump(X: torch.Tensor) -> torch.Tensor:
    r"""1e8 minus a Gaussian bump of height 1 at (0.3, 0.7): minimum 1e8 - 1."""
    centre = torch.tensor([0.3, 0.7], dtype=X.dtype)
    return OFFSET - torch.exp(-((X - centre) ** 2).sum(-1) / 0.05)


STREAM_KW = dict(model="exact", n_init=30, q=10, eval_every=1, seed=0, fit_max_iter=20)


def test_a_float32_stream_learns_offset_targets_as_float64_does():
    problem = _stream()
    sd = float(problem.y_test.std())
    r64 = StreamingLoop(problem, dtype="float64", **STREAM_KW).run(5)
    r32 = StreamingLoop(problem, dtype="float32", **STREAM_KW).run(5)
    for a, b in zip(r32, r64):
        assert b["test_rmse"] < 0.2 * sd  # the premise: float64 learns the signal
        # before the fix: float32 test RMSE 1.1 (= sd, a constant predictor) at every step
        assert a["test_rmse"] == pytest.approx(b["test_rmse"], rel=0.05, abs=1e-3)
        assert a["test_nll"] == pytest.approx(b["test_nll"], abs=0.05)
    assert r32[-1]["prequential_rmse"] == pytest.approx(r64[-1]["prequential_rmse"], rel=0.05)


def test_float32_active_learning_on_offset_targets_matches_float64():
    problem = _pool()
    kw = dict(model="exact", acq="random", n_init=15, q=10, seed=0, fit_max_iter=20)
    r64 = ActiveLearningLoop(problem, dtype="float64", **kw).run(3)
    r32 = ActiveLearningLoop(problem, dtype="float32", **kw).run(3)
    assert [r["indices"] for r in r32] == [r["indices"] for r in r64]  # same labels (random)
    for a, b in zip(r32, r64):
        assert b["rmse"] < 0.3 * float(problem.y_test.std())  # the premise
        assert a["rmse"] == pytest.approx(b["rmse"], rel=0.05, abs=1e-3)
        assert a["mean_var"] == pytest.approx(b["mean_var"], rel=0.1, abs=1e-4)
        assert a["nll"] == pytest.approx(b["nll"], abs=0.05)


def test_float32_qnipv_over_sobol_points_with_singletaskgp_matches_float64():
    r"""qNIPV's Sobol integration points (``integrate_over="sobol"``) were drawn in float64
    whatever the loop's dtype: BoTorch's ``SingleTaskGP`` in float32 (which, unlike the online
    models, does not cast its inputs) stopped the first step with "expected scalar type Float but
    found Double". They now come in the model's dtype, and the float32 run labels the points the
    float64 run labels."""
    problem = _pool()
    kw = dict(
        model="singletaskgp",
        integrate_over="sobol",
        selection="pool",
        num_mc_points=64,
        num_pool_candidates=200,  # the whole pool: no random subset to differ
        n_init=8,
        q=2,
        seed=0,
        fit_max_iter=20,
    )
    r64 = ActiveLearningLoop(problem, dtype="float64", **kw).run(2)
    r32 = ActiveLearningLoop(problem, dtype="float32", **kw).run(2)
    assert [r["indices"] for r in r32] == [r["indices"] for r in r64]
    for a, b in zip(r32, r64):
        assert a["rmse"] == pytest.approx(b["rmse"], rel=0.05, abs=1e-3)


def test_float32_bo_minimises_an_objective_offset_by_1e8():
    r"""The bump is invisible to a surrogate fed float32 targets (all 1e8): before the fix the
    float32 loop never improved on its initial design (regret 0.57 after 6 steps, float64
    0.059 from step 2 on; float32 now 0.059 too)."""
    kw = dict(
        model="exact",
        acq="logei",
        n_init=6,
        seed=0,
        optimizer_options={"num_restarts": 2, "raw_samples": 32, "maxiter": 30},
    )
    regret = {}
    for dtype in ("float64", "float32"):
        problem = CallableProblem(_bump, UNIT, optimal_value=OFFSET - 1.0, name="bump")
        records = BayesOptLoop(problem, dtype=dtype, **kw).run(6)
        regret[dtype] = records[-1]["regret"]
        assert records[0]["regret"] > 0.5  # the initial design misses the bump
    assert regret["float64"] < 0.1
    assert regret["float32"] < 0.1


@pytest.mark.parametrize("kind", ["stream", "bo"])
def test_a_float32_run_on_offset_targets_resumes_to_identical_records(kind, tmp_path):
    if kind == "stream":
        problem = _stream()

        def make(**kw):
            return StreamingLoop(problem, dtype="float32", **STREAM_KW, **kw)

    else:
        problem = CallableProblem(_bump, UNIT, optimal_value=OFFSET - 1.0, name="bump")

        def make(**kw):
            return BayesOptLoop(
                problem,
                dtype="float32",
                model="exact",
                acq="qucb",
                n_init=6,
                seed=1,
                refit_every=2,
                optimizer_options={"num_restarts": 2, "raw_samples": 32, "maxiter": 20},
                **kw,
            )

    reference = make().run(4)
    make(out_dir=tmp_path, checkpoint_every=1).run(2)
    shift, scale = load_checkpoint(tmp_path / CHECKPOINT_FILE)["target_scaling"]
    assert abs(shift) > 0.5 * OFFSET and 0 < scale < 10  # centred and scaled in float64
    resumed = load_loop(tmp_path, problem=problem).run(4)
    assert without_timing(resumed) == without_timing(reference)


def test_classification_metrics_of_a_float32_model_are_computed_in_float64():
    r"""A float32 classifier's test accuracy was a float32 mean (9 of 10 right recorded as
    0.8999999761581421) and its log loss a float32 mean. Both are now computed in float64 from
    the model's probabilities (a wrong, certain prediction still costs -log 1e-12)."""
    from bo_online.loops.streaming import classification_metrics

    probs = torch.tensor([0.9] * 9 + [1.0], dtype=torch.float32)

    class Fixed:
        def predict_proba(self, X: torch.Tensor) -> torch.Tensor:
            return probs[: X.shape[0]]

    y = torch.tensor([1.0] * 9 + [0.0], dtype=torch.float32)
    m = classification_metrics(Fixed(), torch.zeros(10, 2, dtype=torch.float32), y)
    assert m["accuracy"] == 0.9
    p_y = probs.double().clone()
    p_y[-1] = 1e-12  # the wrong, certain prediction: 1 - p = 0, clamped
    assert m["nll"] == pytest.approx(float(-p_y.log().mean()), rel=1e-12)


def test_a_float32_bo_loop_rescales_when_a_value_outgrows_its_target_scaling():
    r"""Initial values that barely vary (sd 1e-6) fix the loop's float32 target scaling; a
    later value 1e10 away then reached the surrogate as 1.4e16, past float32's limit, and every
    model refused it with advice to rescale Y, which the user cannot follow (the loop scaled).
    The loop now re-derives the scaling from all values and rebuilds and refits the surrogate:
    the same model as a loop started from all those values."""
    g = torch.Generator().manual_seed(0)
    X0 = torch.rand(8, 2, generator=g, dtype=torch.float64)
    y0 = 1.0 + 1e-6 * torch.randn(8, generator=g, dtype=torch.float64)
    problem = CallableProblem(None, UNIT)
    loop = BayesOptLoop(
        problem, initial_data=(X0, y0), n_init=0, model="exact", dtype="float32", acq="qucb"
    )
    loop.initialize()
    X_new = torch.tensor([[0.3, 0.7]], dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="target scaling was re-derived from all 9 values"):
        record = loop.tell(X_new, torch.tensor([1e10], dtype=torch.float64))
    assert record["refit"] and loop.step_count == 1 and loop.target_scale > 1e9
    X_all, y_all = torch.cat([X0, X_new]), torch.cat([y0, torch.tensor([1e10])])
    fresh = BayesOptLoop(
        problem,
        initial_data=(X_all, y_all),
        n_init=0,
        model="exact",
        dtype="float32",
        acq="qucb",
    )
    fresh.initialize()
    assert (loop.target_shift, loop.target_scale) == (fresh.target_shift, fresh.target_scale)
    U = torch.rand(20, 2, generator=g, dtype=torch.float32)
    with torch.no_grad():
        mean, ref = loop.model.posterior(U).mean, fresh.model.posterior(U).mean
    torch.testing.assert_close(mean, ref, rtol=1e-5, atol=1e-5)


def _barely_varying_then_far(n: int, far: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``n`` points of the unit square whose targets vary by 1e-6 about 1, except row ``far``
    (1e10): through a float32 target scaling fixed from the others it is 1.4e16, beyond 1.8e15."""
    g = torch.Generator().manual_seed(3)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64)
    y = 1.0 + 1e-6 * torch.randn(n, generator=g, dtype=torch.float64)
    y[far] = 1e10
    return X, y


NO_FIT = dict(model="exact", dtype="float32", seed=0, fit_max_iter=0, init_fit_max_iter=0)


def test_a_float32_active_loop_rescales_when_a_label_outgrows_its_target_scaling():
    r"""As the BO loop: a pool value far beyond the initial design's reached the float32
    surrogate past its limit, which refused it with advice to rescale Y, which the user cannot
    follow (the loop scaled), so the row could never be labelled. The loop now re-derives the
    scaling from every labelled value and rebuilds the surrogate: the same model as a loop
    started from those rows."""
    X, y = _barely_varying_then_far(30, far=29)
    Xt, yt = X[:5], y[:5]
    loop = ActiveLearningLoop(
        PoolProblem("far", X, y, Xt, yt, UNIT), n_init=8, acq="random", **NO_FIT
    )
    loop.initialize()
    assert 29 not in loop.chosen.tolist()
    with pytest.warns(RuntimeWarning, match="target scaling was re-derived from all 10 values"):
        record = loop.tell(torch.tensor([29, int((~loop.used).nonzero()[0])]))
    assert record["refit"] and loop.step_count == 1 and loop.target_scale > 1e9
    rows = loop.chosen
    fresh = ActiveLearningLoop(
        PoolProblem("far", X[rows], y[rows], Xt, yt, UNIT), n_init=10, acq="random", **NO_FIT
    )
    fresh.initialize()
    _assert_same_scaling_and_model(loop, fresh)


def _assert_same_scaling_and_model(loop, fresh) -> None:
    r"""``loop`` (rescaled on the way) has the target scaling and the posterior of ``fresh``,
    a loop started from the same rows."""
    assert loop.target_shift == pytest.approx(fresh.target_shift, rel=1e-12)
    assert loop.target_scale == pytest.approx(fresh.target_scale, rel=1e-12)
    U = torch.rand(20, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float32)
    with torch.no_grad():
        mean, ref = loop.model.posterior(U).mean, fresh.model.posterior(U).mean
    torch.testing.assert_close(mean, ref, rtol=1e-5, atol=1e-5)


def test_a_float32_stream_rescales_when_a_value_outgrows_its_target_scaling():
    r"""The same for a stream: the far row stopped the stream for good (each tell of it was
    refused by the surrogate). It is now taken, with the scaling re-derived from the stream so
    far: the same model as a stream started from those rows."""
    X, y = _barely_varying_then_far(30, far=11)
    Xt, yt = X[20:], y[20:]
    loop = StreamingLoop(StreamProblem("far", X, y, Xt, yt, UNIT), n_init=10, q=2, **NO_FIT)
    loop.initialize()
    with pytest.warns(RuntimeWarning, match="target scaling was re-derived from all 12 values"):
        record = loop.tell(loop.ask())
    assert record["refit"] and record["n"] == 12 and loop.target_scale > 1e9
    loop.tell(loop.ask())  # and the stream goes on
    problem = StreamProblem("far", X, y, Xt, yt, UNIT)
    fresh = StreamingLoop(problem, n_init=12, q=2, **NO_FIT)
    fresh.initialize()
    fresh.tell(fresh.ask())
    _assert_same_scaling_and_model(loop, fresh)
