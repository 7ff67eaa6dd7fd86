"""Tests of bo_online.ax: bo_online surrogates inside Ax's Client, storage, the incremental path.

Sizes are small on purpose (Ax's acquisition optimisation dominates the time); the Branin regret
test runs the 40 trials the issue names, with cheap optimiser settings.
"""

from __future__ import annotations

import copy
import gc
import inspect
import logging
import math
import pickle

import pytest
import torch
from ax.api.client import Client
from ax.api.configs import RangeParameterConfig
from botorch.acquisition.logei import qLogExpectedImprovement
from botorch.sampling import SobolQMCNormalSampler
from botorch.test_functions import Branin, Hartmann
from botorch.utils.datasets import SupervisedDataset

import bo_online.ax as boax
import bo_online.ax.surrogate as ax_surrogate
from bo_online.models import WISKI, OnlineExactGP

logging.getLogger("ax").setLevel(logging.ERROR)

MODELS = sorted(boax.register_all())  # every bo_online model importable today
# Models whose incremental update gives exactly the model rebuilt on all the data.
REBUILD_EQUIVALENT = {"OnlineExactGP", "WISKI", "TSVGP"}
FAST_OPT = {"num_restarts": 1, "raw_samples": 16, "options": {"maxiter": 20}}


def _supports_dim(name: str, d: int) -> bool:
    """Whether the model takes ``d`` inputs with the options the Ax strategy gives it (the
    loops' defaults for ``d`` inputs, e.g. WISKI's structure above 3 inputs)."""
    cls = boax.available_models()[name]._bo_online_base
    X = torch.rand(4, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    defaults = getattr(cls, "loop_default_options", None)
    try:
        cls(X, X.sum(-1, keepdim=True), **(defaults(d) if callable(defaults) else {}))
    except (ValueError, NotImplementedError):
        return False
    return True


@pytest.fixture(autouse=True)
def _fresh_store():
    boax.clear_sessions()
    yield
    boax.clear_sessions()


def _client(problem: str, model: str, seed: int = 0, **gs_options) -> tuple[Client, object]:
    if problem == "branin":
        f = Branin()
        params = [
            RangeParameterConfig(name="x0", parameter_type="float", bounds=(-5.0, 10.0)),
            RangeParameterConfig(name="x1", parameter_type="float", bounds=(0.0, 15.0)),
        ]
    else:
        f = Hartmann(dim=6)
        params = [
            RangeParameterConfig(name=f"x{i}", parameter_type="float", bounds=(0.0, 1.0))
            for i in range(6)
        ]
    client = Client(random_seed=seed)
    client.configure_experiment(parameters=params, name=f"{problem}_{model}")
    client.configure_optimization(objective="-y")
    options = dict(
        botorch_acqf_class=qLogExpectedImprovement,
        acquisition_options={"sampler": SobolQMCNormalSampler(torch.Size([64]), seed=seed)},
        seed=seed,
        optimizer_options=FAST_OPT,
        fit_options={"max_iter": 50},
    )
    options.update(gs_options)
    client.set_generation_strategy(boax.make_generation_strategy(model, **options))
    return client, f


def _run(client: Client, f, n_trials: int, batch_at: tuple[int, ...] = ()) -> list[float]:
    values: list[float] = []
    step = 0
    while len(values) < n_trials:
        size = 3 if step in batch_at else 1
        size = min(size, n_trials - len(values))
        trials = client.get_next_trials(max_trials=size)
        assert len(trials) == size
        for index, params in trials.items():
            x = torch.tensor([[params[f"x{i}"] for i in range(f.dim)]], dtype=torch.float64)
            y = float(f(x))
            values.append(y)
            client.complete_trial(index, raw_data={"y": y})
        step += 1
    return values


# ---------------------------------------------------------------------- registration


def test_registration_and_storage_registry():
    from ax.storage.botorch_modular_registry import CLASS_TO_REVERSE_REGISTRY
    from botorch.models.model import Model

    assert "OnlineExactGP" in MODELS
    ax_cls = boax.register_model_class(OnlineExactGP)
    assert ax_cls is boax.AxOnlineExactGP and issubclass(ax_cls, OnlineExactGP)
    assert boax.register_model_class("OnlineExactGP") is ax_cls  # by name, idempotent
    reverse = CLASS_TO_REVERSE_REGISTRY[Model]
    assert reverse["AxOnlineExactGP"] is ax_cls and reverse["OnlineExactGP"] is OnlineExactGP
    # Ax checks constructor arguments by name before passing submodules.
    assert "input_transform" in inspect.getfullargspec(ax_cls).args
    # Absent classes are skipped, bad ones refused.
    assert "Nope" not in boax.register_all(["bo_online.models.Nope", "no_such_pkg.Model"])
    with pytest.raises(ValueError, match="No bo_online model"):
        boax.register_model_class("NoSuchModel")
    with pytest.raises(ValueError, match="not a subclass"):
        boax.register_model_class(torch.nn.Linear)


# ---------------------------------------------------------------------- Ax Client runs


@pytest.mark.parametrize(
    "model, refit_every, options",
    [
        ("OnlineExactGP", "auto", {}),
        ("OnlineExactGP", 10, {}),
        ("WISKI", "auto", {}),  # the exact GP of its kernel at these n (exact_max_n = 256)
        ("WISKI", "auto", {"exact_max_n": 0}),  # SKI from the first point
    ],
)
def test_branin_regret_40_trials(model, refit_every, options):
    client, f = _client(
        "branin",
        model,
        seed=0,
        num_initial_trials=6,
        fit_options={"max_iter": 30},
        refit_every=refit_every,
        model_options=options,
    )
    values = _run(client, f, 40, batch_at=(8, 14, 20))
    regret = min(values) - f.optimal_value
    assert regret < 0.05, f"{model}: regret {regret:.4f} after 40 trials"
    stats = boax.session_stats()
    if refit_every == "auto" and (model == "OnlineExactGP" or not options):
        # Up to 100 observations the exact GP is rebuilt and fitted from the defaults at every
        # trial, as Ax's own GP is; so is WISKI while it is the exact GP of its kernel.
        assert stats.incremental == 0 and stats.rebuilds == stats.refits >= 20
        assert all(r.startswith("refit from the defaults") for r in list(stats.reasons)[1:])
    else:
        # The model was carried from trial to trial, not rebuilt (one build, then updates);
        # "auto" refits a model whose fit cost is flat in n at every trial with new data.
        assert stats.rebuilds == 1, stats.reasons
        assert stats.incremental >= 20
        if refit_every == "auto":
            assert stats.refits == stats.incremental + 1
        else:
            assert 1 < stats.refits < stats.incremental


@pytest.mark.parametrize("model", [m for m in MODELS if m not in ("OnlineExactGP", "WISKI")])
def test_branin_short_run_each_model(model):
    client, f = _client("branin", model, num_initial_trials=5, refit_every=10)
    values = _run(client, f, 10, batch_at=(6,))  # 5 Sobol, 1, a batch of 3, 1
    assert len(values) == 10 and all(math.isfinite(v) for v in values)
    stats = boax.session_stats()
    assert stats.rebuilds == 1 and stats.incremental == 2, stats.reasons


def test_every_model_takes_six_inputs_at_the_strategy_defaults():
    assert {"OnlineExactGP", "WISKI", "TSVGP", "DecoupledSVGP", "QSGP"} <= {
        m for m in MODELS if _supports_dim(m, 6)
    }


@pytest.mark.parametrize("model", [m for m in MODELS if _supports_dim(m, 6)])
def test_hartmann6_short_run(model):
    client, f = _client("hartmann6", model, num_initial_trials=6, refit_every=10)
    values = _run(client, f, 10, batch_at=(6,))  # 6 Sobol, a batch of 3, one more
    assert len(values) == 10 and all(-3.33 < v <= 0 for v in values)  # Hartmann6's range
    stats = boax.session_stats()
    assert stats.rebuilds == 1 and stats.incremental == 1, stats.reasons


def test_batch_trials_of_several_arms_and_the_best_arm_not_first_in_its_trial():
    """Batch trials (several arms each, through the Experiment API, which ``Client`` does not
    offer) with a bo_online surrogate: Ax's raw and model-based best-point helpers find the
    best arm when it is the third of its trial (bo_online has no
    best-point helper of its own; ``Client.get_best_parameterization`` refuses batch trials in
    Ax 1.3.1, whatever the surrogate: docs/ax.md, Limits)."""
    import pandas as pd
    from ax.core.arm import Arm
    from ax.core.data import Data
    from ax.service.utils.best_point import (
        get_best_by_raw_objective_with_trial_index,
        get_best_parameters_from_model_predictions_with_trial_index,
    )

    client, f = _client("branin", "OnlineExactGP", num_initial_trials=2)
    experiment, gs = client._experiment, client._generation_strategy

    def run(trial):
        trial.mark_running(no_runner_required=True)
        rows = []
        for arm in trial.arms:
            x = torch.tensor([[arm.parameters["x0"], arm.parameters["x1"]]], dtype=torch.float64)
            rows.append(
                {
                    "trial_index": trial.index,
                    "arm_name": arm.name,
                    "metric_name": "y",
                    "metric_signature": "y",
                    "mean": float(f(x)),
                    "sem": float("nan"),
                }
            )
        experiment.attach_data(Data(df=pd.DataFrame(rows)))
        trial.mark_completed()

    for _ in range(4):
        generated = gs.gen_single_trial(experiment=experiment, n=3)
        run(experiment.new_batch_trial(generator_run=generated))
    assert all(len(t.arms) == 3 for t in experiment.trials.values())
    # A batch whose third arm is Branin's minimiser (-pi, 12.275): f = 0.397887.
    trial = experiment.new_batch_trial()
    trial.add_arms_and_weights(
        arms=[
            Arm(parameters={"x0": 9.0, "x1": 14.0}),
            Arm(parameters={"x0": 0.0, "x1": 0.0}),
            Arm(parameters={"x0": -math.pi, "x1": 12.275}),
        ]
    )
    run(trial)
    best_arm = trial.arms[2]
    index, params, _ = get_best_by_raw_objective_with_trial_index(experiment)
    assert (index, params) == (trial.index, best_arm.parameters)
    gs.gen_single_trial(experiment=experiment, n=3)  # the adapter now holds every arm's data
    index, params, _ = get_best_parameters_from_model_predictions_with_trial_index(
        experiment, adapter=gs.adapter
    )
    assert (index, params) == (trial.index, best_arm.parameters)


def test_json_round_trip(tmp_path):
    client, f = _client("branin", "OnlineExactGP", num_initial_trials=5, refit_every=10)
    _run(client, f, 7)
    path = tmp_path / "snapshot.json"
    client.save_to_json_file(str(path))
    boax.clear_sessions()
    loaded = Client.load_from_json_file(str(path))
    assert len(loaded._experiment.trials) == 7
    spec = loaded._generation_strategy._nodes[1].generator_specs[0]
    config = spec.generator_kwargs["surrogate_spec"].model_configs[0]
    assert config.botorch_model_class is boax.AxOnlineExactGP
    trials = loaded.get_next_trials(max_trials=1)
    ((index, params),) = trials.items()
    assert loaded._generation_strategy.current_node_name == "OnlineExactGP"
    model = loaded._generation_strategy.adapter.generator.surrogate.model
    assert isinstance(model, boax.AxOnlineExactGP) and model.num_data == 7
    x = torch.tensor([[params["x0"], params["x1"]]], dtype=torch.float64)
    loaded.complete_trial(index, raw_data={"y": float(f(x))})
    loaded.get_next_trials(max_trials=1)  # ... and goes on incrementally
    assert boax.session_stats().incremental == 1


# ---------------------------------------------------------------------- the incremental path


def _reference(model, X, Y):
    r"""Posterior (mean, variance) function of a model of the same class built from scratch on all
    of ``(X, Y)`` (Y in Ax's current units) with ``model``'s hyperparameters.

    The incremental model holds its data in the units of the trial it was built at (anchor
    units) and maps its posterior to Ax's current units; the reference is built on the same data
    in anchor units and mapped the same way. Its outcome scaling is made equal to ``model``'s:
    directly where the model treats the scaling as a hyperparameter over user-unit statistics
    (WISKI), else by feeding the data standardised with ``model``'s scaling and
    ``standardize=False`` (OnlineExactGP, whose stored targets are standardised)."""
    base = type(model)._bo_online_base
    scale, shift = model._ax_scale, model._ax_shift
    Y_anchor = (Y - shift) / scale
    transform = getattr(model, "input_transform", None)
    # the same regime as the model (WISKI's exact_max_n: the exact GP of its kernel at small n)
    regime = {"exact_max_n": model.exact_max_n} if hasattr(model, "exact_max_n") else {}
    if any(t is model.outcome_mean for t in model.hyperparameters()):
        ref = base(X, Y_anchor, input_transform=transform, **regime)
        ref.outcome_mean, ref.outcome_std = model.outcome_mean.clone(), model.outcome_std.clone()
    else:
        if "standardize" not in inspect.signature(base.__init__).parameters:
            pytest.skip(f"{base.__name__} has no `standardize` option to build the reference.")
        Z = (Y_anchor - model.outcome_mean) / model.outcome_std
        ref = base(X, Z, standardize=False, input_transform=transform, **regime)
        ref.outcome_mean, ref.outcome_std = model.outcome_mean.clone(), model.outcome_std.clone()
    own = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(own[name])

    def predict(test_X):
        post = ref.posterior(test_X)
        return post.mean * scale + shift, post.variance * scale**2

    return predict


def test_wiski_leaving_the_regime_of_its_own_kernel_is_rebuilt_with_its_map_derived():
    r"""Above 6 inputs Ax's WISKI (the loops' defaults: BoTorch's kernel in the exact regime)
    is rebuilt from the defaults in the regime; the trial that takes it past ``exact_max_n``
    rebuilds it on all data instead of conditioning it (its SKI part was never fitted), so the
    learned map is derived from the data and the SKI kernel fitted, and the trial after that
    conditions it incrementally."""
    g = torch.Generator().manual_seed(4)
    X = torch.rand(16, 7, dtype=torch.float64, generator=g)
    Y = torch.sin(3 * X[:, :3].sum(-1, keepdim=True)) + X[:, 3:].sum(-1, keepdim=True)
    opts = {"exact_max_n": 10, "fit_options": {"max_iter": 20}}
    stats = boax.session_stats()
    model = _build(boax.AxWISKI, X[:9], Y[:9], **opts)
    assert model.regime_kernel == "ard" and model.is_exact_gp_on_data()
    assert model.projection.needs_data_init  # not derived in the regime
    model = _build(boax.AxWISKI, X[:12], Y[:12], **opts)
    assert stats.rebuilds == 2 and stats.reasons[-1].startswith("left the exact regime")
    assert not model.is_exact_gp_on_data() and not model.projection.needs_data_init
    assert model.num_data == 12
    model = _build(boax.AxWISKI, X[:14], Y[:14], **opts)
    assert (stats.rebuilds, stats.incremental) == (2, 1) and model.num_data == 14


@pytest.mark.parametrize("model_name", MODELS)
def test_ax_construction_conditions_instead_of_rebuilding(model_name, monkeypatch):
    ax_cls = boax.available_models()[model_name]
    base = ax_cls._bo_online_base
    client, f = _client("branin", model_name, num_initial_trials=5, refit_every=None)
    _run(client, f, 7)
    gs = client._generation_strategy
    before = gs.adapter.generator.surrogate
    old_Y = before.training_data[0].Y.clone()
    previous = before.model  # what the store holds: built, fitted, used for the last trial

    calls = {"condition": 0, "update": 0, "init": 0}
    original_condition = base.condition_on_observations
    original_update = base.update
    original_init = base.__init__

    def spy_condition(self, *args, **kwargs):
        calls["condition"] += 1
        return original_condition(self, *args, **kwargs)

    def spy_update(self, *args, **kwargs):
        calls["update"] += 1
        return original_update(self, *args, **kwargs)

    def spy_init(self, *args, **kwargs):
        calls["init"] += 1
        return original_init(self, *args, **kwargs)

    monkeypatch.setattr(base, "condition_on_observations", spy_condition)
    monkeypatch.setattr(base, "update", spy_update)
    monkeypatch.setattr(base, "__init__", spy_init)
    _run(client, f, 1)  # one more trial: Ax builds a new model for it
    surrogate = gs.adapter.generator.surrogate
    model = surrogate.model
    data = surrogate.training_data[0]
    # A model whose conditioned rows stay apart from its data (t-SVGP) is updated in place on
    # a copy instead, so that its refits see them.
    held = getattr(base, "conditioned_rows_held", True)
    assert calls == {"condition": int(held), "update": int(not held), "init": 0}
    monkeypatch.undo()
    assert isinstance(model, ax_cls) and data.X.shape[0] == 7
    # Ax's standardisation moved, so the affine re-expression was exercised.
    assert not torch.allclose(data.Y[: old_Y.shape[0]], old_Y)

    assert model._ax_scale != 1.0  # ... and the model maps its anchor units to the new ones
    scale, shift = model._ax_scale, model._ax_shift
    test_X = torch.rand(32, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    test_X = test_X * torch.tensor([15.0, 15.0]) + torch.tensor([-5.0, 0.0])
    with torch.no_grad():
        p_inc = model.posterior(test_X)
        # 1. The previous model conditioned by hand on the new row in its own (anchor) units,
        #    through the plain bo_online class (no Ax mapping), then mapped to Ax's units.
        n_old = old_Y.shape[0]
        # 0. The composed map takes the earlier rows, in the anchor units the previous model
        #    holds them in, to exactly the values Ax hands over now.
        old_anchor = (old_Y - previous._ax_shift) / previous._ax_scale
        torch.testing.assert_close(old_anchor * scale + shift, data.Y[:n_old], atol=1e-10, rtol=0)
        Y_anchor = (data.Y[n_old:] - shift) / scale
        by_hand = base.condition_on_observations(previous, data.X[n_old:], Y_anchor)
        p_hand = base.posterior(by_hand, test_X)
        torch.testing.assert_close(p_inc.mean, p_hand.mean * scale + shift, atol=1e-6, rtol=0)
        torch.testing.assert_close(p_inc.variance, p_hand.variance * scale**2, atol=1e-6, rtol=0)
        # 2. A model rebuilt from scratch on all the data with the same hyperparameters, for the
        #    models whose update is exact (DecoupledSVGP and QSGP choose inducing points / bases
        #    from the data they are built on, so a rebuild on more data is another model).
        if model_name in REBUILD_EQUIVALENT:
            ref_mean, ref_var = _reference(model, data.X, data.Y)(test_X)
            torch.testing.assert_close(p_inc.mean, ref_mean, atol=1e-6, rtol=0)
            torch.testing.assert_close(p_inc.variance, ref_var, atol=1e-6, rtol=0)
        # ... and the model predicts the data it was handed, in Ax's current units.
        fit = model.posterior(data.X).mean
        assert (fit - data.Y).abs().max() < 0.5


def _dataset(X, Y, Yvar=None):
    return SupervisedDataset(
        X=X,
        Y=Y,
        Yvar=Yvar,
        feature_names=[f"x{i}" for i in range(X.shape[-1])],
        outcome_names=["y"],
    )


def _build(ax_cls, X, Y, Yvar=None, fit=True, **options):
    """What Ax's Surrogate does: construct_inputs, the constructor, fit_botorch_model."""
    from ax.generators.torch.botorch_modular.utils import fit_botorch_model

    inputs = ax_cls.construct_inputs(_dataset(X, Y, Yvar), **options)
    model = ax_cls(**inputs)
    if fit:
        fit_botorch_model(model, mll_class=None)
    return model


@pytest.mark.parametrize("fixed_noise", [False, True])
def test_reuse_decisions_and_exactness(fixed_noise):
    ax_cls = boax.AxOnlineExactGP
    g = torch.Generator().manual_seed(0)
    X = torch.rand(12, 2, dtype=torch.float64, generator=g)
    raw = torch.sin(6 * X[:, :1]) + X[:, 1:] ** 2
    Yvar = torch.full_like(raw, 1e-3) if fixed_noise else None
    opts = {"refit_every": None, "fit_options": {"max_iter": 5}}

    def units(n):  # Ax-style standardisation of the first n raw values
        y = raw[:n]
        m, s = y.mean(), y.std()
        return (y - m) / s, None if Yvar is None else Yvar[:n] / s**2

    y8, v8 = units(8)
    m8 = _build(ax_cls, X[:8], y8, v8, **opts)
    stats = boax.session_stats()
    assert (stats.rebuilds, stats.incremental, stats.refits) == (1, 0, 1)

    y10, v10 = units(10)
    m10 = _build(ax_cls, X[:10], y10, v10, **opts)
    assert stats.incremental == 1 and not m10.refit_due
    assert m10 is not m8 and m8.num_data == 8  # the previous model is untouched
    predict = _reference(m10, X[:10], y10) if not fixed_noise else None
    test_X = torch.rand(16, 2, dtype=torch.float64, generator=g)
    if predict is not None:
        torch.testing.assert_close(
            m10.posterior(test_X).mean, predict(test_X)[0], atol=1e-8, rtol=0
        )
    # The same posterior as m8 conditioned by hand in m8's units, re-expressed.
    s8, s10 = raw[:8].std(), raw[:10].std()
    a = s8 / s10
    by_hand = m8.condition_on_observations(
        X[8:10],
        ((raw[8:10] - raw[:8].mean()) / s8),
        noise=None if Yvar is None else Yvar[8:10] / s8**2 / m8.outcome_std**2,
    )
    torch.testing.assert_close(
        m10.posterior(test_X).mean,
        a * by_hand.posterior(test_X).mean + (raw[:8].mean() - raw[:10].mean()) / s10,
        atol=1e-8,
        rtol=0,
    )

    # Reordered earlier rows -> rebuild.
    perm = torch.tensor([1, 0, *range(2, 11)])
    y11, v11 = units(11)
    _build(ax_cls, X[:11][perm], y11[perm], None if v11 is None else v11[perm], **opts)
    assert stats.rebuilds == 2 and stats.reasons[-1].startswith("earlier inputs")
    # Back to the ordered data: extends the 10-point model? No -- the store now holds the
    # permuted model, so this rebuilds as well.
    _build(ax_cls, X[:11], y11, v11, **opts)
    assert stats.rebuilds == 3
    # A changed earlier outcome (not an affine image) -> rebuild.
    y12, v12 = units(12)
    y12_bad = y12.clone()
    y12_bad[3] += 0.1
    _build(ax_cls, X[:12], y12_bad, v12, **opts)
    assert stats.rebuilds == 4 and "affine" in stats.reasons[-1]
    # Different model options -> rebuild (the refit schedule alone is not one); same again ->
    # incremental with no new rows.
    _build(ax_cls, X[:12], y12_bad, v12, standardize=False, **opts)
    assert stats.rebuilds == 5 and "options" in stats.reasons[-1]
    same = _build(ax_cls, X[:12], y12_bad, v12, standardize=False, refit_every=3, fit=False)
    assert stats.incremental == 2 and same.num_data == 12
    if fixed_noise:  # changed earlier noise -> rebuild
        _build(ax_cls, X[:12], y12_bad, v12 * 2, standardize=False, fit=False)
        assert "noise" in stats.reasons[-1]


@pytest.mark.parametrize("model_name", MODELS)
def test_float32_outcomes_extend_the_stored_model_as_float64_ones_do(model_name):
    """The affine check of earlier outcomes had a fixed tolerance of 1e-9, which float32 values
    (rounded to 6e-8) never meet: with float32 data every trial was a rebuild ("earlier
    outcomes are not an affine image"), silently. It now allows a few float32 steps, so the
    float32 model is extended as the float64 one is, and predicts what the float64 model of
    the same data predicts, to float32 precision: as closely as a float32 model built on all
    the data at once does (t-SVGP at its default hyperparameters loses 7e-5 to float32 in
    either way, the others 1e-5)."""
    ax_cls = boax.available_models()[model_name]
    g = torch.Generator().manual_seed(0)
    X = torch.rand(14, 2, dtype=torch.float64, generator=g)
    raw = torch.sin(6 * X[:, :1]) + X[:, 1:] ** 2
    test_X = torch.rand(16, 2, dtype=torch.float64, generator=g)
    opts = {"refit_every": None, "fit_options": {"max_iter": 0}}  # default hyperparameters
    posteriors = {}
    for dtype in (torch.float64, torch.float32):
        boax.clear_sessions()
        for n in (10, 12, 14):  # Ax-style standardisation of the first n values, each trial
            y = (raw[:n] - raw[:n].mean()) / raw[:n].std()
            model = _build(ax_cls, X[:n].to(dtype), y.to(dtype), experiment_key="f32", **opts)
        stats = boax.session_stats()
        assert (stats.rebuilds, stats.incremental) == (1, 2), list(stats.reasons)
        with torch.no_grad():
            post = model.posterior(test_X.to(dtype))
        assert post.mean.dtype == dtype
        # the same data at once, not remembered: the float32 error of the model itself
        whole = _build(ax_cls, X.to(dtype), y.to(dtype), incremental=False, **opts)
        with torch.no_grad():
            ref = whole.posterior(test_X.to(dtype))
        posteriors[dtype] = [p.double() for p in (post.mean, post.variance, ref.mean, ref.variance)]
    mean64, var64, ref_mean64, ref_var64 = posteriors[torch.float64]
    mean32, var32, ref_mean32, ref_var32 = posteriors[torch.float32]
    # float32 loses no more on the incremental path than in a model built at once
    mean_tol = 2 * float((ref_mean32 - ref_mean64).abs().max()) + 1e-5
    var_tol = 2 * float((ref_var32 - ref_var64).abs().max()) + 1e-5
    assert mean_tol < 1e-3 and var_tol < 1e-3
    torch.testing.assert_close(mean32, mean64, atol=mean_tol, rtol=0)
    torch.testing.assert_close(var32, var64, atol=var_tol, rtol=0)


@pytest.mark.parametrize("model_name", ["OnlineExactGP", "WISKI"])
def test_the_model_of_a_trial_does_not_keep_the_one_it_was_built_from_alive(model_name):
    r"""An incremental construction becomes the extended model (its ``__dict__``), which
    shared the extended model's GPyTorch load-state hook, a method bound to it: every trial's
    model kept that one alive, with the caches its own refit replaced (WISKI's at 6 inputs:
    about 200 MB more resident in every Ax trial than in the BO loop). Only the stored model
    remains once the trials' models are dropped."""
    ax_cls = boax.available_models()[model_name]
    X = torch.rand(14, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    Y = torch.sin(5 * X.sum(-1, keepdim=True))
    for n in (8, 11, 14):  # a rebuild, then two incremental trials with refits
        model = _build(ax_cls, X[:n], Y[:n], refit_every=1, fit_options={"max_iter": 3})
    del model
    gc.collect()
    assert sum(type(o) is ax_cls for o in gc.get_objects()) == 1  # the store's


def test_refit_schedule():
    ax_cls = boax.AxOnlineExactGP
    g = torch.Generator().manual_seed(1)
    X = torch.rand(14, 2, dtype=torch.float64, generator=g)
    Y = torch.cos(5 * X.sum(-1, keepdim=True))
    opts = {"refit_every": 3, "fit_options": {"max_iter": 10}}
    due = []
    for n in range(6, 14):
        model = _build(ax_cls, X[:n], Y[:n], fit=False, **opts)
        due.append(model.refit_due)
        model.ax_fit()
    # Fit at the build, then after every 3 new observations.
    assert due == [True, False, False, True, False, False, True, False]
    assert boax.session_stats().refits == 3
    # incremental=False: Ax's own behaviour, rebuild and refit every time.
    boax.clear_sessions()
    for n in (6, 7):
        model = _build(ax_cls, X[:n], Y[:n], fit=False, incremental=False, **opts)
        assert model.refit_due
    assert boax.session_stats().rebuilds == 2


def test_auto_refit_schedule_rebuilds_where_botorch_would_and_warm_starts_elsewhere():
    r"""``refit_every="auto"`` (the default): the exact GP is rebuilt and fitted from the
    defaults at every trial up to 100 observations (the same model as Ax's rebuild), then
    conditioned incrementally until its data have grown by 10%; WISKI with ``exact_max_n=0``, and
    t-SVGP with fewer inducing inputs than points, are conditioned and warm-refit at every trial
    with new data; t-SVGP and WISKI while they are the exact GP on their data are rebuilt like the
    exact GP."""
    g = torch.Generator().manual_seed(3)
    X = torch.rand(120, 2, dtype=torch.float64, generator=g)
    Y = torch.sin(5 * X.sum(-1, keepdim=True)) + 0.1 * X[:, :1]
    opts = {"fit_options": {"max_iter": 20}}
    stats = boax.session_stats()

    ax_cls = boax.AxOnlineExactGP
    _build(ax_cls, X[:8], Y[:8], **opts)
    auto = _build(ax_cls, X[:9], Y[:9], **opts)
    assert (stats.rebuilds, stats.incremental, stats.refits) == (2, 0, 2)
    assert stats.reasons[-1].startswith("refit from the defaults")
    rebuilt = _build(ax_cls, X[:9], Y[:9], incremental=False, **opts)
    for a, b in zip(auto.parameters(), rebuilt.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # Up to 100 observations every trial with new data (100 < 1.1 x 95), beyond them
    # incremental until n >= 1.1 x the n of the last fit.
    _build(ax_cls, X[:95], Y[:95], **opts)
    _build(ax_cls, X[:100], Y[:100], **opts)
    assert stats.incremental == 0 and stats.reasons[-1].startswith("refit from the defaults")
    before = (stats.rebuilds, stats.refits)
    grown = _build(ax_cls, X[:109], Y[:109], fit=False, **opts)
    assert stats.incremental == 1 and not grown.refit_due and grown.num_data == 109
    grown.ax_fit()
    assert (stats.rebuilds, stats.refits) == before
    _build(ax_cls, X[:111], Y[:111], **opts)  # past 1.1 x 100
    assert (stats.rebuilds, stats.refits) == (before[0] + 1, before[1] + 1)
    assert stats.reasons[-1].startswith("refit from the defaults")

    for ax_cls, options, rebuilds in (
        (boax.AxWISKI, {}, True),  # exact_max_n = 256 (the loops' default): the exact GP here
        (boax.AxWISKI, {"exact_max_n": 0}, False),  # SKI from the first point
        (boax.AxTSVGP, {"inducing_points": 4}, False),
        (boax.AxTSVGP, {}, True),  # 128 inducing inputs: the exact GP on 9 points
    ):
        boax.clear_sessions()
        stats = boax.session_stats()
        _build(ax_cls, X[:8], Y[:8], **options, **opts)
        model = _build(ax_cls, X[:9], Y[:9], fit=False, **options, **opts)
        assert (stats.rebuilds, stats.incremental) == ((2, 0) if rebuilds else (1, 1))
        assert model.num_data == 9 and model.refit_due  # new data: refit (defaults or warm)
        model.ax_fit()
        same = _build(ax_cls, X[:9], Y[:9], fit=False, **options, **opts)
        assert not same.refit_due  # nothing new since the fit
        assert stats.incremental == (1 if rebuilds else 2)


@pytest.mark.parametrize("model_name", MODELS)
def test_conditioned_rows_held_says_whether_conditioning_adds_to_the_held_data(model_name):
    r"""The store picks ``condition_on_observations`` or ``update`` by the model's
    ``conditioned_rows_held``: where it is true a conditioned model must hold the new rows
    (``num_data`` grows), else the refits of an incremental model would miss them. (False is
    always safe: the store then updates a copy; QSGP's children hold the rows, but a chain of
    them grows a low-rank term every trial, so it takes that path.)"""
    base = boax.available_models()[model_name]._bo_online_base
    X = torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    Y = torch.sin(5 * X.sum(-1, keepdim=True))
    model = base(X[:8], Y[:8])
    conditioned = model.condition_on_observations(X[8:], Y[8:])
    held = getattr(base, "conditioned_rows_held", True)
    assert model.num_data == 8 and (conditioned.num_data == 12 or not held)
    if model_name != "QSGP":
        assert (conditioned.num_data == 12) == held


def test_incremental_tsvgp_holds_the_new_rows_and_refits_on_them():
    r"""t-SVGP's ``condition_on_observations`` keeps new rows apart from its data (a fantasy
    buffer its fit never reads); the Ax path folds them in with ``update`` instead, so the model
    holds them and a refit depends on them (the new rows as given, or flipped and scaled, give
    other hyperparameters)."""
    ax_cls = boax.AxTSVGP
    g = torch.Generator().manual_seed(5)
    X = torch.rand(16, 2, dtype=torch.float64, generator=g)
    Y = torch.sin(5 * X.sum(-1, keepdim=True))
    opts = {"inducing_points": 4, "fit_options": {"max_iter": 30}}
    lengthscales = []
    for sign in (1.0, -5.0):
        boax.clear_sessions()
        first = _build(ax_cls, X[:8], Y[:8], **opts)
        Y_new = torch.cat([Y[:8], sign * Y[8:]])
        model = _build(ax_cls, X, Y_new, fit=False, **opts)
        assert boax.session_stats().incremental == 1
        assert model.num_data == 16 and first.num_data == 8  # the stored model is untouched
        model.ax_fit()
        lengthscales.append(model.covar_module.lengthscale.detach().clone())
    assert (lengthscales[0] - lengthscales[1]).abs().max() > 1e-3


def test_cross_validation_folds_are_not_remembered():
    """Ax's cross-validation builds fold models and loads the full model's state into them;
    those must neither disturb the remembered model nor be remembered themselves."""
    ax_cls = boax.AxOnlineExactGP
    X = torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    Y = torch.sin(4 * X.sum(-1, keepdim=True))
    opts = {"fit_options": {"max_iter": 10}, "refit_every": 10}
    main = _build(ax_cls, X[:10], Y[:10], **opts)
    keep = torch.arange(10) != 3
    fold = _build(ax_cls, X[:10][keep], Y[:10][keep], fit=False, **opts)
    fold.load_state_dict(main.state_dict())
    fold.ax_fit()
    assert fold.num_data == 9
    _build(ax_cls, X[:12], Y[:12], **opts)
    stats = boax.session_stats()
    assert (stats.rebuilds, stats.incremental) == (2, 1)  # main, fold; then main extended


def test_warm_start_refit_after_loading_a_state_dict_refits_on_the_folds_data():
    r"""Ax's ``_construct_model`` with a ``state_dict`` and ``refit=True`` (``refit_on_cv=True``,
    warm-start refits) loads the hyperparameters and then calls the fit; that fit must optimise
    them on the fold's own data (it was skipped: loading counted as a fit), ending where a
    warm-started ``fit`` of the same model from the loaded values ends. With ``refit=False`` Ax
    does not call the fit and the loaded values stay."""
    from ax.generators.torch.botorch_modular.utils import fit_botorch_model

    ax_cls = boax.AxOnlineExactGP
    g = torch.Generator().manual_seed(8)
    X = torch.rand(14, 2, dtype=torch.float64, generator=g)
    Y = torch.sin(6 * X[:, :1]) * torch.cos(3 * X[:, 1:])
    opts = {"fit_options": {"max_iter": 50}, "incremental": False}
    main = _build(ax_cls, X, Y, **opts)
    keep = torch.arange(14) >= 4  # a fold without the first four rows
    fold = _build(ax_cls, X[keep], Y[keep], fit=False, **opts)
    fold.load_state_dict(main.state_dict())
    loaded = fold.covar_module.raw_lengthscale.detach().clone()
    twin = _build(ax_cls, X[keep], Y[keep], fit=False, **opts)
    twin.load_state_dict(main.state_dict())
    fit_botorch_model(fold, mll_class=None)  # what Ax calls for refit=True
    twin.fit(max_iter=50)  # the same warm-started fit, called directly
    moved = fold.covar_module.raw_lengthscale.detach()
    assert (moved - loaded).abs().max() > 1e-3
    torch.testing.assert_close(moved, twin.covar_module.raw_lengthscale.detach())
    assert not fold.refit_due  # fitted now: the schedule counts from here


def test_load_state_dict_carries_hyperparameters_only():
    ax_cls = boax.AxOnlineExactGP
    X = torch.rand(9, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    Y = X.sum(-1, keepdim=True)
    big = _build(ax_cls, X, Y, fit=False, incremental=False)
    with torch.no_grad():
        big.covar_module.raw_lengthscale.fill_(0.3)
    small = _build(ax_cls, X[:5], Y[:5], fit=False, incremental=False)
    small.load_state_dict(big.state_dict())
    assert small.num_data == 5 and small.refit_due  # Ax's refit=True then refits, warm-started
    torch.testing.assert_close(small.covar_module.raw_lengthscale, big.covar_module.raw_lengthscale)


def test_bad_input():
    ax_cls = boax.AxOnlineExactGP
    X = torch.rand(5, 2, dtype=torch.float64)
    for bad in (0, -3, "often", "-1", "\u00b2", 2.5, float("nan"), True):
        with pytest.raises(ValueError, match="'auto', a positive integer or None"):
            ax_cls.construct_inputs(_dataset(X, X[:, :1]), refit_every=bad)
    with pytest.raises(ValueError, match="'auto', a positive integer or None"):
        boax.make_generation_strategy("OnlineExactGP", refit_every="often")  # before any trial
    for good, stored in (("auto", "auto"), (None, None), (7, 7), ("10", 10), (3.0, 3)):
        inputs = ax_cls.construct_inputs(_dataset(X, X[:, :1]), refit_every=good)
        assert inputs["ax_refit_every"] == stored
    with pytest.raises(ValueError, match="continuous parameters only"):
        ax_cls.construct_inputs(_dataset(X, X[:, :1]), categorical_features=[1])
    with pytest.raises(ValueError, match="single-output"):
        ax_cls.construct_inputs(
            SupervisedDataset(X=X, Y=X, feature_names=["a", "b"], outcome_names=["p", "q"])
        )
    with pytest.raises(ValueError, match="num_initial_trials"):
        boax.make_generation_strategy("OnlineExactGP", num_initial_trials=1)
    bad = X.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError):
        _build(ax_cls, bad, X[:, :1])
    assert boax.session_stats().rebuilds == 0  # nothing was stored


@pytest.mark.parametrize("model_name", ["WISKI", "DecoupledSVGP", "QSGP"])
def test_noise_free_observations_reach_the_model_at_the_noise_floor(model_name):
    # Ax reports sem = 0 (noise-free) as Yvar = 0; the models that weigh points by 1/noise
    # refuse a zero variance, which made every model-based trial of such an experiment fail.
    ax_cls = boax.available_models()[model_name]
    X = torch.rand(10, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    Y = (Y - Y.mean()) / Y.std()
    Yvar = torch.zeros_like(Y)
    opts = {"refit_every": 1, "fit_options": {"max_iter": 5}}
    import warnings

    for rows, message in ((8, "8 noise-free observation"), (10, "10 noise-free observation")):
        # one warning per build, this one: the models' own floor warnings are not repeated
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = _build(ax_cls, X[:rows], Y[:rows], Yvar[:rows], **opts)
        said = [str(w.message) for w in caught if "floor" in str(w.message)]
        assert len(said) == 1 and message in said[0], said
        if rows == 8:
            assert torch.isfinite(model.posterior(X).mean).all()
    second = model  # the two new rows were noise-free as well
    stats = boax.session_stats()
    assert (stats.rebuilds, stats.incremental) == (1, 1)
    assert second.num_data == 10
    # nearly noise-free: the posterior mean interpolates the observations
    assert float((second.posterior(X).mean.detach() - Y).abs().max()) < 0.05


def test_failed_update_falls_back_to_rebuild(monkeypatch):
    ax_cls = boax.AxOnlineExactGP
    X = torch.rand(9, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    Y = X.prod(-1, keepdim=True)
    opts = {"fit_options": {"max_iter": 5}}
    _build(ax_cls, X[:7], Y[:7], **opts)

    def broken(*args, **kwargs):
        raise RuntimeError("factor lost definiteness")

    monkeypatch.setattr(ax_surrogate, "_extended_model", broken)  # where the subclass looks it up
    model = _build(ax_cls, X, Y, **opts)
    stats = boax.session_stats()
    assert stats.rebuilds == 2 and "incremental update failed" in stats.reasons[-1]
    assert model.num_data == 9 and model._ax_scale == 1.0


def test_auto_refit_thins_out_where_a_refit_visits_every_observation():
    r"""Beyond ``AUTO_REFIT_SMALL_N`` observations the ``"auto"`` schedule refits the exact GP,
    t-SVGP and the decoupled SVGP only once the data have grown by ``AUTO_REFIT_GROWTH`` (their
    refit's cost grows with n), and WISKI and QSGP at every trial with new data."""
    from bo_online.loops.core import OnlineLoop

    small, growth = OnlineLoop.AUTO_REFIT_SMALL_N, OnlineLoop.AUTO_REFIT_GROWTH
    last = small + 10
    grown = math.ceil((1 + growth) * last)
    for ax_cls, thins in (
        (boax.AxOnlineExactGP, True),
        (boax.AxTSVGP, True),
        (boax.AxDecoupledSVGP, True),
        (boax.AxWISKI, False),
        (boax.AxQSGP, False),
    ):
        due = ax_surrogate._auto_refit_due
        assert due(ax_cls, last + 1, last, since=1) is (not thins), ax_cls.__name__
        assert due(ax_cls, grown, last, since=grown - last), ax_cls.__name__
        assert due(ax_cls, small, small - 1, since=1), ax_cls.__name__  # every trial up to small
        assert not due(ax_cls, last, last, since=0), ax_cls.__name__  # nothing new


def test_wiski_takes_trials_on_bounds_that_float32_cannot_hold():
    """Ax builds its ``Normalize`` from the search space in float32, where 0.9 becomes
    0.89999998: a trial on that bound mapped 6e-8 outside the unit cube, and WISKI's grid refused
    it at every later trial (generation stopped for good)."""
    client = Client(random_seed=0)
    params = [
        RangeParameterConfig(name=f"x{i}", parameter_type="float", bounds=(0.1, 0.9))
        for i in range(4)
    ]
    client.configure_experiment(parameters=params, name="float32_bounds")
    client.configure_optimization(objective="y")
    strategy = boax.make_generation_strategy(
        "WISKI", num_initial_trials=3, optimizer_options=FAST_OPT, fit_options={"max_iter": 5}
    )
    client.set_generation_strategy(strategy)
    for corner in (0.9, 0.1):  # a user's baseline on each face of the box
        index = client.attach_trial(parameters={f"x{i}": corner for i in range(4)})
        client.complete_trial(index, raw_data={"y": 4 * corner})
    for _ in range(5):  # 3 Sobol, 2 from WISKI
        for index, p in client.get_next_trials(max_trials=1).items():
            assert all(0.1 <= v <= 0.9 for v in p.values())
            client.complete_trial(index, raw_data={"y": sum(p.values())})
    assert boax.session_stats().rebuilds >= 1  # WISKI was built, and generated 2 trials


@pytest.mark.parametrize(
    "lower, upper", [(0.1, 0.9), (-5.0, 10.0), (1e6, 1e6 + 100), (1.7e9, 1.7e9 + 86400)]
)
def test_float32_bounds_are_widened_by_their_own_rounding_only(lower, upper):
    """Every point of the float64 box maps into [0, 1], and the cube loses no more than a few
    float32 rounding steps of the bounds (a first version widened by 8-16 steps: 1.9% of the
    cube at [1e6, 1e6 + 100], 4% for a range of timestamps)."""
    from botorch.models.transforms.input import Normalize

    box = torch.tensor([[lower], [upper]], dtype=torch.float64)
    as_ax_builds_it = Normalize(1, bounds=box.float())
    widened = ax_surrogate._bounds_covering_the_box(as_ax_builds_it, torch.float64)
    assert widened is not as_ax_builds_it and widened._offset.dtype == torch.float64
    image = widened.transform(box)
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    top = torch.tensor(max(abs(lower), abs(upper)), dtype=torch.float32)
    step = float(torch.nextafter(top, torch.tensor(math.inf)) - top)  # float32 step there
    assert 1.0 - float(image.max() - image.min()) <= 4 * step / (upper - lower)


def test_refit_every_in_model_options_is_not_replaced_by_the_default():
    # make_generation_strategy(model_options={"refit_every": 3}) silently stored "auto".
    def stored(**kwargs):
        gs = boax.make_generation_strategy("OnlineExactGP", **kwargs)
        spec = gs._nodes[1].generator_specs[0].generator_kwargs["surrogate_spec"]
        return spec.model_configs[0].model_options["refit_every"]

    assert stored(model_options={"refit_every": 3}) == 3
    assert stored(model_options={"refit_every": None}) is None
    assert stored(model_options={"refit_every": 3}, refit_every=3) == 3
    assert stored(refit_every=4) == 4
    assert stored() == "auto"
    with pytest.raises(ValueError, match="refit_every given twice"):
        stored(model_options={"refit_every": 3}, refit_every=5)
    with pytest.raises(ValueError, match="'auto', a positive integer or None"):
        stored(model_options={"refit_every": "often"})


def test_a_warm_refit_in_ax_has_the_loops_iteration_budget(monkeypatch):
    r"""Ax's refit of a model it fitted before is warm-started, as in the BO loops, and gets the
    loops' budget for one (``WARM_REFIT_MAX_ITER`` = 50 L-BFGS iterations); a first fit keeps
    the model's default (200), and a budget in ``fit_options`` wins. With 200 for every refit,
    WISKI at 6 inputs spent 16 s per trial in refits at 15 trials (its 47 hyperparameters
    rarely converge)."""
    from bo_online.loops.refit_rules import WARM_REFIT_MAX_ITER

    budgets = []
    original = boax.AxWISKI.fit

    def recording_fit(self, *args, **kwargs):
        budgets.append(kwargs.get("max_iter"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(boax.AxWISKI, "fit", recording_fit)
    g = torch.Generator().manual_seed(4)
    X = torch.rand(12, 2, dtype=torch.float64, generator=g)
    Y = torch.sin(5 * X.sum(-1, keepdim=True)) + 0.1 * X[:, :1]
    # exact_max_n=0: SKI from the first point (in its exact regime WISKI is rebuilt and fitted
    # from the defaults at every trial, as the exact GP is, and never warm-refit)
    for n in (10, 11):
        _build(boax.AxWISKI, X[:n], Y[:n], exact_max_n=0)
    assert boax.session_stats().incremental == 1
    assert budgets == [None, WARM_REFIT_MAX_ITER]

    boax.clear_sessions()
    budgets.clear()
    for n in (10, 11, 12):
        _build(boax.AxWISKI, X[:n], Y[:n], exact_max_n=0, fit_options={"max_iter": 3})
    assert budgets == [3, 3, 3]


def test_constrained_qlognei_without_a_feasible_point_evaluates_wiski_beyond_its_box():
    """With outcome constraints and no feasible observation yet, BoTorch's qLogNEI estimates
    the infeasible cost at random points of the data's bounding box widened by 10%, i.e. beyond
    Ax's unit cube: WISKI's grid refused them with ValueError, so no model-based trial of such
    an experiment could be generated. The Ax models evaluate such points on the box."""
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.acquisition.objective import GenericMCObjective
    from botorch.models import ModelListGP

    from bo_online.models import WISKI

    g = torch.Generator().manual_seed(0)
    X = torch.rand(8, 2, dtype=torch.float64, generator=g)
    X[0], X[1] = torch.tensor([0.01, 0.02]), torch.tensor([0.98, 0.99])  # data span the box
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    ax_model = _build(boax.AxWISKI, X, Y, fit=False)
    # the same model (no fit: default hyperparameters; the loops' options), outside Ax
    plain = WISKI(X, Y, **WISKI.loop_default_options(2))
    outside = torch.tensor([[-0.07, 0.5], [1.05, -0.02], [0.3, 1.1]], dtype=torch.float64)
    with pytest.raises(ValueError, match="outside the model's input bounds"):
        plain.posterior(outside)  # the model itself still refuses them
    with torch.no_grad():
        post = ax_model.posterior(outside)
        ref = plain.posterior(outside.clamp(0.0, 1.0))
        torch.testing.assert_close(post.mean, ref.mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(
            post.distribution.covariance_matrix,
            ref.distribution.covariance_matrix,
            rtol=1e-10,
            atol=1e-12,
        )
        inside = torch.rand(5, 2, dtype=torch.float64, generator=g)
        torch.testing.assert_close(
            ax_model.posterior(inside).mean, plain.posterior(inside).mean, rtol=0, atol=0
        )
    boax.clear_sessions()
    constraint = _build(boax.AxWISKI, X, X.sum(-1, keepdim=True), fit=False)
    acqf = qLogNoisyExpectedImprovement(
        ModelListGP(ax_model, constraint),
        X_baseline=X,
        sampler=SobolQMCNormalSampler(torch.Size([16]), seed=0),
        objective=GenericMCObjective(lambda Z, X=None: Z[..., 0]),
        constraints=[lambda Z: Z[..., 1] + 10.0],  # c <= -10: no observation is feasible
        prune_baseline=False,
    )
    torch.manual_seed(0)  # the random points of the infeasible-cost estimate
    with torch.no_grad(), pytest.warns(Warning, match="all training points are infeasible"):
        values = acqf(torch.rand(4, 1, 2, dtype=torch.float64, generator=g))
    assert values.shape == (4,) and bool(torch.isfinite(values).all())


@pytest.mark.parametrize("model_name", MODELS)
def test_misspelt_model_or_fit_options_are_refused_before_any_trial(model_name):
    """Ax builds the model only after the Sobol trials, so a misspelt option name failed there
    (a TypeError from the constructor), after as many evaluations; it is refused at once, with
    the accepted names. Options the model takes, and the Ax subclass's own, still pass."""
    with pytest.raises(
        ValueError, match="Unknown model option.*'gridsize'.*accepted: .*refit_every"
    ):
        boax.make_generation_strategy(model_name, model_options={"gridsize": 30})
    with pytest.raises(ValueError, match="Unknown fit option.*'maxiter'.*accepted: .*max_iter"):
        boax.make_generation_strategy(model_name, fit_options={"maxiter": 5})
    boax.make_generation_strategy(
        model_name,
        model_options={"standardize": True, "refit_every": 3, "incremental": False},
        fit_options={"max_iter": 5},
    )


@pytest.mark.parametrize("model_name", MODELS)
def test_fit_option_values_no_fit_can_run_with_are_refused_before_any_trial(model_name):
    """Fit option names were checked when the strategy was made, values not: ``max_iter=-5``
    ran every fit anyway, ``max_iter="10"`` failed with a TypeError at the first model-based
    trial, after the Sobol evaluations. Both are refused at once, with what is accepted."""
    for bad, match in (
        ({"max_iter": -5}, "max_iter must be an integer >= 0, got -5"),
        ({"max_iter": "10"}, "max_iter must be an integer >= 0, got '10'"),
        ({"timeout_sec": -1.0}, "timeout_sec must be a number of seconds >= 0"),
    ):
        with pytest.raises(ValueError, match=match):
            boax.make_generation_strategy(model_name, fit_options=bad)
        with pytest.raises(ValueError, match=match):
            boax.make_generation_strategy(model_name, model_options={"fit_options": bad})
    boax.make_generation_strategy(model_name, fit_options={"max_iter": 0})


_BAD_OPTION_VALUES = [
    ("TSVGP", "inducing_points", 0, "inducing_points must be a whole number m >= 1 or an m x"),
    ("TSVGP", "inducing_points", 2.5, "inducing_points must be a whole number m >= 1 or an m x"),
    ("TSVGP", "inducing_points", "abc", "inducing_points must be a whole number m >= 1"),
    ("TSVGP", "num_init_e_steps", -1, "num_init_e_steps must be an integer >= 0"),
    ("WISKI", "grid_size", 0, "Grid sizes must be >= 6"),
    ("WISKI", "grid_size", "x", "grid_size must be a whole number"),
    ("WISKI", "prior_variance", "nope", "prior_variance must be 'interpolated' or 'exact'"),
    ("WISKI", "grid_jitter", -1.0, "grid_jitter must be a finite number >= 0"),
    ("DecoupledSVGP", "num_mean_bases", 0, "num_mean_bases must be an integer >= 1"),
    ("DecoupledSVGP", "num_cov_bases", "many", "num_cov_bases must be an integer >= 1"),
    ("QSGP", "num_features", -8, "num_features must be >= 1"),
    ("QSGP", "family", "nope", "family must be 'mean_field', 'chevron' or 'full'"),
    ("OnlineExactGP", "standardize", "no", "standardize must be True or False"),
    ("OnlineExactGP", "bounds", "unit", "takes bounds: Tensor | None"),
]


@pytest.mark.parametrize("model_name, option, value, allowed", _BAD_OPTION_VALUES)
def test_bad_model_option_values_are_refused_before_any_trial(model_name, option, value, allowed):
    """Option names were checked when the strategy was made, values not: ``inducing_points=0``,
    ``grid_size="x"``, ``num_features=-8`` ... failed only at the first model-based trial, after
    the Sobol evaluations, with an error from inside the model (``new(): invalid data type
    'str'`` for ``bounds="unit"``). They are refused when the strategy is made, in one line
    naming the option, its value and what the model allows (its own check's message, or the
    constructor's annotation where that message does not name the option); another, valid,
    option given with it is not blamed."""
    others = {"TSVGP": {"condition_steps": 2}, "WISKI": {"exact_max_n": 0}}.get(model_name, {})
    with pytest.raises(ValueError) as info:
        boax.make_generation_strategy(model_name, model_options={**others, option: value})
    message = str(info.value)
    assert "\n" not in message
    assert f"Model option {option}={value!r} is not valid for {model_name}" in message
    assert allowed in message
    # the model's own sizes in its message are the probe's: said so
    assert "built on a 1-input probe" in message
    for name in others:
        assert name not in message


@pytest.mark.parametrize(
    "model_name, options",
    [
        ("WISKI", {"projection": "none"}),  # refused above 3 inputs, valid below
        ("WISKI", {"projection": "all-pairs", "grid_size": 20}),
        ("WISKI", {"projection": "tanh:2"}),
        ("TSVGP", {"inducing_points": 64, "condition_steps": 2}),
        ("DecoupledSVGP", {"num_mean_bases": 32, "num_cov_bases": 16}),
        ("QSGP", {"num_features": 64, "basis": "inducing", "family": "chevron"}),
        ("QSGP", {"likelihood": "laplace", "exact_max_n": 0}),
    ],
)
def test_valid_model_option_values_pass_the_early_check(model_name, options):
    """The value check builds the model on a few points at 1, 2 and 6 inputs and refuses only
    what fails at every one: options valid for some number of inputs pass."""
    boax.make_generation_strategy(model_name, model_options=options)


def test_option_check_passes_a_subclass_forwarding_keywords_and_a_settings_object():
    """The early option check refused every option of a user's subclass whose ``__init__``
    forwards ``**options`` to its parent (it took them for fit settings, QSGP's
    ``**fit_options``), and a whole settings object passed as ``fit_options={"settings": ...}``,
    which the model's ``fit`` takes. Both pass; misspelt fit options still fail."""
    from bo_online.models import WISKI
    from bo_online.models.wiski.fitting import WISKIFitSettings

    class ForwardingWISKI(WISKI):
        def __init__(self, train_X, train_Y, train_Yvar=None, **options):
            super().__init__(train_X, train_Y, train_Yvar, **options)

    boax.make_generation_strategy(ForwardingWISKI, model_options={"grid_size": 20})
    settings = WISKIFitSettings(max_iter=7)
    boax.make_generation_strategy("WISKI", fit_options={"settings": settings, "max_iter": 5})
    with pytest.raises(ValueError, match="Unknown fit option.*'maxiter'"):
        boax.make_generation_strategy("WISKI", fit_options={"settings": settings, "maxiter": 5})


@pytest.mark.parametrize(
    "short, name",
    [
        ("exact", "OnlineExactGP"),
        ("wiski", "WISKI"),
        ("TSVGP", "TSVGP"),
        ("decoupled", "DecoupledSVGP"),
        ("qsgp", "QSGP"),
    ],
)
def test_the_loops_model_names_select_the_same_model_in_ax(short, name):
    """The CLI's and the loops' names (``--model exact``, ``"wiski"``) failed in Ax with
    "<module 'bo_online.models.exact' ...> is not a subclass of OnlineModel" (the name resolved
    to a module of bo_online.models). They select the same class as its own name."""
    gs = boax.make_generation_strategy(short)
    assert gs.name.startswith(f"Sobol+{name}+")
    assert boax.register_model_class(short) is boax.available_models()[name]


def test_a_name_that_is_no_online_model_gets_the_names_to_use():
    for bad in ("bo_online.models.exact", "singletaskgp"):
        with pytest.raises(ValueError, match=r"not a subclass of .*OnlineModel.*'exact', 'wiski'"):
            boax.make_generation_strategy(bad)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"num_restarts": -1}, "optimizer_options num_restarts must be an integer >= 1, got -1"),
        ({"raw_samples": 2.5}, "optimizer_options raw_samples must be an integer >= 1, got 2.5"),
        ({"num_restarts": True}, "optimizer_options num_restarts must be an integer >= 1"),
        (
            {"num_restarts": 4, "raw_samples": 3},
            r"raw_samples \(3\) must be at least num_restarts \(4\)",
        ),
        ("num_restarts=4", "optimizer_options must be a dict of optimize_acqf arguments"),
    ],
)
def test_bad_optimizer_counts_are_refused_before_any_trial(options, message):
    """``optimizer_options={"num_restarts": -1}`` (or fewer raw samples than restarts) was
    taken, and the first model-based trial failed after the Sobol evaluations, inside
    BoTorch. The counts are checked when the strategy is made; valid ones pass on unchanged."""
    with pytest.raises(ValueError, match=message):
        boax.make_generation_strategy("OnlineExactGP", optimizer_options=options)
    good = {"num_restarts": 4, "raw_samples": 64, "options": {"maxiter": 20}}
    gs = boax.make_generation_strategy("OnlineExactGP", optimizer_options=good)
    gen_options = gs._nodes[1].generator_specs[0].generator_kwargs["default_model_gen_options"]
    assert gen_options == {"optimizer_kwargs": good}


def test_a_misspelt_optimizer_option_is_refused_before_any_trial():
    """``optimizer_options={"num_restart": 4}`` was taken, and the first model-based trial
    failed after the Sobol evaluations (BoTorch's ``TypeError: gen_batch_initial_conditions()
    got an unexpected keyword argument 'num_restart'``). A name no optimiser Ax may pick takes
    is refused when the strategy is made, with the closest name; names of the mixed and
    discrete optimisers (which Ax picks for choice parameters) still pass."""
    with pytest.raises(ValueError, match=r"'num_restart' \(did you mean 'num_restarts'\?\)"):
        boax.make_generation_strategy("OnlineExactGP", optimizer_options={"num_restart": 4})
    with pytest.raises(ValueError, match=r"'foo'.*'rawsamples' \(did you mean 'raw_samples'"):
        boax.make_generation_strategy(
            "OnlineExactGP", optimizer_options={"rawsamples": 64, "foo": 1}
        )
    for good in (
        {"num_restarts": 2, "raw_samples": 16, "sequential": True, "timeout_sec": 60.0},
        {"max_batch_size": 512, "unique": True},  # optimize_acqf_discrete's
        {"retry_on_optimization_warning": False, "options": {"maxiter": 20}},
    ):
        boax.make_generation_strategy("OnlineExactGP", optimizer_options=good)


def test_a_torch_device_this_machine_lacks_is_refused_before_any_trial(monkeypatch):
    """``torch_device="cuda"`` on a machine without CUDA was taken, and the first model-based
    trial failed after the Sobol evaluations ("AssertionError: Torch not compiled with CUDA
    enabled"); ``"gpu"`` failed with torch's RuntimeError listing every device type. Both are
    refused when the strategy is made, with the BO loops' device check (cuda:N beyond the
    devices present too)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device 'cuda' requested but CUDA is not available"):
        boax.make_generation_strategy("OnlineExactGP", torch_device="cuda")
    with pytest.raises(ValueError, match="Invalid device 'gpu'"):
        boax.make_generation_strategy("OnlineExactGP", torch_device="gpu")
    with pytest.raises(ValueError, match="torch_device must be cpu or cuda"):
        boax.make_generation_strategy("OnlineExactGP", torch_device="meta")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="this machine has 1 CUDA device"):
        boax.make_generation_strategy("OnlineExactGP", torch_device="cuda:1")
    gs = boax.make_generation_strategy("OnlineExactGP", torch_device="cpu")
    kwargs = gs._nodes[1].generator_specs[0].generator_kwargs
    assert kwargs["torch_device"] == torch.device("cpu")


def test_an_acquisition_function_given_by_name_is_refused_with_what_to_pass():
    """The model may be named (``"WISKI"``), so a user names the acquisition function as well:
    that failed with ``AttributeError: 'str' object has no attribute '__name__'``. It is refused
    with a message that asks for the class; a class still builds the strategy with it."""
    for bad in ("qLogExpectedImprovement", 3):
        with pytest.raises(ValueError, match="botorch_acqf_class must be a BoTorch acquisition"):
            boax.make_generation_strategy("OnlineExactGP", botorch_acqf_class=bad)
    with pytest.raises(ValueError, match="the class, not its name or an instance"):
        boax.make_generation_strategy("OnlineExactGP", botorch_acqf_class=torch.nn.Linear)
    gs = boax.make_generation_strategy("OnlineExactGP", botorch_acqf_class=qLogExpectedImprovement)
    kwargs = gs._nodes[1].generator_specs[0].generator_kwargs
    assert kwargs["botorch_acqf_class"] is qLogExpectedImprovement
    assert gs.name == "Sobol+OnlineExactGP+qLogExpectedImprovement"


def test_switches_given_as_strings_are_refused_not_read_as_true():
    """``incremental`` (a model option) and ``winsorize`` were read with ``bool()``, so
    ``"no"`` or ``"False"`` silently meant True: the model went on incrementally and Winsorize
    was put in. Both are refused with a ``TypeError`` before any trial (and ``construct_inputs``
    refuses ``incremental`` as well); True and False still work."""
    from ax.adapter.transforms.winsorize import Winsorize

    X = torch.rand(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for bad in ("no", "False", 0, None):
        with pytest.raises(TypeError, match="incremental must be True or False"):
            boax.make_generation_strategy("OnlineExactGP", model_options={"incremental": bad})
        with pytest.raises(TypeError, match="incremental must be True or False"):
            boax.AxOnlineExactGP.construct_inputs(_dataset(X, X[:, :1]), incremental=bad)
        with pytest.raises(TypeError, match="winsorize must be True or False"):
            boax.make_generation_strategy("OnlineExactGP", winsorize=bad)
    for flag in (True, False):
        gs = boax.make_generation_strategy(
            "OnlineExactGP", model_options={"incremental": flag}, winsorize=flag
        )
        kwargs = gs._nodes[1].generator_specs[0].generator_kwargs
        config = kwargs["surrogate_spec"].model_configs[0]
        assert config.model_options["incremental"] is flag
        assert (Winsorize in kwargs["transforms"]) is flag
        inputs = boax.AxOnlineExactGP.construct_inputs(_dataset(X, X[:, :1]), incremental=flag)
        assert inputs["ax_incremental"] is flag


def test_num_initial_trials_must_be_a_whole_number():
    """``num_initial_trials=5.5`` became Ax's transition threshold as given, so the model took
    over after 6 Sobol trials, not the 5 or 5.5 asked for; ``"5"`` failed with ``TypeError: '<'
    not supported between instances of 'str' and 'int'``. Both are refused with what is
    accepted; an integral number (of any integral type) is the threshold of both criteria."""
    import numpy as np

    for bad in (5.5, "5", None, True, float("inf"), 1):
        with pytest.raises(ValueError, match="num_initial_trials must be an integer >= 2"):
            boax.make_generation_strategy("OnlineExactGP", num_initial_trials=bad)
    for good in (4, np.int64(4), 4.0):
        gs = boax.make_generation_strategy("OnlineExactGP", num_initial_trials=good)
        thresholds = [c.threshold for c in gs._nodes[0].transition_criteria]
        assert thresholds == [4, 4] and all(type(t) is int for t in thresholds)


@pytest.mark.parametrize(
    "model_name, extra", [("DecoupledSVGP", {}), ("QSGP", {}), ("QSGP", {"exact_max_n": 0})]
)
def test_a_cross_validation_fold_predicts_with_the_loaded_hyperparameters(model_name, extra):
    r"""Ax's cross-validation folds load the fitted model's hyperparameters and predict without
    a fit. The decoupled SVGP's ``a, B`` and QSGP's ``q(w)`` stayed those of the default
    hyperparameters the fold was built with, so its predictions were far off (LOO RMSE 1.1 and
    2.4 where the exact GP's was 0.19, on 9 Sobol points of a 4-D function): Ax judged every
    fit poor and ``get_best_parameterization`` fell back on raw data. The fold's posterior is
    now the GP of its own data under the loaded hyperparameters, checked against the kernel
    (function-space) form: the exact GP for the decoupled SVGP (its bases are the data) and for
    QSGP in its kernel regime (11 points, 512 features), else the GP of QSGP's features
    ``Phi S^-1 Phi^T``."""
    ax_cls = boax.available_models()[model_name]
    g = torch.Generator().manual_seed(6)
    X = torch.rand(12, 3, dtype=torch.float64, generator=g)
    Y = torch.sin(5 * X[:, :1]) + X[:, 1:2] ** 2 - X[:, 2:]
    opts = {"fit_options": {"max_iter": 30}, "incremental": False, **extra}
    main = _build(ax_cls, X, Y, **opts)
    with torch.no_grad():  # clearly away from the defaults the fold starts from
        for name, p in main.named_parameters():
            if name.endswith("raw_lengthscale"):
                p.fill_(-0.8)
    keep = torch.arange(12) != 4
    fold = _build(ax_cls, X[keep], Y[keep], fit=False, **opts)  # what Ax does for a fold
    fold.load_state_dict(main.state_dict())
    for name, p in fold.named_parameters():
        torch.testing.assert_close(p, dict(main.named_parameters())[name])
    Xt = torch.rand(6, 3, dtype=torch.float64, generator=g)
    with torch.no_grad():
        post = fold.posterior(Xt)
        Xf, y = fold.train_X, fold.train_y  # held inputs and standardised outcomes
        if model_name == "DecoupledSVGP":
            c = fold.mean_module.constant
            Kxx = fold.covar_module(Xf).to_dense()
            Ktx = fold.covar_module(Xt, Xf).to_dense()
            Ktt = fold.covar_module(Xt).to_dense()
        elif fold.is_exact_gp_on_data():  # QSGP on 11 <= m points: its kernel's exact GP
            c, k = fold.mean_constant, fold.basis.kernel
            Kxx, Ktx, Ktt = k(Xf).to_dense(), k(Xt, Xf).to_dense(), k(Xt).to_dense()
        else:
            c = fold.mean_constant
            idx = fold.basis.all_indices()
            S_inv = torch.linalg.inv(fold.basis.prior_precision_block(idx, idx))
            Pf, Pt = fold.basis.features(Xf), fold.basis.features(Xt)
            Kxx, Ktx, Ktt = Pf @ S_inv @ Pf.T, Pt @ S_inv @ Pf.T, Pt @ S_inv @ Pt.T
        G = Kxx + fold.likelihood.noise * torch.eye(Xf.shape[0], dtype=torch.float64)
        mean = c + Ktx @ torch.linalg.solve(G, y - c)
        var = torch.diagonal(Ktt - Ktx @ torch.linalg.solve(G, Ktx.T))
    std, mu = fold.outcome_std, fold.outcome_mean
    torch.testing.assert_close(post.mean.squeeze(-1), mean * std + mu, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(post.variance.squeeze(-1), var * std**2, rtol=1e-6, atol=1e-6)


def test_observations_with_and_without_sem_in_one_metric_get_an_error_that_says_what_to_do():
    """Trials of one metric completed with ``(mean, sem)`` and with a bare mean reach the model
    with NaN variances for the latter; the model refused them with "remove or impute them
    before passing data to the model", which an Ax user never does. The error now names the
    metric, the count, and what to report; all-NaN (no SEM anywhere) still means inferred
    noise, and known SEMs pass as they are."""
    X = torch.rand(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    Y = X.sum(-1, keepdim=True)
    Yvar = torch.full_like(Y, 0.01)
    Yvar[[1, 4]] = float("nan")
    for name in MODELS:
        ax_cls = boax.available_models()[name]
        with pytest.raises(ValueError, match=r"2 of the 6 observations of 'y' have no SEM"):
            ax_cls.construct_inputs(_dataset(X, Y, Yvar))
        inputs = ax_cls.construct_inputs(_dataset(X, Y, torch.full_like(Y, float("nan"))))
        assert inputs["train_Yvar"] is None
        inputs = ax_cls.construct_inputs(_dataset(X, Y, torch.full_like(Y, 0.01)))
        torch.testing.assert_close(inputs["train_Yvar"], torch.full_like(Y, 0.01))


def test_fit_options_in_model_options_are_checked_and_not_replaced():
    """``model_options`` is ``ModelConfig.model_options``, which takes ``fit_options``; given
    there, a misspelt fit option was not checked (it failed at the first model-based trial,
    after the Sobol ones), and a ``fit_options`` argument silently replaced it. It is now
    checked before any trial, kept when it is the only one, and two different ones are an
    error; a fit_options that is not a dict is refused with what is expected."""

    def stored(gs):
        spec = gs._nodes[1].generator_specs[0].generator_kwargs["surrogate_spec"]
        return spec.model_configs[0].model_options.get("fit_options")

    with pytest.raises(ValueError, match="Unknown fit option.*'maxiter'.*accepted: .*max_iter"):
        boax.make_generation_strategy(
            "OnlineExactGP", model_options={"fit_options": {"maxiter": 5}}
        )
    with pytest.raises(ValueError, match="fit_options given twice"):
        boax.make_generation_strategy(
            "OnlineExactGP", model_options={"fit_options": {"max_iter": 5}}, fit_options={"lr": 0.1}
        )
    for bad in ([1], "max_iter=5"):
        with pytest.raises(ValueError, match="fit_options must be a dict"):
            boax.make_generation_strategy("OnlineExactGP", fit_options=bad)
        with pytest.raises(ValueError, match="fit_options must be a dict"):
            boax.make_generation_strategy("OnlineExactGP", model_options={"fit_options": bad})
    one = {"max_iter": 5}
    assert stored(boax.make_generation_strategy("TSVGP", model_options={"fit_options": one})) == one
    assert stored(boax.make_generation_strategy("TSVGP", fit_options=one)) == one
    same = boax.make_generation_strategy(
        "TSVGP", model_options={"fit_options": dict(one)}, fit_options=dict(one)
    )
    assert stored(same) == one


@pytest.mark.parametrize("model_name", MODELS)
def test_active_learning_input_constructors_take_every_model(model_name):
    """BoTorch's input constructors for qNegIntegratedPosteriorVariance (Ax's active-learning
    acquisition) and qJointEntropySearch read ``model.train_targets`` for the dtype of their
    points; WISKI keeps statistics, not its targets, so an Ax experiment with it failed at the
    first model-based trial with AttributeError: 'AxWISKI' object has no attribute
    'train_targets'. The Ax subclass supplies Ax's training targets where a model has none."""
    from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance
    from botorch.acquisition.input_constructors import get_acqf_input_constructor

    ax_cls = boax.available_models()[model_name]
    g = torch.Generator().manual_seed(0)
    X = torch.rand(8, 2, dtype=torch.float64, generator=g)
    Y = torch.sin(4 * X[:, :1]) + X[:, 1:]
    model = _build(ax_cls, X, Y, fit=False, incremental=False)
    assert model.train_targets.dtype == torch.float64
    if model_name == "WISKI":  # the targets Ax gave, in its units
        torch.testing.assert_close(model.train_targets, Y.squeeze(-1))
    inputs = get_acqf_input_constructor(qNegIntegratedPosteriorVariance)(
        model=model, bounds=[(0.0, 1.0), (0.0, 1.0)], num_mc_points=16
    )
    acqf = qNegIntegratedPosteriorVariance(**inputs)
    assert torch.isfinite(acqf(X[:3].unsqueeze(-2))).all()


class _KeepsTargets(WISKI):
    """A user's surrogate that keeps its targets itself, GPyTorch-style: as an attribute."""

    def __init__(self, train_X, train_Y, train_Yvar=None, **options):
        super().__init__(train_X, train_Y, train_Yvar, **options)
        self.train_targets = 2 * train_Y.squeeze(-1)


class _KeepsTargetsBuffer(WISKI):
    """... or as a buffer."""

    def __init__(self, train_X, train_Y, train_Yvar=None, **options):
        super().__init__(train_X, train_Y, train_Yvar, **options)
        self.register_buffer("train_targets", 2 * train_Y.squeeze(-1))


@pytest.mark.parametrize("model_class", [_KeepsTargets, _KeepsTargetsBuffer])
def test_ax_train_targets_leave_a_models_own_as_they_are(model_class):
    """The Ax subclass gives ``train_targets`` to a model without them (WISKI); its read-only
    property also shadowed a user surrogate's own: one that sets ``self.train_targets`` failed
    to build ("property 'train_targets' of 'Ax_KeepsTargets' object has no setter"), one that
    keeps them as a buffer read Ax's instead, silently."""
    ax_cls = boax.ax_model_class(model_class)
    X = torch.rand(8, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    Y = X.sum(-1, keepdim=True)
    model = ax_cls(X, Y)
    torch.testing.assert_close(model.train_targets, 2 * Y.squeeze(-1))
    # deepcopy and pickling (Ax copies models) keep both cases
    torch.testing.assert_close(copy.deepcopy(model).train_targets, 2 * Y.squeeze(-1))
    wiski = boax.ax_model_class(WISKI)(X, Y)
    torch.testing.assert_close(copy.deepcopy(wiski).train_targets, Y.squeeze(-1))
    torch.testing.assert_close(pickle.loads(pickle.dumps(wiski)).train_targets, Y.squeeze(-1))
    # models with their own train_targets get no fallback on their attribute lookups
    assert "__getattr__" not in vars(boax.ax_model_class(OnlineExactGP))


@pytest.mark.parametrize("model_name", MODELS)
def test_a_refit_that_fails_midway_leaves_the_stored_model_as_it_was(model_name, monkeypatch):
    # On the incremental path the new model shares its hyperparameter modules with the stored
    # one (the exact GP and the decoupled SVGP are conditioned on it); a refit that raised
    # after some steps moved the stored model's hyperparameters (its posterior by 0.9), and the
    # next trial went on from them.
    ax_cls = boax.available_models()[model_name]
    base = ax_cls._bo_online_base
    X = torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    Y = torch.sin(6 * X).sum(-1, keepdim=True)
    opts = {"fit_options": {"max_iter": 20}, "refit_every": 1, "experiment_key": "k"}
    stored = _build(ax_cls, X[:8], Y[:8], **opts)
    test_X = torch.rand(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mean = stored.posterior(test_X).mean.clone()
    hyper = {k: v.detach().clone() for k, v in stored.named_parameters()}

    def fails_midway(self, *args, **kwargs):
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.7)  # some optimiser steps
        raise RuntimeError("fit failed midway")

    monkeypatch.setattr(base, "fit", fails_midway)
    with pytest.raises(RuntimeError, match="failed midway"):
        _build(ax_cls, X[:10], Y[:10], **opts)
    monkeypatch.undo()
    for k, v in stored.named_parameters():
        assert torch.equal(v.detach(), hyper[k]), k
    with torch.no_grad():
        torch.testing.assert_close(stored.posterior(test_X).mean, mean, atol=0, rtol=0)
    after = _build(ax_cls, X[:10], Y[:10], fit=False, **opts)  # the next trial goes on from it
    for k, v in after.named_parameters():
        assert torch.equal(v.detach(), hyper[k]), k


@pytest.mark.parametrize("model_name", ["OnlineExactGP", "DecoupledSVGP"])
def test_a_state_loaded_into_an_incrementally_built_model_leaves_the_stored_one(model_name):
    # Ax loads a fitted model's state_dict into the model it builds for a cross-validation fold;
    # a model built incrementally (here: on rows that extend the stored ones) shares its
    # hyperparameter modules with the stored model, and loading in place moved the stored
    # model's posterior (by 0.15 / 0.22).
    ax_cls = boax.available_models()[model_name]
    X = torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    Y = torch.sin(6 * X).sum(-1, keepdim=True)
    opts = {"fit_options": {"max_iter": 20}, "experiment_key": "k", "refit_every": 5}
    stored = _build(ax_cls, X[:8], Y[:8], **opts)
    other = _build(ax_cls, X[2:], 2 * Y[2:], fit_options={"max_iter": 20}, experiment_key="o")
    test_X = torch.rand(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mean = stored.posterior(test_X).mean.clone()
    hyper = {k: v.detach().clone() for k, v in stored.named_parameters()}
    fold = _build(ax_cls, X[:9], Y[:9], fit=False, **opts)
    assert boax.session_stats().incremental == 1  # built from the stored model
    fold.load_state_dict(other.state_dict())
    for k, v in fold.named_parameters():  # the fold has the loaded values ...
        assert torch.equal(v.detach(), dict(other.named_parameters())[k].detach()), k
    for k, v in stored.named_parameters():  # ... and the stored model its own
        assert torch.equal(v.detach(), hyper[k]), k
    with torch.no_grad():
        torch.testing.assert_close(stored.posterior(test_X).mean, mean, atol=0, rtol=0)


def test_a_model_that_leaves_its_exact_regime_is_refit_at_that_trial():
    r"""QSGP fitted as the exact GP of its kernel (``exact_max_n``) and conditioned past it
    predicts in weight space with the kernel's hyperparameters: the trial that crosses refits
    whatever ``refit_every`` says (as the loops do); ``refit_every=None`` never refits."""
    ax_cls = boax.AxQSGP
    g = torch.Generator().manual_seed(2)
    X = torch.rand(14, 3, dtype=torch.float64, generator=g)
    Y = torch.cos(4 * X.sum(-1, keepdim=True))
    for every, expected in (
        (5, [True, False, False, True, False, False]),
        (None, [True] + [False] * 5),
    ):
        boax.clear_sessions()
        opts = {"refit_every": every, "fit_options": {"max_iter": 10}}
        due = []
        for n in range(6, 12):  # exact GP up to 8 observations
            model = _build(ax_cls, X[:n], Y[:n], fit=False, exact_max_n=8, num_features=32, **opts)
            due.append(model.refit_due)
            model.ax_fit()
        assert due == expected, every
        assert not model.is_exact_gp_on_data()
