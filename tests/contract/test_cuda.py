r"""Every surrogate and the BO loop on a CUDA device, against the same computation on the CPU.

Skipped where no CUDA device is present (CI has none); run them on a machine with one:
``python -m pytest tests/contract/test_cuda.py``. Float64 on both devices, so the CUDA posterior
must equal the CPU one to round-off (the kernels, solves and Cholesky factors differ only in the
order of floating-point operations).
"""

from __future__ import annotations

import pytest
import torch
from surrogates import SURROGATES, assert_close, ids, latent

from bo_online.loops import BayesOptLoop, load_loop
from bo_online.models.registry import MODEL_PATHS
from bo_online.problems import synthetic_problem

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DT = torch.float64
CUDA = torch.device("cuda")
N0, Q, B = 12, 3, 4  # initial points, points per update, acquisition batch (b x q x d)
TOL = 1e-8


def _on(model: torch.nn.Module, device: torch.device) -> list[str]:
    """Names of the model's parameters and buffers that are not on ``device``."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [name for name, t in named if t.device.type != device.type]


@pytest.mark.parametrize("s", SURROGATES, ids=ids())
@pytest.mark.parametrize("d", [2, 4], ids=["d2", "d4"])
def test_posterior_and_update_on_cuda_equal_cpu(s, d):
    X, Y, _ = s.data(N0, d, seed=0)  # the contract suite's data, in the model's outcomes
    Xn, Yn, _ = s.data(Q, d, seed=1)
    Xt = torch.rand(B, 2, d, generator=torch.Generator().manual_seed(2), dtype=DT)

    cpu = s.make(X, Y)
    gpu = s.make(X.to(CUDA), Y.to(CUDA))
    assert not _on(gpu, CUDA), f"{s.name}: tensors left on the CPU: {_on(gpu, CUDA)}"
    for label in ("built", "updated"):
        m_cpu, c_cpu = latent(cpu, Xt)
        m_gpu, c_gpu = latent(gpu, Xt.to(CUDA))
        assert m_gpu.device.type == "cuda" and c_gpu.device.type == "cuda"
        assert_close(m_gpu.cpu(), m_cpu, TOL, f"{s.name} d={d} {label}: mean")
        assert_close(c_gpu.cpu(), c_cpu, TOL, f"{s.name} d={d} {label}: covariance")
        cpu.update(Xn, Yn)
        gpu.update(Xn.to(CUDA), Yn.to(CUDA))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("model", sorted(MODEL_PATHS))
def test_bo_loop_runs_on_cuda_at_its_defaults(model, dtype, tmp_path):
    """The loop's defaults above 3 inputs (WISKI: every pair of inputs) on Hartmann6, q = 2:
    the model stays on the device, the proposals are finite and inside the box, and a resumed
    run continues on the device."""
    problem = synthetic_problem("hartmann6")
    loop = BayesOptLoop(
        problem,
        model=model,
        acq="qlognei",
        q=2,
        seed=0,
        device="cuda",
        dtype=dtype,
        out_dir=tmp_path,
        checkpoint_every=1,
    )
    records = loop.run(3)
    assert not _on(loop.model, CUDA), f"{model}: tensors left on the CPU: {_on(loop.model, CUDA)}"
    X = loop.X  # every evaluated point, problem units (kept on the CPU)
    lower, upper = problem.bounds.to(X)
    assert torch.isfinite(X).all() and (X >= lower).all() and (X <= upper).all()
    assert len([r for r in records if r["step"] > 0]) == 3

    resumed = load_loop(tmp_path)
    assert resumed.device.type == "cuda" and resumed.dtype == loop.dtype
    resumed.run(4)
    assert resumed.step_count == 4 and not _on(resumed.model, CUDA)


@pytest.mark.parametrize("model", ["tsvgp", "wiski"])
def test_a_classification_stream_scores_its_test_set_on_cuda(model):
    """The test labels stay on the CPU with the problem while the classifier predicts on the
    device: the metrics move them there (a float64 cast alone left them behind, and the first
    evaluation failed with a device mismatch)."""
    from bo_online.loops import StreamingLoop
    from bo_online.problems import StreamProblem

    g = torch.Generator().manual_seed(0)
    X = torch.rand(90, 2, generator=g, dtype=DT)
    y = (X.sum(-1) > 1.0).to(DT)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DT)
    stream = StreamProblem("halves", X[:60], y[:60], X[60:], y[60:], bounds, task="classification")
    options = {"tsvgp": {"inducing_points": 12}, "wiski": {"grid_size": 8}}[model]
    loop = StreamingLoop(
        stream, model=model, model_options=options, q=5, n_init=20, eval_every=2, device="cuda"
    )
    records = loop.run(4)
    assert all(0.0 <= r["test_accuracy"] <= 1.0 for r in records if r["step"] % 2 == 0)
