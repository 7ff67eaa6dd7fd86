"""QSGP.fit_closed_form's typed settings: keywords, settings objects, the deprecated keyword
``evidence`` and QSGP.fit's closed-form path all give the same fit."""

from __future__ import annotations

import warnings

import pytest
import torch

from bo_online.models.qsgp import QSGP, QSGPClosedFormSettings, QSGPFitSettings

DT = torch.float64


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _data(n=24, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(5 * X[:, :1]) + X[:, 1:2] ** 2 + 0.05 * torch.randn(n, 1, generator=g, dtype=DT)
    return X, Y


def _state(model: QSGP) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if v is not None}


def _same(a: QSGP, b: QSGP) -> bool:
    sa, sb = _state(a), _state(b)
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _model() -> QSGP:
    X, Y = _data()
    return QSGP(X, Y, num_features=32)


def test_settings_object_equals_keywords_and_the_settings_are_used():
    kw = {"max_iter": 12, "hyper_evidence": "basis", "hyper_rows": 10}
    a = _model().fit_closed_form(QSGPClosedFormSettings(**kw))
    b = _model().fit_closed_form(**kw)
    assert _same(a, b)
    c = _model().fit_closed_form(
        QSGPClosedFormSettings(max_iter=3), max_iter=12, hyper_evidence="basis", hyper_rows=10
    )
    assert _same(a, c)  # keywords override the settings object
    assert not _same(a, _model().fit_closed_form(max_iter=12, hyper_evidence="basis"))
    assert not _same(
        a, _model().fit_closed_form(max_iter=12, hyper_rows=10, hyper_evidence="kernel")
    )


def test_deprecated_evidence_keyword_warns_and_means_hyper_evidence():
    new = _model().fit_closed_form(max_iter=12, hyper_evidence="basis")
    with pytest.warns(DeprecationWarning, match="`evidence` is deprecated; use `hyper_evidence`"):
        old = _model().fit_closed_form(max_iter=12, evidence="basis")
    assert _same(old, new)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        _model().fit_closed_form(max_iter=2, hyper_evidence="basis")  # the new name: no warning


def test_hyper_rows_none_means_all_rows():
    X, Y = _data(n=30)
    rows6 = QSGP(X, Y, num_features=32).fit_closed_form(
        QSGPClosedFormSettings(max_iter=12, hyper_evidence="basis", hyper_rows=6)
    )
    all_rows = QSGP(X, Y, num_features=32).fit_closed_form(
        QSGPClosedFormSettings(max_iter=12, hyper_evidence="basis", hyper_rows=6), hyper_rows=None
    )
    default = QSGP(X, Y, num_features=32).fit_closed_form(max_iter=12, hyper_evidence="basis")
    assert _same(all_rows, default) and not _same(all_rows, rows6)  # 2048 >= n: all rows


def test_fit_hands_its_closed_form_fields_to_fit_closed_form():
    X, Y = _data(n=30)
    fit = QSGPFitSettings(  # no restandardisation: it rounds train_y differently
        method="closed_form",
        hyper_evidence="basis",
        hyper_rows=8,
        fit_from_defaults_n=0,
        restandardize=False,
    )
    a = QSGP(X, Y, num_features=32).fit(fit, max_iter=10)
    b = QSGP(X, Y, num_features=32).fit_closed_form(
        max_iter=10, hyper_evidence="basis", hyper_rows=8
    )
    b.invalidate_caches()  # fit rebuilds the posterior's caches afterwards
    b.ensure_caches()
    assert _same(a, b)
    assert fit.closed_form_settings() == QSGPClosedFormSettings(200, "basis", 8, None)


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.fit_closed_form(evidence="basis", hyper_evidence="basis"),
        lambda m: m.fit_closed_form(max_iters=5),
        lambda m: m.fit_closed_form(QSGPFitSettings()),
        lambda m: m.fit_closed_form(hyper_evidence="exact"),
    ],
)
def test_bad_closed_form_options_raise_before_anything_changes(call):
    model = _model()
    before = _state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match=r"once|accepted|must be a|hyper_evidence must be"):
            call(model)
    after = _state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
