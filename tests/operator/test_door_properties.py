"""The door, by property (hypothesis): run files generated around the spec model — the examples as they are, fields
set from the CRD's own schema (values inside, at and beyond its bounds, enums and their typos, patterns and text
that breaks them), type confusions (a quoted number, a number for text, a list for an object) and structural damage
(a field dropped, an unknown one added, an object replaced) — and for every one:

- `rlt validate` never raises (a traceback) and says INVALID or ok;
- whatever it accepts, the CRD's schema and CEL rules accept (evaluated as tests/operator/test_crd_cel.py does);
- whatever the CRD refuses, it refuses too, naming the same field.

CI runs 200 seeded examples (derandomized: the same ones every time). More on demand, with a fresh seed:
    RLT_DOOR_EXAMPLES=20000 python -m pytest -q tests/operator/test_door_properties.py -s
Every counterexample found is kept in tests/operator/test_door_cases.py as a regular test.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from suite_helpers import EXAMPLES, ROOT

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_crd_cel import ROOT as CRD_ROOT  # noqa: E402
from test_crd_cel import _rules as cel_rules  # noqa: E402
from test_crd_cel import crd_refusals  # noqa: E402

from rlt.cli import main as rlt_main  # noqa: E402

EXAMPLES_ASKED = int(os.environ.get("RLT_DOOR_EXAMPLES", "0"))
MAX_EXAMPLES = EXAMPLES_ASKED or 200
BASES = [yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.glob("rltrun-*.yaml"))]
SPEC_SCHEMA = CRD_ROOT["properties"]["spec"]


# --------------------------------------------------------------------------------------------- the door, two ways


def door(doc: Any, folder: Path) -> tuple[bool, list[str], Any]:
    """`rlt validate --no-data --no-plan` on the document written as YAML: (accepted, problem lines, the document as
    the reader reads it back, or None when it cannot)."""
    path = folder / "run.yaml"
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    path.write_text(text)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = rlt_main(["validate", "--no-data", "--no-plan", str(path)])  # an exception here fails the test
    problems = [line.strip() for line in err.getvalue().splitlines()[1:] if line.strip()]
    assert code in (0, 1), (code, err.getvalue())
    assert "Traceback" not in err.getvalue() + out.getvalue()
    assert (code == 0) == (err.getvalue() == ""), err.getvalue()
    try:
        from rlt.spec import reader

        (read,) = reader.load_yaml(text)
    except Exception:  # noqa: BLE001 - refused by the reader: the API server gets no such JSON either
        read = None
    return code == 0, problems, read


_LEADING_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*)*) ")


def crd_field(refusal: str) -> str:
    """The field a CRD refusal names: the schema error's path, or a CEL rule's object plus its fieldPath (what the
    API server names), else the field its message starts with ('cpuLimit must be at least...')."""
    where, _, message = refusal.partition(": ")
    where = where.lstrip(".").replace("[]", "")
    if _FIELD_PATHS.get(message):
        return f"{where}{_FIELD_PATHS[message]}".strip(".")
    named = _LEADING_FIELD.match(message)
    if named and (named.group(1)[0].islower()):
        where = f"{where}.{named.group(1)}" if where not in ("", "<root>") else named.group(1)
    return where.removeprefix("<root>").strip(".")


def _names(problem: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", "", problem.split(": ", 1)[0])


def same_field(crd: str, problems: list[str]) -> bool:
    """Some problem names the CRD's field, its object, or a field inside it."""
    field = re.sub(r"\.\d+(?=\.|$)", "", crd)
    for p in problems:
        named = _names(p)
        if not named or named == "<root>":
            continue
        if field.startswith(named) or named.startswith(field):
            return True
        if field.rsplit(".", 1)[0] == named.rsplit(".", 1)[0]:  # a sibling: a rule between two fields
            return True
    return False


def check_door(doc: Any, folder: Path) -> None:
    accepted, problems, read = door(doc, folder)
    if read is None:
        assert not accepted
        return
    refusals = crd_refusals(read) if isinstance(read, dict) else ["<root>: not an object"]
    if accepted:
        assert refusals == [], f"rlt validate accepts what the CRD refuses: {refusals}"
        return
    named = [r for r in refusals if r.strip(". ").startswith("spec")]  # metadata: the API server's own rules
    if not named:
        return
    if not _is_cel(named[0]):  # schema errors: each one named
        for refusal in named:
            assert same_field(crd_field(refusal), problems), f"the CRD refuses {refusal!r}, rlt says {problems}"
    else:  # CEL rules (what the model's validators check once the fields inside are valid): one of them named
        assert any(same_field(crd_field(r), problems) for r in named), f"the CRD refuses {named}, rlt says {problems}"


_CEL_MESSAGES = {rule["message"] for _, rule in cel_rules(CRD_ROOT)}
_FIELD_PATHS = {rule["message"]: rule.get("fieldPath") for _, rule in cel_rules(CRD_ROOT)}


def _is_cel(refusal: str) -> bool:
    return refusal.partition(": ")[2] in _CEL_MESSAGES


# --------------------------------------------------------------------------------------------- generating runs


