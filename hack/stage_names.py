"""Count the places that branch on a stage by its name outside the stage's own modules (issue 41).

A branch is a string literal naming a stage (rlt.contract.stage_registry.STAGE_ORDER) that is an operand of a
comparison (`==`, `!=`, `in`, `not in`, also inside a tuple/list/set operand), a `match` case's value, a dict
literal's key or a subscript's key. The stage table itself and the stages' own modules (a module named after the
stage: rlt/stages/<stage>.py, rlt/checks/stage_terms/<stage>.py, ...) are where a stage may name itself.

It also counts the typed reads of one stage's settings by name (`spec.stages.<stage>`, any `<x>.stages.<stage>`)
outside that stage's own modules (issue 55): a module reading another stage's settings instead of asking the table
or the stage.

    python hack/stage_names.py            # the count per module, and the total
    python hack/stage_names.py --list     # every place, file:line
    python hack/stage_names.py --reads    # the reads of a stage's settings outside its modules (--list: places)
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "training" / "rlt", ROOT / "operator" / "rlt_operator")
TABLE = ROOT / "training" / "rlt" / "contract" / "stage_registry.py"


def stage_names() -> tuple[str, ...]:
    sys.path.insert(0, str(ROOT / "training"))
    from rlt.contract.stage_registry import STAGE_ORDER

    return STAGE_ORDER


def _literals(node: ast.AST, names: frozenset[str]) -> list[ast.Constant]:
    """The stage-name literals of `node`, itself or the items of a tuple/list/set literal."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [n for n in items if isinstance(n, ast.Constant) and n.value in names]


def branches(tree: ast.AST, names: frozenset[str]) -> list[int]:
    """Line numbers of every stage-name branch in `tree`."""
    lines: list[int] = []
    for node in ast.walk(tree):
        found: list[ast.Constant] = []
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found += _literals(operand, names)
        elif isinstance(node, ast.MatchValue):
            found += _literals(node.value, names)
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                found += _literals(key, names) if key is not None else []
        elif isinstance(node, ast.Subscript):
            found += _literals(node.slice, names)
        lines += [n.lineno for n in found]
    return lines


def own_module(path: Path, names: frozenset[str]) -> bool:
    return path == TABLE or path.stem in names


def count(roots: tuple[Path, ...] = PACKAGES, names: tuple[str, ...] | None = None) -> dict[str, list[int]]:
    """file (relative to the repo) -> the lines of its stage-name branches, for every file that has one."""
    known = frozenset(names if names is not None else stage_names())
    out: dict[str, list[int]] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if own_module(path, known):
                continue
            lines = branches(ast.parse(path.read_text(), str(path)), known)
            if lines:
                out[str(path.relative_to(ROOT))] = lines
    return out


def own_module_of(path: Path, stage: str) -> bool:
    """A module of `stage` itself: named after it (stages/rl.py, spec/stages/rl.py, checks/stage_terms/rl.py) or
    its parts (stages/rl_reward.py)."""
    return path.stem == stage or path.stem.startswith(f"{stage}_")


def settings_reads(tree: ast.AST, names: frozenset[str], path: Path) -> list[tuple[int, str]]:
    """(line, stage) of every `<x>.stages.<stage>` in `tree` outside that stage's own modules, once a line."""
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in names
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "stages"
            and not own_module_of(path, node.attr)
        ):
            found.add((node.lineno, node.attr))
    return sorted(found)


def count_reads(roots: tuple[Path, ...] = PACKAGES, names: tuple[str, ...] | None = None) -> dict[str, list[str]]:
    """file (relative to the repo) -> 'line:stage' of each read of a stage's settings outside its own modules."""
    known = frozenset(names if names is not None else stage_names())
    out: dict[str, list[str]] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            reads = settings_reads(ast.parse(path.read_text(), str(path)), known, path)
            if reads:
                out[str(path.relative_to(ROOT))] = [f"{line}:{stage}" for line, stage in reads]
    return out


def main() -> int:
    if "--reads" in sys.argv:
        reads = count_reads()
        for f, places in sorted(reads.items(), key=lambda kv: -len(kv[1])):
            print(f"{len(places):4}  {f}" + (f"  ({', '.join(places)})" if "--list" in sys.argv else ""))
        print(f"{sum(len(p) for p in reads.values()):4}  reads of a stage's settings outside its own modules")
        return 0
    found = count()
    per_file = Counter({f: len(lines) for f, lines in found.items()})
    for f, n in per_file.most_common():
        print(f"{n:4}  {f}")
        if "--list" in sys.argv:
            print("".join(f"        {f}:{line}\n" for line in found[f]), end="")
    print(f"{sum(per_file.values()):4}  stage-name branches outside the stage table and the stages' own modules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
