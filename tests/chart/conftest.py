"""Fixtures of the chart tests (helpers live in chart_helpers.py)."""

from __future__ import annotations

import pytest
from chart_helpers import VALUE_SETS, render_set


@pytest.fixture(params=list(VALUE_SETS))
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render_set(request.param)
