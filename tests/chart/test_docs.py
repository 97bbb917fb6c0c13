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


def _headers(text: str):
    """Every `kubectl get rlt` header a page shows: a line (or a shell comment) naming NAME then PHASE."""
    for line in text.splitlines():
        found = re.search(r"\b((?:NAMESPACE\s+)?NAME\s+PHASE\b[A-Z ]*)", line)
        if found:
            yield line, found.group(1).split()


def test_every_kubectl_get_rlt_example_shows_the_crds_printer_columns():
    """A page's example of `kubectl get rlt` shows the columns the CRD prints (default; -A adds NAMESPACE; -o wide adds
    the priority-1 columns): an added or renamed column fails here until every example follows."""
    from rlt_operator.crd import PRINTER_COLUMNS

    default = ["NAME"] + [c["name"].upper() for c in PRINTER_COLUMNS if not c.get("priority")]
    wide = default + [c["name"].upper() for c in PRINTER_COLUMNS if c.get("priority")]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), CHART / "README.md"]
    seen, wrong = 0, []
    for page in pages:
        for line, columns in _headers(page.read_text()):
            seen += 1
            shown = columns[1:] if columns[0] == "NAMESPACE" else columns
            if shown not in (default, wide):
                wrong.append(f"{page.relative_to(ROOT)}: {line.strip()}")
    assert seen >= 3, "the examples this test reads are gone: is the pattern still right?"
    assert not wrong, (
        f"columns are {' '.join(default)} (-o wide: + {' '.join(wide[len(default) :])}); stale:\n" + "\n".join(wrong)
    )


def test_runbooks_keep_the_evidence_and_say_where_it_is():
    """On call, deleting a Failed run to retry it deletes its kept failed pod and log (issue 45): no runbook says to
    delete and re-apply; RLTRunFailed's says where the evidence is and how checkpoints are reused (the retained claim
    of a run created again under the same name, not existingClaim)."""
    doc = (ROOT / "docs" / "alerts.md").read_text()
    assert not re.search(r"delete\s+and\s+re-?(apply|create)", doc, re.I), "a runbook says to delete and re-apply"
    failed = doc.split("## RLTRunFailed", 1)[1].split("\n## ", 1)[0]
    for needle in (
        "lastFailedPod",
        "RUN-last-failure",
        "{.data.log-tail}",
        "terminated.message",
        "get events",
        "kubectl -n NS logs",
        "retentionPolicy: Retain",
    ):
        assert needle in failed, needle
    assert "existingClaim` is not needed" in failed
    assert not re.search(r"kubectl logs(?! -n)", doc), "a kubectl logs hint without -n"
