"""The core package `rlt` depends on nothing of the operator's: operator commands come through an entry point."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rlt

CORE = Path(rlt.__file__).resolve().parent


def test_importing_every_rlt_module_imports_nothing_of_the_operator():
    code = (
        "import importlib, pkgutil, sys, rlt\n"
        "names = [m.name for m in pkgutil.walk_packages(rlt.__path__, 'rlt.')]\n"
        "for n in names: importlib.import_module(n)\n"
        "import rlt.cli\n"
        "print(len(names), sorted(m for m in sys.modules if m.split('.')[0] == 'rlt_operator'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert int(out[0]) > 20, "every module of rlt was found and imported"
    assert out[1].strip() == "[]"


def test_no_rlt_source_names_the_operator_package_in_an_import():
    offenders = []
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{path.relative_to(CORE)}:{node.lineno}" for n in names if n.split(".")[0] == "rlt_operator"]
    assert not offenders


def test_operator_commands_register_through_the_entry_point_group():
    from rlt.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices  # the `rlt` sub-commands
    assert {"validate", "run", "stage", "crd", "operator", "sandbox"} <= set(commands)
    pyproject = (CORE.parents[1] / "pyproject.toml").read_text()
    assert '[project.entry-points."rlt.commands"]\noperator = "rlt_operator.cli:register"' in pyproject
