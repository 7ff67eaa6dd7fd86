r"""Basis-function dictionaries for the weight-space GP of :mod:`bo_online.models.qsgp`.

QSGP (Evans & Nair, 2018, arXiv:1812.03010) models ``f(x) = phi(x)^T w`` with a weight prior
``w ~ N(0, S^-1)``, so the implied kernel is ``k(x, z) = phi(x)^T S^-1 phi(z)``. A basis provides:

* ``features(X, idx)``: the columns ``idx`` of ``Phi`` at inputs ``X`` (``... x q x |idx|``); the
  full ``n x m`` matrix is never formed by the model (it asks for ``m~`` columns at a time);
* blocks of the prior precision ``S`` (``prior_precision_block``) or, for diagonal ``S``, its
  diagonal (``prior_precision_diag``), which the estimators of Theorems 1-2 and Prop. 2 need;
* ``kernel_diag(X)``: the exact kernel's prior variance ``k(x, x)`` (Prop. 4 augmentation).

Three dictionaries, as in the paper:

* :class:`RFFBasis` -- random Fourier features for the SE-ARD kernel (Rahimi & Recht), ``S = I``,
  ``phi_j(x) = sqrt(2 s^2 / m) cos(omega_j^T (x / ell) + b_j)``: by default (``sampling="qmc"``)
  columns ``2p`` and ``2p + 1`` are the cosine and sine (``b = 0``, ``-pi / 2``) of one frequency
  ``omega_p``, quasi-random normal; with ``sampling="random"`` the paper's ``omega_j ~ N(0, I)``,
  ``b_j ~ U(0, 2 pi)``. Frequencies and phases are regenerated from ``(seed, j)`` every time they
  are needed (Sec. 4: "we can just save the random seeds"), so memory is independent of ``m`` and
  any column subset costs ``O(|idx| d)`` to produce.
* :class:`InducingBasis` -- inducing points at the training inputs: ``Phi = K(X, Z)``,
  ``S = K(Z, Z)`` (App. G / I.2), fixed hyperparameters; the implied prior on the training inputs
  is the exact GP.
* :class:`RVMBasis` -- the relevance-vector machine (App. I.3): ``Phi = K(X, Z)`` and a learned
  diagonal precision ``S = diag(s)``.
"""

from __future__ import annotations

import math
import warnings

import torch
from gpytorch.kernels import Kernel, RBFKernel, ScaleKernel
from torch import Tensor, nn

__all__ = [
    "QSGPBasis",
    "RFFBasis",
    "InducingBasis",
    "RVMBasis",
    "hashed_uniform",
    "kronecker_uniform",
]

_M32 = 0xFFFFFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    r"""``(x * c) mod 2^32`` for int64 ``x`` in ``[0, 2^32)`` without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: Tensor) -> Tensor:
    r"""A 32-bit avalanche mixer (the "lowbias32" integer hash), on int64 tensors holding u32."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hashed_uniform(seed: int, rows: Tensor, width: int, dtype: torch.dtype) -> Tensor:
    r"""Uniform(0, 1) numbers that are a pure function of ``(seed, row, column)``.

    PyTorch's generators cannot jump to the j-th draw of a stream, which regenerating one
    feature column out of millions needs; hence this small counter-based generator (three rounds
    of a 32-bit avalanche mixer over seed, row and column; rows < 2^32).

    Args:
        seed: integer seed of the dictionary.
        rows: ``k`` int64 feature indices.
        width: numbers per row.

    Returns:
        ``k x width`` tensor of numbers in ``(0, 1)``.
    """
    rows = rows.to(torch.int64)
    cols = torch.arange(1, width + 1, dtype=torch.int64, device=rows.device)
    s = int(_mix32(torch.tensor((seed * 0x9E3779B1 + 0x632BE5AB) & _M32, dtype=torch.int64)))
    h = _mix32((rows & _M32) ^ s)
    h = _mix32((h.unsqueeze(-1) + _mul32(cols, 0x27D4EB2F)) & _M32)
    h = _mix32(h ^ ((s * 0x165667B1) & _M32))
    return (h.to(dtype) + 0.5) / 4294967296.0


