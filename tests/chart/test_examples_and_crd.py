"""Example RLTRuns against `rlt validate` and the CRD's openAPIV3Schema; the chart's CRD copy; manifests/install."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from chart_helpers import CHART, IMAGE, ROOT, helm, render_set

from rlt_operator.cluster import peering

CRD_FILE = ROOT / "manifests" / "crd" / "rltruns.rlt.dev.yaml"
CHART_CRD = CHART / "files" / "crds" / "rltruns.rlt.dev.yaml"
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
RLT = Path(sys.executable).parent / "rlt"


def crd_schema() -> dict:
    crd = yaml.safe_load(CRD_FILE.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]


def schema_errors(doc: dict) -> list[str]:
    # Kubernetes structural schemas are OpenAPI 3.0: boolean exclusiveMinimum, i.e. JSON Schema draft 4.
    validator = jsonschema.Draft4Validator(crd_schema())
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_required_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {
        "rltrun-paper-7b.yaml",
        "rltrun-local.yaml",
        "rltrun-tiny.yaml",
        "rltrun-small-2gpu.yaml",
        "rltrun-multinode.yaml",
        "rltrun-suspended.yaml",
    } <= names


def test_examples_pass_rlt_validate():
    # examples with trainerArgs make validate import TRL (checked against its config classes): allow for a slow box
    proc = subprocess.run([str(RLT), "validate", *map(str, EXAMPLES)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": ok (") == len(EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_matches_crd_schema(path):
    for doc in yaml.safe_load_all(path.read_text()):
        assert doc["apiVersion"] == "rlt.dev/v1alpha1" and doc["kind"] == "RLTRun"
        assert schema_errors(doc) == []


def test_crd_schema_rejects_bad_runs():
    good = yaml.safe_load((ROOT / "manifests" / "examples" / "rltrun-small-2gpu.yaml").read_text())
    assert schema_errors(good) == []
    bad = copy.deepcopy(good)
    bad["spec"]["stages"]["rl"]["numGenerations"] = "many"
    assert any("numGenerations" in e for e in schema_errors(bad))
    bad = copy.deepcopy(good)
    bad["spec"]["resources"]["trainer"]["nodes"] = 0
    assert any("nodes" in e for e in schema_errors(bad))


def test_example_specifics():
    def spec(name):
        return yaml.safe_load((ROOT / "manifests" / "examples" / name).read_text())["spec"]

    small = spec("rltrun-small-2gpu.yaml")["resources"]
    assert (
        small["trainer"]["gpus"] * small["trainer"].get("nodes", 1)
        + small["generator"]["gpus"] * small["generator"]["replicas"]
        == 2
    )
    multi = spec("rltrun-multinode.yaml")
    assert multi["resources"]["trainer"]["nodes"] > 1
    assert multi["storage"]["accessMode"] == "ReadWriteMany"
    assert spec("rltrun-suspended.yaml")["suspend"] is True


def test_chart_crd_is_a_copy_of_the_generated_crd():
    assert CHART_CRD.read_text() == CRD_FILE.read_text(), "run `make chart-crd`"


def test_rendered_crd_is_the_file_plus_the_keep_policy():
    out = helm("template", "rel", str(CHART), *IMAGE, "--show-only", "templates/crd.yaml").stdout
    lines = out.splitlines()
    assert lines[:2] == ["---", "# Source: rlt-operator/templates/crd.yaml"]
    inserted = ["  annotations:", "    helm.sh/resource-policy: keep"]
    body = lines[2:]
    i = body.index("metadata:")
    assert body[i + 1 : i + 3] == inserted
    assert body[: i + 1] + body[i + 3 :] == CRD_FILE.read_text().splitlines()
    crd = yaml.safe_load(out)
    assert crd["spec"]["names"]["kind"] == "RLTRun"


def test_install_manifests_equal_helm_template():
    sys.path.insert(0, str(ROOT / "hack"))
    try:
        import render_install
    finally:
        sys.path.pop(0)
    committed = (ROOT / "manifests" / "install" / "rlt-operator.yaml").read_text()
    assert committed == render_install.render(), "run `make install-manifests`"
    docs = [d for d in yaml.safe_load_all(committed) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "Namespace" and "CustomResourceDefinition" in kinds and "Deployment" in kinds
    installed = [d for d in render_set("defaults") if "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]
    assert len(installed) < len(render_set("defaults")), "the chart's `helm test` pod is rendered, but not installed"
    assert len(docs) == len(installed) + 1 + len(peering.crds())  # + the Namespace, the chart's crds/
    assert all(d["metadata"].get("namespace", "rlt-system") == "rlt-system" for d in docs)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_say_which_cluster_objects_they_expect(path):
    """A PriorityClass, StorageClass or Kueue queue an example names must be in its header comment: on a cluster
    without it the pods are never created (a real Job controller's FailedCreate), so the reader must know first."""
    text = path.read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for doc in yaml.safe_load_all(text):
        spec = (doc or {}).get("spec") or {}
        named = {
            "PriorityClass": (spec.get("scheduling") or {}).get("priorityClassName"),
            "StorageClass": (spec.get("storage") or {}).get("storageClassName"),
            "LocalQueue": (spec.get("scheduling") or {}).get("queueName"),
        }
        for kind, name in named.items():
            if name:
                assert f"{kind} {name}" in header, f"{path.name}: names {kind} {name!r} but its header does not say so"
