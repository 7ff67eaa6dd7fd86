r"""Kronecker structure of WISKI's grid kernel for kernels that factor over dimensions.

On a regular product grid (row-major, last dimension fastest) a kernel that is a product over
dimensions, such as an RBF-ARD kernel (``exp(-sum_k r_k^2 / 2) = prod_k exp(-r_k^2 / 2)``),
possibly scaled, gives ``K_UU = K_1 kron ... kron K_k`` with ``K_j`` the kernel on the ``m_j``
coordinates of dimension j (Saatci, "Scalable Inference for Structured Gaussian Process
Models", 2011; docs/math.md §1). The jitter goes on each factor, ``K_j + jitter * k_j(0) I``, so
that the jittered kernel keeps the structure; its root is then ``R = R_1 kron ... kron R_k``
(``R_j`` the Cholesky factor of the jittered ``K_j``, and the Kronecker product of lower-triangular
factors is the lower-triangular Cholesky factor of the product), and

    R^T G R   costs   2 m^2 (m_1 + ... + m_k)   instead of   2 m^3 + m^3 / 3,

which, with the kernel evaluated on ``m_1 + ... + m_k`` coordinates instead of ``m^2`` pairs,
makes the marginal likelihood's cost that of the one remaining ``m x m`` Cholesky factor of
``A = sigma^2 I + R^T G R``. GPyTorch's ``KroneckerProductLinearOperator`` has Kronecker
matrix products, but not this product with a dense ``G`` on both sides under autograd, with the
factors' jitter where the model needs it, so the few contractions are written here.
"""

from __future__ import annotations

from typing import Sequence

import torch
from gpytorch.kernels import Kernel, RBFKernel, ScaleKernel
from torch import Tensor

from bo_online.linalg import psd_cholesky

__all__ = ["kronecker_factors", "kron_roots", "kron_dense", "kron_matmul", "kron_congruence"]


def kronecker_factors(
    kernel: Kernel, axes: Sequence[Tensor], relative_jitter: float
) -> list[Tensor] | None:
    r"""The jittered factors ``K_j + relative_jitter * k_j(0) I`` (``m_j x m_j`` each) of ``kernel``
    on the product grid with coordinates ``axes`` (one ``m_j`` vector per dimension), or None when
    the kernel is not known to factor over dimensions (anything but an RBF kernel, optionally in a
    ``ScaleKernel``, acting on all dimensions). Differentiable in the kernel's hyperparameters.

    Each factor is the kernel itself evaluated on points that vary in one dimension only (the
    others held at 0, where an RBF factor is 1), so GPyTorch computes every entry; a
    ``ScaleKernel``'s outputscale goes on the first factor.
    """
    k = len(axes)
    scale, base = None, kernel
    if type(base) is ScaleKernel:
        if not _acts_on_all(base, k):  # GPyTorch applies the outer kernel's active_dims
            return None
        scale, base = base.outputscale, base.base_kernel
        if scale.numel() != 1:
            return None
    if type(base) is not RBFKernel or base.batch_shape != torch.Size():
        return None
    if not _acts_on_all(base, k) or base.ard_num_dims not in (None, 1, k):
        return None
    factors = []
    for j, coords in enumerate(axes):
        points = torch.zeros(coords.shape[0], k, dtype=coords.dtype, device=coords.device)
        points[:, j] = coords
        Kj = base(points).to_dense()
        if j == 0 and scale is not None:
            Kj = scale.reshape(()) * Kj
        jitter = relative_jitter * torch.diagonal(Kj).mean()
        factors.append(Kj + jitter * torch.eye(Kj.shape[-1], dtype=Kj.dtype, device=Kj.device))
    return factors


def _acts_on_all(kernel: Kernel, k: int) -> bool:
    r"""Whether ``kernel`` reads every one of the ``k`` grid coordinates, in order."""
    dims = kernel.active_dims
    return dims is None or dims.tolist() == list(range(k))


def kron_roots(factors: Sequence[Tensor]) -> list[Tensor]:
    r"""The lower Cholesky factors ``R_j`` of the (jittered) factors: ``R_1 kron ... kron R_k``
    is the Cholesky factor of their Kronecker product."""
    return [psd_cholesky(F) for F in factors]


def kron_dense(factors: Sequence[Tensor]) -> Tensor:
    r"""``F_1 kron ... kron F_k`` as a dense ``m x m`` tensor."""
    out = factors[0]
    for F in factors[1:]:
        out = torch.kron(out, F)
    return out


def kron_matmul(factors: Sequence[Tensor], M: Tensor) -> Tensor:
    r"""``(F_1 kron ... kron F_k) M`` for ``M``: ``m x r`` (``m = prod m_j``, row-major), in
    ``m r (m_1 + ... + m_k)`` flops: one matrix product per dimension, with that dimension's
    index moved to the front (measured faster than batched products over the other indices)."""
    sizes = [F.shape[-1] for F in factors]
    T = M.reshape(*sizes, M.shape[-1])
    for j, F in enumerate(factors):
        T = T.movedim(j, 0)
        shape = T.shape
        T = (F @ T.reshape(shape[0], -1)).reshape(shape).movedim(0, j)
    return T.reshape(M.shape)


def kron_congruence(roots: Sequence[Tensor], G: Tensor) -> Tensor:
    r"""``R^T G R`` for ``R = R_1 kron ... kron R_k`` and a symmetric ``G`` (``m x m``), in
    ``2 m^2 (m_1 + ... + m_k)`` flops; symmetric to rounding."""
    transposed = [R.mT for R in roots]
    RtG = kron_matmul(transposed, G)  # R^T G; its transpose is G R (G symmetric)
    return kron_matmul(transposed, RtG.mT)