def kronecker_uniform(seed: int, rows: Tensor, width: int, dtype: torch.dtype) -> Tensor:
    r"""Points ``rows`` of a randomly shifted Kronecker (R-) sequence in ``width`` dimensions.

    ``u_j = frac(shift + (j + 1) alpha)`` with ``alpha_k = phi^-k`` (``k = 1..width``), ``phi`` the
    positive root of ``x^(width + 1) = x + 1`` (Roberts, "The unreasonable effectiveness of
    quasirandom sequences", 2018), and ``shift`` hashed from ``seed``. A pure function of
    ``(seed, j)``, like :func:`hashed_uniform`, so any column subset is cheap to regenerate
    (SciPy's and PyTorch's Sobol/Halton engines can only be drawn in order).

    Returns:
        ``k x width`` tensor of numbers in ``(0, 1)``.
    """
    phi = 2.0
    for _ in range(64):  # fixed point of x = (1 + x)^(1 / (width + 1))
        phi = (1.0 + phi) ** (1.0 / (width + 1))
    alpha = torch.tensor([phi ** -(k + 1) for k in range(width)], dtype=torch.float64)
    shift = hashed_uniform(seed, torch.zeros(1, dtype=torch.int64), width, torch.float64)[0]
    j = rows.to(device="cpu", dtype=torch.float64).unsqueeze(-1) + 1.0
    u = torch.remainder(shift + j * alpha, 1.0)
    return u.clamp(1e-12, 1.0 - 1e-12).to(device=rows.device, dtype=dtype)


class QSGPBasis(nn.Module):
    r"""Interface of a basis dictionary (``m`` functions, prior precision ``S``)."""

    num_features: int
    diagonal_prior: bool = True  # S diagonal (Prop. 2 then estimates log|S|)
    trainable: bool = True  # hyperparameters may be learned (empirical Bayes)

    def features(self, X: Tensor, idx: Tensor | None = None, frozen: dict | None = None) -> Tensor:
        r"""``Phi[X, idx]``: ``... x q x |idx|`` (all ``m`` columns if ``idx`` is None).
        ``frozen``: optional hyperparameter values to use instead of the live ones (App. F.3)."""
        raise NotImplementedError

    def prior_precision_diag(self, idx: Tensor) -> Tensor:
        r"""``diag(S)[idx]`` (``|idx|``)."""
        raise NotImplementedError

    def prior_precision_block(self, rows: Tensor, cols: Tensor) -> Tensor:
        r"""``S[rows, cols]`` (``|rows| x |cols|``); for diagonal S, zeros off the diagonal."""
        eq = rows.unsqueeze(-1) == cols.unsqueeze(-2)
        return eq.to(self.dtype) * self.prior_precision_diag(rows).unsqueeze(-1)

    def kernel_diag(self, X: Tensor) -> Tensor:
        r"""Exact prior variance ``k(x, x)`` at ``X`` (``... x q``)."""
        raise NotImplementedError

    def frozen_state(self) -> dict:
        r"""Detached copies of the hyperparameters that define ``Phi`` (for App. F.3)."""
        return {}

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype_ref.dtype

    def all_indices(self) -> Tensor:
        return torch.arange(self.num_features, device=self._dtype_ref.device)


