"""Online GP surrogates; each subclasses :class:`bo_online.models.base.OnlineModel`.

One subpackage per family (``wiski``, ``tsvgp``, ``decoupled``, ``qsgp``), the exact GP
(``exact``) as the reference, the shared contract (``base``), fit helpers (``fitting``) and
BoTorch's pathwise sampling for the surrogates (``pathwise``).
"""

# registers the surrogates with BoTorch's pathwise samplers (draw_matheron_paths, ...)
from bo_online.models import pathwise  # noqa: F401
from bo_online.models.base import OnlineModel
from bo_online.models.decoupled import DecoupledFitSettings, DecoupledSVGP
from bo_online.models.exact import ExactFitSettings, OnlineExactGP
from bo_online.models.fitting import OptimizerSettings
from bo_online.models.qsgp import (
    QSGP,
    QSGPClosedFormSettings,
    QSGPFitSettings,
    QSGPSGDSettings,
)
from bo_online.models.tsvgp import TSVGP, TSVGPFitSettings
from bo_online.models.wiski import WISKI, WISKIFitSettings, WISKIProjectionFitSettings

__all__ = [
    "OnlineModel",
    "OnlineExactGP",
    "WISKI",
    "TSVGP",
    "DecoupledSVGP",
    "QSGP",
    "OptimizerSettings",
    "ExactFitSettings",
    "WISKIFitSettings",
    "WISKIProjectionFitSettings",
    "TSVGPFitSettings",
    "DecoupledFitSettings",
    "QSGPFitSettings",
    "QSGPSGDSettings",
    "QSGPClosedFormSettings",
]
