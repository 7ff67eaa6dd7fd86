"""Moved to :mod:`bo_online.models.classifiers` (kept so that old imports still work)."""

from bo_online.models.classifiers import *  # noqa: F401,F403
from bo_online.models.classifiers import __all__  # noqa: F401
