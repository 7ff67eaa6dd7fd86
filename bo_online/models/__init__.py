"""Online GP surrogates; each subclasses :class:`bo_online.models.base.OnlineModel`."""

from bo_online.models.base import OnlineModel
from bo_online.models.fitting import OptimizerSettings
from bo_online.models.decoupled import DecoupledFitSettings, DecoupledSVGP
from bo_online.models.exact import ExactFitSettings, OnlineExactGP
from bo_online.models.qsgp import QSGP, QSGPFitSettings, QSGPSGDSettings
from bo_online.models.tsvgp import TSVGP, TSVGPFitSettings
from bo_online.models.wiski import WISKI

__all__ = [
    "OnlineModel",
    "OnlineExactGP",
    "WISKI",
    "TSVGP",
    "DecoupledSVGP",
    "DecoupledFitSettings",
    "QSGP",
    "OptimizerSettings",
    "ExactFitSettings",
    "TSVGPFitSettings",
    "QSGPFitSettings",
    "QSGPSGDSettings",
]
