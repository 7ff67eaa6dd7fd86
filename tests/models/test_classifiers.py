r"""The streaming loop's binary classifiers (``bo_online.models.classifiers``).

``predict_proba`` is checked against the predictive probability integrated here, by adaptive
quadrature (SciPy), from each model's own latent posterior:

* t-SVGP: ``p(y = 1 | x) = int link(f) N(f; mu, s^2) df`` with the latent marginal ``N(mu, s^2)``;
* two-class WISKI Dirichlet: ``E[softmax(f)_1] = E[sigmoid(f_1 - f_0)]`` with independent class
  latents, so ``f_1 - f_0 ~ N(mu_1 - mu_0, s_0^2 + s_1^2)`` (a 1-D integral).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from botorch.sampling import SobolQMCNormalSampler
from scipy import integrate, special, stats

from bo_online.models.classifiers import (
    CLASSIFIERS,
    CONSTANT_PRIOR_SD,
    TSVGPClassifier,
    WISKIBinaryClassifier,
    classifier_class,
)
from bo_online.models.wiski.classification import WISKIDirichletClassifier

DT = torch.float64


def _data(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``n x 2`` inputs in the unit cube and ``n x 1`` labels of a noisy linear boundary."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=DT)
    flip = torch.rand(n, generator=g, dtype=DT) < 0.1
    y = ((X[:, 0] + 0.5 * X[:, 1] > 0.7) ^ flip).to(DT)
    return X, y.unsqueeze(-1)


def _gauss_expectation(fn, mean: float, var: float) -> float:
    r"""``int fn(f) N(f; mean, var) df`` by adaptive quadrature over +-12 standard deviations."""
    sd = math.sqrt(var)
    value, _ = integrate.quad(
        lambda f: fn(f) * stats.norm.pdf(f, mean, sd),
        mean - 12 * sd,
        mean + 12 * sd,
        epsabs=1e-13,
        epsrel=1e-12,
        limit=200,
    )
    return value


def _latent_marginals(model, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Means and variances (``n`` each) from the joint ``n``-point posterior's diagonal (not the
    per-point path ``predict_proba`` takes)."""
    with torch.no_grad():
        post = model.posterior(X)
        return post.mean.reshape(-1), post.variance.reshape(-1)


@pytest.mark.parametrize(
    "link, fn, tol",
    [
        ("probit", special.ndtr, 1e-12),  # closed form Phi(mu / sqrt(1 + s^2))
        ("logit", special.expit, 1e-10),  # 32-node Gauss-Hermite in the likelihood
    ],
)
def test_tsvgp_classifier_probability_integrates_the_link_over_the_latent(link, fn, tol):
    X, y = _data()
    clf = TSVGPClassifier(X[:30], y[:30], link=link, inducing_points=12)
    clf.update(X[30:], y[30:])
    clf.fit(max_iter=5)
    Xt = torch.rand(15, 2, generator=torch.Generator().manual_seed(1), dtype=DT)
    mean, var = _latent_marginals(clf, Xt)
    assert float(var.min()) > 1e-4  # a genuinely uncertain latent, so the integral matters
    ref = torch.tensor(
        [_gauss_expectation(fn, float(m), float(v)) for m, v in zip(mean, var)], dtype=DT
    )
    p = clf.predict_proba(Xt)
    assert p.shape == (15,) and p.dtype == DT
    torch.testing.assert_close(p, ref, rtol=0, atol=tol)
    # Integrating matters: the plug-in link(mu) differs by far more than the tolerance.
    assert float(abs(fn(mean.numpy()) - ref.numpy()).max()) > 100 * tol


