"""The classical baseline ``RefitSingleTaskGP``: an update with no points changes nothing (it
rebuilt and refit the ``SingleTaskGP`` from its defaults, moving the hyperparameters)."""

from __future__ import annotations

import pytest
import torch

from bo_online.models.singletask import RefitSingleTaskGP


def test_update_with_no_points_keeps_the_model_and_its_hyperparameters():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(12, 2, dtype=torch.float64, generator=g)
    Y = torch.sin(6 * X).sum(-1, keepdim=True)
    model = RefitSingleTaskGP(X, Y).fit()
    with torch.no_grad():  # a state the refit from the defaults would not return to
        model.model.covar_module.lengthscale = torch.tensor([[0.7, 0.05]], dtype=torch.float64)
    wrapped, before = model.model, {k: v.clone() for k, v in model.state_dict().items()}
    assert model.update(X[:0], Y[:0]) is model
    assert model.model is wrapped and model.num_data == 12
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_botorch_data_advice_is_shown_once_not_at_every_rebuild():
    r"""Every update rebuilds the ``SingleTaskGP``, and BoTorch's fit resets Python's show-once
    registry, so its ``InputDataWarning`` (float32 inputs) came once per step: 61 times in a
    60-step stream. Each piece of advice is shown once per model; new advice (inputs that leave
    the unit cube later) still shows, once."""
    import warnings

    from botorch.exceptions.warnings import InputDataWarning

    g = torch.Generator().manual_seed(0)
    X = torch.rand(18, 2, dtype=torch.float32, generator=g)
    X[14:] += 2.0  # outside the unit cube: other advice, from the update that brings them
    Y = torch.sin(6 * X).sum(-1, keepdim=True)

    def advice(caught: list) -> list[str]:
        return [str(w.message) for w in caught if issubclass(w.category, InputDataWarning)]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = RefitSingleTaskGP(X[:8], Y[:8], refit_max_iter=5).fit()
        first = advice(caught)
        for i in range(8, 18, 2):
            model.update(X[i : i + 2], Y[i : i + 2])
    shown = advice(caught)
    assert first and all("float32" in text for text in first)
    assert len(set(shown)) == len(shown)  # nothing twice
    later = shown[len(first) :]
    assert len(later) == 1 and "unit cube" in later[0], shown
    assert model.num_data == 18 and torch.equal(model.model.train_inputs[0], X)


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, dtype=torch.float64, generator=g)
    return X, torch.sin(6 * X).sum(-1, keepdim=True)


def test_a_float64_state_loads_into_a_float32_model_as_float32():
    """As torch's ``load_state_dict`` keeps a module's dtype (and the online surrogates do): a
    float64 state loaded into a float32 model took the state's float64 data and rebuilt the
    ``SingleTaskGP`` on them, so the model turned float64 throughout. It stays float32 and
    predicts as the float64 model within float32 accuracy."""
    X, Y = _data(12, 0)
    Xn, Yn = _data(3, 1)
    m64 = RefitSingleTaskGP(X, Y, refit_max_iter=5)
    m64.update(Xn, Yn)
    m32 = RefitSingleTaskGP(X.float(), Y.float(), refit_max_iter=5)
    m32.load_state_dict(m64.state_dict())
    floating = [t for t in (*m32.parameters(), *m32.buffers()) if t.is_floating_point()]
    assert floating and all(t.dtype == torch.float32 for t in floating)
    assert m32.num_data == 15
    Xt, _ = _data(5, 2)
    with torch.no_grad():
        post32, post64 = m32.posterior(Xt.float()), m64.posterior(Xt)
    assert post32.mean.dtype == torch.float32
    torch.testing.assert_close(post32.mean.double(), post64.mean, rtol=0, atol=2e-3)
    torch.testing.assert_close(post32.variance.double(), post64.variance, rtol=0, atol=2e-3)


def test_a_state_that_does_not_fit_leaves_the_model_as_it_was():
    """A state that fails to load (here without the lengthscale) raised torch's RuntimeError but
    left the model holding the state's data (15 points for 12) and a ``SingleTaskGP`` rebuilt on
    them with default hyperparameters. The model is now as it was."""
    X, Y = _data(12, 0)
    Xn, Yn = _data(3, 1)
    other = RefitSingleTaskGP(X, Y, refit_max_iter=5)
    other.update(Xn, Yn)
    state = {k: v for k, v in other.state_dict().items() if "raw_lengthscale" not in k}
    model = RefitSingleTaskGP(X, Y, refit_max_iter=5).fit()
    Xt, _ = _data(5, 2)
    wrapped, before = model.model, {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        mean = model.posterior(Xt).mean
    with pytest.raises(RuntimeError, match="Missing key"):
        model.load_state_dict(state)
    assert model.model is wrapped and model.num_data == 12
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    with torch.no_grad():
        assert torch.equal(model.posterior(Xt).mean, mean)
