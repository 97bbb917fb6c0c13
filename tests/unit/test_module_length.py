"""The bounds on module and function length (issue 41: files refilled within a day of their split, with nothing to
stop them): a module of the shipped packages past MAX_LINES is split by concern before it grows further, and a
function past MAX_FUNCTION_LINES is cut into named steps. Ruff's max-statements counts statements, not lines: a
function of a few long expressions passes it at any length, so the lines are counted here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from suite_helpers import ROOT

MAX_LINES = 600
MAX_FUNCTION_LINES = 100
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


def long_functions(source: str, where: str) -> list[str]:
    """Each function or method of `source` longer than MAX_FUNCTION_LINES (decorators and docstring included)."""
    return [
        f"{where}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines (bound {MAX_FUNCTION_LINES})"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_no_shipped_function_is_longer_than_the_bound():
    found = [
        line
        for folder in SHIPPED
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line in long_functions(path.read_text(), path.relative_to(ROOT).as_posix())
    ]
    assert not found


def test_a_function_one_line_past_the_bound_is_named():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    ok = f"def ok():\n{body}\n"
    long = f"def long():\n{body}\n    return 0\n"
    assert long_functions(ok, "m.py") == []
    assert long_functions(ok + long, "m.py") == [
        f"m.py:{MAX_FUNCTION_LINES + 1} long: {MAX_FUNCTION_LINES + 1} lines (bound {MAX_FUNCTION_LINES})"
    ]
