r"""Exceptions a run can end with, importable without torch (the CLI catches them before it has
loaded anything heavy)."""

from __future__ import annotations

__all__ = ["CampaignError", "ObjectiveError", "describe"]


#: What an objective that returned None is told (the objective's name is put before it).
NONE_RESULT = "returned None instead of one value per point (is a `return` missing?)"
COMPLEX_RESULT = (
    "returned complex values; it must return real numbers (take `.real` or `abs()` if the "
    "imaginary part is round-off)"
)


class ObjectiveError(RuntimeError):
    r"""A user objective raised, or returned a wrong number of values or NaN/inf; the message
    names the objective, the exception and the innermost frame of the user's own code.

    Args:
        message: what went wrong.
        objective: the objective's name once the message names it (None while it does not:
            the problem that calls the objective adds it).
    """

    def __init__(self, message: str, objective: str | None = None) -> None:
        super().__init__(message)
        self.objective = objective


class CampaignError(RuntimeError):
    r"""A campaign of a sweep raised; the message names the campaign, its error and how to go
    on (the sweep stops at the first such campaign).

    Args:
        message: what went wrong.
        campaign: the campaign's name (its run directory under the sweep's output folder).
    """

    def __init__(self, message: str, campaign: str) -> None:
        super().__init__(message)
        self.campaign = campaign


def describe(error: BaseException) -> str:
    r"""An exception as messages name it: ``ValueError: bad input``, or the class alone for one
    without a message (``MemoryError``, not ``MemoryError:`` with nothing after it)."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