def _schema_paths(node: dict[str, Any], path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(path, schema) of every field of the spec schema, list items at index 0, map values under key 'k'."""
    out = [(path, node)] if path else []
    for name, sub in (node.get("properties") or {}).items():
        out += _schema_paths(sub, (*path, name))
    if isinstance(node.get("items"), dict):
        out += _schema_paths(node["items"], (*path, 0))
    if isinstance(node.get("additionalProperties"), dict):
        out += _schema_paths(node["additionalProperties"], (*path, "k"))
    return out


FIELDS = _schema_paths(SPEC_SCHEMA)
TEXT = st.sampled_from(
    [
        "",
        "x",
        "a b",
        "Exist",
        "yes",
        "1",
        "1e5",
        "-1",
        "https://huggingface.co/org/m",
        "s3://b/x",
        "ghcr.io/x/y:1:2",
        "UPPER",
        "a" * 70,
        "builtin:nope",
        "café",
        "\u2028",
        "a/b/c",
        "0777",
    ]
)
NUMBERS = st.one_of(
    st.sampled_from([0, 1, -1, 2, 3, 7, 8, 64, 100, 2**31, 2**32 - 1, 2**32, 2**53, 2**63 - 1, 2**63]),
    st.integers(-5, 10**6),
    st.sampled_from([0.0, 0.5, 1.0, -0.5, 1e-8, 0.999, 1.5, 1e308, math.inf, math.nan]),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
ANY = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)


def value_for(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values a field of this schema may get: valid ones, its bounds and one past them, and the wrong type."""
    kind = schema.get("type")
    near: list[Any] = []
    for bound in ("minimum", "maximum"):
        if bound in schema:
            b = schema[bound]
            near += [b, b - 1, b + 1] if kind == "integer" else [b, b - 0.5, b + 0.5, b * 0.999 + 1e-9]
    options: list[st.SearchStrategy[Any]] = [ANY]
    if kind == "integer":
        options += [st.sampled_from(near or [0, 1]), st.integers(-3, 300), st.integers(-3, 300).map(str)]
    elif kind == "number":
        options += [st.sampled_from(near or [0.0, 1.0]), st.floats(-2, 2, allow_nan=False), st.just("0.5")]
    elif kind == "boolean":
        options += [st.booleans(), st.sampled_from(["true", "yes", 1])]
    elif kind == "string":
        if "enum" in schema:
            options += [
                st.sampled_from(schema["enum"]),
                st.sampled_from([e + "x" for e in schema["enum"] if e] or ["x"]),
            ]
        if "pattern" in schema:
            options.append(st.from_regex(schema["pattern"].replace(r"\s", " "), fullmatch=True).map(lambda s: s[:80]))
        options += [TEXT, st.text(max_size=12)]
    elif kind == "object":
        options += [st.just({}), st.dictionaries(st.sampled_from(["a", "b", "key", "name"]), ANY, max_size=2)]
    elif kind == "array":
        options += [st.just([]), st.lists(ANY, max_size=2)]
    return st.one_of(options)


def set_at(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    if not isinstance(doc.get("spec"), dict):
        doc["spec"] = {}
    node: Any = doc["spec"]
    for i, part in enumerate(path[:-1]):
        nxt = path[i + 1]
        empty: Any = [] if isinstance(nxt, int) else {}
        if isinstance(node, list):
            if not node:
                node.append(empty)
            if not isinstance(node[0], (dict, list)):
                node[0] = empty
            node = node[0]
        elif isinstance(node, dict):
            if not isinstance(node.get(part), (dict, list)) or isinstance(node.get(part), list) != isinstance(
                empty, list
            ):
                node[part] = empty
            node = node[part]
    last = path[-1]
    if isinstance(node, list):
        node[:1] = [value]
    elif isinstance(node, dict):
        node[last] = value


def all_paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path] if path else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += all_paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += all_paths(v, (*path, i))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    return _get(doc, path[:-1])


@st.composite
def run_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(0, 3))):
        how = draw(st.sampled_from(["field", "field", "field", "confuse", "drop", "unknown", "replace"]))
        if how == "field":
            path, schema = draw(st.sampled_from(FIELDS))
            set_at(doc, path, draw(value_for(schema)))
            continue
        paths = all_paths(doc)
        path = draw(st.sampled_from(paths))
        parent, key, value = _parent(doc, path), path[-1], _get(doc, path)
        if how == "confuse":  # the same value as another type
            if isinstance(value, bool):
                new: Any = str(value).lower()
            elif isinstance(value, (int, float)):
                new = draw(st.sampled_from([str(value), bool(value), [value]]))
            elif isinstance(value, str):
                new = draw(st.sampled_from([0, 1.5, True, [value], {"value": value}]))
            else:
                new = draw(st.sampled_from(["", 0, None]))
            parent[key] = new
        elif how == "drop" and isinstance(parent, dict):
            del parent[key]
        elif how == "unknown" and isinstance(value, dict):
            value[draw(st.sampled_from(["extra", "batchsize", "learning_rate", "Enabled"]))] = draw(ANY)
        elif how == "replace":
            parent[key] = draw(ANY)
    return doc


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    here = Path.cwd()
    os.chdir(ROOT)  # the examples name their files from the repository root
    yield tmp_path_factory.mktemp("door")
    os.chdir(here)


def test_the_door_agrees_with_the_crd_on_generated_run_files(folder):
    start, count = time.monotonic(), [0]

    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=not EXAMPLES_ASKED,  # CI: the same examples every run; on demand: new ones
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(run_documents())
    def examples(doc):
        count[0] += 1
        if EXAMPLES_ASKED and count[0] % 1000 == 0:  # a long run says how far it is
            print(f"door property: {count[0]} examples, {time.monotonic() - start:.0f}s", flush=True)
        check_door(doc, folder)

    examples()
    print(f"\ndoor property: {count[0]} examples in {time.monotonic() - start:.0f}s")
