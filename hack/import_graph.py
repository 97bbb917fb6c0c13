"""The import graph of the shipped packages, read from their source with ast, and the circles in it.

`python hack/import_graph.py` prints every circle (a module that, through its imports, imports itself) and exits 1
if there is one. Every import counts: top-level, inside functions, and under `if TYPE_CHECKING:` (a type-only
circle still means the two modules cannot be read or moved apart). Importing `a.b.c` also runs `a/__init__` and
`a/b/__init__`, so a module depends on its parent packages too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# source folder -> the packages shipped from it
SOURCES = {"training": ("rlt",), "operator": ("rlt_operator", "rlt_sandbox")}


def modules() -> dict[str, Path]:
    """Every module of the shipped packages: dotted name -> file."""
    found: dict[str, Path] = {}
    for folder, packages in SOURCES.items():
        for package in packages:
            base = ROOT / folder / package
            for path in sorted(base.rglob("*.py")):
                parts = path.relative_to(ROOT / folder).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        # `from pkg import sub` imports the module pkg.sub when there is one
        return [prefix] + [f"{prefix}.{a.name}" for a in node.names]
    return []


def graph() -> dict[str, set[str]]:
    """module -> the shipped modules it imports (directly, or as the parent package of one it imports)."""
    mods = modules()
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for imported in _imported(node, name, path.name == "__init__.py"):
                parts = imported.split(".")
                # the module itself and every parent package it runs on the way
                targets |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & mods.keys()
        targets.discard(name)
        # a package's own parents are not dependencies of it in the sense of a circle
        edges[name] = {t for t in targets if not name.startswith(t + ".")}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    edges = graph()
    circles = cycles(edges)
    for circle in circles:
        print("circle: " + " <-> ".join(circle))
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports, {len(circles)} circles")
    return 1 if circles else 0


if __name__ == "__main__":
    raise SystemExit(main())