@pytest.mark.parametrize("link", ["probit", "logit"])
def test_tsvgp_classifier_probability_of_a_fantasy_model_is_each_sample_s_own(link):
    r"""A fantasy classifier (batch ``sample x batch``) gives, for plain ``n x d`` queries, each
    fantasy's probabilities: those of a copy updated with that fantasy's labels. Its rows were
    put where its batch dims go, which failed to broadcast with the fantasy batch."""
    X, y = _data()
    clf = TSVGPClassifier(X, y, link=link, inducing_points=12)
    Xf = torch.rand(3, 2, 2, generator=torch.Generator().manual_seed(5), dtype=DT)
    fant = clf.fantasize(Xf, SobolQMCNormalSampler(torch.Size([2]), seed=0))
    Xt = torch.rand(7, 2, generator=torch.Generator().manual_seed(6), dtype=DT)
    p = fant.predict_proba(Xt)
    assert p.shape == (2, 3, 7)
    for s in range(2):
        for b in range(3):
            ref = copy.deepcopy(clf).update(Xf[b], fant._cy[s, b, -2:].unsqueeze(-1))
            torch.testing.assert_close(p[s, b], ref.predict_proba(Xt), rtol=0, atol=1e-12)
    # query batch dims line up with the model's as the posterior's do
    torch.testing.assert_close(fant.predict_proba(Xt.expand(3, 7, 2)), p, rtol=0, atol=1e-14)


def test_tsvgp_classifier_sets_its_own_likelihood():
    X, y = _data()
    with pytest.raises(ValueError, match="pass link= instead"):
        TSVGPClassifier(X, y, likelihood=None)
    # an unknown link names the option (it named only the likelihood's own argument)
    with pytest.raises(ValueError, match="TSVGPClassifier option link must be 'probit' or"):
        TSVGPClassifier(X, y, link="foo")


def test_tsvgp_classifier_default_is_as_confident_as_the_true_probabilities():
    r"""Labels drawn from known probabilities ``Phi(g(x))`` with a sharp boundary: the default
    classifier's probabilities are close to the true ones and as far from 1/2. With the former
    default kernel (unit prior variance, no outputscale) the latent could not reach the scale of
    ``g`` and the classifier was underconfident: mean |p - p_true| 0.052 and sharpness 0.032 below
    the truth's here (0.052-0.061 and 0.032-0.045 on three data draws; now 0.026-0.042 and
    0.002-0.021)."""
    g = torch.Generator().manual_seed(2)

    def true_prob(X: torch.Tensor) -> torch.Tensor:
        return special.ndtr(12 * (X[:, 0] + 0.5 * X[:, 1] - 0.75) + 3 * torch.sin(6 * X[:, 1]))

    X = torch.rand(300, 2, generator=g, dtype=DT)
    y = (torch.rand(300, generator=g, dtype=DT) < true_prob(X)).to(DT).unsqueeze(-1)
    Xt = torch.rand(2000, 2, generator=g, dtype=DT)
    clf = TSVGPClassifier(X, y)
    clf.fit()
    p, p_true = clf.predict_proba(Xt), true_prob(Xt)
    assert float((p - p_true).abs().mean()) < 0.04
    sharpness, true_sharpness = (p - 0.5).abs().mean(), (p_true - 0.5).abs().mean()
    assert abs(float(sharpness - true_sharpness)) < 0.015


def test_tsvgp_classifier_loads_a_state_saved_without_an_outputscale():
    r"""A state saved when the default kernel had no outputscale loads as outputscale 1: the
    same model (probabilities equal to the saved model's), which then fits its outputscale."""
    X, y = _data()
    unscaled = get_covar_module_with_dim_scaled_prior(ard_num_dims=2).to(DT)
    old = TSVGPClassifier(X, y, inducing_points=12, covar_module=unscaled)
    old.fit(max_iter=20)
    clf = TSVGPClassifier(X, y, inducing_points=12)
    clf.load_state_dict(old.state_dict())
    Xt = torch.rand(9, 2, generator=torch.Generator().manual_seed(3), dtype=DT)
    torch.testing.assert_close(clf.predict_proba(Xt), old.predict_proba(Xt), rtol=0, atol=1e-12)
    assert float(clf.covar_module.outputscale) == pytest.approx(1.0, abs=1e-12)
    clf.fit(max_iter=20)
    assert float(clf.covar_module.outputscale) > 1.5  # free again, and labels want more


