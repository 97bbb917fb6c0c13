"""Which package may import which: the core `rlt` nothing of the operator's, the shipped operator nothing of the
sandbox's (commands of both come through an entry point), no import circle anywhere in the shipped packages, and
the subpackages of rlt and of rlt_operator as floors: no pair importing each other, no import up a floor."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rlt
import rlt_operator

CORE = Path(rlt.__file__).resolve().parent
OPERATOR = Path(rlt_operator.__file__).resolve().parent
ROOT = CORE.parents[1]
SHIPPED = ("rlt", "rlt_operator", "rlt_sandbox")


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
    assert (
        '[project.entry-points."rlt.commands"]\noperator = "rlt_operator.cli:register"\n'
        'sandbox = "rlt_sandbox.cli:register"' in pyproject
    )


def _imports_of(package: Path, banned: str) -> list[str]:
    """`file:line` of every import (any depth, type-only ones too) in `package` that names package `banned`."""
    offenders = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.relative_to(package)}:{node.lineno}" for n in names if n.split(".")[0] == banned]
    return offenders


def test_the_shipped_operator_imports_nothing_of_the_sandbox():
    assert not _imports_of(OPERATOR, "rlt_sandbox")
    # and the operator image copies the operator package only
    containerfile = (ROOT / "images/operator/Containerfile").read_text()
    assert "COPY operator/rlt_operator " in containerfile and "rlt_sandbox" not in containerfile


def test_no_import_circle_in_the_shipped_packages():
    """hack/import_graph.py reads every import of rlt, rlt_operator and rlt_sandbox from the source (ast)."""
    run = subprocess.run([sys.executable, str(ROOT / "hack/import_graph.py")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
    assert " 0 circles" in run.stdout
    assert int(run.stdout.split(" modules")[0].split()[-1]) > 60, "every module was read"
    assert " 0 two-way subpackage pairs, 0 imports up a floor" in run.stdout


def _import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "hack/import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _graph_of_a_copy(tmp_path, monkeypatch, package: Path, edits: dict[str, str]):
    """hack/import_graph.py over a copy of `package` (under tmp_path, at its place in the repository) with `edits`
    (path inside the package -> text appended, the file made if new)."""
    copy = tmp_path / package.relative_to(ROOT)
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in edits.items():
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        with (copy / path).open("a") as f:
            f.write(text)
    graph = _import_graph()
    monkeypatch.setattr(graph, "ROOT", tmp_path)
    return graph


def test_a_back_import_between_two_subpackages_fails_the_graph(tmp_path, monkeypatch, capsys):
    """The same tree with one import added from the contract floor up to stages: a two-way pair and an import up a
    floor, each named with the module that makes it."""
    upward = {"contract/layout.py": "\nfrom rlt.stages.context import StageContext  # noqa\n"}
    assert _graph_of_a_copy(tmp_path, monkeypatch, CORE, upward).main() == 1
    out = capsys.readouterr().out
    assert "two-way: contract <-> stages: rlt.contract.layout -> rlt.stages.context" in out
    assert "up a floor, contract -> stages: rlt.contract.layout -> rlt.stages.context" in out
    assert " 1 two-way subpackage pairs" in out


@pytest.mark.parametrize(
    "package, extra, says",
    [
        (
            CORE,
            {"extra/__init__.py": "from rlt.contract import layout  # noqa\n"},
            "rlt.extra is on no floor (add it to FLOORS)",
        ),
        (
            OPERATOR,
            {"extra.py": "from rlt_operator.config import kinds  # noqa\n"},
            "rlt_operator.extra is on no floor (add it to OPERATOR_FLOORS)",
        ),
    ],
)
def test_a_subpackage_on_no_floor_fails_the_graph(tmp_path, monkeypatch, capsys, package, extra, says):
    assert _graph_of_a_copy(tmp_path, monkeypatch, package, extra).main() == 1
    assert says in capsys.readouterr().out


def test_an_upward_import_in_the_operator_fails_the_graph(tmp_path, monkeypatch, capsys):
    """The operator has floors too (config, builders, status, crd, cluster, apply, then its root modules): the same
    tree with the pure status floor importing the API client above it fails, naming the import."""
    upward = {"status/observed.py": "\nfrom rlt_operator.cluster.kube import Kube  # noqa\n"}
    assert _graph_of_a_copy(tmp_path, monkeypatch, OPERATOR, upward).main() == 1
    out = capsys.readouterr().out
    assert "up a floor, status -> cluster: rlt_operator.status.observed -> rlt_operator.cluster.kube" in out
    assert " 0 two-way subpackage pairs, 1 imports up a floor" in out


def test_no_module_imports_a_private_name_of_another():
    """What modules share has a public name (the builders' common parts, evaluate's greedy decoding): no
    `from rlt... import _name` in the shipped packages, the benchmarks or hack/."""
    offenders = []
    for folder in ("training/rlt", "operator", "benchmarks", "hack"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in SHIPPED:
                    offenders += [
                        f"{path.relative_to(ROOT)}:{node.lineno}: {a.name}"
                        for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")  # __version__ is public
                    ]
    assert not offenders


def test_the_operator_pod_imports_no_training_floor():
    """README's table: the operator pod reads the contract, the spec and validation, never the stages, the laptop
    runner, model loading or the capacity plan (torch is not in the operator image). Every import counts, lazy ones
    too (hack/import_graph.py)."""
    graph = _import_graph()
    edges = graph.graph()
    seen: set[str] = set()
    todo = [m for m in edges if m.startswith("rlt_operator")]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += edges.get(module, ())
    training_only = ("rlt.stages", "rlt.run", "rlt.cli", "rlt.data.models", "rlt.checks.capacity", "rlt.checks.shapes")
    assert sorted(m for m in seen if m.startswith(training_only)) == []
    assert "rlt.checks.validation" in seen and "rlt.contract.env" in seen, "the walk reached rlt"
    assert "rlt.checks.step_time" in seen, "the trainer's grace period is sized in the operator, torch-free"
