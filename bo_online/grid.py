"""Moved to :mod:`bo_online.models.wiski.grid`; kept so old imports and saved run configs work."""

from bo_online.models.wiski.grid import *  # noqa: F401,F403
from bo_online.models.wiski.grid import PADDING_CELLS, __all__  # noqa: F401
