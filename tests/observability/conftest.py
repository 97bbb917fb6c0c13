"""Fixtures of the observability tests (helpers live in obs_helpers.py)."""

from __future__ import annotations

import pytest
from obs_helpers import Procs


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.stop_all()
