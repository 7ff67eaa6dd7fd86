r"""Exceptions a run can end with, importable without torch (the CLI catches them before it has
loaded anything heavy)."""

from __future__ import annotations

__all__ = ["ObjectiveError"]


class ObjectiveError(RuntimeError):
    r"""A user objective raised, or returned a wrong number of values or NaN/inf; the message
    names the objective, the exception and the innermost frame of the user's own code."""
