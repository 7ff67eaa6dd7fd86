r"""Quadruply stochastic GP (QSGP): a weight-space GP whose SGD step costs O(1) in n and m.

Evans & Nair, "Quadruply Stochastic Gaussian Processes" (2018, arXiv:1812.03010); corrected
equations in docs/math.md §4, conditioning in docs/math.md §5.

Model: ``f(x) = c + phi(x)^T w``, ``w ~ N(0, S^-1)`` with a basis dictionary of ``m`` functions
(:mod:`bo_online.models.qsgp.bases`: random Fourier features for SE-ARD, inducing points at the
training inputs, or a relevance-vector machine), and a Gaussian variational posterior
``q(w) = N(mu, C C^T)`` whose Cholesky factor ``C`` is

* ``family="mean_field"``: diagonal (QSGP-0);
* ``family="chevron"``: the first ``k`` columns dense below the diagonal, the rest diagonal
  (QSGP-k);
* ``family="full"``: dense lower triangular (small ``m`` only; exact inference for a Gaussian
  likelihood, Eq. 2 at its optimum is the exact log marginal likelihood).

Fitting (``fit``, settings :class:`QSGPFitSettings`):

* ``method="closed_form"`` (Gaussian likelihood, moderate ``n m``): hyperparameters maximise the
  exact log marginal likelihood of the finite-basis model (equal to Eq. 2 maximised over the full
  family) or, for the RFF basis in the kernel regime or while ``n <= m / 8``, the exact GP
  evidence of the kernel the features approximate (``hyper_evidence="auto"``, the default);
  then ``mu``/``C`` are set to the ELBO optimum within the chosen family (Prop. 1 for diagonal
  columns). This is what a BO loop gets by default.
* ``method="sgd"`` (settings :class:`QSGPSGDSettings`): the paper's procedure. Every step samples
  rows once and basis functions three times (Theorems 1-2, Prop. 2; Theorem 3 for
  Laplace/logistic likelihoods), adds the Eq. 3 / Prop. 3 control variates, and updates only the
  touched variational coordinates with sparse AdaGrad (so a step costs the same for any ``m``),
  the hyperparameters with Adam, both with exponentially decayed learning rates and a warm-up
  freeze of the hyperparameters.

Kernel regime (:mod:`~bo_online.models.qsgp.kernel_regime`): while the model holds at most
``exact_max_n`` points (default ``m``) an RFF basis with a Gaussian likelihood predicts with the
exact GP of the kernel its features approximate, and its fits maximise that GP's evidence; the
features' approximation error made spurious maxima that acquisition optimisers chased. Beyond, the
weight-space posterior ``q(w)``, which the fits keep up to date all the while.

Online use: ``condition_on_observations`` / ``update`` / ``fantasize`` condition the current
Gaussian posterior exactly on new Gaussian observations ("posterior as prior", docs/math.md §5);
the data are kept and absorbed into the variational fit by the next ``fit``. ``sample_paths``
returns explicit, deterministic posterior function draws (pathwise-conditioned) for Thompson
sampling.

Use it for very large data sets or very many basis functions (warm-starting BO from historical
data), for explicit sample paths, or for robust (Laplace) / classification (logistic) likelihoods.

Modules: :mod:`~bo_online.models.qsgp.model` (the class), :mod:`~bo_online.models.qsgp.bases`
(basis dictionaries), :mod:`~bo_online.models.qsgp.variational` (``q(w)`` and its moments),
:mod:`~bo_online.models.qsgp.conditioning`, :mod:`~bo_online.models.qsgp.evidence` (the fits'
objectives), :mod:`~bo_online.models.qsgp.fitting` (settings, closed-form fit),
:mod:`~bo_online.models.qsgp.sgd`, :mod:`~bo_online.models.qsgp.sgd_inputs` and
:mod:`~bo_online.models.qsgp.estimators` (the stochastic procedure),
:mod:`~bo_online.models.qsgp.sample_paths`, :mod:`~bo_online.models.qsgp.kernel_regime`.
"""

from bo_online.models.qsgp.bases import InducingBasis, QSGPBasis, RFFBasis, RVMBasis
from bo_online.models.qsgp.evidence import KERNEL_EVIDENCE_MAX_N_PER_FEATURE
from bo_online.models.qsgp.fitting import (
    FIT_FROM_DEFAULTS_N,
    QSGPClosedFormSettings,
    QSGPFitSettings,
    QSGPSGDSettings,
    QSGPStepSettings,
)
from bo_online.models.qsgp.model import QSGP
from bo_online.models.qsgp.sample_paths import QSGPSamplePaths

__all__ = [
    "FIT_FROM_DEFAULTS_N",
    "KERNEL_EVIDENCE_MAX_N_PER_FEATURE",
    "QSGP",
    "InducingBasis",
    "QSGPBasis",
    "QSGPClosedFormSettings",
    "QSGPFitSettings",
    "QSGPSGDSettings",
    "QSGPSamplePaths",
    "QSGPStepSettings",
    "RFFBasis",
    "RVMBasis",
]
