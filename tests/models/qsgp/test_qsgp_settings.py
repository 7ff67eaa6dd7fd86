"""QSGP's typed fit settings, its log prior and optimiser bounds, against direct computations
(keyword fits, GPyTorch's priors written out, the constraints' bounds)."""

from __future__ import annotations

import math

import pytest
import torch
from botorch.optim.utils.numpy_utils import get_bounds_as_ndarray
from gpytorch.priors import LogNormalPrior

from bo_online.models import QSGP, QSGPFitSettings, QSGPSGDSettings
from bo_online.models.qsgp.fitting import resolve_fit_settings

DT = torch.float64


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _data(n=20, d=3, seed=0, noise=0.05):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(5 * X[:, :1]) + X[:, 1:2] ** 2 + noise * torch.randn(n, 1, generator=g, dtype=DT)
    return X, Y


def _state(model: QSGP) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if v is not None}


def _assert_same_fit(a: QSGP, b: QSGP, atol: float = 1e-12) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], atol=atol, rtol=0, msg=key)


def _differs(a: QSGP, b: QSGP) -> bool:
    sa, sb = _state(a), _state(b)
    return any(sa[k].shape != sb[k].shape or not torch.allclose(sa[k], sb[k]) for k in sa)


def test_closed_form_fit_with_settings_equals_fit_with_keywords():
    X, Y = _data()
    kw = {"max_iter": 15, "hyper_evidence": "basis", "hyper_rows": 12, "fit_from_defaults_n": 0}
    a = QSGP(X, Y, num_features=64).fit(QSGPFitSettings(**kw))
    b = QSGP(X, Y, num_features=64).fit(**kw)
    _assert_same_fit(a, b)
    # the settings were used: other settings give another fit
    assert _differs(a, QSGP(X, Y, num_features=64).fit(max_iter=15))


def test_sgd_fit_with_settings_equals_fit_with_keywords():
    X, Y = _data()
    kw = {"max_iter": 25, "num_rows": 8, "num_cols": 16, "cv_rank": 5, "lr": 0.2, "freeze_iters": 3}

    def model():
        return QSGP(X, Y, num_features=32, family="chevron", num_dense_columns=3)

    a = model().fit(QSGPFitSettings(method="sgd", **kw))
    b = model().fit(method="sgd", **kw)
    c = model().fit_sgd(QSGPSGDSettings(**kw))
    d = model().fit_sgd(**kw)
    _assert_same_fit(a, b)
    _assert_same_fit(c, d)
    _assert_same_fit(a, c)  # fit(method="sgd") hands the same settings to fit_sgd
    assert _differs(a, model().fit(method="sgd", **{**kw, "lr": 0.05}))


def test_settings_object_overridden_by_keywords():
    X, Y = _data()
    base = QSGPFitSettings(max_iter=3, hyper_evidence="basis")
    a = QSGP(X, Y, num_features=64).fit(base, max_iter=12)
    b = QSGP(X, Y, num_features=64).fit(max_iter=12, hyper_evidence="basis")
    _assert_same_fit(a, b)


def test_constructor_options_are_the_fit_defaults_and_none_keeps_its_meaning():
    X, Y = _data(n=24)
    opts = {"hyper_evidence": "basis", "fit_from_defaults_n": 0}
    a = QSGP(X, Y, num_features=64, hyper_rows=6, **opts).fit(max_iter=12)
    b = QSGP(X, Y, num_features=64).fit(max_iter=12, hyper_rows=6, **opts)
    _assert_same_fit(a, b)
    # hyper_rows=None means all rows (not "keep the default", 6 here)
    c = QSGP(X, Y, num_features=64, hyper_rows=6, **opts).fit(max_iter=12, hyper_rows=None)
    d = QSGP(X, Y, num_features=64, **opts).fit(max_iter=12)  # default 2048 >= n: all rows
    _assert_same_fit(c, d)
    assert _differs(a, c)
    assert resolve_fit_settings(None, {"hyper_rows": None}, {"hyper_rows": 6}).hyper_rows is None
    assert resolve_fit_settings(None, {"max_iter": None}).max_iter is None


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.fit(max_iters=5),
        lambda m: m.fit(QSGPFitSettings(max_iter=5), num_row=3),
        lambda m: m.fit_sgd(num_row=3),
        lambda m: m.fit(method="newton"),
        lambda m: m.fit(settings={"max_iter": 5}),
    ],
)
def test_bad_fit_option_raises_before_anything_changes(call):
    X, Y = _data()
    model = QSGP(X[:15], Y[:15], num_features=32).fit(max_iter=5)
    model.update(X[15:], Y[15:])  # held conditioning data, which a fit would absorb
    before = _state(model)
    with pytest.raises(ValueError, match=r"accepted|Unknown fit method|must be a"):
        call(model)
    after = _state(model)
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key
    assert model.cond_X is not None and model.train_X.shape[0] == 15 and model.num_data == 20


