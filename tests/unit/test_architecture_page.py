"""docs/architecture.md tells the truth where a test can check it: the operator pod's row lists exactly the `rlt`
modules the operator loads, every command, script, file and module the page names is in the repository, and the
page and its decision records point at no issue tracker the repository does not link."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

from suite_helpers import ROOT, hack_module

PAGE = ROOT / "docs" / "architecture.md"
# Where a path the page names may be rooted: the repository, the two packages' folders, docs/.
BASES = (ROOT, ROOT / "training" / "rlt", ROOT / "operator" / "rlt_operator", ROOT / "operator", ROOT / "docs")

# What the operator does with rlt: every module of rlt_operator imported, every example run validated (the
# operator's door) and its children built (what it creates). Prints the rlt modules loaded, and whether torch was.
OPERATOR_LOADS = """
import glob, importlib, json, pkgutil, sys
import yaml
import rlt_operator
for m in pkgutil.walk_packages(rlt_operator.__path__, "rlt_operator."):
    importlib.import_module(m.name)
from rlt.checks.validation import validate_spec
from rlt_operator.builders import RunRef
from rlt_operator.apply.dry_run import run_children

for path in sorted(glob.glob(sys.argv[1] + "/*.yaml")):
    for doc in yaml.safe_load_all(open(path)):
        if doc and doc.get("kind") == "RLTRun":
            spec = validate_spec(doc["spec"], name=doc["metadata"]["name"])
            run_children(RunRef(doc["metadata"]["name"], "ns", "uid"), spec)
loaded = [(n, hasattr(m, "__path__")) for n, m in sys.modules.items() if n.startswith("rlt.")]
print(json.dumps({"modules": sorted(loaded), "torch": "torch" in sys.modules}))
"""


def operator_row_claims() -> list[str]:
    """The `rlt` parts the page's operator-pod row names, as paths under rlt/ (`spec/` a folder, `checks/x` one)."""
    row = next(line for line in PAGE.read_text().splitlines() if line.startswith("| operator pod"))
    claims = row.split("of `rlt`", 1)[1]
    return re.findall(r"`([a-z_]+/(?:[a-z_]+/?)*)`", claims)


def test_the_operator_pods_row_names_what_the_operator_loads() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", OPERATOR_LOADS, str(ROOT / "manifests" / "examples")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["torch"], "the operator image has no torch"
    loaded = ["/".join(name.split(".")[1:]) for name, package in out["modules"] if not package]
    claims = operator_row_claims()
    assert "spec/" in claims and "checks/validation" in claims, claims

    def covered(module: str, claim: str) -> bool:
        return module.startswith(claim) if claim.endswith("/") else module == claim

    unnamed = [m for m in loaded if not any(covered(m, c) for c in claims)]
    unused = [c for c in claims if not any(covered(m, c) for m in loaded)]
    assert not unnamed, f"the operator loads rlt modules docs/architecture.md's operator row does not name: {unnamed}"
    assert not unused, f"docs/architecture.md's operator row names rlt parts the operator does not load: {unused}"


def _backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def _module_has(dotted: str) -> bool:
    """`rlt.a.b` (or `rlt_operator.a.b`) is a module, or `rlt.a.b.Name` a name a module defines (read from its
    source, not imported)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:cut]))
        except ModuleNotFoundError:  # a name under a module, not a submodule
            continue
        if spec is None or spec.origin is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        source = Path(spec.origin).read_text()
        return re.search(rf"^(?:class |def )?{re.escape(rest[0])}\b", source, re.M) is not None
    return False


def test_every_command_script_file_and_module_the_page_names_exists() -> None:
    from rlt.cli import build_parser

    text = PAGE.read_text()
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # `rlt`'s sub-commands
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    missing: list[str] = []
    named = 0
    for token in _backticked(text):
        if "<" in token or "://" in token or token.startswith("/"):
            continue  # a pattern (stages/<s>.py) or a URL/volume path, not a file of the repository
        if m := re.fullmatch(r"make ([\w-]+)", token):
            named += 1
            missing += [] if m.group(1) in targets else [f"make target {m.group(1)}"]
        elif m := re.fullmatch(r"rlt ([a-z/]+).*", token):
            named += 1
            missing += [f"rlt {c}" for c in m.group(1).split("/") if c not in commands]
        elif token.startswith("python "):
            named += 1
            script = token.split()[1]
            missing += [] if (ROOT / script).is_file() else [script]
        elif re.fullmatch(r"rlt(_operator)?(\.\w+)+(:\w+)?", token):
            named += 1
            missing += [] if _module_has(token.split(":")[0]) else [token]
        elif "/" in token and " " not in token:
            named += 1
            path = token.rstrip("/")
            candidates = [path, path + ".py", path.split(".")[0] + ".py"]
            if not any((base / c).exists() for base in BASES for c in candidates):
                missing.append(token)
    assert named > 30, "the scan found the page's names"
    assert not missing, f"docs/architecture.md names what the repository does not have: {missing}"


def test_the_page_and_its_decisions_cite_no_unlinked_tracker() -> None:
    pages = [PAGE, *sorted((ROOT / "docs" / "decisions").glob("*.md"))]
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in pages
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bissues? #?\d+|(?<![\w/])#\d+\b", line, re.I)
    ]
    assert not found, f"issue numbers of a tracker the repository does not link: {found}"


def test_every_change_checklist_says_make_generate() -> None:
    section = PAGE.read_text().split("## Checklists for common changes", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^\*\*(.+?)\*\*(.*?)(?=^\*\*|\Z)", section, re.M | re.S)
    assert len(items) >= 6, [title for title, _ in items]
    assert not [title for title, body in items if "make generate" not in body]


def test_the_floors_the_page_draws_are_the_import_graphs() -> None:
    """Each floor matrix on the page is hack/import_graph.py's of today, counts and all (`make docs` writes them):
    the floors it checks, top floor first, and how many imports each makes of each below it."""
    gen_docs = hack_module("gen_docs")
    text = PAGE.read_text().split("## The floors", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^(```\n.*?^```)", text, re.M | re.S)
    assert blocks == [gen_docs.floors_block("rlt"), gen_docs.floors_block("rlt_operator")], "run `make docs`"
