"""The chart README documents every value; the docs pages the issue asks for exist and link up."""

from __future__ import annotations

import re

import yaml
from chart_helpers import CHART, ROOT

OPAQUE = {"podSecurityContext", "securityContext", "resources"}  # documented as one row each


def leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        if key in OPAQUE or key.endswith(".labels") or not isinstance(v, dict) or not v:
            yield key
        else:
            yield from leaves(v, key)


def test_readme_documents_every_value():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    rows = set(re.findall(r"^\| `([^`]+)` \|", readme, re.M))
    missing = [k for k in leaves(values) if k not in rows]
    assert not missing, f"undocumented values: {missing}"
    stale = [r for r in rows if "." in r and r.split(".")[0] in values and r not in set(leaves(values))]
    assert not stale, f"README documents values that do not exist: {stale}"


def test_docs_pages_exist_and_link():
    docs = ROOT / "docs"
    for page in ("install.md", "gpu-cluster.md", "walkthrough.md", "alerts.md", "dashboards.md"):
        assert (docs / page).is_file(), page
    install = (docs / "install.md").read_text()
    for needle in ("helm install", "helm upgrade", "helm uninstall", "kubectl delete crd", "resource-policy: keep"):
        assert needle in install
    # uninstall order: runs, then the operator, then the CRD
    order = [install.index(s) for s in ("kubectl delete rltruns", "helm uninstall rlt-operator", "kubectl delete crd")]
    assert order == sorted(order)
    prereq = (docs / "gpu-cluster.md").read_text()
    for needle in ("nvidia.com/gpu", "StorageClass", "ReadWriteMany", "Kueue", "queueName"):
        assert needle in prereq
    walkthrough = (docs / "walkthrough.md").read_text()
    assert "kubectl apply -f manifests/examples/rltrun-small-2gpu.yaml" in walkthrough
    for title in ("RLTRun overview", "RLT training", "RLT generation", "RLT operator"):
        assert title in walkthrough
    for rel in re.findall(r"\]\(([^)#]+\.md)\)", install + prereq + walkthrough):
        assert (docs / rel).resolve().is_file(), rel


def test_readme_indexes_every_docs_page_in_reading_order():
    """The README's documentation index links every page of docs/ (a new page is added to it, not forgotten), and
    its numbered steps come in the order a newcomer walks: what it is, a local run, the sandbox, data, cluster,
    on call."""
    readme = (ROOT / "README.md").read_text()
    index = readme.split("## Documentation, in reading order", 1)[1].split("\n## ", 1)[0]
    linked = set(re.findall(r"\(docs/([\w.-]+\.md)\)", index))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages missing from the README's index: {sorted(pages - linked)}"
    steps = re.findall(r"^\d\. \*\*([^*]+)\*\*", index, re.M)
    assert steps == ["What it is", "A local run", "The sandbox", "Your data", "Your cluster", "On call"], steps
