"""Moved to :mod:`bo_online.models.wiski.covariance`;
kept so old imports and saved run configs work.
"""

from bo_online.models.wiski.covariance import *  # noqa: F401,F403
from bo_online.models.wiski.covariance import __all__  # noqa: F401
