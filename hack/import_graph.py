"""The import graph of the shipped packages, read from their source with ast, and the circles in it.

`python hack/import_graph.py` prints every circle (a module that, through its imports, imports itself), then the
floors of `rlt` (FLOORS: its subpackages, bottom up) and of `rlt_operator` (OPERATOR_FLOORS: its subpackages and the
modules at its root) with the count of module imports from each to each, and exits 1 if there is a circle, a pair of
floors that import each other (either way, at any depth), an import that runs up from a lower floor to a higher one,
or a subpackage on no floor. Every import counts: top-level, inside functions, and under `if TYPE_CHECKING:` (a type-only
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
# The subpackages of rlt, bottom floor first: a module may import its own floor and the ones below, never above.
FLOORS = ("contract", "spec", "method", "data", "rcl", "checks", "stages", "run", "cli")
# The operator's, the same way: its kind table and settings, the pure builders (spec -> manifests) and status
# (children -> status), the CRD, the process's link to the API server, the child writes, then the loop and its commands.
OPERATOR_FLOORS = ("config", "builders", "status", "crd", "cluster", "apply", "reconcile", "handlers", "cli")
# package -> (its floors, the name of the tuple that lists them)
PACKAGE_FLOORS = {"rlt": (FLOORS, "FLOORS"), "rlt_operator": (OPERATOR_FLOORS, "OPERATOR_FLOORS")}


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


def _subpackage(module: str, package: str = "rlt") -> str | None:
    """The subpackage (or root module) of `package` that `module` belongs to."""
    parts = module.split(".")
    return parts[1] if parts[0] == package and len(parts) > 1 else None


def subpackage_imports(edges: dict[str, set[str]], package: str = "rlt") -> dict[tuple[str, str], list[str]]:
    """(importing subpackage, imported subpackage) of `package` -> the `module -> module` imports between them. A
    subpackage's __init__ counts only where nothing else of it is imported (importing rlt.spec.run runs it too)."""
    found: dict[tuple[str, str], list[str]] = {}
    for module, targets in sorted(edges.items()):
        a = _subpackage(module, package)
        for target in sorted(targets):
            b = _subpackage(target, package)
            root = target.count(".") == 1
            if a and b and a != b and not (root and any(t.startswith(target + ".") for t in targets)):
                found.setdefault((a, b), []).append(f"{module} -> {target}")
    return found


def two_way(pairs: dict[tuple[str, str], list[str]]) -> list[tuple[str, str]]:
    """Subpackage pairs that import each other, each once (sorted)."""
    return sorted((a, b) for a, b in pairs if a < b and (b, a) in pairs)


def upward(pairs: dict[tuple[str, str], list[str]], package: str = "rlt") -> list[str]:
    """Imports from a floor to a higher one, and subpackages the package's floors do not place."""
    floors, listed_in = PACKAGE_FLOORS[package]
    problems = [
        f"{package}.{s} is on no floor (add it to {listed_in})"
        for s in sorted({s for p in pairs for s in p} - set(floors))
    ]
    for (a, b), imports in sorted(pairs.items()):
        if a in floors and b in floors and floors.index(a) < floors.index(b):
            problems += [f"up a floor, {a} -> {b}: {i}" for i in imports]
    return problems


def floor_table(pairs: dict[tuple[str, str], list[str]], floors: tuple[str, ...] = FLOORS) -> str:
    """Rows import columns: the count of module imports, top floor first (so every count sits below the diagonal)."""
    order = list(reversed(floors))
    width = max(map(len, order))
    lines = [" " * width + " " + " ".join(f"{f:>{width}}" for f in order)]
    for a in order:
        cells = [f"{len(pairs.get((a, b), [])) or ('.' if a != b else '-'):>{width}}" for b in order]
        lines.append(f"{a:>{width}} " + " ".join(cells))
    return "\n".join(lines)


def main() -> int:
    edges = graph()
    circles = cycles(edges)
    for circle in circles:
        print("circle: " + " <-> ".join(circle))
    both: list[tuple[str, str]] = []
    up: list[str] = []
    for package, (floors, _) in PACKAGE_FLOORS.items():
        pairs = subpackage_imports(edges, package)
        package_both = two_way(pairs)
        for a, b in package_both:
            print(f"two-way: {a} <-> {b}: " + "; ".join(pairs[(a, b)] + pairs[(b, a)]))
        package_up = upward(pairs, package)
        for line in package_up:
            print(line)
        print(f"{package}:\n{floor_table(pairs, floors)}")
        both += package_both
        up += package_up
    print(
        f"{len(edges)} modules, {sum(map(len, edges.values()))} imports, {len(circles)} circles, "
        f"{len(both)} two-way subpackage pairs, {len(up)} imports up a floor"
    )
    return 1 if circles or both or up else 0


if __name__ == "__main__":
    raise SystemExit(main())
