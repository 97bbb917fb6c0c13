"""The pods' environment has one table (rlt.contract.env): the builders write only names it lists, every name it says
the operator writes is written, and no shipped module retypes one of its names as a literal."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

import rlt
import rlt_operator
from rlt.contract import env
from rlt.spec.loading import parse_run
from rlt_operator import builders as b

EXAMPLES = Path(rlt.__file__).resolve().parents[2] / "manifests/examples"
REF = b.RunRef(name="r1", namespace="team", uid="uid-1")
NAMES = {v.name for v in env.POD_ENV}


def _spec(name: str):
    return parse_run(yaml.safe_load((EXAMPLES / name).read_text())).spec


def _written() -> dict[str, set[str]]:
    """Every variable name the builders write into a pod -> the containers that get it (the multi-node and LoRA GPU
    examples, with generators and a Hub token: every branch of the env)."""
    found: dict[str, set[str]] = {}
    for example in ("rltrun-paper-7b.yaml", "rltrun-multinode.yaml", "rltrun-lora-tracked.yaml"):
        spec = _spec(example)
        user = {e.name for e in spec.env} | {e.name for e in spec.secret_env()}
        for stage in ("sft", "rl"):
            pods = [b.trainer_job(REF, spec, stage, 0)["spec"]["template"]["spec"]]
            if stage == "rl":
                pods.append(b.generator_statefulset(REF, spec, stage, 0)["spec"]["template"]["spec"])
            for pod in pods:
                for container in pod.get("initContainers", []) + pod["containers"]:
                    for e in container.get("env", []):
                        if e["name"] not in user:
                            found.setdefault(e["name"], set()).add(f"{example}:{stage}:{container['name']}")
    return found


def test_the_builders_write_only_names_of_the_table():
    written = _written()
    assert written, "the pods were rendered"
    assert not {n: sorted(c) for n, c in written.items() if n not in NAMES}


def test_every_name_the_table_says_the_operator_writes_is_written():
    written = _written()
    said = {v.name for v in env.POD_ENV if v.writer.startswith("operator")}
    assert said - written.keys() == set()
    assert {"RLT_RUN", "RLT_RESTART", "RLT_GENERATOR_URL", "RLT_GENERATOR_PORT"}.isdisjoint(written), "removed"


@pytest.mark.parametrize("package", [rlt, rlt_operator], ids=["rlt", "rlt_operator"])
def test_no_shipped_module_retypes_a_name_of_the_table(package):
    """A name of the table as a string literal (or the start of an f-string, `f"RLT_METRICS_PORT={x}"`) anywhere
    but in the table: the reader or writer would drift from it."""
    base = Path(package.__file__).resolve().parent
    table = Path(env.__file__).resolve()
    offenders = []
    for path in sorted(base.rglob("*.py")):
        if path == table:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if text in NAMES or any(text.startswith(n + "=") for n in NAMES):
                    offenders.append(f"{path.relative_to(base)}:{node.lineno}: {text!r}")
    assert not offenders


def test_the_docs_table_is_the_table():
    docs = (EXAMPLES.parents[1] / "docs/operator.md").read_text()
    assert env.markdown_table() in docs
