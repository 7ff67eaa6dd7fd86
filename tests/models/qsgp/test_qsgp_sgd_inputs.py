"""The containers of one QSGP SGD step (ColumnSample, VariationalLeaves, ControlVariateState)
against direct indexing of the sample and of q(w)'s parameters."""

from __future__ import annotations

import pytest
import torch

from bo_online.models import QSGP
from bo_online.models.qsgp.estimators import sample_indices
from bo_online.models.qsgp.sgd_inputs import ColumnSample, ControlVariateState

DT = torch.float64


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _model(m=24, k=3):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(30, 2, generator=g, dtype=DT)
    Y = torch.sin(4 * X[:, :1]) + 0.05 * torch.randn(30, 1, generator=g, dtype=DT)
    model = QSGP(X, Y, num_features=m, family="chevron", num_dense_columns=k)
    model.var_mean = torch.randn(m, generator=g, dtype=DT)
    model.var_log_diag = -1 + 0.2 * torch.randn(m, generator=g, dtype=DT)
    model.var_cols = 0.2 * torch.randn(m, k, generator=g, dtype=DT)
    return model


@pytest.mark.parametrize("num_dense_cols", [None, 2])
def test_column_sample_maps_back_to_the_index_sample(num_dense_cols):
    g = torch.Generator().manual_seed(1)
    s = sample_indices(30, 24, 4, 6, 7, 5, num_dense_cols, generator=g)
    c = ColumnSample.from_index_sample(s)
    touched = sorted(set(torch.cat([s.i, s.j, s.r, s.dr]).tolist()))
    assert c.U.tolist() == touched  # sorted, distinct, exactly the touched columns
    for idx, inv in ((s.i, c.inv_i), (s.j, c.inv_j), (s.r, c.inv_r), (s.dr, c.inv_dr)):
        assert torch.equal(c.U[inv], idx)
    assert c.dr_u.tolist() == sorted(set(s.dr.tolist()))
    assert torch.equal(c.dr_u[c.dr_inv], s.dr)
    assert c.index is s and not c.all_columns


def test_column_sample_of_all_columns_skips_the_gathers():
    g = torch.Generator().manual_seed(2)
    s = sample_indices(30, 16, 2, 6, 16, 5, generator=g, replace_cols=False)
    c = ColumnSample.from_index_sample(s)
    assert c.all_columns and c.U is s.i and c.inv_j is s.i
    assert torch.equal(c.U, torch.arange(16))
    assert torch.equal(c.U[c.inv_r], s.r) and torch.equal(c.U[c.inv_dr], s.dr)


def test_variational_leaves_are_q_at_the_touched_columns():
    model = _model()
    g = torch.Generator().manual_seed(3)
    s = sample_indices(30, 24, 3, 6, 5, 4, 2, generator=g)
    c = ColumnSample.from_index_sample(s)
    leaves = model._variational_leaves(c)
    assert torch.equal(leaves.mu, model.var_mean[c.U])
    assert torch.equal(leaves.log_diag, model.var_log_diag[c.U])
    expected_cols = torch.stack([model.var_cols[u, c.dr_u] for u in c.U.tolist()])
    assert torch.equal(leaves.cols, expected_cols)
    tensors = leaves.tensors()
    assert len(tensors) == 3 and all(t.is_leaf and t.requires_grad for t in tensors)
    # copies: moving a leaf leaves q(w) alone
    before = model.var_mean.clone()
    with torch.no_grad():
        leaves.mu.add_(1.0)
    assert torch.equal(model.var_mean, before)
    mean_field = QSGP(
        model.train_X, model.train_y.unsqueeze(-1), num_features=24, family="mean_field"
    )
    mf_leaves = mean_field._variational_leaves(c)
    assert mf_leaves.cols is None and len(mf_leaves.tensors()) == 2


def test_control_variate_state_is_a_tuple_and_a_plain_tuple_gives_the_same_loss():
    model = _model()
    g = torch.Generator().manual_seed(4)
    state = model.control_variate_state(10, g)
    assert isinstance(state, ControlVariateState)
    p, X_p, frozen, a = state  # unpacks as the tuple it replaced
    assert torch.equal(X_p, model.train_X[p]) and a.shape == (10, 1 + model.num_dense)
    # a = Phi_p [mu, l_0..l_{k-1}] with the dense columns written out
    Phi_p = model.basis.features(X_p, model.basis.all_indices(), frozen)
    L = torch.tril(model.var_cols, -1)
    torch.testing.assert_close(a, Phi_p @ torch.cat([model.var_mean[:, None], L], -1))
    s = sample_indices(30, 24, 3, 6, 5, 4, generator=g)
    loss_nt, st_nt = model.stochastic_loss(s, cv_state=state)
    loss_tuple, st_tuple = model.stochastic_loss(s, cv_state=tuple(state))
    assert torch.equal(loss_nt, loss_tuple)
    assert torch.equal(st_nt["Fp_U"], st_tuple["Fp_U"])
    grads_nt = torch.autograd.grad(loss_nt, st_nt["leaves"])
    grads_tuple = torch.autograd.grad(loss_tuple, st_tuple["leaves"])
    for x, y in zip(grads_nt, grads_tuple):
        assert torch.equal(x, y)
