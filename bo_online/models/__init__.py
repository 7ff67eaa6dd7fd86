"""Online GP surrogates; each subclasses :class:`bo_online.models.base.OnlineModel`."""

from bo_online.models.base import OnlineModel
from bo_online.models.fitting import OptimizerSettings
from bo_online.models.decoupled import DecoupledSVGP
from bo_online.models.exact import ExactFitSettings, OnlineExactGP
from bo_online.models.qsgp import QSGP
from bo_online.models.tsvgp import TSVGP
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
]