class RFFBasis(QSGPBasis):
    r"""Random Fourier features of the SE-ARD kernel ``s^2 exp(-|(x - z) / ell|^2 / 2)``.

    Args:
        dim: input dimension d.
        num_features: m.
        kernel: a ``ScaleKernel(RBFKernel(ard_num_dims=d))`` holding the lengthscales and the
            outputscale (GPyTorch's parameterisation, constraints and priors); default a fresh one.
        seed: integer seed; frequencies and phases are a deterministic function of it.
        sampling: ``"qmc"`` (default): columns ``2p`` and ``2p + 1`` are the cosine and the sine
            of frequency ``p``, the p-th point of a randomly shifted Kronecker sequence in ``d``
            dimensions (Roberts' R-sequence, ``frac(shift + (p + 1) alpha)``, ``alpha_k = phi^-k``
            with ``phi^(d+1) = phi + 1``) through the normal inverse CDF; ``"random"``:
            independent hashed draws of frequency (Box-Muller) and phase per column, the Rahimi
            & Recht estimator. Both are a pure function of ``(seed,
            j)``. Quasi-Monte Carlo features approximate the kernel with an error that falls
            faster than ``m^-1/2`` in low dimension (Yang, Sindhwani, Avron & Mahoney, "Quasi-Monte
            Carlo Feature Maps for Shift-Invariant Kernels", 2014, arXiv:1412.8293), which a BO
            loop needs: the random estimator's error in the posterior mean (several % of the
            data's spread at m = 512) is larger than the improvements LogEI has to resolve.
    """

    diagonal_prior = True

    def __init__(
        self,
        dim: int,
        num_features: int,
        kernel: ScaleKernel | None = None,
        seed: int = 0,
        sampling: str = "qmc",
    ) -> None:
        super().__init__()
        if num_features < 1:
            raise ValueError(f"num_features must be >= 1, got {num_features}.")
        if sampling not in ("qmc", "random"):
            raise ValueError(f"sampling must be 'qmc' or 'random', got {sampling!r}.")
        self.sampling = sampling
        self.num_features = int(num_features)
        self.dim = int(dim)
        self.seed = int(seed)
        if kernel is None:
            kernel = ScaleKernel(RBFKernel(ard_num_dims=dim))
        if not (isinstance(kernel, ScaleKernel) and isinstance(kernel.base_kernel, RBFKernel)):
            raise ValueError("RFFBasis needs a ScaleKernel(RBFKernel(ard_num_dims=d)) kernel.")
        self.kernel = kernel
        self.register_buffer("_dtype_ref", torch.zeros((), dtype=torch.float64))
        self._freq_cache: tuple | None = None

    def frequencies(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        r"""Standard-normal frequencies (``|idx| x d``) and phases (``|idx|``) of columns idx.

        ``"qmc"``: column ``j`` takes point ``j // 2`` of the shifted Kronecker sequence
        (:func:`kronecker_uniform`) through the normal inverse CDF and phase ``0`` (even ``j``,
        cosine) or ``-pi / 2`` (odd ``j``, sine); ``"random"``: one hashed draw of ``2d + 1``
        uniforms per column (Box-Muller for the frequency, a uniform phase). The last result is
        kept, so the data rows and the control-variate rows of one SGD step share
        a single generation, and a model's posterior calls (the same block index tensors every
        time) share one (not one generated under inference mode outside it)."""
        cached = self._freq_cache
        if (
            cached is not None
            and cached[0] is idx
            and cached[1].dtype == self.dtype
            and (torch.is_inference_mode_enabled() or not cached[1].is_inference())
        ):
            return cached[1], cached[2]
        d, dt = self.dim, self.dtype
        if self.sampling == "qmc":  # columns 2p, 2p + 1: cos and sin of frequency p
            u = kronecker_uniform(self.seed, torch.div(idx, 2, rounding_mode="floor"), d, dt)
            omega = math.sqrt(2.0) * torch.erfinv(2.0 * u - 1.0)
            phase = -0.5 * math.pi * torch.remainder(idx, 2).to(dt)
        else:
            u = hashed_uniform(self.seed, idx, 2 * d + 1, dt)
            omega = torch.sqrt(-2.0 * torch.log(u[:, :d])) * torch.cos(
                2.0 * math.pi * u[:, d : 2 * d]
            )
            phase = 2.0 * math.pi * u[:, 2 * d]
        self._freq_cache = (idx, omega, phase)
        return omega, phase

    def frozen_state(self) -> dict:
        return {
            "lengthscale": self.kernel.base_kernel.lengthscale.detach().clone(),
            "outputscale": self.kernel.outputscale.detach().clone(),
        }

    def features(self, X: Tensor, idx: Tensor | None = None, frozen: dict | None = None) -> Tensor:
        if idx is None:
            idx = self.all_indices()
        omega, phase = self.frequencies(idx.to(self._dtype_ref.device))
        if frozen is None:
            ell, s2 = self.kernel.base_kernel.lengthscale, self.kernel.outputscale
        else:
            ell, s2 = frozen["lengthscale"], frozen["outputscale"]
        Z = X / ell.reshape(-1)  # ... x q x d
        arg = Z @ omega.transpose(-1, -2).to(X) + phase.to(X)
        return torch.sqrt(2.0 * s2 / self.num_features) * torch.cos(arg)

    def prior_precision_diag(self, idx: Tensor) -> Tensor:
        return torch.ones(idx.shape, dtype=self.dtype, device=idx.device)

    def kernel_diag(self, X: Tensor) -> Tensor:
        return self.kernel.outputscale.expand(X.shape[:-1]).to(X)


def _renamed_centers(centers: Tensor | None, centres: Tensor | None) -> Tensor:
    r"""``centers``, or the deprecated keyword ``centres`` (with a ``DeprecationWarning``)."""
    if centres is not None:
        warnings.warn(
            "The argument `centres` is deprecated; use `centers`.", DeprecationWarning, stacklevel=3
        )
        if centers is not None:
            raise ValueError("Pass the centres once, as `centers`.")
        return centres
    if centers is None:
        raise TypeError("Missing the argument `centers` (an m x d tensor).")
    return centers


class _KernelColumnsBasis(QSGPBasis):
    r"""``Phi = K(X, Z)`` with centres ``Z`` (``m x d``), shared by the inducing and RVM bases."""

    def __init__(self, centers: Tensor, kernel: Kernel) -> None:
        super().__init__()
        if centers.dim() != 2:
            raise ValueError(f"centers must be m x d, got {tuple(centers.shape)}.")
        if kernel is None:
            raise TypeError("Missing the argument `kernel` (a GPyTorch kernel).")
        self.num_features = int(centers.shape[0])
        self.kernel = kernel
        # (the buffer keeps its name "centres": saved state_dicts hold it under that key)
        self.register_buffer("centres", centers)
        self.register_buffer("_dtype_ref", torch.zeros((), dtype=centers.dtype))

    @property
    def centers(self) -> Tensor:
        r"""The centres ``Z`` (``m x d``)."""
        return self.centres

    def features(self, X: Tensor, idx: Tensor | None = None, frozen: dict | None = None) -> Tensor:
        Z = self.centres if idx is None else self.centres[idx]
        return self.kernel(X, Z).to_dense()

    def kernel_diag(self, X: Tensor) -> Tensor:
        return self.kernel(X, diag=True)


class InducingBasis(_KernelColumnsBasis):
    r"""Inducing points at the training inputs: ``Phi = K(X, Z)``, ``S = K(Z, Z) + jitter I``.

    The hyperparameters are fixed (App. I.2: a dense ``S`` has no cheap ``log|S|``, so no empirical
    Bayes); the kernel's parameters are excluded from training.
    """

    diagonal_prior = False
    trainable = False

    def __init__(
        self,
        centers: Tensor | None = None,
        kernel: Kernel | None = None,
        jitter: float = 1e-8,
        *,
        centres: Tensor | None = None,
    ) -> None:
        super().__init__(_renamed_centers(centers, centres), kernel)
        self.jitter = float(jitter)
        for p in self.kernel.parameters():
            p.requires_grad_(False)

    def prior_precision_block(self, rows: Tensor, cols: Tensor) -> Tensor:
        K = self.kernel(self.centres[rows], self.centres[cols]).to_dense()
        eq = rows.unsqueeze(-1) == cols.unsqueeze(-2)
        return K + self.jitter * eq.to(K)

    def prior_precision_diag(self, idx: Tensor) -> Tensor:
        return self.kernel(self.centres[idx], diag=True) + self.jitter


class RVMBasis(_KernelColumnsBasis):
    r"""Relevance-vector machine: ``Phi = K(X, Z)``, learned diagonal ``S = diag(exp(log_s))``.

    The kernel is fixed; the per-function precisions are the hyperparameters (App. I.3).
    """

    diagonal_prior = True

    def __init__(
        self,
        centers: Tensor | None = None,
        kernel: Kernel | None = None,
        init_precision: float = 1.0,
        *,
        centres: Tensor | None = None,
    ) -> None:
        centers = _renamed_centers(centers, centres)
        super().__init__(centers, kernel)
        for p in self.kernel.parameters():
            p.requires_grad_(False)
        self.log_precision = nn.Parameter(
            torch.full((self.num_features,), math.log(init_precision), dtype=centers.dtype)
        )

    def prior_precision_diag(self, idx: Tensor) -> Tensor:
        return self.log_precision[idx].exp()