@pytest.mark.parametrize("link", ["probit", "logit"])
def test_tsvgp_classifier_constant_mean_has_a_weak_gaussian_prior(link):
    r"""The constant mean's log prior is ``log N(c; 0, sd^2)`` (computed here by hand), added to
    the fit's objective with the kernel's. With labels of one class only the bound alone sends
    the constant to -inf: the fit stopped at -7.3 (probit) / -12.6 (logit) on 20 zeros, so
    p(y = 1) was ~1e-7 and the first positive label cost 16 nats. Under the prior the constant
    stays within three prior sds and p(y = 1) is a few percent (Laplace's rule of succession
    gives 1/22 for 20 zeros)."""
    X, _ = _data(20)
    clf = TSVGPClassifier(X, torch.zeros(20, 1, dtype=DT), link=link)
    sd = CONSTANT_PRIOR_SD[link]
    with torch.no_grad():
        clf.mean_module.constant.fill_(-1.3)
        with_prior = clf.log_prior()
        prior = clf.mean_module._priors.pop("mean_prior")
        without = clf.log_prior()
        clf.mean_module._priors["mean_prior"] = prior
    by_hand = -0.5 * (1.3 / sd) ** 2 - math.log(sd * math.sqrt(2 * math.pi))
    assert float(with_prior - without) == pytest.approx(by_hand, rel=1e-12)

    clf.fit()
    assert -3 * sd < float(clf.mean_module.constant) < 0.0
    p = clf.predict_proba(torch.rand(5, 2, dtype=DT, generator=torch.Generator().manual_seed(1)))
    assert bool(((p > 5e-3) & (p < 0.2)).all()), p


def test_tsvgp_classifier_loads_a_state_saved_before_its_mean_prior():
    r"""A state without the prior's buffers (saved before the constant had its prior) loads:
    the prior keeps its fixed values and the saved constant is taken."""
    X, y = _data()
    clf = TSVGPClassifier(X, y)
    state = {k: v for k, v in clf.state_dict().items() if "mean_prior" not in k}
    state["mean_module.raw_constant"] = torch.tensor(-0.7, dtype=DT)
    fresh = TSVGPClassifier(X, y)
    fresh.load_state_dict(state)
    assert float(fresh.mean_module.constant) == -0.7
    assert float(fresh.mean_module.mean_prior.scale) == CONSTANT_PRIOR_SD["probit"]


def test_wiski_binary_probability_is_the_expected_softmax_of_the_class_latents():
    X, y = _data(60)
    clf = WISKIBinaryClassifier(X[:40], y[:40], num_samples=40_000, grid_size=12)
    clf.update(X[40:], y[40:])
    Xt = torch.rand(12, 2, generator=torch.Generator().manual_seed(2), dtype=DT)
    (m0, v0), (m1, v1) = (_latent_marginals(m, Xt) for m in clf.models)
    ref = torch.tensor(
        [
            _gauss_expectation(special.expit, float(a - b), float(c + d))
            for a, b, c, d in zip(m1, m0, v1, v0)
        ],
        dtype=DT,
    )
    p = clf.predict_proba(Xt)
    assert p.shape == (12,)
    # Monte Carlo with 40 000 samples: standard error <= 0.5 / 200 = 0.0025; allow 4 of them.
    torch.testing.assert_close(p, ref, rtol=0, atol=0.01)
    # The average is not the plug-in sigmoid of the mean difference (the latents are uncertain).
    assert float((torch.sigmoid(m1 - m0) - ref).abs().max()) > 0.02
    # Seeded: the same call gives the same numbers.
    assert torch.equal(p, clf.predict_proba(Xt))


def test_wiski_binary_is_the_two_class_dirichlet_model_on_n_by_1_labels():
    r"""Labels ``n x 1`` in {0, 1} (float) give the class models of the Dirichlet classifier built
    on the same integer labels; other labels raise and leave the model unchanged."""
    X, y = _data(50)
    clf = WISKIBinaryClassifier(X[:30], y[:30], grid_size=12)
    clf.update(X[30:], y[30:])
    ref = WISKIDirichletClassifier(X[:30], y[:30].reshape(-1).long(), 2, grid_size=12)
    ref.update(X[30:], y[30:].reshape(-1).long())
    Xt = torch.rand(7, 2, generator=torch.Generator().manual_seed(3), dtype=DT)
    for a, b in zip(clf.latent(Xt), ref.latent(Xt)):  # means, variances: n x 2 each
        assert torch.equal(a, b)
    state = {k: v.clone() for k, v in clf.state_dict().items()}
    with pytest.raises(ValueError, match=r"labels in \{0, 1\}"):
        clf.update(X[:2], torch.tensor([[0.0], [0.5]], dtype=DT))
    after = clf.state_dict()
    assert state.keys() == after.keys() and all(torch.equal(state[k], after[k]) for k in state)


