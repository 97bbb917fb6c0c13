"""The bound on module length, beside ruff's bound on function length (pyproject's max-statements): a module of
the shipped packages past MAX_LINES is split by concern before it grows further (issue 41: files refilled within a
day of their split, with nothing to stop them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from suite_helpers import ROOT

MAX_LINES = 600
SHIPPED = ("training/rlt", "operator/rlt_operator", "operator/rlt_sandbox")

# Modules being split now, each with its size when listed as its ceiling: it may shrink, never grow, and leaves the
# list once it is under MAX_LINES (test_the_allowlist_holds_only_modules_still_over_the_bound says when).
ALLOWED: dict[str, int] = {}


def lines_of(path: Path) -> int:
    return len(path.read_text().splitlines())


def shipped_modules() -> dict[str, int]:
    return {
        path.relative_to(ROOT).as_posix(): lines_of(path)
        for folder in SHIPPED
        for path in sorted((ROOT / folder).rglob("*.py"))
    }


def over_the_bound(modules: dict[str, int], allowed: dict[str, int]) -> list[str]:
    """Each module longer than its bound (MAX_LINES, or its ceiling in `allowed`), with its length and the bound."""
    return [
        f"{name}: {n} lines (bound {allowed.get(name, MAX_LINES)}; split it by concern)"
        for name, n in sorted(modules.items())
        if n > allowed.get(name, MAX_LINES)
    ]


def test_no_shipped_module_is_longer_than_the_bound():
    modules = shipped_modules()
    assert len(modules) > 100, "the packages were not found where the test looks"
    assert not over_the_bound(modules, ALLOWED)


def test_the_allowlist_holds_only_modules_still_over_the_bound():
    """A split module leaves the list (else it could refill up to its old size unseen)."""
    modules = shipped_modules()
    assert not [name for name in ALLOWED if modules.get(name, 0) <= MAX_LINES]


@pytest.mark.parametrize("extra", [1, 50])
def test_a_module_one_line_past_the_bound_is_named(extra):
    modules = {"operator/rlt_operator/new.py": MAX_LINES + extra, "operator/rlt_operator/ok.py": MAX_LINES}
    assert over_the_bound(modules, {}) == [
        f"operator/rlt_operator/new.py: {MAX_LINES + extra} lines (bound {MAX_LINES}; split it by concern)"
    ]
