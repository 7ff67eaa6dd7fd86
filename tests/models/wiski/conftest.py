"""Fixtures shared by the WISKI tests."""

from __future__ import annotations

from typing import Any

import pytest

from bo_online.models import WISKI


@pytest.fixture
def fit_projection_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of every ``WISKI.fit_projection`` call made in the test (each call
    still runs)."""
    calls: list[dict[str, Any]] = []
    original = WISKI.fit_projection

    def spy(self, *args, **kwargs):
        calls.append(kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(WISKI, "fit_projection", spy)
    return calls
