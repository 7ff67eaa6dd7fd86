"""Moved to :mod:`bo_online.models.wiski.classification`;
kept so old imports and saved run configs work.
"""

from bo_online.models.wiski.classification import *  # noqa: F401,F403
from bo_online.models.wiski.classification import __all__  # noqa: F401
