"""Moved to :mod:`bo_online.models.tsvgp.inducing`; kept so old imports work."""

from bo_online.models.tsvgp.inducing import *  # noqa: F401,F403
from bo_online.models.tsvgp.inducing import __all__  # noqa: F401
