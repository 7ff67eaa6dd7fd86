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
