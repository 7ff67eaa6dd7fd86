"""Moved to :mod:`bo_online.models.wiski.additive`;
kept so old imports and saved run configs work.
"""

from bo_online.models.wiski.additive import *  # noqa: F401,F403
from bo_online.models.wiski.additive import (  # noqa: F401
    ADDITIVE_GRID_BUDGET,
    RegularGrid,
    __all__,
)
