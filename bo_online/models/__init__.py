"""Online GP surrogates; each subclasses :class:`bo_online.models.base.OnlineModel`."""

from bo_online.models.base import OnlineModel
from bo_online.models.exact import OnlineExactGP

__all__ = ["OnlineModel", "OnlineExactGP"]
from bo_online.models.qsgp import QSGP  # noqa: E402

__all__ += ["QSGP"]