def test_wiski_binary_refuses_labels_of_more_than_one_column_and_stays_as_it_was():
    r"""A ``q x 2`` label tensor is not ``2q`` labels: flattened, it was taken with an X of
    ``2q`` rows, each label on the wrong row. It is refused (as t-SVGP refuses it), at
    construction and in ``update``, and the model stays as it was; so are non-tensor labels."""
    X, y = _data(40)
    two_cols = y[30:38].reshape(4, 2)
    with pytest.raises(ValueError, match=r"n x 1"):
        WISKIBinaryClassifier(X[30:38], two_cols, grid_size=12)
    clf = WISKIBinaryClassifier(X[:30], y[:30], grid_size=12)
    state = {k: v.clone() for k, v in clf.state_dict().items()}
    for bad in (two_cols, [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0]):
        with pytest.raises(ValueError, match=r"n x 1"):
            clf.update(X[30:38], bad)
    after = clf.state_dict()
    assert state.keys() == after.keys() and all(torch.equal(state[k], after[k]) for k in state)
    # the same labels as one column are taken, paired row by row
    ref = WISKIBinaryClassifier(X[:30], y[:30], grid_size=12)
    clf.update(X[30:38], two_cols.reshape(-1, 1))
    ref.update(X[30:38], y[30:38])
    Xt = torch.rand(5, 2, generator=torch.Generator().manual_seed(4), dtype=DT)
    assert torch.equal(clf.predict_proba(Xt), ref.predict_proba(Xt))


def test_wiski_binary_state_round_trip_restores_the_grown_statistics():
    X, y = _data(50)
    clf = WISKIBinaryClassifier(X[:30], y[:30], grid_size=12)
    clf.update(X[30:], y[30:])
    fresh = WISKIBinaryClassifier(X[:10], y[:10], grid_size=12)
    fresh.load_state_dict(clf.state_dict())
    Xt = torch.rand(9, 2, generator=torch.Generator().manual_seed(4), dtype=DT)
    assert torch.equal(fresh.predict_proba(Xt), clf.predict_proba(Xt))
    # Malformed keys (another class index, no name, a bare prefix) are the same KeyError, not
    # an IndexError / unpacking error, and leave the model as it was.
    for key in ("other.0.x", "models.2.x", "models.x.y", "models.0", "models"):
        with pytest.raises(KeyError, match="Unexpected key"):
            fresh.load_state_dict({**clf.state_dict(), key: torch.zeros(1)})
        assert torch.equal(fresh.predict_proba(Xt), clf.predict_proba(Xt))


def test_wiski_binary_state_that_fails_to_load_leaves_the_classifier_as_it_was():
    """The class models load their parts in turn: a part that did not fit (the second class
    model's lengthscale missing) raised torch's RuntimeError after the first class model had
    taken its new state (its statistics, factors and hyperparameters), so the classifier was
    left half loaded. Every class model is now as it was."""
    X, y = _data(50)
    clf = WISKIBinaryClassifier(X[:30], y[:30], grid_size=12)
    clf.update(X[30:], y[30:])
    state = clf.state_dict()
    key = next(k for k in state if k.startswith("models.1.") and "raw_lengthscale" in k)
    state.pop(key)
    fresh = WISKIBinaryClassifier(X[:10], y[:10], grid_size=12)
    Xt = torch.rand(9, 2, generator=torch.Generator().manual_seed(4), dtype=DT)
    before = fresh.predict_proba(Xt)
    saved = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(RuntimeError, match="Missing key"):
        fresh.load_state_dict(state)
    after = fresh.state_dict()
    assert saved.keys() == after.keys()
    assert all(torch.equal(saved[k], after[k]) for k in saved)
    assert torch.equal(fresh.predict_proba(Xt), before)
    assert [m.num_data for m in fresh.models] == [10, 10]


