"""The auto refit rule shared by the BO loops and Ax (bo_online.loops.refit_rules)."""

from __future__ import annotations

import pytest

from bo_online.loops.core import OnlineLoop
from bo_online.loops.refit_rules import growth_refit_due


@pytest.mark.parametrize(
    ("n", "last", "due"),
    [
        (50, 40, True),  # at or below the small-n threshold: every time
        (100, 99, True),
        (109, 100, False),
        (110, 100, True),  # exactly 10% growth; (1 + 0.1) * 100 is 110.00000000000001
        (220, 200, True),
        (219, 200, False),
        (1100, 1000, True),
        (1099, 1000, False),
        (330, 300, True),
        (None, 300, True),  # unknown n or no fit yet: due
        (500, None, True),
    ],
)
def test_growth_rule_is_due_at_exactly_the_stated_growth(n, last, due):
    small, growth = OnlineLoop.AUTO_REFIT_SMALL_N, OnlineLoop.AUTO_REFIT_GROWTH
    assert (small, growth) == (100, 0.1)
    assert growth_refit_due(n, last, small, growth) is due


def test_growth_rule_matches_integer_arithmetic_for_every_n():
    # n >= 1.1 * last in exact arithmetic is 10 * n >= 11 * last
    for last in range(101, 2000, 7):
        for n in range(last, last + last // 5):
            assert growth_refit_due(n, last, 100, 0.1) is (10 * n >= 11 * last), (n, last)


@pytest.mark.parametrize("refit_every", [7, 0])
def test_a_surrogate_that_leaves_its_exact_regime_is_refit_at_once(refit_every):
    r"""QSGP fitted as the exact GP of its kernel (n <= exact_max_n) and then updated past it
    predicts in weight space with the kernel's hyperparameters, which are not the evidence of
    what it now predicts with: the loop refits at the step that crosses, whatever the schedule
    (not with refits off). The refit maximises the weight-space (basis) evidence."""
    from bo_online.loops import BayesOptLoop
    from bo_online.problems import SyntheticProblem

    loop = BayesOptLoop(
        SyntheticProblem("hartmann", dim=6),
        model="qsgp",
        model_options={"exact_max_n": 14, "num_features": 64},
        n_init=12,
        refit_every=refit_every,
        seed=0,
        optimizer_options={"num_restarts": 2, "raw_samples": 32},
    )
    loop.run(4)  # n = 13, 14 (the exact GP), 15, 16
    refits = [bool(r["refit"]) for r in loop.records if r.get("phase") != "init"][-4:]
    assert not loop.model.is_exact_gp_on_data()
    if refit_every == 0:
        assert refits == [False] * 4
        return
    assert refits == [False, False, True, False]
    assert loop.model._resolve_evidence("auto") == "basis"


def test_a_run_resumed_before_it_leaves_the_exact_regime_refits_there_as_the_uninterrupted(
    tmp_path,
):
    r"""Whether the surrogate was the exact GP at its last fit is loop state: a run checkpointed
    at n = 14 (exact_max_n) and resumed must still refit at the step that crosses to 15, as the
    run that was never stopped does (bit for bit), not lose that to a fresh loop's default."""
    from bo_online.loops import BayesOptLoop, load_loop, without_timing
    from bo_online.problems import SyntheticProblem

    kw = dict(
        model="qsgp",
        model_options={"exact_max_n": 14, "num_features": 64},
        n_init=12,
        refit_every=7,
        seed=0,
        optimizer_options={"num_restarts": 2, "raw_samples": 32},
    )
    reference = BayesOptLoop(SyntheticProblem("hartmann", dim=6), **kw).run(4)
    BayesOptLoop(SyntheticProblem("hartmann", dim=6), out_dir=tmp_path, **kw).run(2)
    resumed = load_loop(tmp_path).run(4)
    assert [bool(r["refit"]) for r in resumed][-4:] == [False, False, True, False]
    assert without_timing(resumed) == without_timing(reference)