def test_unknown_fit_option_names_the_accepted_ones():
    X, Y = _data()
    model = QSGP(X, Y, num_features=32)
    with pytest.raises(ValueError, match=r"'num_col'.*accepted: .*num_cols"):
        model.fit(num_col=4)
    with pytest.raises(ValueError, match=r"'timeout'.*accepted: .*timeout_sec"):
        model.fit_sgd(timeout=1.0)


def test_log_prior_equals_the_default_priors_written_out():
    X, Y = _data(d=4)
    model = QSGP(X, Y, num_features=64)
    kernel = model.basis.kernel
    kernel.base_kernel.lengthscale = torch.tensor([[0.2, 0.9, 1.7, 3.1]], dtype=DT)
    model.likelihood.noise = torch.tensor([0.03], dtype=DT)
    ls = kernel.base_kernel.lengthscale.detach()
    noise = model.likelihood.noise.detach()
    # BoTorch's SingleTaskGP defaults: dimension-scaled LogNormal lengthscale prior, LogNormal
    # noise prior; the outputscale is fixed at 1 and has no prior
    ls_prior = LogNormalPrior(math.sqrt(2) + 0.5 * math.log(4), math.sqrt(3))
    noise_prior = LogNormalPrior(-4.0, 1.0)
    expected = ls_prior.log_prob(ls).sum() + noise_prior.log_prob(noise).sum()
    torch.testing.assert_close(model.log_prior(), expected.to(DT), atol=1e-12, rtol=0)
    with_priors = model.marginal_log_likelihood(include_priors=True)
    without = model.marginal_log_likelihood(include_priors=False)
    torch.testing.assert_close(
        (with_priors - without) * model.num_data, expected.to(DT), atol=1e-10, rtol=0
    )
    # fixed per-point noise: the likelihood (and its prior) is unused
    fixed = QSGP(X, Y, train_Yvar=torch.full_like(Y, 0.01), num_features=64)
    fixed.basis.kernel.base_kernel.lengthscale = ls
    torch.testing.assert_close(
        fixed.log_prior(), ls_prior.log_prob(ls).sum().to(DT), atol=1e-12, rtol=0
    )


def test_bounds_are_the_constraints_and_keep_the_noise_above_its_floor():
    X, Y = _data(noise=0.0)  # noise-free: the evidence pushes the noise to its lower bound
    model = QSGP(X, Y, num_features=64)
    params, bounds = model._trainable_hypers_and_bounds()
    assert set(params) == {
        "basis.kernel.base_kernel.raw_lengthscale",
        "likelihood.noise_covar.raw_noise",
    }
    arr = get_bounds_as_ndarray(params, bounds)
    # BoTorch's default constraints are untransformed (enforced only through these bounds):
    # lengthscales >= 0.025, noise >= 1e-4; params in insertion order: 3 lengthscales, noise
    ls_con = model.basis.kernel.base_kernel.raw_lengthscale_constraint
    noise_con = model.likelihood.noise_covar.raw_noise_constraint
    assert not ls_con.enforced and not noise_con.enforced
    floor = float(noise_con.lower_bound)
    assert arr[:3, 0].tolist() == [float(ls_con.lower_bound)] * 3 and arr[3, 0] == floor
    assert arr[:, 1].tolist() == [math.inf] * 4
    model.fit(max_iter=50)
    assert float(model.likelihood.noise) >= floor
    assert float(model.basis.kernel.base_kernel.lengthscale.min()) >= float(ls_con.lower_bound)


def test_centres_argument_is_deprecated_for_centers():
    from gpytorch.kernels import RBFKernel, ScaleKernel

    from bo_online.models.qsgp import InducingBasis, RVMBasis

    X, _ = _data(n=8)
    kernel = ScaleKernel(RBFKernel(ard_num_dims=3)).to(DT)
    for cls in (InducingBasis, RVMBasis):
        new = cls(X, kernel)
        with pytest.warns(DeprecationWarning, match="use `centers`"):
            old = cls(centres=X, kernel=kernel)
        assert torch.equal(old.centers, X) and torch.equal(new.centers, X)
        assert set(old.state_dict()) == set(new.state_dict())  # saved key "centres" unchanged
        assert "centres" in new.state_dict()
        torch.testing.assert_close(old.features(X[:3]), new.features(X[:3]), atol=0, rtol=0)