def test_classifier_class_names_the_classifying_surrogates():
    assert classifier_class("TSVGP") is TSVGPClassifier
    assert classifier_class("wiski") is WISKIBinaryClassifier
    assert set(CLASSIFIERS) == {"tsvgp", "wiski"}
    with pytest.raises(ValueError, match="cannot classify.*tsvgp, wiski"):
        classifier_class("exact")


@pytest.mark.parametrize("num_samples", [0, -3, 2.5, True])
def test_wiski_binary_refuses_a_sample_count_that_is_not_a_positive_integer(num_samples):
    r"""``num_samples=0`` averaged no samples (NaN probabilities: a stream recorded null log
    losses and counted every point wrong); a negative count failed in ``torch.randn`` after the
    initial fit. Both are refused when the classifier is built."""
    X, y = _data(30)
    with pytest.raises(ValueError, match="num_samples must be an integer >= 1"):
        WISKIBinaryClassifier(X, y, num_samples=num_samples, grid_size=8)
    clf = WISKIDirichletClassifier(X, y.reshape(-1).long(), 2, grid_size=8)
    with pytest.raises(ValueError, match="num_samples must be an integer >= 1"):
        clf.predict_proba(X[:3], num_samples=num_samples)


@pytest.mark.parametrize("alpha_eps", [0.0, -1.0, float("nan"), float("inf")])
def test_wiski_dirichlet_refuses_a_concentration_that_is_not_positive(alpha_eps):
    r"""``alpha_eps = 0`` made the wrong classes' targets ``log 0 = -inf`` and the error said
    "Y contains ... NaN/inf value(s); remove or impute them" about labels that had none."""
    X, y = _data(30)
    with pytest.raises(ValueError, match="alpha_eps must be a finite number > 0"):
        WISKIBinaryClassifier(X, y, alpha_eps=alpha_eps, grid_size=8)


def test_wiski_binary_takes_numpy_numbers_for_its_options():
    # the checks above took only Python int / float: np.int64(16) (accepted before) was refused
    X, y = _data(30)
    clf = WISKIBinaryClassifier(
        X, y, num_samples=np.int64(16), alpha_eps=np.float32(0.01), grid_size=8
    )
    assert clf.num_samples == 16 and type(clf.num_samples) is int
    assert clf.predict_proba(X[:3]).shape == (3,)


@pytest.mark.parametrize("name", ["tsvgp", "wiski"])
def test_binary_probability_keeps_the_batch_shape_of_its_inputs(name):
    r"""``predict_proba`` on ``b x n x d`` points (a grid of a decision surface, say) gives
    ``b x n`` probabilities equal to the flat call's; it returned ``b n`` flattened ones."""
    X, y = _data(40)
    options = {"inducing_points": 12} if name == "tsvgp" else {"grid_size": 8}
    clf = CLASSIFIERS[name](X, y, **options)
    Xt = torch.rand(3, 5, 2, generator=torch.Generator().manual_seed(3), dtype=DT)
    p = clf.predict_proba(Xt)
    assert p.shape == (3, 5)
    torch.testing.assert_close(p, clf.predict_proba(Xt.reshape(15, 2)).reshape(3, 5))
    if name == "tsvgp":  # deterministic: each probability is that point's one-row call
        torch.testing.assert_close(p[1, 2], clf.predict_proba(Xt[1, 2:3])[0])
    # (WISKI's Monte-Carlo draws depend on the call's shape; with the flat call's shape they
    # are the same draws, so the equality above also checks that no rows were permuted.)


