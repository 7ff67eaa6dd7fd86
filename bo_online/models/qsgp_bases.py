"""Moved to :mod:`bo_online.models.qsgp.bases`; kept so old imports and saved run configs work."""

from bo_online.models.qsgp.bases import (  # noqa: F401
    InducingBasis,
    QSGPBasis,
    RFFBasis,
    RVMBasis,
    hashed_uniform,
    kronecker_uniform,
)
