"""The classical baseline ``RefitSingleTaskGP``: an update with no points changes nothing (it
rebuilt and refit the ``SingleTaskGP`` from its defaults, moving the hyperparameters)."""

from __future__ import annotations

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
