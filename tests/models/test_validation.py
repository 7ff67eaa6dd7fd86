r"""``first_outside``: the box test shared by the models' input checks and the WISKI grid, against a
plain Python loop over the entries."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

from bo_online.likelihoods import Bernoulli
from bo_online.models import QSGP, TSVGP, WISKI, DecoupledSVGP, OnlineExactGP
from bo_online.models.validation import check_inputs, first_outside


def _loop_reference(X: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor):
    r"""(first offending index in row-major order, number of offending points) by visiting every
    entry; NaN is outside (it is not inside any box)."""
    first, points = None, set()
    for idx in itertools.product(*(range(s) for s in X.shape)):
        x, k = float(X[idx]), idx[-1]
        inside = float(lower[k]) <= x <= float(upper[k])
        if not inside:
            first = first if first is not None else list(idx)
            points.add(idx[:-1])
    return first, len(points)


@pytest.mark.parametrize("seed", range(4))
def test_first_outside_matches_a_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    lower = torch.tensor([0.0, -1.0, 2.0], dtype=torch.float64)
    upper = torch.tensor([1.0, 1.0, 5.0], dtype=torch.float64)
    # 2 x 5 x 3 points in a box 20% wider than [lower, upper]: some entries fall outside.
    X = lower + (upper - lower) * (
        1.4 * torch.rand(2, 5, 3, generator=g, dtype=torch.float64) - 0.2
    )
    if seed == 3:
        X[1, 2, 0] = math.nan
    X[0, 0] = torch.stack([lower, upper])[seed % 2]  # a point exactly on a face is inside
    expected_first, expected_count = _loop_reference(X, lower, upper)
    found = first_outside(X, lower, upper)
    if expected_first is None:
        assert found is None
    else:
        assert found is not None
        assert found.index == expected_first
        assert found.count == expected_count
    # Inside the box (clamped, NaN-free): nothing to report.
    assert (
        first_outside(torch.minimum(torch.maximum(X.nan_to_num(0.5), lower), upper), lower, upper)
        is None
    )


def test_check_inputs_names_the_first_point_outside() -> None:
    bounds = torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=torch.float64)
    X = torch.tensor([[[0.5, 1.0], [0.2, 2.5]], [[1.5, -1.0], [0.0, 2.0]]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"2 point\(s\) outside .* index \[0, 1, 1\]: value 2\.5"):
        check_inputs(X, dim=2, bounds=bounds)
    check_inputs(X.clamp(0.0, 1.0), dim=2, bounds=bounds)  # inside (faces included): no error


def test_a_point_an_ulp_outside_passes_in_float32_and_a_refusal_shows_the_digits() -> None:
    """The boundary tolerance covers a few ulps of the inputs' own dtype (float32's ulp at 1 is
    1.2e-7, above the 1e-9 relative tolerance), and a point refused is printed with enough
    digits to tell it from the bound (it read "value 1, allowed [0, 1]")."""
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    one_up = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    check_inputs(torch.tensor([[0.5, float(one_up)]], dtype=torch.float32), dim=2, bounds=bounds)
    with pytest.raises(ValueError, match=r"value 1\.00001\d*, allowed \[0, 1\]"):
        check_inputs(torch.tensor([[0.5, 1.00001]], dtype=torch.float32), dim=2, bounds=bounds)
    with pytest.raises(ValueError, match=r"value 1\.00000001\d*, allowed"):
        check_inputs(torch.tensor([[0.5, 1.00000001]], dtype=torch.float64), dim=2, bounds=bounds)


@pytest.mark.parametrize("model_cls", ["DecoupledSVGP", "OnlineExactGP", "WISKI", "TSVGP"])
def test_noise_at_the_floor_in_user_units_is_not_reported_as_below_it(model_cls):
    """A fixed noise set to the floor in the user's units lands a rounding step below it in the
    model's standardised units (as rescaled at a refit); that is raised silently, while a noise
    truly below is reported."""
    import warnings

    from gpytorch.utils.warnings import NumericalWarning

    import bo_online.models as models
    from bo_online.models.validation import train_noise_floor

    cls = getattr(models, model_cls)
    for seed in range(6):  # which data round below the floor is a matter of chance
        g = torch.Generator().manual_seed(seed)
        X = torch.rand(30, 3, generator=g, dtype=torch.float64)
        Y = (X.sum(-1, keepdim=True) * 7.3).sin() * 3.1 + 11
        at_floor = train_noise_floor(Y).expand_as(Y).clone()
        with warnings.catch_warnings():
            warnings.simplefilter("error", NumericalWarning)
            cls(X, Y, at_floor).fit(max_iter=3)
    with pytest.warns(NumericalWarning, match="below the floor"):
        cls(X, Y, at_floor / 2)


def test_a_scalar_noise_at_update_is_the_same_variance_for_every_new_point() -> None:
    """``update(X, Y, noise=torch.tensor(v))`` on a fixed-noise model equals passing ``v`` for each
    new point (before: refused as if it had batch dimensions)."""
    from bo_online.models import OnlineExactGP

    g = torch.Generator().manual_seed(3)
    X = torch.rand(12, 2, generator=g, dtype=torch.float64)
    Y = torch.sin(4 * X).sum(-1, keepdim=True)
    Yvar = torch.full_like(Y, 0.05)
    Xn = torch.rand(3, 2, generator=g, dtype=torch.float64)
    Yn = torch.sin(4 * Xn).sum(-1, keepdim=True)
    scalar = OnlineExactGP(X, Y, train_Yvar=Yvar)
    full = OnlineExactGP(X, Y, train_Yvar=Yvar)
    scalar.update(Xn, Yn, noise=torch.tensor(0.2, dtype=torch.float64))
    full.update(Xn, Yn, noise=torch.full_like(Yn, 0.2))
    Xt = torch.rand(5, 2, generator=g, dtype=torch.float64)
    a, b = scalar.posterior(Xt), full.posterior(Xt)
    assert torch.allclose(a.mean, b.mean, rtol=0, atol=1e-12)
    assert torch.allclose(a.variance, b.variance, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex128], ids=["bool", "complex"])
def test_targets_that_are_not_real_numbers_are_refused_with_a_value_error(dtype) -> None:
    """Boolean labels (natural for a Bernoulli t-SVGP) or complex targets, at construction,
    update and conditioning, raise a ValueError that says to convert them (before: torch's
    NotImplementedError for ``abs`` of a bool tensor from deep inside the checks), and the model
    is left as it was; the converted labels are taken."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(10, 2, generator=g, dtype=torch.float64)
    labels = torch.rand(10, 1, generator=g, dtype=torch.float64) > 0.5
    bad = labels if dtype == torch.bool else labels.to(dtype)
    for make in (lambda Y: OnlineExactGP(X, Y), lambda Y: TSVGP(X, Y, likelihood=Bernoulli())):
        with pytest.raises(ValueError, match="real numbers"):
            make(bad)
        model = make(labels.double())
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(ValueError, match="real numbers"):
            model.update(X[:2], bad[:2])
        with pytest.raises(ValueError, match="real numbers"):
            model.condition_on_observations(X[:2], bad[:2])
        after = model.state_dict()
        assert before.keys() == after.keys()
        assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "model_cls", [OnlineExactGP, TSVGP, DecoupledSVGP, WISKI, QSGP], ids=lambda c: c.__name__
)
def test_complex_inputs_and_noise_are_refused_with_a_value_error(model_cls) -> None:
    """Complex X at update, conditioning and the posterior, and complex noise, raise a ValueError
    that says to pass real numbers, and the model is left as it was. (Before, complex X was cast
    to the model's dtype, keeping only its real part with torch's warning, and the points were
    added; complex noise failed with torch's NotImplementedError.)"""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(10, 2, generator=g, dtype=torch.float64)
    Y = torch.sin(5 * X).sum(-1, keepdim=True)
    Yvar = torch.full_like(Y, 0.01)
    model = model_cls(X, Y, Yvar)
    model.posterior(X[:2])  # caches built before the snapshot
    before = {k: v.clone() for k, v in model.state_dict().items()}
    Xc = X[:2].to(torch.complex128)
    noise_c = Yvar[:2].to(torch.complex128)
    for call in (
        lambda: model.update(Xc, Y[:2], Yvar[:2]),
        lambda: model.condition_on_observations(Xc, Y[:2], noise=Yvar[:2]),
        lambda: model.posterior(Xc),
        lambda: model.update(X[:2], Y[:2], noise_c),
        lambda: model.condition_on_observations(X[:2], Y[:2], noise=noise_c),
    ):
        with pytest.raises(ValueError, match="real numbers"):
            call()
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "model_cls", [OnlineExactGP, TSVGP, DecoupledSVGP, WISKI, QSGP], ids=lambda c: c.__name__
)
def test_integer_targets_build_the_model_of_the_same_numbers_as_floats(model_cls) -> None:
    """Integer targets (counts) at construction are the numbers they hold, as ``update`` takes
    them (before: torch's RuntimeError from the outcome mean of an integer tensor in every model
    but QSGP): the posterior equals the one of the model built on the same values as float64,
    and the outcome scaling is the data's mean and unbiased standard deviation."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(12, 2, generator=g, dtype=torch.float64)
    Y = torch.randint(0, 5, (12, 1), generator=g)
    Xt = torch.rand(3, 2, generator=g, dtype=torch.float64)
    torch.manual_seed(0)
    counts = model_cls(X, Y)
    torch.manual_seed(0)
    floats = model_cls(X, Y.double())
    Yd = Y.double().reshape(-1)
    torch.testing.assert_close(counts.outcome_mean, Yd.mean().reshape(1))
    torch.testing.assert_close(counts.outcome_std, Yd.std().reshape(1))
    torch.testing.assert_close(counts.posterior(Xt).mean, floats.posterior(Xt).mean)
    torch.testing.assert_close(counts.posterior(Xt).variance, floats.posterior(Xt).variance)


def _sobol_data_in_box(function, box: torch.Tensor, n: int):
    r"""``n`` scrambled Sobol points: unit-cube ``U``, the same points ``X`` in ``box`` and the
    ``n x 1`` values of ``function`` there."""
    from torch.quasirandom import SobolEngine

    U = SobolEngine(box.shape[-1], scramble=True, seed=0).draw(n, dtype=torch.float64)
    X = box[0] + (box[1] - box[0]) * U
    return U, X, function(X).unsqueeze(-1)


@pytest.mark.parametrize("name", ["OnlineExactGP", "TSVGP", "DecoupledSVGP", "QSGP"])
def test_inputs_outside_the_unit_cube_warn_as_botorch_does(name):
    r"""The default kernels' lengthscale prior is made for unit-cube inputs: on Styblinski-Tang
    8-D in its own box [-5, 5]^8 with 17 points the fit left every lengthscale at its start
    (each pair of points looks unrelated), without a word, where BoTorch's SingleTaskGP warns.
    Each model now warns (InputDataWarning) and says to pass a Normalize input transform; with
    it the fit equals the fit on the same data mapped to the unit cube by hand."""
    from botorch.exceptions.warnings import InputDataWarning
    from botorch.models.transforms.input import Normalize
    from botorch.test_functions import StyblinskiTang

    import bo_online.models as models

    cls = getattr(models, name)
    box = torch.tensor([[-5.0] * 8, [5.0] * 8], dtype=torch.float64)
    U, X, Y = _sobol_data_in_box(StyblinskiTang(dim=8), box, 17)
    with pytest.warns(InputDataWarning, match=r"span \[-4.*outside the unit cube.*Normalize"):
        cls(X, Y, bounds=box)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputDataWarning)
        normalized = cls(X, Y, input_transform=Normalize(8, bounds=box)).fit()
        by_hand = cls(U, Y).fit()

    def lengthscales(model):
        kernel = model.basis.kernel.base_kernel if name == "QSGP" else model.covar_module
        return kernel.lengthscale.detach()

    assert torch.allclose(lengthscales(normalized), lengthscales(by_hand), rtol=1e-5)
    assert float(lengthscales(by_hand).std()) > 0.3  # the fit moved them: an informative test


def test_wiski_on_inputs_outside_the_unit_cube_warns_as_the_other_models():
    r"""WISKI's default kernel acts on a grid over its input box, with the same unit-cube
    lengthscale prior: on Branin (20 points) in its own box [-5, 10] x [0, 15] the fit gave
    lengthscales 2.1 and 1.0 (0.14 and 0.07 of the box) and a posterior mean up to 70 away from
    the fit on the same data in the unit cube (0.15 and 0.39), without a word, where the other
    models warned. It now warns too; with Normalize the fit equals the fit on the unit cube."""
    from botorch.exceptions.warnings import InputDataWarning
    from botorch.models.transforms.input import Normalize
    from botorch.test_functions import Branin

    from bo_online.models import WISKI

    box = Branin().bounds.to(torch.float64)
    U, X, Y = _sobol_data_in_box(Branin(), box, 20)
    with pytest.warns(InputDataWarning, match=r"WISKI: the training inputs span \[-4.*Normalize"):
        WISKI(X, Y, bounds=box)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputDataWarning)
        normalized = WISKI(X, Y, input_transform=Normalize(2, bounds=box)).fit()
        by_hand = WISKI(U, Y).fit()
        WISKI(
            X, Y, bounds=box, projection="tanh"
        )  # a grid over the projection's (-1, 1)^k: no warning
    torch.testing.assert_close(
        normalized.covar_module.lengthscale, by_hand.covar_module.lengthscale, rtol=1e-5, atol=0
    )
    assert float(by_hand.covar_module.lengthscale.detach().min()) < 0.5  # the fit moved them


def test_the_unit_cube_warning_names_the_line_that_built_the_model():
    r"""The warning named the caller of the constructor that warns (``stacklevel=3``): for a
    subclass (``TSVGPClassifier``) or a model built inside another (a WISKI classifier's class
    models) a line in bo_online, not the user's. It now names the first line outside
    ``bo_online.models``."""
    from botorch.exceptions.warnings import InputDataWarning

    from bo_online.models import OnlineExactGP
    from bo_online.models.classifiers import TSVGPClassifier, WISKIBinaryClassifier

    X = torch.linspace(-5, 5, 12, dtype=torch.float64).reshape(6, 2)
    y = (X[:, :1] > 0).to(X)
    box = torch.tensor([[-5.0, -5.0], [5.0, 5.0]], dtype=torch.float64)
    for build in (
        lambda: OnlineExactGP(X, y),
        lambda: TSVGPClassifier(X, y),
        lambda: WISKIBinaryClassifier(X, y, bounds=box),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            build()
        named = {w.filename for w in caught if issubclass(w.category, InputDataWarning)}
        assert named == {__file__}


def test_whole_number_takes_every_whole_real_and_0d_tensor_and_refuses_the_rest():
    r"""``whole_number`` (basis counts, inducing points, ...) refused ``np.float32(8.0)`` and 0-d
    tensors / arrays, which WISKI's ``grid_size`` takes: one rule for every count option."""
    import numpy as np

    from bo_online.models.validation import whole_number

    for value in (
        8,
        8.0,
        np.int32(8),
        np.float32(8.0),
        np.float64(8.0),
        torch.tensor(8),
        torch.tensor(8.0),
        np.array(8),
        np.array(8.0),
    ):
        assert whole_number("n", value, 1) == 8 and type(whole_number("n", value, 1)) is int
    for value in (
        8.5,
        np.float32(8.5),
        torch.tensor(8.5),
        float("nan"),
        np.float32("inf"),
        True,
        np.array([8]),
        torch.tensor([8]),
        "8",
        0,
        torch.tensor(0),
    ):
        with pytest.raises(ValueError, match="n must be an integer >= 1"):
            whole_number("n", value, 1)


@pytest.mark.parametrize("cls", [DecoupledSVGP, QSGP])
def test_a_seed_that_is_not_whole_is_refused_not_cut(cls):
    r"""``seed=2.5`` (e.g. from Ax model_options or a JSON config) was cut to 2 without a word:
    two different settings gave one model. It is refused; whole numbers of any type are taken
    (as the int)."""
    import numpy as np

    X = torch.rand(10, 2, dtype=torch.float64)
    Y = X.sum(-1, keepdim=True)
    with pytest.raises(ValueError, match="seed must be an integer"):
        cls(X, Y, seed=2.5)
    assert cls(X, Y, seed=np.float32(3.0)).seed == 3 and cls(X, Y, seed=-4).seed == -4