def test_wiski_classifier_refits_its_class_models_learned_maps_on_all_labelled_points(
    monkeypatch,
):
    r"""Above the all-pairs dimensions each class model has a learned input map. The classifier
    had no ``fit_projection``, so a stream's refits fitted the kernels alone and kept the maps
    of the initial design. Its ``fit_projection`` now refits each class model through
    :meth:`WISKI.fit_projection` on the Dirichlet targets and noise of all labelled points
    (checked against class WISKIs built and refit by hand from those targets), and the loop
    refits it that way."""
    from bo_online.loops import StreamingLoop
    from bo_online.models.wiski.model import WISKI
    from bo_online.problems import StreamProblem

    d, g = 7, torch.Generator().manual_seed(0)
    X = torch.rand(140, d, generator=g, dtype=DT)
    y = (torch.sin(5 * X @ torch.linspace(1, -1, d, dtype=DT)) + 3 * X[:, 0] > 1.5).to(DT)
    options = WISKIBinaryClassifier.loop_default_options(d)
    assert "tanh" in options["projection"]  # the structure with a learned map
    clf = WISKIBinaryClassifier(X[:60], y[:60].unsqueeze(-1), **options)
    clf.update(X[60:], y[60:].unsqueeze(-1))
    before = [p.detach().clone() for p in clf.projection.parameters()]
    clf.fit_projection(X, y.unsqueeze(-1), max_iter=5)
    assert any(not torch.equal(a, b) for a, b in zip(before, clf.projection.parameters()))
    # by hand: Milios et al.'s targets log(alpha) - s2 / 2 and noise s2 = log(1 + 1 / alpha)
    alpha = torch.stack([1.0 - y, y], -1) + 0.01
    noise = torch.log1p(1 / alpha)
    targets = alpha.log() - noise / 2
    Xt = torch.rand(9, d, generator=g, dtype=DT)
    for c, model in enumerate(clf.models):
        ref = WISKI(X[:60], targets[:60, c : c + 1], noise[:60, c : c + 1], **options)
        ref.fit_projection(X, targets[:, c : c + 1], noise[:, c : c + 1], max_iter=5)
        with torch.no_grad():
            mine, theirs = model.posterior(Xt), ref.posterior(Xt)
        torch.testing.assert_close(mine.mean, theirs.mean, rtol=0, atol=1e-10)
        torch.testing.assert_close(mine.variance, theirs.variance, rtol=0, atol=1e-10)
    # a stream's refits go through it, on every labelled point the loop holds
    box = torch.stack([torch.zeros(d, dtype=DT), torch.ones(d, dtype=DT)])
    problem = StreamProblem("c7", X[:120], y[:120], X[120:], y[120:], box, task="classification")
    loop = StreamingLoop(problem, model="wiski", n_init=60, q=10, seed=0, fit_max_iter=3)
    calls = []
    fit = WISKIBinaryClassifier.fit_projection

    def counted(self, X, Y, **kw):
        calls.append(X.shape[0])
        return fit(self, X, Y, **kw)

    monkeypatch.setattr(WISKIBinaryClassifier, "fit_projection", counted)
    records = loop.run(6)
    assert calls == [r["n"] for r in records if r["refit"]] == [60, 110]


def test_a_projection_module_given_to_the_classifier_is_copied_for_each_class():
    """A map passed as a module (``projection=TanhProjection(...)``, as ``--model-option`` does)
    was shared by every class model, so a refit of the maps moved the earlier classes' map
    under statistics built on the old one. Each class now gets its own copy of the module as
    given: the same classifier as one whose factory hands out fresh copies."""
    import copy

    from bo_online.models.wiski.projection import TanhProjection

    d, g = 5, torch.Generator().manual_seed(1)
    X = torch.rand(60, d, generator=g, dtype=DT)
    labels = (3 * X[:, 0] + X[:, 1]).long().clamp(max=2)  # three classes
    torch.manual_seed(0)
    given = TanhProjection(d, out_dim=2).to(DT)
    pristine = copy.deepcopy(given)
    clf = WISKIDirichletClassifier(X, labels, 3, projection=given, grid_size=12)
    maps = [m.projection for m in clf.models]
    assert len({id(p) for p in maps}) == 3
    ref = WISKIDirichletClassifier(
        X, labels, 3, projection_factory=lambda: copy.deepcopy(pristine), grid_size=12
    )
    Xt = torch.rand(7, d, generator=g, dtype=DT)
    for a, b in zip(clf.latent(Xt), ref.latent(Xt)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    clf.fit_projection(X, labels, max_iter=3, joint=True)
    ref.fit_projection(X, labels, max_iter=3, joint=True)
    for a, b in zip(clf.latent(Xt), ref.latent(Xt)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)
